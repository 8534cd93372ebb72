"""Layout: every validation rule (good and bad cases) and the rank <-> coordinate grid."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import (
    AXES,
    Coords,
    Layout,
    expert_groups,
    grid_groups,
    grid_index,
    grid_rank,
)
from paraxis.spec.model_config import PRESETS


def test_rank_order_tp_fastest_then_dp_then_pp():
    layout = Layout(dp=2, tp=2, pp=2)
    assert [(c.dp_rank, c.tp_rank, c.pp_rank) for c in map(layout.coords, range(8))] == [
        (0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0),
        (0, 0, 1), (0, 1, 1), (1, 0, 1), (1, 1, 1)]
    assert layout.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.groups("dp_tp") == [[0, 1, 2, 3], [4, 5, 6, 7]]


degrees = st.sampled_from([1, 2, 3, 4])


@given(degrees, degrees, degrees)
def test_grid_is_a_bijection_and_groups_partition_the_world(dp, tp, pp):
    layout = Layout(dp=dp, tp=tp, pp=pp)
    world = dp * tp * pp
    coords = [layout.coords(r) for r in range(world)]
    assert len(set(coords)) == world
    assert all(layout.rank(**c._asdict()) == r for r, c in enumerate(coords))
    for axis, size in (("dp", dp), ("tp", tp), ("pp", pp), ("dp_tp", dp * tp)):
        groups = layout.groups(axis)
        assert sorted(r for g in groups for r in g) == list(range(world))
        assert all(len(g) == size for g in groups)
    for group in layout.groups("tp"):  # TP groups are neighbouring ranks (one node)
        assert group == list(range(group[0], group[0] + tp))
    for rank in range(world):  # members of a group differ only along its axis
        c = layout.coords(rank)
        assert all(layout.coords(r).dp_rank == c.dp_rank and layout.coords(r).pp_rank ==
                   c.pp_rank for r in layout.group_of(rank, "tp"))


def test_axes_are_one_ordered_list_outermost_first():
    assert AXES == ("pp", "dp", "cp", "tp")
    assert Coords._fields == tuple(f"{axis}_rank" for axis in AXES)
    # With cp > 1 the formula in the layout module's docstring holds: cp sits
    # between dp and tp, so a CP group is tp-strided ranks inside one dp replica.
    degrees = {"pp": 2, "dp": 2, "cp": 2, "tp": 2}
    for rank in range(16):
        i = grid_index(degrees, rank)
        assert rank == ((i["pp"] * 2 + i["dp"]) * 2 + i["cp"]) * 2 + i["tp"]
        assert grid_rank(degrees, i) == rank
    assert grid_groups(degrees, ("cp",))[:2] == [[0, 2], [1, 3]]
    assert grid_groups(degrees, ("tp",))[:2] == [[0, 1], [2, 3]]
    assert grid_groups(degrees, ("dp", "cp"))[:2] == [[0, 2, 4, 6], [1, 3, 5, 7]]


@given(degrees, degrees, degrees, degrees, st.sampled_from([1, 2, 4]))
def test_rank_0s_groups_are_the_first_of_every_group(pp: int, dp: int, cp: int, tp: int,
                                                      ep: int) -> None:
    """What the planner's links read (rank 0's group alone) is the first of the world's."""
    from paraxis.spec.grid import expert_dp_groups, first_expert_groups, first_group

    sizes = {"pp": pp, "dp": dp, "cp": cp, "tp": tp}
    for axes in (("dp",), ("cp",), ("dp", "cp"), ("pp",), ("tp",), ("dp", "tp")):
        assert first_group(sizes, axes) == grid_groups(sizes, axes)[0]
    if (dp * cp) % ep:
        with pytest.raises(ParaxisError, match="must divide dp"):
            first_expert_groups(sizes, ep)
    else:
        assert first_expert_groups(sizes, ep) == (expert_groups(sizes, ep)[0],
                                                  expert_dp_groups(sizes, ep)[0])


