"""The package's layers, as `ls paraxis/` shows them: imports only go down, the torch-free
layers stay torch-free, every top-level name belongs to a layer, an import inside a function
says why, and comments explain the code rather than its history.

The layer order and the torch-free rule are import-linter contracts in pyproject.toml
([tool.importlinter]); import-linter counts `TYPE_CHECKING` imports and imports inside
functions (a type is a dependency too). The rest is read here with `ast` and regular
expressions.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "paraxis"
TOP_LEVEL_AT_MOST = 16  # the layers' folders, cli.py, __init__.py and __main__.py
LAZY = re.compile(r"#\s*lazy:\s*\S")
# History belongs in git and docs/: a comment names no work session, issue or stop, and no
# file outside the repository. Written in two parts so that this file does not match itself.
HISTORY = re.compile("|".join((r"\bsess" r"ions? \d", r"\biss" r"ues? #?\d", r"\bst" r"op \d",
                               r"PLAT" r"FORM\.md")), re.IGNORECASE)


def layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    [contract] = [c for c in config["contracts"] if c.get("containers") == ["paraxis"]]
    return contract["layers"]


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("importlinter")  # a dev requirement: `make test` installs it
    code = "import sys; from importlinter.cli import lint_imports; " \
           "sys.exit(lint_imports(no_cache=True, no_logo=True))"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, env={"PYTHONPATH": str(cwd), "PATH": ""}, timeout=120)


def test_the_layer_contracts_hold():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_the_contract_catches_an_import_up_the_layers(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "high.py").write_text("")
    (package / "low.py").write_text(textwrap.dedent("""\
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from pkg import high
        """))
    (tmp_path / ".importlinter").write_text(textwrap.dedent("""\
        [importlinter]
        root_package = pkg
        [importlinter:contract:layers]
        name = layers
        type = layers
        layers =
            pkg.high
            pkg.low
        """))
    result = lint_imports(tmp_path)
    assert result.returncode == 1 and "pkg.low -> pkg.high" in result.stdout, result.stdout


def test_every_top_level_name_belongs_to_a_layer():
    entries = sorted(p.stem for p in PACKAGE.iterdir()
                     if p.name != "__pycache__" and (p.is_dir() or p.suffix == ".py"))
    strays = [e for e in entries if e not in (*layers(), "__init__", "__main__")]
    assert not strays, f"top-level names outside the layer list in pyproject.toml: {strays}"
    assert len(entries) <= TOP_LEVEL_AT_MOST, entries


def unexplained_function_imports(source: str) -> list[int]:
    """Lines of imports inside functions that carry no `# lazy: reason` marker."""
    lines = source.splitlines()
    found: list[int] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if in_function and isinstance(node, ast.Import | ast.ImportFrom):
            if not LAZY.search(lines[node.lineno - 1]):
                found.append(node.lineno)
        inside = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(ast.parse(source), False)
    return found


def test_the_function_import_finder():
    source = textwrap.dedent("""\
        import os
        def f():
            import json
            from torch import nn  # lazy: torch only when training
            def g():
                import re
        """)
    assert unexplained_function_imports(source) == [3, 6]


def test_an_import_inside_a_function_is_a_command_s_or_says_why():
    commands = PACKAGE / "commands"
    unexplained = [f"{path.relative_to(ROOT)}:{line}"
                   for path in sorted(PACKAGE.rglob("*.py")) if commands not in path.parents
                   for line in unexplained_function_imports(path.read_text())]
    assert not unexplained, ("an import inside a function outside paraxis/commands/ needs "
                             "`# lazy: <reason>` or a place at the top: "
                             + ", ".join(unexplained))


def test_the_history_pattern():
    assert HISTORY.search("as before sess" "ion 21") and HISTORY.search("(iss" "ue 20)")
    assert HISTORY.search("see PLAT" "FORM.md") and not HISTORY.search("an issue with 2 ranks")


def test_comments_explain_the_code_not_its_history():
    found = [f"{path.relative_to(ROOT)}:{number}"
             for folder in ("paraxis", "tests", "bench", "validation", "tools")
             for path in sorted((ROOT / folder).rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if HISTORY.search(line)]
    assert not found, "history in the code (it belongs in git and docs/): " + ", ".join(found)


def test_the_readme_code_map_is_written_from_the_layer_list():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import code_map
    finally:
        sys.path.remove(str(ROOT / "tools"))
    assert code_map.layers() == layers()
    assert f"{code_map.BEGIN}\n{code_map.table()}\n{code_map.END}" in (
        ROOT / "README.md").read_text(), "run `python tools/code_map.py --write`"


def test_no_test_asks_the_suite_s_own_process_for_a_gpu():
    """conftest hides the GPUs from the suite's processes (`dist.hidden_gpus`), so a test
    skipped on `torch.cuda.is_available()` never runs, even on a GPU machine: two CUDA cases
    were skipped unsaid on one. They skip on `gpu_count()` and run in a spawned rank."""
    asking = [f"{path.name}:{text.count(chr(10), 0, found.start()) + 1}"
              for path in sorted((ROOT / "tests").glob("test_*.py"))
              for text in (path.read_text(),)
              for found in re.finditer(r"skipif\(\s*not torch\.cuda\.is_available\(\)", text)]
    assert asking == []
