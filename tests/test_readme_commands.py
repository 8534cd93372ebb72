"""The README's `paraxis train` lines are runs paraxis accepts: each one's flags parse, its
run checks pass, and its layout fits its model on its ranks (without training: the layout
rules are what a new model preset or rule breaks in a line nobody reruns)."""

import re
import shlex
from pathlib import Path

import pytest

from paraxis.cli import build_parser
from paraxis.files.model_file import load_model_config
from paraxis.train.flags import config_from_args
from paraxis.train.start import with_launch_layout

ROOT = Path(__file__).parent.parent


def readme_train_lines() -> list[str]:
    """Every `paraxis train` command of the README's shell blocks, continuations joined and
    comments cut."""
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    lines = []
    for block in blocks:
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            command = line.split("#")[0].strip()
            if command.startswith("paraxis train"):
                lines.append(command)
    return lines


def test_the_readme_has_train_lines() -> None:
    assert len(readme_train_lines()) >= 10


@pytest.mark.parametrize("line", readme_train_lines())
def test_readme_train_line_is_a_valid_run(line: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # --config examples/... is relative to the checkout
    args = build_parser().parse_args(shlex.split(line)[1:])
    cfg = config_from_args(args)
    cfg.check()
    if cfg.auto.enabled:  # --layout auto: the planner picks at launch (tests/test_auto_layout)
        return
    train, layout = cfg.train, with_launch_layout(cfg).layout
    layout.validate(cfg.launch.nproc, load_model_config(cfg.model.name), train.global_batch,
                    train.seq_len)