def test_expert_groups_are_carved_out_of_dp_x_cp():
    degrees = {"pp": 1, "dp": 4, "cp": 1, "tp": 2}
    assert expert_groups(degrees, 2) == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert expert_groups(degrees, 1) == [[r] for r in (0, 2, 4, 6, 1, 3, 5, 7)]
    assert Layout(dp=4, tp=2).groups("ep") == expert_groups(degrees, 1)
    with pytest.raises(ParaxisError, match="must divide dp"):
        expert_groups(degrees, 3)


def test_expert_parallelism_is_carved_out_of_dp_x_cp():
    assert Layout(dp=2, ep=2).world_size == 2  # ep never changes the world size
    assert str(Layout(dp=4, ep=2)) == "dp=4,tp=1,pp=1,ep=2,zero=0"
    with pytest.raises(ParaxisError, match="must divide dp\\*cp") as error:
        Layout(dp=1, ep=2)
    assert "\n" not in str(error.value)


def test_old_layout_dicts_load_and_every_field_has_help():
    old = {"dp": 2, "tp": 1, "pp": 2, "zero": 1, "microbatches": 4, "schedule": "1f1b",
           "virtual_stages": 1, "recompute": "none", "sequence_parallel": False}
    assert Layout(**old) == Layout(dp=2, pp=2, zero=1, microbatches=4)
    assert Layout(**old).to_dict() == {**old, "cp": 1, "ep": 1, "etp": 1, "cp_attention": "ring",
                                       "cp_a2a": 1, "zero3_reshard": "forward",
                                       "recompute_layers": 1, "recompute_method": "uniform",
                                       "dp_shard": 0}
    assert str(Layout(**old)) == "dp=2,tp=1,pp=2,zero=1,microbatches=4,schedule=1f1b"
    import dataclasses

    for f in dataclasses.fields(Layout):
        assert f.metadata["help"] and "\n" not in f.metadata["help"], f.name


def test_valid_layouts_pass():
    tiny = PRESETS["tiny-llama"]
    Layout(dp=2, tp=2, pp=2, zero=1, microbatches=4).validate(8, tiny, 16, 128)
    Layout(pp=2, schedule="interleaved", virtual_stages=2, microbatches=4).validate(2, tiny, 8)
    Layout(tp=2, sequence_parallel=True).validate(2, tiny, 4, 128)
    Layout(dp=4, zero=3).validate(4, tiny, 8)


BAD = [
    (dict(dp=0), {}, "positive integer"),
    (dict(zero=4), {}, "zero"),
    (dict(schedule="zigzag"), {}, "unknown schedule"),
    (dict(recompute="some"), {}, "unknown recompute"),
    (dict(pp=2, virtual_stages=2, microbatches=4), {}, "needs schedule=interleaved"),
    # one stage has nothing to split into chunks: a planner that took v here divided the
    # activations it holds by v
    (dict(schedule="interleaved", virtual_stages=2), {}, "needs pp > 1"),
    (dict(schedule="zb-v"), {}, "needs pp > 1"),
    (dict(pp=4, schedule="interleaved", virtual_stages=2, microbatches=6), {},
     "multiple of pp"),
    (dict(sequence_parallel=True), {}, "needs tp > 1"),
    (dict(pp=2, zero=3, zero3_reshard="never"), {}, "unknown zero3_reshard"),
    (dict(dp=2, tp=2), dict(world_size=8), "dp*tp*pp"),
    (dict(tp=8), dict(model="tiny"), "attention heads are not divisible"),
    (dict(tp=4), dict(model="tiny-llama"), "kv heads are not divisible"),
    (dict(pp=8), dict(model="tiny"), "cannot fill"),
    (dict(pp=2, schedule="interleaved", virtual_stages=4, microbatches=4), dict(model="tiny"),
     "cannot fill"),
    (dict(dp=2, microbatches=3), dict(global_batch=8), "not divisible by dp*microbatches"),
    (dict(tp=2, sequence_parallel=True), dict(seq_len=7), "seq_len"),
]


@pytest.mark.parametrize("fields,against,message", BAD)
def test_bad_layouts_name_the_rule(fields, against, message):
    against = dict(against)
    if "model" in against:
        against["model"] = PRESETS[against["model"]]
    with pytest.raises(ParaxisError, match=re.escape(message)) as error:
        Layout(**fields).validate(**against)
    assert "\n" not in str(error.value)


