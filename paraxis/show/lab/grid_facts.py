"""The 3D grid for the lab page: every rank's role under every (dp, tp, pp, cp, ep) setting.

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
GROUP_AXES = ("tp", "cp", "dp", "pp", "ep")


def grid_key(dp: int, tp: int, pp: int, cp: int, ep: int) -> str:
    return f"{dp}/{tp}/{pp}/{cp}/{ep}"


def grid_settings() -> list[tuple[int, int, int, int, int]]:
    return [(dp, tp, pp, cp, ep) for dp in DEGREES for tp in DEGREES for pp in DEGREES
            for cp in CP_DEGREES for ep in EP_DEGREES]


def grid_layout(dp: int, tp: int, pp: int, cp: int, ep: int) -> Layout:
    layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
    layout.validate(layout.world_size)
    return layout


def grid_facts() -> dict:
    """Per setting: every rank's (dp, cp, tp, pp) coordinates, its label per GPUs-per-node
    choice, and each axis's groups; or the Layout's error (ep must divide dp x cp)."""
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
            "groups": {axis: layout.groups(axis) for axis in GROUP_AXES}}
    return {"degrees": DEGREES, "cp": CP_DEGREES, "ep": EP_DEGREES,
            "gpus_per_node": GPUS_PER_NODE, "layouts": layouts}
