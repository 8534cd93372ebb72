"""The lab's two widgets beyond the course, context parallelism and mixtures of experts, in a
real browser (as tests/test_lab.py drives the others): every figure read back from the page
and compared with a fresh call into the library, and the embedded figures checked against
ground truths they could get wrong (the causal triangle, the ring's K/V, the runtime's drops).
"""


import pytest
import torch

from paraxis.model.routing import counts_by_rank, route_batch
from paraxis.model.transformer import build_model
from paraxis.parallel.experts.layer import moe_layers
from paraxis.plan.comm import Link
from paraxis.plan.context import cp_layer_times, wire_bytes_per_rank
from paraxis.show.lab import context_facts as C
from paraxis.show.lab import expert_facts as X
from paraxis.show.lab.page import lab_data, write_lab
from paraxis.show.viz.context import blocks_text, contiguous_pairs
from paraxis.spec.cp_balance import (
    VARIANTS,
    pairs_per_rank,
    rank_chunks,
    ring_blocks,
    ring_source,
    saved_bytes_per_rank,
)
from paraxis.spec.expert_placement import all_to_all_bytes, send_matrix, uniform_send_matrix
from paraxis.spec.model_config import PRESETS
from tests.test_lab import click, open_lab, slide, text


@pytest.fixture(scope="module")
def data():
    return lab_data()


@pytest.fixture(scope="module")
def browser(tmp_path_factory, data):
    """The page in its own headless session (tests/test_lab.py has its own)."""
    driver = open_lab(write_lab(tmp_path_factory.mktemp("lab"), data))
    yield driver
    driver.quit()


def attributes(driver, selector: str, *names: str) -> list[list[str]]:
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map("
        "(e) => arguments[1].map((n) => e.getAttribute(n)))", selector, list(names))


def bytes_text(b: float) -> str:
    """The page's bytesText, for comparing a shown figure with the library's."""
    scale, unit = (1e9, "GB") if b >= 1e9 else (1e6, "MB") if b >= 1e6 else (1e3, "kB")
    return f"{float(f'{b / scale:.3g}'):g} {unit}"


# ----------------------------------------------------------------- context parallelism


@pytest.mark.parametrize("cp", C.CP_DEGREES)
def test_context_cells_cover_the_causal_triangle_once_where_the_data_are(data, cp):
    """Every (query chunk, key chunk) with key <= query exactly once; computed by the rank
    holding the query chunk; under the ring, at the step when it holds the key chunk."""
    setting = data["context"]["settings"][str(cp)]
    holder = {c: rank for rank in range(cp) for c in rank_chunks(rank, cp)}
    triangle = {(q, k) for q in range(2 * cp) for k in range(q + 1)}
    for variant in VARIANTS:
        cells = setting["cells"][variant]
        assert sorted((q, k) for q, k, *_ in cells) == sorted(triangle), variant
        for q, k, rank, step, half in cells:
            assert half == (q == k)
            if variant == "all_to_all":
                assert rank is None and step is None
                continue
            assert rank == holder[q]
            if variant == "ring":
                assert k in rank_chunks(ring_source(rank, step, cp), cp)
            else:
                assert step is None


