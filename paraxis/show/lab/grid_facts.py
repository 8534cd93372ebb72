"""The 3D grid for the lab page: every rank's role under every (dp, tp, pp, cp, ep) setting,
and under each hybrid sharding (`dp_shard`) of it.

Roles come from `Layout` (coordinates and groups, as the runtime builds its process groups)
and the label `viz.grid.cell_label` prints on the static rank grid, so a hover on the page
says what the picture and the runtime say.
"""

from __future__ import annotations

from paraxis.show.viz.grid import cell_label
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout

DEGREES = [1, 2, 4]  # dp, tp, pp
CP_DEGREES = [1, 2]
EP_DEGREES = [1, 2, 4]
GPUS_PER_NODE = [4, 8]
# dp_shard, where it divides dp and is smaller (dp_shard = dp is plain ZeRO; a group of one
# shards nothing: plain data parallelism)
SHARD_SIZES = [2]
GROUP_AXES = ("tp", "cp", "dp", "pp", "ep")
SHARD_AXES = ("dp_shard", "dp_replicate")  # ZeRO's shard groups and the copies of a shard


def grid_key(dp: int, tp: int, pp: int, cp: int, ep: int) -> str:
    return f"{dp}/{tp}/{pp}/{cp}/{ep}"


def grid_settings() -> list[tuple[int, int, int, int, int]]:
    return [(dp, tp, pp, cp, ep) for dp in DEGREES for tp in DEGREES for pp in DEGREES
            for cp in CP_DEGREES for ep in EP_DEGREES]


def shard_sizes(dp: int) -> list[int]:
    """The dp_shard choices that make a hybrid layout at this dp (0, every dp rank, aside)."""
    return [size for size in SHARD_SIZES if size < dp and dp % size == 0]


def grid_layout(dp: int, tp: int, pp: int, cp: int, ep: int, dp_shard: int = 0) -> Layout:
    """The layout a setting shows; hybrid sharding needs ZeRO, so a dp_shard brings zero=1."""
    layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, dp_shard=dp_shard,
                    zero=1 if dp_shard else 0)
    layout.validate(layout.world_size)
    return layout


def shard_facts(setting: tuple[int, int, int, int, int], dp_shard: int) -> dict:
    """A hybrid layout's shard groups and copies groups, or its error (ep must divide
    dp_shard x cp). Its other groups and coordinates are the plain setting's."""
    try:
        layout = grid_layout(*setting, dp_shard=dp_shard)
    except ParaxisError as error:
        return {"error": str(error)}
    return {axis: layout.groups(axis) for axis in SHARD_AXES}


def grid_facts() -> dict:
    """Per setting: every rank's (dp, cp, tp, pp) coordinates, its label per GPUs-per-node
    choice, each axis's groups, and per hybrid dp_shard its shard and copies groups; or the
    Layout's error (ep must divide dp x cp). To keep the page small, a hybrid layout shares
    the plain one's labels (its copy, cell_label's "/g", is its place in its copies group),
    and the plain layout carries no shard groups (one per dp x cp group, copies of one rank)."""
    layouts = {}
    for setting in grid_settings():
        try:
            layout = grid_layout(*setting)
        except ParaxisError as error:
            layouts[grid_key(*setting)] = {"error": str(error)}
            continue
        world = range(layout.world_size)
        layouts[grid_key(*setting)] = {
            "coords": [[c.dp_rank, c.cp_rank, c.tp_rank, c.pp_rank]
                       for c in map(layout.coords, world)],
            "labels": {str(n): [cell_label(layout, r, n) for r in world]
                       for n in GPUS_PER_NODE},
            "groups": {axis: layout.groups(axis) for axis in GROUP_AXES},
            "shards": {str(size): shard_facts(setting, size) for size in shard_sizes(setting[0])}}
    return {"degrees": DEGREES, "cp": CP_DEGREES, "ep": EP_DEGREES,
            "gpus_per_node": GPUS_PER_NODE, "layouts": layouts}
