"""Pictures of context parallelism: they draw the runtime's split and kernel calls, and the
rank grid shows the cp coordinate `Layout.coords` gives."""

import re

import pytest
import torch
from matplotlib.collections import PatchCollection
from test_viz import assert_readable

from paraxis.cli import main
from paraxis.parallel.context.all_to_all import by_head_group
from paraxis.show.viz.context import block_cells, cell_pairs, contiguous_pairs, plot_chunks
from paraxis.show.viz.context_ring import (
    plot_kv_all_to_all,
    plot_kv_exchange,
    plot_kv_gather,
    plot_kv_ring,
)
from paraxis.show.viz.grid import plot_rank_grid, rank_roles
from paraxis.spec.cp_balance import VARIANTS, pairs_per_rank, rank_chunks, ring_source
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout


@pytest.mark.parametrize("variant", VARIANTS)
def test_block_matrix_is_the_causal_triangle_and_adds_up_to_the_balance(variant):
    for cp in range(1, 9):
        cells = block_cells(cp, variant)
        holder = {c: r for r in range(cp) for c in rank_chunks(r, cp)}
        # Exactly the blocks on or under the diagonal, each computed by its query's holder,
        # the diagonal ones causal inside: counted independently of the kernel calls.
        assert set(cells) == {(q, k) for q in range(2 * cp) for k in range(q + 1)}
        for (q, k), cell in cells.items():
            assert cell.half == (q == k)
            if variant == "all_to_all":  # every rank, for its heads
                assert cell.rank is None and cell.step is None
                continue
            assert cell.rank == holder[q]
            if variant == "ring":  # computed when the key's holder's K/V reach the rank
                assert ring_source(cell.rank, cell.step, cp) == holder[k]
            else:
                assert cell.step is None
        seq_len = 6 * 2 * cp
        assert cell_pairs(cells, seq_len, cp) == pairs_per_rank(seq_len, cp)
    # The contiguous split the picture compares with: the same triangle, lopsided.
    # seq 16, cp 2: rank 0 a causal 8-token square (36), rank 1 its own (36) + 8 x 8 before
    assert contiguous_pairs(16, 2) == [36, 36 + 64] and pairs_per_rank(16, 2) == [68, 68]
    assert sum(contiguous_pairs(64, 4)) == 64 * 65 // 2


def test_every_picture_builds_for_cp_1_to_8():
    for cp in range(1, 9):
        variant = VARIANTS[cp % 3]
        fig = plot_chunks(64 * cp, cp, variant)
        assert_readable(fig)
        # The matrix draws one shape per computed block, triangles on the diagonal.
        (blocks,) = [c for ax in fig.axes for c in ax.collections
                     if isinstance(c, PatchCollection)]
        assert len(blocks.get_paths()) == cp * (2 * cp + 1)
        for fig in (plot_kv_ring(cp), plot_kv_gather(cp), plot_kv_all_to_all(cp)):
            assert fig._suptitle is not None and f"cp = {cp}" in fig._suptitle.get_text()


def test_ring_picture_shows_whose_kv_each_rank_holds():
    # The arrows go to the next rank (where `ring._Pass` sends): what a rank holds at step t
    # is what the next one holds at t+1, and the dK/dV sent at the last step reach the owner.
    for cp in range(1, 9):
        for rank in range(cp):
            assert all(ring_source((rank + 1) % cp, step + 1, cp) == ring_source(rank, step, cp)
                       for step in range(cp - 1))
            assert ring_source(rank, cp - 1, cp) == (rank + 1) % cp
    fig = plot_kv_ring(4)
    for step, ax in enumerate(fig.axes[:4]):
        held = [t.get_text() for t in ax.texts if t.get_text().startswith("KV")]
        assert held == [f"KV{ring_source(r, step, 4)}" for r in range(4)]
        arrows = len(ax.patches) - 4  # four nodes, then K/V (solid) and dK/dV (dashed)
        assert arrows == 4 * ((step < 3) + (step > 0))


def test_rank_grid_labels_carry_the_cp_coordinate_of_layout_coords():
    layout = Layout(dp=2, cp=2, tp=2, pp=2)
    roles = rank_roles(layout, gpus_per_node=8)
    assert [(r["dp"], r["cp"], r["tp"], r["pp"]) for r in roles] == \
        [(c.dp_rank, c.cp_rank, c.tp_rank, c.pp_rank) for c in map(layout.coords, range(16))]
    fig = plot_rank_grid(layout, 8)
    assert_readable(fig)
    assert fig._suptitle.get_text().startswith("4D rank grid")
    seen = {}
    for ax in fig.axes:
        texts = {(round(t.get_position()[0], 2), int(t.get_position()[1])): t.get_text()
                 for t in ax.texts if t.get_text().startswith("rank ")}
        for t in ax.texts:
            match = re.fullmatch(r"dp(\d) cp(\d) tp(\d) pp(\d) · node \d", t.get_text())
            if match:
                x, y = t.get_position()
                rank = int(texts[(round(x, 2), int(y))].split()[1])
                seen[rank] = tuple(map(int, match.groups()))
    assert seen == {r: (c.dp_rank, c.cp_rank, c.tp_rank, c.pp_rank)
                    for r, c in enumerate(map(layout.coords, range(16)))}
    fig = plot_rank_grid(Layout(dp=2, tp=2), 8)  # cp = 1: the 3D grid, no cp in labels
    assert fig._suptitle.get_text().startswith("3D rank grid")
    assert not any(" cp" in t.get_text() for ax in fig.axes for t in ax.texts)