def test_context_widget_draws_and_steps_the_ring(browser, data):
    widget = "window.lab.widgets.context"
    for cp in C.CP_DEGREES:
        slide(browser, "cp-degree", C.CP_DEGREES, cp)
        holder = {c: rank for rank in range(cp) for c in rank_chunks(rank, cp)}
        chunks = attributes(browser, "#cp-sequence rect", "id", "data-rank")
        assert {int(i.split("-")[-1]): int(r) for i, r in chunks} == holder
        for variant in VARIANTS:
            slide(browser, "cp-variant", list(VARIANTS), variant)
            cells = attributes(browser, "#cp-matrix [id^=cp-cell]", "id", "data-rank",
                               "data-shown")
            assert len(cells) == cp * (2 * cp + 1)
            assert all(shown == "true" for *_, shown in cells)  # the whole picture first
            for cell_id, rank, _ in cells:
                q = int(cell_id.split("-")[2])
                assert rank == ("all" if variant == "all_to_all" else str(holder[q]))
        slide(browser, "cp-variant", list(VARIANTS), "ring")
        click(browser, "cp-reset")
        assert "holds q, k and v of its two chunks" in text(browser, "cp-phase")
        embedded = {(q, k): step for q, k, _, step, _ in
                    data["context"]["settings"][str(cp)]["cells"]["ring"]}
        for step in range(cp):
            click(browser, "cp-step")
            shown = {tuple(map(int, i.split("-")[2:])) for i, _, s in attributes(
                browser, "#cp-matrix [id^=cp-cell]", "id", "data-rank", "data-shown")
                if s == "true"}
            assert shown == {cell for cell, s in embedded.items() if s <= step}
            lines = text(browser, "cp-ranks").split("\n")
            for rank, line in enumerate(lines):
                source = ring_source(rank, step, cp)
                blocks = blocks_text(ring_blocks(rank, step, cp), rank_chunks(rank, cp),
                                     rank_chunks(source, cp)).replace("\n", ", ")
                assert line == (f"rank {rank}: K/V of rank {source} (chunks "
                                f"{','.join(map(str, rank_chunks(source, cp)))}) → {blocks}")
        assert browser.execute_script(f"return {widget}.animation.index()") == cp


def pairs_text(n: int) -> str:
    """The page's pairsText."""
    return f"{float(f'{n / 1e9:.3g}'):g} bn" if n >= 1e9 else f"{float(f'{n / 1e6:.3g}'):g} M"


