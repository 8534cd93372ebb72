"""The benchmark command runs end to end at a tiny size, so it cannot rot."""

import json
import subprocess
import sys


def test_bench_quick_writes_table_and_json(tmp_path):
    out = tmp_path / "benchmarks.md"
    subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(out)], check=True,
                   timeout=900, capture_output=True)
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    peers = " ".join(r["peer"] for r in rows)
    for peer in ("plain PyTorch loop", "DDP", "FSDP2", "DTensor", "Schedule1F1B",
                 "ScheduleGPipe"):
        assert peer in peers, peer
    assert all(r["paraxis_tokens_per_s"] > 0 and r["peer_tokens_per_s"] > 0 for r in rows)
    table = out.read_text()
    assert "| work | ranks |" in table
    assert table.count("\n| ") == len(rows) + 1  # header plus one line per row
