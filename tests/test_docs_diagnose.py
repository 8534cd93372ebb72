"""docs/diagnose.md's worked answers are what `paraxis diagnose` prints now, line for line:
the run folders `python examples/diagnose_runs.py` writes, then each `$ paraxis diagnose`
block of the doc run again (the measured CPU run, `runs/tiny`, is a machine's and is left
out)."""

from __future__ import annotations

import runpy
import shlex
from pathlib import Path

import pytest

from paraxis.cli import main

ROOT = Path(__file__).resolve().parents[1]


def worked_answers() -> list[tuple[str, str]]:
    """(command, printed text) of each `$ paraxis diagnose` block of the doc but the
    measured one."""
    lines = (ROOT / "docs" / "diagnose.md").read_text().splitlines()
    answers = []
    for i, line in enumerate(lines):
        if line.startswith("$ paraxis diagnose") and "runs/tiny" not in line:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            answers.append((line[2:], "\n".join(lines[i + 1:end])))
    return answers


def test_the_doc_has_its_worked_answers() -> None:
    assert len(worked_answers()) == 5


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("diagnose")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        runpy.run_path(str(ROOT / "examples" / "diagnose_runs.py"), run_name="__main__")
    return folder


@pytest.mark.parametrize("command, printed", worked_answers(),
                         ids=[command.split("--", 1)[1][:40] for command, _ in worked_answers()])
def test_worked_answer_is_what_diagnose_prints(command: str, printed: str, runs: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(runs)
    main(shlex.split(command)[1:])
    out, err = capsys.readouterr()
    assert (out + err).rstrip("\n") == printed, (
        "docs/diagnose.md no longer shows what this prints: rerun it after "
        "`python examples/diagnose_runs.py` and paste its output")
