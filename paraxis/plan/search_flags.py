"""The plan's search flags, read into what the search takes: a --layout text's fields
(fixed, or one whole layout), the constraint flags into `Constraints`, --no-overlap and
--exposed into `Overlap`. `paraxis plan` and `paraxis plan --verify` read them alike.

    fixed, stated, micro_batch = stated_fields(args, cfg)   # "dp=2,zero=1" -> dp, zero fixed
    complete_layout(fixed, stated, micro_batch, 64)         # None: a partial layout
    search_constraints(args, fixed, stated, micro_batch, cfg)
"""

from __future__ import annotations

import argparse

from paraxis.plan.cost import Overlap
from paraxis.plan.memory import check_interleaving
from paraxis.plan.search import Constraints
from paraxis.spec.cp_balance import VARIANTS as CP_VARIANTS
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import FIXED_VIRTUAL, RECOMPUTE, Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.model_splits import check_model

MICRO_BATCH_KEYS = ("micro_batch", "micro_batch_size", "mbs")


def overlap_rules(no_overlap: bool, exposed: tuple[str, ...] | list[str]) -> Overlap:
    """The overlap rules the flags ask for: all off with --no-overlap; each --exposed dp,
    zero3, tp or cp turns that one off (--exposed pp turns the pipeline sends' hiding on)."""
    if no_overlap:
        return Overlap(dp=False, tp=False, pp=False, zero3_prefetch=False, cp=False)
    return Overlap(dp="dp" not in exposed, tp="tp" not in exposed, pp="pp" in exposed,
                   cp="cp" not in exposed,
                   zero3_prefetch="zero3" not in exposed)


