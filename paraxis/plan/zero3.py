"""ZeRO-3's traffic as paraxis's runtime makes it: which parameters a step gathers how often
(`Zero3Kept`), the bytes its collectives assemble with and without a pipeline
(`zero3_volume`, `zero3_pipeline_volume`; `data_parallel.flat.VOLUME` counts the runtime's),
and which compute hides each gather (`zero3_windows`). Seconds come from plan/comm.py.
Pure arithmetic: the planner imports it without torch.
"""

from __future__ import annotations

from typing import NamedTuple

from paraxis.spec.layout import Layout


class Zero3Kept(NamedTuple):
    """Parameters of one rank's stage that ZeRO-3 gathers for a microbatch's forward only,
    as paraxis's runtime does (data_parallel/zero.py, pipeline_parallel/zero3.py): an
    embedding, whose backward needs only the token ids, and without a pipeline the last unit,
    kept gathered from its forward into its backward, and a tied embedding and head's root
    unit (with the final norm), gathered when the forward starts and freed when its
    gradients are complete, as PyTorch FSDP treats its root (FSDP2 as torchtitan wraps it
    keeps the last block too; FSDP1 gathers it again); `param_bytes` each (none travels in
    FP8)."""

    once: float = 0.0
    param_bytes: float = 2
    # gathered again by a split backward's W (pipeline_parallel/zero3.py: a LayerNorm's
    # backward, or full recompute's rerun, reads the weights), each microbatch
    regathered: float = 0.0


class Zero3Layer(NamedTuple):
    """Seconds of one layer's ZeRO-3 collectives per microbatch (`comm.zero3_layer_times`)."""

    gather: float  # the forward's
    again: float  # the backward's
    scatter: float  # the gradients' reduce-scatter
    w_gather: float = 0.0  # a split backward's W, where it reads the weights

    def plus(self, other: Zero3Layer) -> Zero3Layer:
        return Zero3Layer(*(a + b for a, b in zip(self, other, strict=True)))


def zero3_volume(stage_params: float, microbatches: int, kept: Zero3Kept,
                 param_bytes: float = 2, grad_bytes: float = 2,
                 regather_bytes: float | None = None) -> dict[str, float]:
    """Bytes one rank's ZeRO-3 collectives assemble per step without a pipeline, as the
    runtime does it (`data_parallel/zero.py`), for `stage_params` (after TP): every
    microbatch gathers the parameters for its forward and again for its backward
    (`regather_bytes` a parameter, default `param_bytes`) but for `kept` (`Zero3Kept`), and
    reduce-scatters their gradients. {"all_gather", "reduce_scatter"}, as
    `zero3_pipeline_volume`."""
    again = param_bytes if regather_bytes is None else regather_bytes
    backward = stage_params * again - kept.once * kept.param_bytes
    return {"all_gather": microbatches * (stage_params * param_bytes + backward),
            "reduce_scatter": microbatches * stage_params * grad_bytes}


def zero3_pipeline_volume(stage_params: float, microbatches: int, reshard: str,
                          param_bytes: float = 2, grad_bytes: float = 2,
                          forward_only_params: float = 0.0, regathered_params: float = 0.0,
                          regather_bytes: float | None = None) -> dict[str, float]:
    """Bytes one rank's ZeRO-3 collectives assemble per step under a pipeline, as the
    runtime does it (`pipeline_parallel/zero3.py`), for a stage of `stage_params` (after TP):
    {"all_gather", "reduce_scatter"}.

    reshard "forward" (FSDP's reshard_after_forward): every microbatch gathers the stage's
    parameters for its forward and again for its backward, except `forward_only_params`
    (an embedding: its backward needs only the token ids), plus `regathered_params` (a
    zero-bubble W under full recompute re-gathers its chunk, first virtual stage excepted).
    "step": each parameter is gathered once and kept to its chunk's last backward. Gradients
    accumulate over the microbatches and are reduce-scattered once (Rajbhandari et al. 2020
    Sec. 5.3 for the per-layer gathers; PyTorch FSDP2's gradient sync on the last microbatch).
    regather_bytes: the backward's gathers, bytes per parameter (default `param_bytes`).
    """
    again = param_bytes if regather_bytes is None else regather_bytes
    if reshard == "step":
        gathered = stage_params * param_bytes
    else:
        gathered = microbatches * (stage_params * param_bytes + (
            stage_params - forward_only_params + regathered_params) * again)
    return {"all_gather": gathered, "reduce_scatter": stage_params * grad_bytes}



def zero3_windows(times: Zero3Layer, layer: dict[str, float], layout: Layout
                  ) -> tuple[list[tuple[float, float]], int]:
    """(communication, compute window) pairs of one layer's ZeRO-3 traffic (`times`) and how
    many times they repeat per step, from the layer's forward/backward seconds: FSDP's
    prefetch one layer ahead (Zhao et al. 2023 Sec. 3.3) hides each behind one layer's
    compute, per microbatch. Under a pipeline (pipeline_parallel/zero3.py) the gradients are
    reduce-scattered once per step and the gathers come per microbatch (zero3_reshard
    "forward", a split backward's W gathering again where it reads the weights) or once
    ("step")."""
    forward, backward = layer["forward"], layer["backward"]
    if layout.pp == 1:
        return [(times.gather, forward), (times.again + times.scatter, backward)], \
            layout.microbatches
    m = layout.microbatches
    pairs = ([(times.gather, forward)] if layout.zero3_reshard == "step"
             else [(m * times.gather, m * forward),
                   (m * (times.again + times.w_gather), m * backward)])
    return [*pairs, (times.scatter, backward)], 1
