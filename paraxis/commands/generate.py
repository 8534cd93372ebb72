"""`paraxis generate`: continue a prompt with a trained or imported model, for a quick look.

    paraxis generate --checkpoint runs/x/checkpoint --prompt "def main(" --max-new-tokens 200
    paraxis generate --checkpoint hf/llama --prompt "Hello" --temperature 0      # greedy

The text goes through the tokenizer given with --tokenizer ("bytes": the byte-level one),
else the checkpoint directory's own tokenizer.json, else the one its run trained with (the
checkpoint's config.toml), else the byte-level one. torch is imported only when the command
runs, so `paraxis plan` stays torch-free (cli.py builds every subcommand's parser).
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

from paraxis.files.checkpoint_manifest import folder_of, resolve
from paraxis.spec.errors import ParaxisError

MAX_NEW_TOKENS = 100_000
# Below this, logits / temperature overflows fp32 (logits of order 1 over 1e-38 -> inf, and
# softmax of inf is nan); 1e-4 is already greedy in practice.
MIN_TEMPERATURE = 1e-4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--checkpoint", required=True,
        help="a Hugging Face model directory or a paraxis checkpoint directory")
    add("--prompt", required=True, help="text to continue")
    add("--max-new-tokens", type=int, default=100, help="tokens to add (default 100)")
    add("--temperature", type=float, default=0.8, help="default 0.8; 0: greedy")
    add("--top-k", type=int, default=50,
        help="sample among the k likeliest tokens (default 50; 0: all)")
    add("--seed", type=int, default=0, help="the sampling's seed (default 0)")
    add("--tokenizer", default=None, help="Hugging Face tokenizer.json, or 'bytes' (default: "
        "the checkpoint's own tokenizer.json, else the one its run trained with, else "
        "byte-level)")
    add("--device", default="auto", help="auto, cpu or cuda")


def run(args: argparse.Namespace) -> int:
    from paraxis.dist.groups import pick_device
    from paraxis.model.inference import generate, load_for_inference, pick_tokenizer

    if not 0 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        raise ParaxisError(f"--max-new-tokens {args.max_new_tokens} must be within 0.."
                           f"{MAX_NEW_TOKENS} (this is a quick look, not a server)")
    if not (args.temperature == 0 or MIN_TEMPERATURE <= args.temperature < float("inf")):
        raise ParaxisError(f"--temperature {args.temperature} must be >= 0 (0: greedy) and "
                           f"else finite and at least {MIN_TEMPERATURE} (smaller ones overflow "
                           "the logits)")
    if not 0 <= args.seed < 2**63:
        raise ParaxisError(f"--seed {args.seed} must be between 0 and 2**63 - 1")
    if args.top_k < 0:
        raise ParaxisError(f"--top-k {args.top_k} must be >= 0 (0: no cut)")
    if not args.checkpoint.strip():  # Path("") is the working folder
        raise ParaxisError("--checkpoint is empty; give a paraxis checkpoint or a Hugging Face "
                           "model directory")
    checkpoint = folder_of(args.checkpoint)
    cfg, model = load_for_inference(checkpoint, pick_device(args.device))
    tokenizer = pick_tokenizer(checkpoint, args.tokenizer or trained_tokenizer(checkpoint),
                               cfg.vocab_size)
    if args.tokenizer and tokenizer.vocab_size > cfg.vocab_size:  # not the model's own one
        raise ParaxisError(f"the tokenizer has {tokenizer.vocab_size} tokens, more than the "
                           f"model's vocabulary of {cfg.vocab_size}; give the tokenizer it was "
                           "trained with (--tokenizer)")
    prompt = [int(t) for t in tokenizer.encode(args.prompt, special=True)]
    if not prompt:
        raise ParaxisError("--prompt is empty after tokenisation; give some text")
    if max(prompt) >= cfg.vocab_size:
        raise ParaxisError(f"prompt token id {max(prompt)} is outside the model's vocabulary of "
                           f"{cfg.vocab_size}; give the tokenizer it was trained with "
                           "(--tokenizer)")
    new = generate(model, prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed)
    print(tokenizer.decode(prompt + new))
    return 0


def trained_tokenizer(checkpoint: Path) -> str | None:
    """The tokenizer.json the checkpoint's run trained with, as its config.toml records it
    (None: the checkpoint holds its own, it has no run file, or the run's text went in as
    bytes); refused where it is gone."""
    if (checkpoint / "tokenizer.json").is_file():  # the checkpoint's own comes first
        return None
    try:
        run_file = resolve(checkpoint) / "config.toml"  # the checkpoint generate loads
        tokenizer = tomllib.loads(run_file.read_text()).get("data", {}).get("tokenizer")
    except (ParaxisError, OSError, ValueError, AttributeError):
        return None  # a Hugging Face directory, an import, or no run file generate can read
    if not isinstance(tokenizer, str) or not tokenizer:
        return None
    if not Path(tokenizer).is_file():
        raise ParaxisError(f"the run trained with tokenizer {tokenizer} ({run_file}), which is "
                           "not there any more; give --tokenizer PATH")
    return tokenizer
