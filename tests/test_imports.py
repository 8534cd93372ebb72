"""The shape of the package: no import cycle, no long module, few and explained `noqa: ANN`.

The import graph is read from the source with `ast`, so every import counts: the ones inside
functions (a cycle hidden in a function body is still a cycle: it only moves the failure to
the moment the function first runs) and the ones under `if TYPE_CHECKING:` (a type is a
dependency: a cycle kept out of sight there is still two modules that need each other).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "paraxis"
MAX_LINES = 500
MAX_NOQA_ANN = 5


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in the tree, wherever it stands."""
    return [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]


def imported_modules(name: str, source: str, known: set[str], is_package: bool = False
                     ) -> set[str]:
    """The modules among `known` that module `name` (whose text is `source`) imports at run
    time. `from pkg import x` counts as an import of `pkg.x` when `x` is a submodule, else of
    `pkg`; relative imports are resolved against `name`'s package; importing `pkg.mod` also
    runs `pkg/__init__.py`, so it is an edge to `pkg` too."""
    package = name if is_package else name.rpartition(".")[0]
    edges: set[str] = set()
    for node in _imports(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        for target in targets:
            while target and target not in known:  # an attribute of a module, not a module
                target = target.rpartition(".")[0]
            # Importing a.b.c first runs the packages a and a.b, unless they are already
            # running, as the importing module's own packages always are.
            while target and target != name and not name.startswith(target + "."):
                if target in known:
                    edges.add(target)
                target = target.rpartition(".")[0]
    return edges


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imported_modules(name, path.read_text(), known, path.name == "__init__.py")
            for name, path in found.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of the graph, each written as a path that returns to its start: for every
    edge a -> b that lies on some cycle, the shortest way back from b to a (duplicates that are
    rotations of one another dropped), so every import that closes a loop is named."""
    cycles: dict[frozenset[tuple[str, str]], list[str]] = {}
    for a in sorted(graph):
        for b in sorted(graph[a]):
            back = _shortest_path(graph, b, a)
            if back is not None:
                cycle = [a, *back]
                cycles.setdefault(frozenset(zip(cycle, cycle[1:], strict=False)), cycle)
    return list(cycles.values())


def _shortest_path(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """Breadth-first: the shortest import path from `start` to `goal`, or None."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            if node == goal:
                return paths[node]
            for nxt in sorted(graph.get(node, ())):
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    return None


def test_the_cycle_finder_sees_function_level_and_type_checking_imports():
    source = {
        "p.a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import b\n",
        "p.b": "def f():\n    from p import c\n",
        "p.c": "from . import b\nimport p.a\nfrom q.r import s\n",
        "q": "", "q.r": "",
    }
    graph = {name: imported_modules(name, text, set(source)) for name, text in source.items()}
    assert graph["p.a"] == {"p.b"} and graph["p.b"] == {"p.c"}
    assert graph["p.c"] == {"p.a", "p.b", "q", "q.r"}  # q.r runs q's __init__ first
    assert find_cycles(graph) == [["p.a", "p.b", "p.c", "p.a"], ["p.b", "p.c", "p.b"]]
    assert find_cycles({"x": {"y"}, "y": {"x", "z"}, "z": {"y"}}) == [
        ["x", "y", "x"], ["y", "z", "y"]]


def test_no_import_cycle_inside_paraxis():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_module_over_500_lines():
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


NOQA_ANN = re.compile(r"#\s*noqa:\s*ANN\w*(?P<reason>.*)$")


def test_few_noqa_ann_markers_each_with_its_reason():
    markers = [(f"{path.relative_to(PACKAGE.parent)}:{number}", match["reason"])
               for path in sorted(PACKAGE.rglob("*.py"))
               for number, line in enumerate(path.read_text().splitlines(), 1)
               if (match := NOQA_ANN.search(line))]
    unexplained = [where for where, reason in markers
                   if not re.match(r"\s*(,\s*ANN\w*\s*)*-\s*\S", reason)]
    assert len(markers) <= MAX_NOQA_ANN, (
        f"{len(markers)} `noqa: ANN` markers (at most {MAX_NOQA_ANN}): "
        + ", ".join(where for where, _ in markers))
    assert not unexplained, ("write the reason after each marker (`# noqa: ANN001 - why`): "
                             + ", ".join(unexplained))


def test_commands_run_elsewhere_are_told_where_paraxis_is():
    """A test that starts a process in another folder passes `env` (PYTHONPATH at the
    checkout): where paraxis is not installed, as on the GPU image, `python -m paraxis`
    from a temporary folder finds no module."""
    unplaced = []
    for path in sorted((PACKAGE.parent / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            keywords = {k.arg: k.value for k in node.keywords}
            cwd = keywords.get("cwd")
            if cwd is None or "env" in keywords or ast.unparse(cwd) == "ROOT":
                continue
            unplaced.append(f"{path.name}:{node.lineno}")
    assert not unplaced, "pass env={**os.environ, 'PYTHONPATH': str(ROOT)}: " + ", ".join(
        unplaced)
