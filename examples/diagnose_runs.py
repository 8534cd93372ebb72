"""Four run folders of a 13B run on 64 and 128 GPUs, as `paraxis train --metrics-file` writes
them, for the worked answers of docs/diagnose.md: `python examples/diagnose_runs.py` writes
runs/13b-leak, runs/13b-nan, runs/13b-64gpu and runs/13b-128gpu."""
import json
from pathlib import Path

from paraxis.train.config import RunConfig
from paraxis.train.run_file import to_toml

LAYOUT = ("dp=8,tp=8,pp=2,microbatches=64,schedule=interleaved,virtual_stages=2,"
          "sequence_parallel=true")


def write(folder, steps_done, peak, loss=lambda s: 2.0, grad=lambda s: 1.0,
          tokens_per_s=230_000.0, layout=LAYOUT, steps=10_000, on_nan="stop"):
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "metrics.jsonl", "w") as out:
        for s in range(steps_done):
            record = {"step": s, "loss": loss(s), "grad_norm": grad(s),
                      "tokens_per_s": tokens_per_s, "step_time_s": 1024 * 4096 / tokens_per_s,
                      "peak_mem_bytes": peak(s)}
            if s % 10 == 0:  # logging steps gather every rank's peak
                ranks = [peak(s) - (0 if r < 64 else 3e9) for r in range(128)]
                record |= {"peak_mem_bytes_by_rank": ranks, "peak_mem_bytes_max_rank": max(ranks)}
            out.write(json.dumps(record) + "\n")
    config = RunConfig.from_flags(model="llama2-13b", steps=steps, global_batch=1024,
                                  seq_len=4096, precision="bf16", layout=layout, on_nan=on_nan,
                                  metrics_file=str(folder / "metrics.jsonl"))
    (folder / "config.toml").write_text(to_toml(config))


def main() -> None:
    # 1. crashed at step 4,000: rank 0's peak grows 14 GB every 1,000 steps from 24 GB
    write("runs/13b-leak", 4000, lambda s: 24e9 + 14e6 * s)
    # 1b. the same run diverging instead: the gradient norm spikes, then the loss turns NaN
    write("runs/13b-nan", 4000, lambda s: 30e9, on_nan="skip",
          loss=lambda s: None if s >= 3995 else 2.0,
          grad=lambda s: None if s >= 3995 else 40.0 if s >= 3990 else 1.0)
    # 2. before and after a move to a bigger cluster (64 -> 128 GPUs), 40% fewer tokens/s per GPU
    write("runs/13b-64gpu", 20, lambda s: 30e9, tokens_per_s=118_000.0, steps=20,
          layout=LAYOUT.replace("dp=8", "dp=4"))
    write("runs/13b-128gpu", 20, lambda s: 30e9, tokens_per_s=141_600.0, steps=20,
          layout=LAYOUT.replace("microbatches=64", "microbatches=32"))


if __name__ == "__main__":
    main()
