"""Three trials of the fault matrix (`bench/faults.py`; the whole matrix is `python -m bench
--only faults`): a rank SIGKILLed between its shard file and the manifest of a save, in
backward, and as it enters a collective; each run restarts itself (--max-restarts) and must
end bit-identical to an uninterrupted one, leave no process behind and lose no checkpoint."""

from __future__ import annotations

import pytest

from bench import faults


@pytest.mark.slow
def test_three_seeded_kills_resume_exactly_with_no_orphan_and_no_checkpoint_lost(tmp_path):
    expected = faults.straight(2, tmp_path / "straight")
    for index, phase in enumerate(("save", "backward", "collective")):
        trial = faults.kill_trial(25 + index, 2, expected, tmp_path / f"kill-{index}", phase)
        assert trial["restarted"], trial  # the fault fired and the launcher restarted
        assert trial["exit_code"] == 0 and trial["exact"], trial
        assert trial["orphans"] == 0 and trial["intact"] and not trial["foreign"], trial
