"""The README's code map, written from the layer list (pyproject.toml, [tool.importlinter])
and each layer's own docstring, so that the map and the code cannot drift apart.

    python tools/code_map.py            # print the table
    python tools/code_map.py --write    # replace the table in README.md

tests/test_layers.py checks that README.md holds the table this prints.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- code map: tools/code_map.py -->", "<!-- end of code map -->"


def layers() -> list[str]:
    """The top-level layers, highest first, as the layer contract lists them."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    [contract] = [c for c in config["contracts"] if c.get("containers") == ["paraxis"]]
    return contract["layers"]


def summary(path: Path) -> str:
    """A module's or package's docstring, first paragraph, on one line."""
    source = path / "__init__.py" if path.is_dir() else path
    doc = ast.get_docstring(ast.parse(source.read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split()).replace("|", "\\|")


def table() -> str:
    rows = ["| layer (lowest first) | what it holds |", "|---|---|"]
    for name in reversed(layers()):
        path = ROOT / "paraxis" / name
        path = path if path.is_dir() else path.with_suffix(".py")
        shown = f"`paraxis/{name}/`" if path.is_dir() else f"`paraxis/{name}.py`"
        rows.append(f"| {shown} | {summary(path)} |")
        if path.is_dir():
            for sub in sorted(p for p in path.iterdir() if (p / "__init__.py").is_file()):
                rows.append(f"| &nbsp;&nbsp;`{sub.name}/` | {summary(sub)} |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    text = table()
    if "--write" not in argv:
        print(text)
        return 0
    readme = ROOT / "README.md"
    before, rest = readme.read_text().split(BEGIN)
    _, after = rest.split(END)
    readme.write_text(f"{before}{BEGIN}\n{text}\n{END}{after}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