def test_report_with_cp_draws_the_context_pictures(monkeypatch):
    from paraxis.plan.inputs import PlanInputs
    from paraxis.show.report import pictures as report_pictures
    from paraxis.show.report.plan import make_plan
    from paraxis.train.run_hardware import choose_hardware

    def sections(layout):
        inputs = PlanInputs(model="tiny", gpus=4, layout=layout, seq_len=128, global_batch=8,
                            precision="mixed")
        plan = make_plan(choose_hardware(inputs, None, 4, "tiny"))
        return {anchor: body for anchor, _, body in
                report_pictures.pictures(plan, ("pipeline", "", ""))}

    with_cp = sections("dp=1,cp=2,tp=2,cp_attention=all_gather")
    assert list(with_cp) == ["grid", "tp", "context", "pipeline", "memory", "ring"]
    assert with_cp["context"].count("<img") == 2
    assert "--attention all_gather" in with_cp["context"]
    assert "(dp, cp, tp, pp)" in with_cp["grid"]
    # cp = 1: the report's sections as before (pictures not drawn: their order is the test)
    for name in ("_grid", "_tp", "_memory", "_ring", "_context"):
        monkeypatch.setattr(report_pictures, name, lambda plan, name=name: (name, "", ""))
    assert list(sections("dp=2,tp=2")) == ["_grid", "_tp", "pipeline", "_memory", "_ring"]


def test_context_command_prints_the_split_and_writes_pictures(tmp_path, capsys):
    assert main(["context", "--layout", "dp=2,cp=2", "--seq-len", "16",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "r0    0, 3      0-3, 12-15" in out
    assert f"{pairs_per_rank(16, 2)[0]:,}" in out
    assert "step 1: r0 KV1 q3×k1,2 | r1 KV0 q1,2×k0" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        ["context-chunks-ring.png", "context-grid.png", "context-ring.png"]


def test_two_level_cp_is_described_and_drawn_as_it_runs(tmp_path, capsys):
    """cp_a2a=2 of cp=4: the all-to-all inside r0,r1 and r2,r3, then the ring over the 2
    groups on chunks twice as long (it once printed a one-level ring over all 4)."""
    assert main(["context", "--layout", "cp=4,cp_a2a=2", "--seq-len", "64",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "two levels, cp_a2a=2: cp = 2 x 2" in out and "(r0,r1; r2,r3)" in out
    assert "coarse chunks g and 3-g of 4 chunks of 16 tokens" in out
    assert "every group (r0,r2; r1,r3) run the ring over 2" in out
    assert "    step 1: r0 KV1 q3×k1,2 | r1 KV0 q1,2×k0" in out
    assert "step 3:" not in out  # no ring over 4
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "context-chunks-ring-across.png", "context-grid.png", "context-ring-across.png"]


def test_all_gather_text_keeps_the_causal_call_apart(capsys):
    """The own chunks' call is causal: merged with the full calls on the same rows it read
    q2,3×k0-3, as if q2 saw k3."""
    assert main(["context", "--cp", "3", "--seq-len", "60", "--attention", "all_gather"]) == 0
    out = capsys.readouterr().out
    assert "  r2: q2,3×k2,3 + q2,3×k0,1" in out
    assert "  r1: q1,4×k1,4 + q1,4×k0 + q4×k2,3" in out


@pytest.mark.parametrize("argv, message", [
    (["--cp", "3", "--seq-len", "100"], "not divisible by 6"),
    (["--cp", "0"], "must be within 1..64"),
    (["--cp", "4", "--layout", "cp=2"], "disagrees with the layout"),
])
def test_context_command_bad_input_is_one_line(argv, message, capsys):
    assert main(["context", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_pictures_refuse_bad_input_in_one_line():
    with pytest.raises(ParaxisError, match="not divisible by 8"):
        plot_chunks(100, 4)
    with pytest.raises(ParaxisError, match="unknown context-parallel attention"):
        plot_kv_exchange(2, "p2p")
    with pytest.raises(ParaxisError, match="at most cp = 16"):
        plot_kv_ring(17)


def test_grid_labels_name_each_ranks_expert_parallel_place():
    from paraxis.show.viz.grid import cell_label

    layout = Layout(dp=4, ep=2, tp=2)
    for group in layout.groups("ep"):
        for place, rank in enumerate(group):
            assert f" ep{place} " in cell_label(layout, rank, 8)
    assert " ep" not in cell_label(Layout(dp=4, tp=2), 0, 8)


def test_all_to_all_picture_shows_rows_before_and_columns_during():
    """Before the exchange rank r holds its chunks of every head group (row r), during
    attention rank j holds head group j of every chunk (column j): the runtime's split
    (`all_to_all.by_head_group` sends head group j to rank j)."""
    cp = 4
    fig = plot_kv_all_to_all(cp)
    before, during = fig.axes[:2]
    labels = [[t.get_text() for t in ax.texts] for ax in (before, during)]
    assert labels[0] == [f"r{row}" for row in range(cp) for _ in range(cp)]
    # the rank the runtime sends each head group to ([j] of its split goes to rank j), with
    # two heads a group, so a split other than contiguous groups would show here
    sent = by_head_group(torch.arange(2 * cp).view(1, 2 * cp, 1, 1), cp)
    holder = {int(head) // 2: rank for rank in range(cp) for head in sent[rank].flatten()}
    assert len(holder) == cp
    assert labels[1] == [f"r{holder[col]}" for _ in range(cp) for col in range(cp)]
    assert "sends 3 of its 4 pieces" in fig._suptitle.get_text()
