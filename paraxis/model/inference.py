"""A trained or imported model on one device, and sampling from it (`paraxis generate`).

    cfg, model = load_for_inference("hf/llama")         # or a paraxis checkpoint directory
    new_ids = generate(model, prompt_ids, max_new_tokens=50, temperature=0.8, top_k=50)

The checkpoint is a Hugging Face directory (config.json + safetensors) or a paraxis checkpoint
(manifest.json). There is no KV cache: every new token reruns the model over the context
(cropped to the model's max_seq_len), plenty for a look at a small model and nothing like a
serving engine.
"""

from __future__ import annotations

from pathlib import Path

import torch

from paraxis.data.corpus import BYTE_VOCAB, ByteTokenizer, HFTokenizer
from paraxis.model.checkpoint import complete_checkpoints, read_full_state
from paraxis.model.hf import read_hf
from paraxis.model.transformer import Transformer
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import ModelConfig


def load_for_inference(path: str | Path, device: str | torch.device = "cpu",
                       dtype: torch.dtype = torch.float32) -> tuple[ModelConfig, Transformer]:
    """The single-device model, in eval mode, of a Hugging Face or paraxis checkpoint."""
    path = Path(path)
    if not path.is_dir():
        raise ParaxisError(f"checkpoint {path} is not a directory; give a Hugging Face model "
                           "directory (config.json) or a paraxis checkpoint (manifest.json)")
    if (path / "manifest.json").is_file() or complete_checkpoints(path):
        cfg, state = read_full_state(path)  # a checkpoint, or the newest in a run's directory
    elif (path / "config.json").is_file():
        cfg, state = read_hf(path)
    else:
        raise ParaxisError(f"{path} holds neither config.json (a Hugging Face model) nor "
                           "manifest.json (a paraxis checkpoint) nor step-N checkpoints")
    broken = next((name for name, tensor in state.items()
                   if tensor.is_floating_point() and not torch.isfinite(tensor).all()), None)
    if broken is not None:  # sampling from them would fail deep inside torch.multinomial
        raise ParaxisError(f"{path}: tensor {broken!r} holds NaN or infinite values; use "
                           "another checkpoint (an earlier step, or the source's own weights)")
    return cfg, model_from_state(cfg, state, device, dtype)


def model_from_state(cfg: ModelConfig, state: dict[str, torch.Tensor],
                     device: str | torch.device = "cpu",
                     dtype: torch.dtype = torch.float32) -> Transformer:
    """A Transformer holding `state` ({parameter name: full tensor}), without first drawing
    random weights it would overwrite (built on the meta device, then assigned)."""
    with torch.device("meta"):
        model = Transformer(cfg)
    state = dict(state)
    if cfg.tied_embeddings:  # state_dict() lists the tied head under both names
        state.setdefault("lm_head.weight", state.get("tok_emb.weight"))
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as error:
        reason = str(error).splitlines()[1].strip() if "\n" in str(error) else str(error)
        raise ParaxisError(f"checkpoint weights do not fit model {cfg.name}: {reason}") from None
    if cfg.tied_embeddings:
        model.lm_head.weight = model.tok_emb.weight  # assign=True replaced both: tie again
    return model.to(device=device, dtype=dtype).eval()


@torch.no_grad()
def generate(model: Transformer, prompt: list[int], max_new_tokens: int,
             temperature: float = 0.0, top_k: int = 0, seed: int = 0) -> list[int]:
    """The new token ids after `prompt`: greedy when temperature is 0, else sampled from the
    softmax of logits / temperature over the top_k most likely tokens (0: all), seeded."""
    device = next(model.parameters()).device
    generator = torch.Generator(device).manual_seed(seed)
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    for _ in range(max_new_tokens):
        x = model.embed(ids[:, -model.cfg.max_seq_len:])
        for block in model.blocks:
            x = block(x)
        logits = model.logits(x[:, -1]).float()[0]  # only the last position is needed
        if temperature == 0:
            token = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if 0 < top_k < logits.numel():
                kth_largest = torch.topk(logits, top_k).values[-1]
                logits = logits.masked_fill(logits < kth_largest, float("-inf"))
            token = torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)
        ids = torch.cat([ids, token.view(1, 1)], dim=1)
    return ids[0, len(prompt):].tolist()


def pick_tokenizer(checkpoint: Path, given: str | None, vocab_size: int
                   ) -> HFTokenizer | ByteTokenizer:
    """--tokenizer ("bytes": the byte-level one), else the checkpoint's tokenizer.json, else
    bytes (if the model's are)."""
    if given == "bytes":
        return ByteTokenizer()
    if given:
        return HFTokenizer(given)
    if (checkpoint / "tokenizer.json").is_file():
        return HFTokenizer(checkpoint / "tokenizer.json")
    if vocab_size > BYTE_VOCAB:
        raise ParaxisError(f"the model's vocabulary is {vocab_size} tokens and {checkpoint} "
                           "holds no tokenizer.json; give --tokenizer PATH/tokenizer.json (or "
                           "--tokenizer bytes for a model trained on bytes)")
    return ByteTokenizer()
