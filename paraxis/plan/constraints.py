"""What a user fixes or bounds in a layout search (`Constraints`), and, where they leave no
shape of the GPUs to try, the one line that says why."""

from __future__ import annotations

import math
from dataclasses import dataclass

from paraxis.spec.cp_balance import VARIANTS as CP_VARIANTS
from paraxis.spec.errors import ParaxisError
from paraxis.spec.grid import divisors
from paraxis.spec.hashing import hash_once, state_unhashed
from paraxis.spec.kernels import fused_loss_problem


@dataclass(frozen=True)
class Constraints:
    """Limits the user puts on the search (None: free)."""

    __hash__ = hash_once  # a search's cached settings read it some 10^4 times: hashed once
    __getstate__ = state_unhashed

    max_tp: int | None = None
    max_pp: int | None = None  # --no-pp is max_pp=1
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    ep: int | None = None  # expert parallelism (mixtures of experts only)
    # experts split over tp (etp = tp) or whole on every tp rank (etp = 1); None: split, and
    # whole too where each tp rank would route its own sequence shard (`_expert_splits`)
    split_experts: tuple[bool, ...] | None = None
    cp_attention: tuple[str, ...] = CP_VARIANTS  # how K/V reach the queries when cp > 1
    cp_a2a: int | None = None  # two-level cp's all-to-all size (None: each, cp_variants.py)
    zero: int | None = None
    dp_shard: int | None = None  # hybrid sharding's group (0: every dp rank); None: tried
    recompute: tuple[str, ...] = ("none", "selective", "full")
    # blocks per checkpoint when recompute is full (None: 1, then grouped where 1 does not fit)
    recompute_layers: int | None = None
    # which blocks full recompute checkpoints (`Layout.recompute_method`); under "block",
    # recompute_layers is how many of each chunk (None: the fewest that fit)
    recompute_method: str = "uniform"
    # GPipe has 1F1B's bubble but holds every microbatch, and SP has the same traffic as TP
    # without it but less memory: both are dominated, so they are left out unless asked for.
    schedules: tuple[str, ...] = ("1f1b", "interleaved")
    sequence_parallel: tuple[bool, ...] = (True,)
    tp_within_node: bool = False  # forbid TP groups that cross nodes
    # model chunks per device tried for interleaved (None: 2 and 4 where the layers split
    # evenly into them, else the smallest depth that splits them)
    virtual_stages: tuple[int, ...] | None = None
    micro_batch: int | None = None  # sequences per microbatch (None: every size that fits)
    # `--fused-loss`: only layouts the runtime runs it on (`spec.kernels.fused_loss_problem`)
    fused_loss: bool = False

    def __post_init__(self) -> None:
        if self.fused_loss:
            problem = fused_loss_problem(self.tp or 1, self.zero or 0)
            if problem:
                raise ParaxisError(problem)


def constraints_text(c: Constraints) -> str:
    given = [f"{n}={getattr(c, n)}" for n in ("tp", "pp", "dp", "cp", "ep", "max_tp", "max_pp")
             if getattr(c, n) is not None]
    return ", ".join(given + (["tp_within_node"] if c.tp_within_node else [])) or "none"


def why_no_shape(c: Constraints, world: int, per_node: int) -> str:
    """Why the constraints leave no (dp, cp, tp, pp) for `world` GPUs, in one line."""
    fixed = {name: getattr(c, name) for name in ("tp", "pp", "cp", "dp")
             if getattr(c, name) is not None}
    for name, value in fixed.items():
        if world % value:
            return (f"{name}={value} does not divide the {world} GPUs; choose {name} among "
                    f"{', '.join(map(str, divisors(world)))}")
    product = math.prod(fixed.values())
    if len(fixed) > 1 and world % product:
        named = " x ".join(f"{name}={value}" for name, value in fixed.items())
        return (f"{named} = {product} does not divide the {world} GPUs; choose degrees "
                f"whose product divides {world}")
    if len(fixed) == 4 and product != world:
        return (f"dp x cp x tp x pp = {product}, not the {world} GPUs; leave one of them "
                "open or make the product the GPU count")
    if c.tp is not None and c.max_tp is not None and c.tp > c.max_tp:
        return f"tp={c.tp} is above --max-tp {c.max_tp}; drop one of them"
    if c.tp is not None and c.tp_within_node and c.tp > per_node:
        return (f"tp={c.tp} spans more than a node's {per_node} GPUs, which --tp-within-node "
                f"forbids; choose tp <= {per_node} or drop the flag")
    if c.pp is not None and c.max_pp is not None and c.pp > c.max_pp:
        return (f"pp={c.pp} is above the {c.max_pp} stages allowed (--max-pp, or --no-pp); "
                "drop one of them")
    return (f"no (dp, cp, tp, pp) for {world} GPUs is allowed by the constraints "
            f"({constraints_text(c)}); relax them")
