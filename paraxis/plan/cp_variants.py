"""The K/V exchange of context parallelism, compared per shape after the search.

The three variants (`context_parallel.balance.VARIANTS`) hold the same model states and the
same activations (the all-to-all's repeated K/V copies aside, `context.repeated_kv_bytes`),
run the same FLOPs and differ in how long the exchange takes and how much of it hides
(`context.cp_layer_times`) and in the attention kernel's rate (`context.kernel_pieces`).
So the search prices its whole grid with the first variant asked for, and then each
(dp, tp, pp, cp, ep, etp) shape's fastest fitting layout again with each other variant: one
evaluation per shape and variant instead of a second and third grid, which would more than
double a search's time. What this can miss: a variant whose best
microbatch size or recomputation differs from the first variant's, which only a different
exchange time can cause; `paraxis plan --layout cp_attention=NAME` searches that variant's
whole grid. Two-level cp (`cp_a2a`: an all-to-all inside groups of cp_a2a ranks, the ring
or the all-gather across them) is tried the same way, for every cp_a2a dividing cp.
"""

from __future__ import annotations

from collections.abc import Callable

from paraxis.plan.cost import Estimate
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig


def other_variants(ranked: list[Estimate], variants: tuple[str, ...], a2a: int | None,
                   cfg: ModelConfig, world: int,
                   price: Callable[[Layout], Estimate],
                   wanted: Callable[[Estimate], bool] = lambda estimate: True
                   ) -> list[Estimate]:
    """The estimates, fitting or not, of each cp > 1 shape's fastest layout in `ranked`
    with every variant of `variants` (those the heads allow; `price` evaluates one
    layout), and for the ring and the all-gather in two levels too: each `cp_a2a` that
    divides cp (`a2a`: only that one); of the shapes whose fastest is `wanted` only."""
    fastest: dict[tuple[int, ...], Estimate] = {}
    for estimate in ranked:
        layout = estimate.layout
        shape = (layout.dp, layout.tp, layout.pp, layout.cp, layout.ep, layout.etp)
        if layout.cp > 1 and (shape not in fastest
                              or estimate.step_time_s < fastest[shape].step_time_s):
            fastest[shape] = estimate
    found = []
    for estimate in filter(wanted, fastest.values()):
        cp = estimate.layout.cp
        splits = [a for a in range(1, cp) if cp % a == 0] if a2a is None else [a2a]
        for variant in variants:
            for split in splits if variant != "all_to_all" else [1]:
                layout = estimate.layout.replace(cp_attention=variant, cp_a2a=split)
                if layout == estimate.layout:
                    continue  # the search priced it
                try:
                    layout.validate(world, cfg)
                except ParaxisError:  # the heads do not split over cp: it cannot run
                    continue
                found.append(price(layout))
    return found
