"""The three context-parallel attention variants timed against each other, gloo on CPU.

    PYTHONPATH=. python -m tools.probes.cp_variants          # the table in docs/context.md
    PYTHONPATH=. python -m tools.probes.cp_variants --quick  # smoke (tests/test_bench_smoke.py)

Same work in every row: causal attention, forward and backward, of one fixed random q, k, v
(and output gradient), 8 query heads of head_dim 64, split by the zig-zag balance; each
variant's outputs and q, k, v gradients are first checked against unsharded
`F.scaled_dot_product_attention` (bench/bench_cp.py's check, whose inputs these are). A row
times "all_to_all" or "all_gather" against the "ring" in the same processes, their steps
alternating (`bench.common.compare`); "speed" is the ring's time over the variant's (above
1: the variant is faster), with its 95% bootstrap interval.
No planner figure is beside them: on CPU the ranks share two cores, and what the planner's
GPU model weighs (links that run while the kernels compute) is not what this machine has.
"""

from __future__ import annotations

from bench.bench_cp import TOLERANCE, _setup, check
from bench.common import Row, compare, quick_flag
from paraxis.spec.cp_balance import VARIANTS

HEADS = 8


def rows(quick: bool = False) -> list[Row]:
    layouts = ((2, 2),) if quick else ((2, 8), (2, 2), (4, 8), (4, 2))  # (cp, kv_heads)
    seq, steps, repeats = (256, 2, 1) if quick else (4096, 6, 3)
    out = []
    for cp, kv_heads in layouts:
        worst = max(check(cp, seq, HEADS, kv_heads,
                          tuple(f"paraxis {v}" for v in VARIANTS)).values())
        if not worst <= TOLERANCE:
            raise AssertionError(f"cp={cp}, kv_heads {kv_heads}: {worst:.1e} from unsharded")
        for variant in ("all_to_all", "all_gather"):
            work = (f"causal attention fwd+bwd cp={cp} ({HEADS} heads, {kv_heads} kv, head_dim "
                    f"64, seq {seq}; within {worst:.0e} of unsharded)")
            out.append(compare(work, cp, seq,
                               (variant, lambda v=variant, h=kv_heads: _setup(
                                   f"paraxis {v}", seq, HEADS, h)),
                               ("ring", lambda h=kv_heads: _setup("paraxis ring", seq, HEADS, h)),
                               steps=steps, repeats=repeats, device="cpu"))
    return out


def main() -> None:
    quick = quick_flag(__doc__, "one small layout (a smoke run)")
    print("| work | variant | variant ms | ring ms | speed vs ring (95% interval) |")
    print("|---|---|---|---|---|")
    for row in rows(quick):
        low, high = row.ratio_interval
        print(f"| {row.name} | {row.paraxis} | {1e3 * row.paraxis_step_time_s:.1f} | "
              f"{1e3 * row.peer_step_time_s:.1f} | {row.ratio:.2f} ({low:.2f}-{high:.2f}) |")


if __name__ == "__main__":
    main()