def test_parse_and_print_round_trip():
    layout = Layout.parse("dp=2, tp=2, pp=2, zero=1, microbatches=8, schedule=gpipe, sp=true")
    assert layout == Layout(dp=2, tp=2, pp=2, zero=1, microbatches=8, schedule="gpipe",
                            sequence_parallel=True)
    assert Layout.parse(str(layout)) == layout
    with pytest.raises(ParaxisError, match="cannot read layout item"):
        Layout.parse("dp2")
    with pytest.raises(ParaxisError, match="must be an integer"):
        Layout.parse("dp=two")
    # every reader of layout text (plan, report, convert, train): a key given twice is an
    # error, two names of one field too
    for text, key in (("dp=2,dp=4", "dp"), ("sp=true,sequence_parallel=false",
                                             "sequence_parallel")):
        with pytest.raises(ParaxisError, match=f"sets {key} more than once"):
            Layout.parse_fields(text)


def test_layout_module_imports_without_torch():
    import subprocess
    import sys

    code = ("import sys, paraxis.spec.layout, paraxis.spec.model_config; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_build_groups_names_every_axis_group():
    from paraxis.dist.groups import GROUP_AXES, build_groups

    groups = build_groups(Layout())  # a single process: every group is None
    assert {axis: groups.group(axis) for axis in GROUP_AXES} == dict.fromkeys(GROUP_AXES)
    assert (groups.dp_rank, groups.tp_rank, groups.pp_rank, groups.cp_rank, groups.ep_rank) \
        == (0, 0, 0, 0, 0)
    assert groups.pp_ranks == [0] and groups.is_first_stage and groups.is_last_stage


def _members(layout: Layout) -> dict:
    """On a rank of `layout`: the ranks of each of its groups (None where it has none), and
    of the group `new_groups` gives it from a partition that leaves rank 3 alone."""
    import torch.distributed as dist

    from paraxis.dist.groups import GROUP_AXES, build_groups, new_groups

    groups = build_groups(layout)
    mine = {axis: None if groups.group(axis) is None
            else dist.get_process_group_ranks(groups.group(axis)) for axis in GROUP_AXES}
    odd = new_groups([[2, 0, 1], [3]], "test")
    return {"axes": mine, "odd": None if odd is None else dist.get_process_group_ranks(odd)}


def test_every_rank_gets_the_layouts_groups_of_more_than_one_rank():
    from paraxis.dist.groups import GROUP_AXES
    from paraxis.dist.testing import run_distributed

    layout = Layout(dp=2, pp=2, zero=1)
    for rank, got in enumerate(run_distributed(_members, 4, (layout,))):
        for axis in GROUP_AXES:
            if got["axes"][axis] is None:
                continue
            assert got["axes"][axis] == layout.group_of(rank, axis), (rank, axis)
        assert got["axes"]["dp"] == layout.group_of(rank, "dp")
        assert got["axes"]["pp"] == layout.group_of(rank, "pp")
        assert got["axes"]["tp"] is None  # tp=1: no group of one rank
        assert got["odd"] == (None if rank == 3 else [0, 1, 2])


def test_the_block_method_recomputes_the_first_blocks_of_each_chunk():
    """recompute_method=block (Megatron-LM's --recompute-method block): full recompute of a
    chunk's first recompute_layers blocks only; it needs recompute=full, reads back from its
    text, and counts what the runtime checkpoints (`Transformer.set_recompute`)."""
    layout = Layout.parse("pp=2,microbatches=4,schedule=interleaved,virtual_stages=2,"
                          "recompute=full,recompute_method=block,recompute_layers=1")
    assert "recompute_method=block,recompute_layers=1" in str(layout)
    assert Layout.parse(str(layout)) == layout
    assert layout.checkpoint_group == 1
    assert Layout(recompute="full", recompute_layers=3).checkpoint_group == 3
    for text, message in (("recompute_method=block", "add recompute=full"),
                          ("recompute=selective,recompute_method=block", "add recompute=full"),
                          ("recompute=full,recompute_method=some", "unknown recompute_method")):
        with pytest.raises(ParaxisError, match=message) as error:
            Layout.parse(text)
        assert "\n" not in str(error.value)