def test_context_widget_figures(browser):
    link = Link(bandwidth_Bps=1e9, latency_s=0.0, crosses_nodes=False)
    for cp, seq, variant in ((4, 131072, "ring"), (8, 8192, "all_to_all"),
                             (2, 32768, "all_gather")):
        slide(browser, "cp-degree", C.CP_DEGREES, cp)
        slide(browser, "cp-seq", C.SEQ_LENS, seq)
        slide(browser, "cp-variant", list(VARIANTS), variant)
        pairs = pairs_per_rank(seq, cp)
        assert pairs == [seq * (seq + 1) // 2 // cp] * cp  # the zig-zag's point
        assert text(browser, "cp-balanced") == f"{pairs_text(pairs[0])} on every rank"
        contiguous = contiguous_pairs(seq, cp)
        assert text(browser, "cp-lopsided") == f"{max(contiguous) / (sum(contiguous) / cp):.2f}x"
        shape = C.SHAPE
        args = (shape["batch"], shape["heads"], shape["kv_heads"], seq, shape["head_dim"], cp,
                shape["bytes"])
        for v in VARIANTS:
            row = browser.execute_script(
                "return [...document.querySelectorAll('#cp-row-' + arguments[0] + ' td')]"
                ".map((td) => td.textContent)", v)
            wire = wire_bytes_per_rank(v, *args)
            saved = saved_bytes_per_rank(*args, v)
            assert row[1:] == [bytes_text(wire[0]), bytes_text(wire[1]), bytes_text(saved)]
            # the bytes the planner prices: its whole exchange's seconds on a link of 1 GB/s
            # with no latency
            priced = cp_layer_times(PRESETS[C.MODEL], v, cp, 1, seq, 1, shape["bytes"], link,
                                    0.0, 0.0, 0.0)["total"]
            assert priced * 1e9 == pytest.approx(sum(wire), rel=1e-6), v
        assert browser.execute_script("return document.getElementById('cp-row-' + "
                                      "arguments[0]).className", variant) == "chosen"
    click(browser, "cp-check")
    answer = text(browser, "cp-answer")
    assert answer.startswith("Rank 0 holds chunks 0 and 7 of 8")
    assert "rank 2's K/V (chunks 2,5) and computes q7×k2,5" in answer


# ------------------------------------------------------------------ mixture of experts


def kept_by_the_runtime(chosen: torch.Tensor, ep: int, capacity_factor: float) -> list[list[int]]:
    """Per EP rank and expert, the assignments the runtime's capacity rule keeps
    (`MoE._within_capacity` on each rank's tokens; all of them when dropless)."""
    cfg = PRESETS[X.MODEL].replace(capacity_factor=capacity_factor)
    layer = moe_layers(build_model(cfg))[0]
    kept = []
    for part in chosen.chunk(ep):
        keep = layer._within_capacity(part)
        kept.append(torch.bincount(part.flatten() if keep is None else part[keep],
                                   minlength=cfg.n_experts).tolist())
    return kept


def test_expert_drops_are_the_runtime_s(data):
    _, routes = route_batch(X.MODEL, X.BATCH, X.SEQ_LEN)
    for cf in X.CAPACITY_FACTORS:
        for block, ep in ((0, 4), (3, 2)):
            embedded = data["experts"]["settings"][f"{block}/{ep}/{cf:g}"]
            assert embedded["kept"] == kept_by_the_runtime(torch.tensor(routes[block][0]), ep,
                                                           cf), (cf, block, ep)
    assert any(data["experts"]["settings"][f"0/4/{cf:g}"]["kept"] !=
               data["experts"]["settings"]["0/4/0"]["kept"] for cf in X.CAPACITY_FACTORS[1:])


def test_expert_widget_figures(browser):
    cfg, routes = route_batch(X.MODEL, X.BATCH, X.SEQ_LEN)
    for block, ep, cf in ((0, 4, 0.0), (2, 2, 1.0), (1, 8, 1.25), (3, 1, 2.0)):
        slide(browser, "moe-block", sorted(routes), block)
        slide(browser, "moe-ep", X.EP_DEGREES, ep)
        slide(browser, "moe-cf", X.CAPACITY_FACTORS, cf)
        chosen = routes[block][0]
        routed = counts_by_rank(chosen, cfg.n_experts, ep)
        kept = kept_by_the_runtime(torch.tensor(chosen), ep, cf)
        sends = send_matrix(kept, ep)
        shown = [[int(text(browser, f"moe-send-{i}-{j}")) for j in range(ep)]
                 for i in range(ep)]
        assert shown == sends
        totals = [sum(column) for column in zip(*routed, strict=True)]
        busiest = totals.index(max(totals))
        load = max(totals) / (sum(totals) / cfg.n_experts)
        assert text(browser, "moe-expert-load") == f"{load:.2f}x (expert {busiest})"
        work = [sum(column) for column in zip(*sends, strict=True)]  # kept, by holding rank
        assert text(browser, "moe-rank-load") == (
            f"{max(work) / (sum(work) / ep):.2f}x (rank {work.index(max(work))})")
        dropped = sum(map(sum, routed)) - sum(map(sum, kept))
        assert text(browser, "moe-dropped").startswith(f"{dropped} of {sum(totals)} ")
        assert (dropped > 0) == (cf in (1.0, 1.25))  # this router overfills some expert
        sent = all_to_all_bytes(sends, cfg.d_model, X.BYTES_PER_VALUE)
        assert text(browser, "moe-bytes").startswith(" · ".join(map(bytes_text, sent)))
        tokens = X.BATCH * X.SEQ_LEN // ep
        uniform = uniform_send_matrix(tokens, cfg.top_k, cfg.n_experts, ep, cf)
        assert text(browser, "moe-uniform") == (
            bytes_text(all_to_all_bytes(uniform, cfg.d_model, X.BYTES_PER_VALUE)[0]) + " each")
        bars = attributes(browser, "#moe-bars [id^=moe-drop-]", "id")
        assert len(bars) == sum(1 for e in range(cfg.n_experts)
                                if sum(r[e] for r in routed) > sum(k[e] for k in kept))
    click(browser, "moe-check")
    answer = text(browser, "moe-answer")
    assert "(ep − 1)/ep = 75.0% leave at ep = 4" in answer
    sends = send_matrix(counts_by_rank(routes[0][0], cfg.n_experts, 4), 4)
    leave = 1 - sum(sends[i][i] for i in range(4)) / sum(map(sum, sends))
    assert f"this router sends {100 * leave:.1f}%" in answer


def test_no_errors_in_the_console(browser):
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
