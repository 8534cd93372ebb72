"""The fault matrix (`python -m bench --only faults`): break real runs at chosen moments and
check that nothing is lost.

Each kill trial SIGKILLs one rank (chosen by the trial's seed) in one phase of one step
(before the step, in forward, in backward, in its first collective, or between the shard
files and the manifest of a checkpoint save: `PARAXIS_FAULT=kill:...,phase=...`,
`paraxis/train/faults.py`) of a run with `--max-restarts 2`; each SIGTERM trial sends
SIGTERM to the `--nproc` launcher after a random step, then resumes with `--resume auto`.
A trial passes when
- the run ends with exit code 0 (after the restart or the resume),
- its final weights and AdamW moments equal an uninterrupted run's, bit for bit,
- no process of it is left (no rank outlives its launcher),
- no checkpoint is lost or foreign: the folder holds every step it should, all of its run.

The full matrix: 20 kill trials of dp2 x pp2 ZeRO-1 on 4 ranks, 5 of dp2 x tp2 x pp2 ZeRO-1
on 8, and 5 SIGTERM trials on 4 ranks; `--quick` runs one of each (`trials` picks others).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS, EVERY = 8, 2
PHASES = ("step", "forward", "backward", "collective", "save")
LAYOUTS = {4: ["--dp", "2", "--pp", "2", "--zero", "1", "--microbatches", "2"],
           8: ["--dp", "2", "--tp", "2", "--pp", "2", "--zero", "1", "--microbatches", "2"],
           2: ["--dp", "2", "--zero", "1"]}


def command(nproc: int, *extra: str, steps: int = STEPS) -> list[str]:
    return [sys.executable, "-m", "paraxis", "train", "--nproc", str(nproc), *LAYOUTS[nproc],
            "--model", "tiny", "--steps", str(steps), "--global-batch", "8", "--seq-len", "32",
            "--device", "cpu", "--quiet", "--checkpoint-dir", "ck", "--checkpoint-every",
            str(EVERY), "--keep", "0", "--metrics-file", "m.jsonl", "--timeout-s", "60",
            *extra]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def final_state(folder: Path) -> dict:
    from paraxis.model.checkpoint import read_full_state
    from paraxis.model.checkpoint.entries import KINDS

    return read_full_state(folder / "ck", KINDS)[1]


def straight(nproc: int, folder: Path, steps: int = STEPS) -> dict:
    """The uninterrupted run's final state, the reference every trial must equal."""
    folder.mkdir(parents=True)
    done = subprocess.run(command(nproc, steps=steps), cwd=folder, env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return final_state(folder)


def _orphans(folder: Path) -> list[int]:
    """Live processes working in the trial's folder (every rank and launcher of it does)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if os.readlink(entry / "cwd") == str(folder.resolve()):
                    state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state != "Z":
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


def _verdict(folder: Path, expected: dict, code: int, started: float,
             steps: int = STEPS) -> dict:
    import json

    import torch

    from paraxis.model.checkpoint import complete_checkpoints

    time.sleep(0.2)  # the launcher joined its ranks before exiting; a stray one shows
    orphans = _orphans(folder)
    saved = complete_checkpoints(folder / "ck")
    owner = json.loads((folder / "ck" / "run.json").read_text())["id"]
    runs = {json.loads((d / "manifest.json").read_text()).get("run", {}).get("id")
            for _, d in saved}
    got = final_state(folder) if code == 0 else {}
    exact = code == 0 and sorted(got) == sorted(expected) and all(
        torch.equal(got[name], expected[name]) for name in expected)
    return {"exit_code": code, "exact": exact, "orphans": len(orphans),
            "checkpoints": [step for step, _ in saved], "foreign": sorted(runs - {owner}),
            "intact": [step for step, _ in saved] == list(range(EVERY, steps + 1, EVERY))
            and runs == {owner}, "seconds": round(time.monotonic() - started, 1)}


def _finish(run: subprocess.Popen, seconds: float) -> str:
    """The run's stderr once it exits; a run still going after `seconds` is SIGKILLed (its
    ranks follow their launcher) and counts as failed (exit code -9), so one stuck trial
    does not end the matrix."""
    try:
        return run.communicate(timeout=seconds)[1]
    except subprocess.TimeoutExpired:
        run.kill()
        return run.communicate()[1] + f"\n(killed after {seconds} s)"


def kill_trial(seed: int, nproc: int, expected: dict, folder: Path,
               phase: str | None = None, steps: int = STEPS) -> dict:
    """SIGKILL a seeded rank in a seeded phase of a seeded step; the run restarts itself."""
    chooser = random.Random(seed)
    phase = phase or chooser.choice(PHASES)
    # a save follows step s when s + 1 is a checkpoint step
    step = chooser.choice([s for s in range(1, steps - 1) if phase != "save"
                           or (s + 1) % EVERY == 0])
    victim = chooser.randrange(nproc)
    folder.mkdir(parents=True)
    started = time.monotonic()
    run = subprocess.Popen(command(nproc, "--max-restarts", "2", steps=steps), cwd=folder,
                           env=_env(PARAXIS_FAULT=f"kill:rank={victim},step={step},"
                                    f"phase={phase}"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = _finish(run, 900)
    return {"kind": "kill", "seed": seed, "ranks": nproc, "victim": victim, "step": step,
            "phase": phase, "restarted": "restarting every rank" in stderr,
            **_verdict(folder, expected, run.returncode, started, steps)}


def sigterm_trial(seed: int, nproc: int, expected: dict, folder: Path) -> dict:
    """SIGTERM to the launcher after a seeded step, then `--resume auto`."""
    after = random.Random(seed).randint(1, STEPS - 2)
    folder.mkdir(parents=True)
    started = time.monotonic()
    run = subprocess.Popen(command(nproc), cwd=folder, env=_env(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = folder / "m.jsonl"
    while run.poll() is None and (not metrics.exists()
                                  or len(metrics.read_text().splitlines()) < after):
        time.sleep(0.05)
    run.send_signal(signal.SIGTERM)
    stderr = _finish(run, 600)
    stopped = run.returncode
    resumed = subprocess.Popen(command(nproc, "--resume", "auto"), cwd=folder, env=_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _finish(resumed, 600)
    verdict = _verdict(folder, expected, resumed.returncode, started)
    # the stop saved an extra checkpoint off the every-2 grid: only the grid is required
    grid = list(range(EVERY, STEPS + 1, EVERY))
    verdict["intact"] = set(grid) <= set(verdict["checkpoints"]) and not verdict["foreign"]
    return {"kind": "sigterm", "seed": seed, "ranks": nproc, "after": after,
            "stopped_code": stopped, "stop_line": stderr.strip().splitlines()[-1:],
            **verdict}


def run(quick: bool, trials: tuple[int, int, int] = (20, 5, 5), seed: int = 2500) -> dict:
    """The matrix: (kill trials on 4 ranks, kill trials on 8, SIGTERM trials on 4)."""
    if quick:
        trials = (1, 1, 1)
    out = []
    with tempfile.TemporaryDirectory(prefix="paraxis-faults-") as tmp:
        root = Path(tmp)
        for nproc, kills, terms in ((4, trials[0], trials[2]), (8, trials[1], 0)):
            if not kills and not terms:
                continue
            expected = straight(nproc, root / f"straight-{nproc}")
            for index in range(kills):
                trial_seed = seed + 1000 * nproc + index
                out.append(kill_trial(trial_seed, nproc, expected,
                                      root / f"kill-{nproc}-{index}"))
                print(f"  {out[-1]}", flush=True)
            for index in range(terms):
                trial_seed = seed + 1000 * nproc + 500 + index
                out.append(sigterm_trial(trial_seed, nproc, expected,
                                         root / f"term-{nproc}-{index}"))
                print(f"  {out[-1]}", flush=True)
    passed = [t for t in out if t["exact"] and not t["orphans"] and t["intact"]]
    return {"trials": out, "passed": len(passed), "total": len(out), "seed": seed}


def render(section: dict) -> str:
    rows = ["| kind | ranks | seed | victim, step, phase / SIGTERM after | exit | bit-identical "
            "| orphans | checkpoints intact | s |", "|---" * 9 + "|"]
    for t in section["trials"]:
        what = (f"rank {t['victim']}, step {t['step']}, {t['phase']}" if t["kind"] == "kill"
                else f"after step {t['after']} (stopped with {t['stopped_code']})")
        rows.append(f"| {t['kind']} | {t['ranks']} | {t['seed']} | {what} | {t['exit_code']} "
                    f"| {'yes' if t['exact'] else 'NO'} | {t['orphans']} | "
                    f"{'yes' if t['intact'] else 'NO'} | {t['seconds']} |")
    return ("## Fault matrix\n\n"
            f"{section['passed']} of {section['total']} trials passed: each resumed "
            "bit-identical to an uninterrupted run, left no process behind and lost no "
            "checkpoint (`bench/faults.py`).\n\n" + "\n".join(rows) + "\n")
