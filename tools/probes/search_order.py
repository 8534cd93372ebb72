"""How the order a search takes its shapes in moves its work (`Floors.best_first`).

    python -m tools.probes.search_order [--runs 3]

For Mixtral 8x22B at 128K tokens on 1024 A100s (the slowest search `bench_plan` times) and
Mixtral 8x7B at 32K: where the fastest shape sits in each of the two orders (the coarse
floor's, and the floor of each group's lightest recomputation that fits), and, searching
with the first order alone, the second alone and the two in turn, the layouts priced and
the search's time in this process (the least of `--runs`, caches warm). The answer is the
same in every order; the probe checks it.
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

from paraxis.plan.floor import Floors
from paraxis.plan.hardware import build_cluster
from paraxis.plan.prune import ep_group
from paraxis.plan.search import search
from paraxis.spec.model_config import PRESETS

CASES = [("mixtral-8x22b", 2048, 131072), ("mixtral-8x7b", 1024, 32768)]
TAKEN = Floors.best_first


def _one_order(second: bool, taken: list | None = None):  # noqa: ANN202
    """`Floors.best_first` taking one of its two orders alone (the shapes it returns also
    into `taken`)."""
    def best_first(self, shapes, micro_batch, settings, group, lightest=None):  # noqa: ANN001, ANN202
        members, orders = self.group_orders(shapes, micro_batch, settings, group, lightest)
        order = [shape for key in orders[-1 if second else 0] for shape in members[key]]
        if taken is not None:
            taken.extend(order)
        return order
    return best_first


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="searches timed per order")
    args = parser.parse_args(argv)
    cluster = build_cluster("a100-80gb", 1024)
    for model, batch, seq in CASES:
        cfg = PRESETS[model]
        orders: dict[str, list] = {}
        results = {}
        for name, patch in (("coarse floor alone", _one_order(False)),
                            ("lightest fit alone", _one_order(True)), ("in turn", TAKEN)):
            with mock.patch.object(Floors, "best_first", patch):
                seconds = []
                for _ in range(args.runs):
                    start = time.perf_counter()
                    results[name] = search(cfg, cluster, seq, batch)
                    seconds.append(time.perf_counter() - start)
            orders[name] = seconds
        answers = {str(r.ranked[0].layout) for r in results.values()}
        assert len(answers) == 1, answers
        fastest = ep_group(results["in turn"].ranked[0].layout)
        print(f"{model} at {seq} tokens, 1024 A100s: the fastest shape {answers.pop()}")
        for name, second in (("coarse floor", False), ("lightest fit", True)):
            taken: list = []
            with mock.patch.object(Floors, "best_first", _one_order(second, taken)):
                search(cfg, cluster, seq, batch)
            groups = list(dict.fromkeys(ep_group(s) for s in taken))
            print(f"  by the {name}: its group {groups.index(fastest) + 1} of {len(groups)}")
        for name, seconds in orders.items():
            print(f"  {name}: {results[name].considered} layouts priced, "
                  f"{min(seconds):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
