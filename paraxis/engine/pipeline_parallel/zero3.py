"""ZeRO-3 under a pipeline schedule: when a stage's chunks are gathered, freed and reduced.

With pp > 1 a stage holds one model part per chunk (`stage.stage_parts`), and the ZeRO-3
units of `data_parallel.zero.ParamGatherer` are those of each part in turn (embedding, blocks,
final norm, LM head). Within one compute action (F, B or W of one microbatch and chunk) the
gatherer's hooks do what they do without a pipeline: gather a unit before its forward, the
next unit of the same chunk prefetched behind it; gather again when the gradient reaches the
unit's output, the unit before it prefetched. What changes is that a schedule interleaves
the forwards and backwards of different microbatches and chunks (1F1B, interleaved,
zero-bubble), so three decisions move out of the hooks and into the schedule's action list,
which this module reads (`PipelineZero3.around` wraps every compute action):

- The phase. The hooks' single forward/backward flag was set by the model's forward and by
  the first backward hook; under a schedule it is set by the action itself (F: forward; B
  and W: backward, where activation recompute re-runs a block's forward and must neither free
  it nor hook it again).
- When gathered weights are freed, `Layout.zero3_reshard` (PyTorch FSDP2's
  `reshard_after_forward`, which torchtitan sets per pipeline schedule): "forward" frees a
  chunk's units when each action ends, so every microbatch gathers them for its forward and
  again for its backward (the stage holds one unit and its prefetch at a time); "step" keeps
  them from their first use to the chunk's last backward (one gather per step, the stage's
  weights held whole: memory traded for communication).
- When gradients are reduced. They accumulate whole over the microbatches in `.grad` and
  are reduce-scattered from the chunk's last backward (its last W under a zero-bubble
  schedule). PyTorch's pipelining does the same with FSDP2 (gradient sync off in every
  microbatch's backward, one reduction after the last), reducing each chunk where the
  schedule says; here the reduction starts inside that last backward, one unit at a time. The
  chunks of a stage finish their backward last-to-first (the later virtual stage's backward
  of the last microbatch comes first), the order in which the reducer launches its units. A
  chunk holding a tied embedding copy is reduced when the step ends instead, after the copies'
  gradients are summed (`tied.TiedEmbedding`).

Between actions the first unit the next action needs is prefetched (an F's first unit, a
backward's last), so its gather overlaps the stage's sends and receives.

A zero-bubble W reads no weight of a linear (its weight gradient is dy^T x) nor of an
RMSNorm (split_backward's cut node there is the multiply by the weight), so under "forward" it
runs with its chunk freed, except (`w_reads_weights`) under full recompute, where W re-runs
the blocks' forward, and with a LayerNorm (GPT-2), whose one backward kernel
(native_layer_norm_backward) reads the weight even for the weight gradient alone: then W
gathers the chunk first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

from paraxis.engine.data_parallel.zero import ParamGatherer
from paraxis.spec.errors import ParaxisError
from paraxis.spec.schedules import COMPUTE, Action, Schedule
from paraxis.spec.schedules import w_reads_weights as reads_weights


def w_reads_weights(parts: list[nn.Module], recompute: str) -> bool:
    """Whether a split backward's W needs its chunk's weights gathered (see above; the
    planner asks the same `spec.schedules.w_reads_weights` of the model's style)."""
    return reads_weights(parts[0].cfg.style, recompute)


class PipelineZero3:
    """The ZeRO-3 life cycle of one stage's chunks along its action list.

    gatherer: the data-parallel engine's (its units in chunk order); parts: the stage's
    chunks; reshard: "forward" or "step" (`Layout.zero3_reshard`); recompute: the layout's;
    tied: parameters whose gradients are summed across chunks or stages before reduction.
    """

    def __init__(self, gatherer: ParamGatherer, parts: list[nn.Module], schedule: Schedule,
                 stage: int, reshard: str, recompute: str, tied: list[nn.Parameter]) -> None:
        if gatherer.root_index is not None:
            raise ParaxisError("ZeRO-3 with pp>1 found parameters outside the stage's "
                               "embedding, blocks and head; use zero<=2 with this model")
        self.gatherer = gatherer
        self.schedule = schedule
        self.stage = stage
        self.reshard = reshard
        self.actions = schedule.stages[stage]
        self.split = schedule.split_backward
        chunk_of_param = {id(p): chunk for chunk, part in enumerate(parts)
                          for p in part.parameters()}
        gatherer.chunk_of = [chunk_of_param[id(unit.params[0])] for unit in gatherer.units]
        self.units_of = [[i for i, c in enumerate(gatherer.chunk_of) if c == chunk]
                         for chunk in range(len(parts))]
        # the action after which a chunk has all of its step's gradients
        grads_in = "W" if self.split else "B"
        self.last_grads = {a.chunk: i for i, a in enumerate(self.actions) if a.kind == grads_in}
        tied_ids = {id(p) for p in tied}
        self.deferred = {chunk for chunk, part in enumerate(parts)
                         if any(id(p) in tied_ids for p in part.parameters())}
        self.w_needs_weights = w_reads_weights(parts, recompute)
        self.sync_now = False  # whether the running backward reduces its chunk's gradients

    def _here(self, action: Action) -> int:
        return self.schedule.virtual_stage(self.stage, action.chunk)

    def _gathers_for_backward(self, action: Action) -> bool:
        """Whether a B/W reads its chunk's weights: a fused B always; a split B except on the
        first virtual stage (nothing to compute there: its W runs the whole backward); a W
        there, or where W reads weights (`w_reads_weights`)."""
        if action.kind == "B":
            return not self.split or self._here(action) > 0
        return self._here(action) == 0 or self.w_needs_weights

    @contextlib.contextmanager
    def around(self, position: int) -> Iterator[None]:
        """Wrap the compute action at `position` of this stage's list."""
        action = self.actions[position]
        gatherer, units = self.gatherer, self.units_of[action.chunk]
        last = self.last_grads.get(action.chunk) == position
        gatherer.phase = "forward" if action.kind == "F" else "backward"
        gatherer.keep = self.reshard == "step"
        self.sync_now = last and action.chunk not in self.deferred
        if action.kind == "W" and self._here(action) > 0 and self.w_needs_weights:
            needed = [i for i in units if gatherer.hooks[i].backward_needs_weights]
            for index in needed:  # no hook fires in such a W: gather the chunk here
                gatherer.prefetch(index)
            for index in needed:
                gatherer.gather(index)
        try:
            yield
        finally:
            gatherer.keep = False
            gatherer.phase = "forward"  # what an evaluation's forward expects
        if self.reshard == "forward" or last:
            for index in units:
                gatherer.free(index)
        self._prefetch_after(position)

    def _prefetch_after(self, position: int) -> None:
        """Start gathering the first unit the next compute action needs."""
        following = (a for a in self.actions[position + 1:] if a.kind in COMPUTE)
        action = next(following, None)
        if action is None:
            return
        units = self.units_of[action.chunk]
        if action.kind == "F":
            self.gatherer.prefetch(units[0])
        elif self._gathers_for_backward(action) and \
                self.gatherer.hooks[units[-1]].backward_needs_weights:
            self.gatherer.prefetch(units[-1])
