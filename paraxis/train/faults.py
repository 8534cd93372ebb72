"""Fault injection for the reliability tests: break a real run on purpose, in one place.

    PARAXIS_FAULT="hang:rank=2,step=1"   rank 2 stops before step 1 (sleeps forever): the
                                         others block in their next collective with it
    PARAXIS_FAULT="nan:step=3"           the token embedding's output is NaN on step 3, on
    PARAXIS_FAULT="nan:step=3,rank=1"    every rank or on one: the loss and every gradient
                                         downstream become NaN, as an overflow makes them
    PARAXIS_FAULT="kill:rank=1,step=3"   rank 1 SIGKILLs itself before step 3, in the first
                                         attempt only (a restarted run goes through)
    PARAXIS_FAULT="kill:rank=1,step=3,phase=backward"   ... or during step 3's forward,
                                         backward, first collective, or checkpoint save
                                         (phases: step, forward, backward, collective, save;
                                         save: the save after step 3, between the shard
                                         files and the manifest)

Read once when the loop starts; unset (every real run) it costs one comparison per step. The
faults act through the real model and collectives, so what the tests see (a timeout naming
the wait, a NaN caught by the loop's check) is what a real fault produces.
"""

from __future__ import annotations

import math
import os
import signal
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from paraxis.dist.groups import restart_attempt
from paraxis.dist.watchdog import WATCH
from paraxis.model.checkpoint.save import FAIL_ENV
from paraxis.spec.errors import ParaxisError

KINDS = ("hang", "nan", "kill")
PHASES = ("step", "forward", "backward", "collective", "save")


@dataclass
class Fault:
    kind: str
    step: int
    rank: int | None = None  # None: every rank
    phase: str = "step"  # when a kill strikes within its step
    _hooks: list = field(default_factory=list)

    def before_step(self, step: int, rank: int, model: nn.Module) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        WATCH.on_wait = None
        if step != self.step or self.rank not in (None, rank):
            return
        if self.kind == "hang":
            while True:  # a stalled rank: only the watchdog or the launcher ends it
                time.sleep(3600)
        if self.kind == "kill":
            if restart_attempt() == 0:
                self._arm_kill(rank, model)
            return
        for name, module in model.named_modules():
            if name.rsplit(".", 1)[-1] == "tok_emb":
                self._hooks.append(module.register_forward_hook(_poison))

    def _arm_kill(self, rank: int, model: nn.Module) -> None:
        """SIGKILL this rank now, or at the phase asked for: a lost node, no goodbye."""
        if self.phase == "step":
            _die()
        elif self.phase == "collective":
            WATCH.on_wait = _die
        elif self.phase == "save":
            os.environ[FAIL_ENV] = f"{self.step + 1}:{rank}"
        else:  # the rank's first module with weights: every pipeline stage has one
            first = next(m for m in model.modules() if not list(m.children())
                         and any(True for _ in m.parameters(recurse=False)))
            hook = _die_in_forward if self.phase == "forward" else _die_in_backward
            self._hooks.append(first.register_forward_hook(hook))


def _die(*args: object) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _die_in_forward(module: nn.Module, args: object, output: torch.Tensor) -> None:
    _die()


def _die_in_backward(module: nn.Module, args: object, output: torch.Tensor) -> None:
    if isinstance(output, torch.Tensor) and output.requires_grad:
        output.register_hook(_die)


def _poison(module: nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
    return output * math.nan


def from_env() -> Fault | None:
    """The fault PARAXIS_FAULT asks for, or None."""
    text = os.environ.get("PARAXIS_FAULT", "").strip()
    if not text:
        return None
    kind, _, rest = text.partition(":")
    try:
        items = dict((k.strip(), v.strip()) for k, v in (item.split("=") for item in
                                                          rest.split(",")))
        phase = items.pop("phase", "step")
        options = {k: int(v) for k, v in items.items()}
    except ValueError:
        options, phase = {}, ""
    if (kind not in KINDS or "step" not in options or set(options) - {"step", "rank"}
            or phase not in PHASES):
        raise ParaxisError(f"PARAXIS_FAULT={text!r} is not a fault; write e.g. "
                           "'hang:rank=2,step=1', 'nan:step=3' or 'kill:rank=1,step=3,"
                           "phase=backward' (kinds: hang, nan, kill; phases: "
                           f"{', '.join(PHASES)})")
    return Fault(kind, options["step"], options.get("rank"), phase)
