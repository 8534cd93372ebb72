"""`paraxis calibrate`'s refusals and its output file."""

import json
import resource
from pathlib import Path

import paraxis.commands.calibrate as command
from paraxis.cli import main


def test_a_cpu_calibration_without_collectives_is_refused(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert main(["calibrate", "--nproc", "1", "--device", "cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "at least 2" in err and err.count("\n") == 1
    assert not out.exists()


def test_a_failed_write_keeps_the_profile_already_there(tmp_path, capsys, monkeypatch):
    """The new profile outgrows the file-size limit (a full disk's stand-in) part-way."""
    out = tmp_path / "profile.json"
    out.write_text('{"old": true}\n')
    profile = json.loads((Path(__file__).parents[1] / "docs" / "hardware-profile.json")
                         .read_text())
    profile["calibration"].update(seconds=1.0, padding="x" * 200_000)
    monkeypatch.setattr(command, "calibrate", lambda *args: profile)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (65536, hard))
    try:
        code = main(["calibrate", "--nproc", "2", "--device", "cpu", "--out", str(out)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    err = capsys.readouterr().err
    assert code == 2 and "cannot be written" in err and err.count("\n") == 1
    assert out.read_text() == '{"old": true}\n'
    assert [path.name for path in tmp_path.iterdir()] == ["profile.json"]  # no staging left
