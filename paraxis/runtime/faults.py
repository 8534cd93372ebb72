"""Fault injection for the reliability tests: break a real run on purpose, in one place.

    PARAXIS_FAULT="hang:rank=2,step=1"   rank 2 stops before step 1 (sleeps forever): the
                                         others block in their next collective with it
    PARAXIS_FAULT="nan:step=3"           the token embedding's output is NaN on step 3, on
    PARAXIS_FAULT="nan:step=3,rank=1"    every rank or on one: the loss and every gradient
                                         downstream become NaN, as an overflow makes them
    PARAXIS_FAULT="kill:rank=1,step=3"   rank 1 SIGKILLs itself before step 3, in the first
                                         attempt only (a restarted run goes through)

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

from paraxis.errors import ParaxisError
from paraxis.runtime.distributed import restart_attempt

KINDS = ("hang", "nan", "kill")


@dataclass
class Fault:
    kind: str
    step: int
    rank: int | None = None  # None: every rank
    _hooks: list = field(default_factory=list)

    def before_step(self, step: int, rank: int, model: nn.Module) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        if step != self.step or self.rank not in (None, rank):
            return
        if self.kind == "hang":
            while True:  # a stalled rank: only the watchdog or the launcher ends it
                time.sleep(3600)
        if self.kind == "kill":
            if restart_attempt() == 0:
                os.kill(os.getpid(), signal.SIGKILL)  # a lost node: no handler, no goodbye
            return
        for name, module in model.named_modules():
            if name.rsplit(".", 1)[-1] == "tok_emb":
                self._hooks.append(module.register_forward_hook(_poison))


def _poison(module: nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
    return output * math.nan


def from_env() -> Fault | None:
    """The fault PARAXIS_FAULT asks for, or None."""
    text = os.environ.get("PARAXIS_FAULT", "").strip()
    if not text:
        return None
    kind, _, rest = text.partition(":")
    try:
        options = {k.strip(): int(v) for k, v in (item.split("=") for item in rest.split(","))}
    except ValueError:
        options = {}
    if kind not in KINDS or "step" not in options or set(options) - {"step", "rank"}:
        raise ParaxisError(f"PARAXIS_FAULT={text!r} is not a fault; write e.g. "
                           "'hang:rank=2,step=1' or 'nan:step=3' (kinds: hang, nan, kill)")
    return Fault(kind, options["step"], options.get("rank"))