def layout_fields(text: str) -> tuple[dict[str, object], Layout, int | None]:
    """The fields a --layout text sets; the layout they describe, with the defaults and the
    microbatch count the search would choose left at a value the rules accept (so every
    other rule is checked now); and the micro-batch size (sequences per microbatch, how
    papers state a run) if the text gives one."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    sizes = [item for item in items if item.partition("=")[0].strip().replace("-", "_")
             in MICRO_BATCH_KEYS]
    micro_batch = None
    if sizes:
        raw = sizes[-1].partition("=")[2].strip()
        if not raw.isdigit() or int(raw) < 1:
            raise ParaxisError(f"layout {sizes[-1]!r}: the micro-batch size must be a positive "
                               "integer (sequences per microbatch)")
        micro_batch = int(raw)
    fields = Layout.parse_fields(",".join(item for item in items if item not in sizes))
    if "virtual_stages" in fields and fields["virtual_stages"] != 1:
        fields.setdefault("schedule", "interleaved")
    # a multiple of pp satisfies every schedule's rule on the microbatch count; where ep is
    # given without dp, dp = ep stands in (the experts' ranks come out of dp x cp), and where
    # etp is given without tp, tp = etp
    # (and a chunked schedule without pp, pp = 2: the search tries only pipelines then)
    chunked = fields.get("virtual_stages", 1) != 1 or fields.get("schedule") in FIXED_VIRTUAL
    pp = fields.get("pp", 2 if chunked else 1)
    open_fields: dict[str, object] = {"microbatches": pp, "pp": pp}
    if "ep" in fields and "dp" not in fields:
        open_fields["dp"] = fields["ep"]
    if "etp" in fields and "tp" not in fields:  # etp is 1 or tp: a split names tp
        open_fields["tp"] = fields["etp"]
    if fields.get("dp_shard") and "dp" not in fields:  # a shard group needs its copies
        open_fields["dp"] = 2 * int(fields["dp_shard"])  # type: ignore[call-overload]
    if fields.get("dp_shard") and "zero" not in fields:  # ...and a ZeRO stage to shard
        open_fields["zero"] = 1
    stated = Layout(**{**open_fields, **fields})  # type: ignore[arg-type]
    return fields, stated, micro_batch


def stated_fields(args: argparse.Namespace,
                  cfg: ModelConfig) -> tuple[dict[str, object], Layout, int | None]:
    """--layout's fields, the layout they state and its micro-batch size (`layout_fields`),
    its expert split checked against the model and --tp."""
    fixed, stated, micro_batch = layout_fields(args.layout or "")
    check_flag_conflicts(args, fixed, stated)
    if "etp" in fixed:  # experts to split, and a tp to split them over
        check_model(stated, cfg)
        if stated.etp > 1 and args.tp and args.tp != stated.etp:
            raise ParaxisError(f"--tp {args.tp} contradicts etp={stated.etp} in --layout "
                               "(etp is 1 or tp); drop one")
    return fixed, stated, micro_batch


# The flags that narrow a search: those that fix a Layout field of their name (a degree,
# ZeRO's stage) or allow some of its values (recompute, schedule), and the limits.
FIXING_FLAGS = ("tp", "pp", "dp", "cp", "ep", "zero")
CHOOSING_FLAGS = ("recompute", "schedule")
LIMIT_FLAGS = ("max_tp", "max_pp", "no_pp", "no_sp", "tp_within_node")


def check_flag_conflicts(args: argparse.Namespace, fixed: dict[str, object],
                         stated: Layout) -> None:
    """A constraint flag that contradicts a field --layout fixes: one line naming both (the
    layout would win, and the flag be dropped unsaid)."""
    for flag in FIXING_FLAGS:
        value = getattr(args, flag, None)
        if flag in fixed and value is not None and value != getattr(stated, flag):
            raise ParaxisError(f"--{flag} {value} contradicts {flag}={getattr(stated, flag)} "
                               "in --layout; give one of them")
    for field in CHOOSING_FLAGS:
        values = getattr(args, field, None)
        if field in fixed and values and getattr(stated, field) not in values:
            said = f"{field}={getattr(stated, field)}"
            if field == "schedule" and stated.virtual_stages > 1:  # v implies interleaving
                said = f"virtual_stages={stated.virtual_stages} ({said})"
            raise ParaxisError(f"--{field} {' '.join(values)} contradicts {said} in "
                               "--layout; give one of them")
    if getattr(args, "no_sp", False) and fixed.get("sequence_parallel"):
        raise ParaxisError("--no-sp contradicts sequence_parallel=true in --layout; give one")
    for flag, field in (("max_tp", "tp"), ("max_pp", "pp")):
        limit = getattr(args, flag, None)
        if limit is not None and field in fixed and getattr(stated, field) > limit:
            raise ParaxisError(f"--{flag.replace('_', '-')} {limit} contradicts {field}="
                               f"{getattr(stated, field)} in --layout; give one of them")
    no_pp = getattr(args, "no_pp", False) or getattr(args, "max_pp", None) == 1 \
        or getattr(args, "pp", None) == 1
    if no_pp and stated.pp > 1:
        why = "pp" if "pp" in fixed else "a chunked schedule (it needs pp > 1)"
        raise ParaxisError(f"--no-pp / --max-pp 1 / --pp 1 contradicts {why} in --layout; "
                           "give one of them")


def check_complete_layout_flags(args: argparse.Namespace, fields: dict[str, object]
                                ) -> None:
    """A search flag beside a complete --layout (microbatches given): one line saying what to
    write in the layout instead (a flag the layout states the same is fine:
    `check_flag_conflicts` refuses one that differs)."""
    for flag in (*FIXING_FLAGS, *CHOOSING_FLAGS, *LIMIT_FLAGS):
        value = getattr(args, flag, None)
        if value in (None, False, []) or flag in fields:
            continue
        option = "--" + flag.replace("_", "-")
        if flag in LIMIT_FLAGS:
            raise ParaxisError(f"{option} narrows a search, and --layout is complete (it fixes "
                               "the microbatches): drop it, or leave them out to search")
        given = value[0] if isinstance(value, list) and len(value) == 1 else value
        if isinstance(given, list):
            raise ParaxisError(f"{option} {' '.join(map(str, given))} narrows a search, and "
                               "--layout is complete (it fixes the microbatches): put one "
                               f"{flag}=... in --layout")
        raise ParaxisError(f"{option} {given} is not part of the complete --layout (it fixes "
                           f"the microbatches): add {flag}={given} to --layout")


def complete_layout(fields: dict[str, object], stated: Layout, micro_batch: int | None,
                     global_batch: int) -> Layout | None:
    """The one layout the fields state (microbatches given, or a micro-batch size with dp),
    or None: a partial layout, whose open fields the search fills."""
    if micro_batch is not None and global_batch % micro_batch:
        raise ParaxisError(f"global batch {global_batch} does not split into microbatches of "
                           f"{micro_batch} sequences; give a micro_batch dividing it")
    if micro_batch is not None and "microbatches" in fields and "dp" not in fields:
        raise ParaxisError(f"micro_batch={micro_batch} and microbatches="
                           f"{stated.microbatches} without dp: give microbatches with dp, or "
                           "micro_batch alone (the search fills the rest)")
    if micro_batch is not None and "dp" in fields:
        per_replica, rest = divmod(global_batch, stated.dp * micro_batch)
        if rest or not per_replica:
            raise ParaxisError(f"global batch {global_batch} does not split into microbatches "
                               f"of {micro_batch} over dp={stated.dp}; choose a micro-batch "
                               f"size dividing {global_batch // stated.dp}")
        if "microbatches" in fields and stated.microbatches != per_replica:
            raise ParaxisError(f"dp={stated.dp} x microbatches={stated.microbatches} x "
                               f"micro_batch={micro_batch} is not the global batch "
                               f"{global_batch}; give microbatches or micro_batch, not both")
        return stated.replace(microbatches=per_replica)
    return stated if "microbatches" in fields else None


def search_constraints(args: argparse.Namespace, fixed: dict[str, object], stated: Layout,
                       micro_batch: int | None, cfg: ModelConfig) -> Constraints:
    """The search's limits: the fields a partial --layout fixes (`stated_fields`), else the
    constraint flags (--tp, --zero, --recompute, --no-pp, ...); `plan --verify` ranks the same."""
    pp = stated.pp if "pp" in fixed else args.pp  # a depth is checked against a given pp
    if "virtual_stages" in fixed and pp:
        check_interleaving(stated.replace(pp=pp, microbatches=pp), cfg)
    return Constraints(
        max_tp=args.max_tp, max_pp=1 if args.no_pp else args.max_pp,
        tp=stated.tp if "tp" in fixed or stated.etp > 1 else args.tp,
        pp=stated.pp if "pp" in fixed else args.pp,
        dp=stated.dp if "dp" in fixed else args.dp,
        cp=stated.cp if "cp" in fixed else args.cp,
        ep=stated.ep if "ep" in fixed else args.ep,
        split_experts=(stated.etp > 1,) if "etp" in fixed else None,
        cp_attention=((stated.cp_attention,) if "cp_attention" in fixed
                      else CP_VARIANTS),
        cp_a2a=stated.cp_a2a if "cp_a2a" in fixed else None,
        zero=stated.zero if "zero" in fixed else args.zero,
        dp_shard=stated.dp_shard if "dp_shard" in fixed else None,
        recompute=((stated.recompute,) if "recompute" in fixed
                   else tuple(args.recompute or RECOMPUTE)),
        recompute_layers=(stated.recompute_layers if "recompute_layers" in fixed
                          else None),
        recompute_method=stated.recompute_method,
        schedules=((stated.schedule,) if "schedule" in fixed
                   else tuple(args.schedule or ("1f1b", "interleaved"))),
        virtual_stages=((stated.virtual_stages,) if "virtual_stages" in fixed
                        else None),
        sequence_parallel=((stated.sequence_parallel,) if "sequence_parallel" in fixed
                           else (False,) if args.no_sp else (True,)),
        tp_within_node=args.tp_within_node, micro_batch=micro_batch,
        fused_loss=getattr(args, "fused_loss", False))
