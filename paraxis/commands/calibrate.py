"""`paraxis calibrate`: measure this machine and write the profile the planner prices with.

    paraxis calibrate                                  # ranks 2,4,8 -> profile.json
    paraxis calibrate --nproc 2 --sizes-kb 16,256 --out hw.json
    paraxis plan --model small-llama --gpus 4 --hardware profile.json ...

Compute is timed on one rank (one thread on a CPU, one GPU on a CUDA machine); each rank
count in --nproc starts that many real processes (gloo on CPU, NCCL on GPUs) and times every
collective at every message size, then fits latency and bandwidth (paraxis/train/calibrate/fit.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from paraxis.files.host import write_whole
from paraxis.spec.errors import ParaxisError
from paraxis.train.calibrate.measure import DEFAULT_SIZES_KB, _device_type, calibrate, cpu_cores

RANKS_PER_CORE = 4  # past this, starting and timing the ranks takes longer than it tells


MAX_BUSY_S = 600.0  # the busy window that counts the cores our ranks get
MAX_MESSAGE_BYTES = 2**30  # the largest collective message timed


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ParaxisError(f"{flag} {text!r} must be a comma list of integers, e.g. "
                           "2,4,8") from None
    if not values or min(values) < 1:
        raise ParaxisError(f"{flag} {text!r} needs positive integers, e.g. 2,4,8")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--nproc", default=None,
        help="rank counts to time collectives on, comma list (default: 2,4,8 on a CPU; "
             "2, 4, 8 up to the GPU count on a CUDA machine)")
    add("--out", default="profile.json", help="the hardware profile to write (JSON)")
    add("--model", default="small-llama",
        help="preset whose layer shapes the GEMMs and kernels are timed at")
    add("--tokens", type=int, default=2048, help="tokens per GEMM (batch x sequence)")
    add("--seq-len", type=int, default=128, help="sequence length of the attention timing")
    add("--sizes-kb", default=",".join(map(str, DEFAULT_SIZES_KB)),
        help="collective message sizes in KiB (at least two; the largest should reach the "
             "largest message a run sends, e.g. a 25 MB gradient bucket)")
    add("--repeats", type=int, default=5,
        help="timed repeats per measurement (kernels: the fastest; collectives: the median)")
    add("--device", default="auto", help="auto, cpu or cuda")
    add("--busy-s", type=float, default=2.0,
        help="seconds one busy rank per core runs to see how many cores our ranks get (CPU)")


def default_nproc(device: str) -> list[int]:
    if _device_type(device) == "cpu":
        return [2, 4, 8]
    import torch

    return [n for n in (2, 4, 8) if n <= torch.cuda.device_count()] or [1]


MIN_SEQ_LEN = 8


def run(args: argparse.Namespace) -> int:
    nproc = (_int_list(args.nproc, "--nproc") if args.nproc is not None
             else default_nproc(args.device))
    cores = cpu_cores()
    on_cpu = _device_type(args.device) == "cpu"
    if on_cpu and max(nproc) < 2:
        # ranks alone time no collective: the profile would leave gloo's links to the
        # planner's GPU defaults (NVLink speeds)
        raise ParaxisError(f"--nproc {args.nproc}: a CPU profile needs collectives timed on "
                           "2 or more ranks; give rank counts of at least 2, e.g. 2,4")
    if args.nproc is not None and on_cpu and max(nproc) > RANKS_PER_CORE * cores:
        raise ParaxisError(f"--nproc {max(nproc)} is more ranks than this machine's {cores} "
                           f"CPU core(s) run ({RANKS_PER_CORE} a core); give rank counts of "
                           f"{RANKS_PER_CORE * cores} or fewer, e.g. 2,4")
    sizes = [kb * 1024 for kb in _int_list(args.sizes_kb, "--sizes-kb")]
    if max(sizes) > MAX_MESSAGE_BYTES:
        raise ParaxisError(f"--sizes-kb {args.sizes_kb}: a message of at most "
                           f"{MAX_MESSAGE_BYTES // 1024} KiB (1 GiB) is timed; a run's largest "
                           "is a gradient bucket (25 MiB by default)")
    if len(set(sizes)) < 2:
        raise ParaxisError(f"--sizes-kb {args.sizes_kb}: give at least two sizes to fit "
                           "latency and bandwidth")
    for flag, count in (("--repeats", args.repeats), ("--tokens", args.tokens),
                        ("--seq-len", args.seq_len)):
        if count < 1:
            raise ParaxisError(f"{flag} {count} must be at least 1")
    if not 0 < args.busy_s <= MAX_BUSY_S:
        raise ParaxisError(f"--busy-s {args.busy_s} must be above 0 and at most {MAX_BUSY_S:g} "
                           "seconds, e.g. 2")
    if args.tokens % args.seq_len:
        raise ParaxisError(f"--tokens {args.tokens} must be a multiple of --seq-len "
                           f"{args.seq_len}")
    if args.seq_len < MIN_SEQ_LEN or args.tokens < 2 * args.seq_len:
        # the elementwise probe subtracts a one-token run: too few tokens time nothing
        raise ParaxisError(f"--tokens {args.tokens} --seq-len {args.seq_len}: time at least "
                           f"{MIN_SEQ_LEN} tokens a sequence and two sequences (default 2048 "
                           "and 128), where the rates mean something")
    from paraxis.files.host import available_host_bytes, check_writable
    from paraxis.files.model_file import load_model_config
    from paraxis.plan.hardware import hardware_from_data

    cfg = load_model_config(args.model)  # a bad name or file: one line here, not per rank
    # the timed GEMMs' fp32 input and output at the widest (the LM head's vocabulary), at least
    gemm_bytes = 4 * args.tokens * (cfg.d_model + max(cfg.d_ff, cfg.d_ff_expert,
                                                       cfg.vocab_size))
    if gemm_bytes > available_host_bytes() / 2:
        raise ParaxisError(f"--tokens {args.tokens}: the timed GEMMs at {args.model}'s widest "
                           f"layer would take {gemm_bytes / 1e9:.1f} GB, more than half of "
                           "this machine's free memory; give fewer tokens (default 2048)")
    check_writable(args.out, "--out", "profile.json")  # before minutes of measuring
    out = Path(args.out)
    profile = calibrate(nproc, sizes, args.model, args.tokens, args.seq_len, args.repeats,
                        args.device, args.busy_s)
    try:  # a profile the planner's own reader refuses is not written
        hardware_from_data(out, profile)
    except ParaxisError as error:
        raise ParaxisError(f"the calibration measured nothing a plan can use ({error}); "
                           f"{out} is left as it was: run it again on a quieter machine, or "
                           "with more --tokens") from None
    try:  # whole or not at all: a profile already at --out survives a failed write
        write_whole(out, json.dumps(profile, indent=2) + "\n")
    except OSError as error:
        raise ParaxisError(f"--out {out} cannot be written ({error.strerror or error}); any "
                           "profile there is kept as it was; free some space or choose "
                           "another path") from None
    print(f"wrote {out} in {profile['calibration']['seconds']:.1f} s; use it with "
          f"`paraxis plan --hardware {out}`")
    return 0
