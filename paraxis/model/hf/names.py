"""Where each paraxis parameter lives in a Hugging Face checkpoint: one table, read both ways.

A paraxis parameter is a box inside one Hugging Face tensor, described by a `Source`: the
tensor's name, whether it is stored transposed (GPT-2's Conv1D keeps weights as (in, out),
nn.Linear as (out, in)), and the offset of the box along our first dim (GPT-2's fused
`c_attn` stacks q, k and v along the output dim, so k starts d_model rows after q). Reading
maps a region of ours to the region of theirs that holds it (`their_index`); writing fills
each of their tensors from the parameters whose boxes tile it (`hf_tensors`).

Conventions, checked against transformers' modeling_llama.py and modeling_gpt2.py:
- RoPE: both implementations rotate halves (channel i pairs with i + head_dim/2), and HF
  Llama checkpoints already carry the q/k row permutation that Meta's interleaved pairs need,
  so q and k rows are copied as they are.
- GPT-2's `gelu_new` is the tanh approximation of GELU, the one `paraxis.model.transformer` uses.
- GPT-2 ties its LM head to `wte`: it appears once, as our `tok_emb.weight`.
- Mixtral (modeling_mixtral.py, conversion_mapping.py of transformers 5): the router is
  `block_sparse_moe.gate` and expert e's SwiGLU is `experts.{e}.w1` (gate), `w3` (up) and
  `w2` (down), the keys `save_pretrained` writes and Mistral's files hold. In memory
  transformers 5 renames `block_sparse_moe` to `mlp` and stacks the experts (`gate_up_proj`:
  (experts, 2 x width, d_model), every gate's rows then every up's; `down_proj`); it loads
  that form from disk too, and so does `HFReader` (`fused_experts`).
"""

from __future__ import annotations

from typing import NamedTuple

from paraxis.files.hf_config import check_mixtral_form
from paraxis.model.transformer import parameter_shapes
from paraxis.spec.model_config import ModelConfig

# Llama: paraxis name -> Hugging Face name, copied as they are.
LLAMA_TOP = {"tok_emb.weight": "model.embed_tokens.weight", "norm_f.weight": "model.norm.weight",
             "lm_head.weight": "lm_head.weight"}
LLAMA_BLOCK = {  # within blocks.{i}. -> within model.layers.{i}.
    "norm1.weight": "input_layernorm.weight",
    "attn.q.weight": "self_attn.q_proj.weight",
    "attn.k.weight": "self_attn.k_proj.weight",
    "attn.v.weight": "self_attn.v_proj.weight",
    "attn.o.weight": "self_attn.o_proj.weight",
    "norm2.weight": "post_attention_layernorm.weight",
    "mlp.gate.weight": "mlp.gate_proj.weight",
    "mlp.up.weight": "mlp.up_proj.weight",
    "mlp.down.weight": "mlp.down_proj.weight",
}
# Mixtral, within blocks.{i}.moe. -> within model.layers.{i}.: the on-disk keys, and the
# fused ones (their tensor, which width-sized slot of it along its rows) of transformers'
# memory.
MIXTRAL_ROUTER, FUSED_ROUTER = "block_sparse_moe.gate.weight", "mlp.gate.weight"
MIXTRAL_EXPERT = {"gate": "w1", "up": "w3", "down": "w2"}  # experts.{e}.<ours> -> <theirs>
FUSED_EXPERT = {"gate": ("mlp.experts.gate_up_proj", 0), "up": ("mlp.experts.gate_up_proj", 1),
                "down": ("mlp.experts.down_proj", 0)}
GPT2_TOP = {"tok_emb.weight": "wte.weight", "pos_emb.weight": "wpe.weight",
            "norm_f.weight": "ln_f.weight", "norm_f.bias": "ln_f.bias"}
# GPT-2, within blocks.{i}. -> within h.{i}.: (their name, stored transposed, which d_model
# slot of a fused tensor).
GPT2_BLOCK = {
    "norm1.weight": ("ln_1.weight", False, 0), "norm1.bias": ("ln_1.bias", False, 0),
    **{f"attn.{part}.weight": ("attn.c_attn.weight", True, slot) for slot, part in
       enumerate("qkv")},
    **{f"attn.{part}.bias": ("attn.c_attn.bias", False, slot) for slot, part in
       enumerate("qkv")},
    "attn.o.weight": ("attn.c_proj.weight", True, 0), "attn.o.bias": ("attn.c_proj.bias", False, 0),
    "norm2.weight": ("ln_2.weight", False, 0), "norm2.bias": ("ln_2.bias", False, 0),
    "mlp.up.weight": ("mlp.c_fc.weight", True, 0), "mlp.up.bias": ("mlp.c_fc.bias", False, 0),
    "mlp.down.weight": ("mlp.c_proj.weight", True, 0),
    "mlp.down.bias": ("mlp.c_proj.bias", False, 0),
}
GPT2_PREFIX = "transformer."  # what GPT2LMHeadModel saves; OpenAI's original files omit it
# Buffers older transformers versions saved next to the weights: recomputed, never needed.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


class Source(NamedTuple):
    """The box of one paraxis parameter inside Hugging Face tensor `name`."""

    name: str
    transposed: bool = False
    offset: int = 0  # along our first dim (their last when transposed)
    expert: int | None = None  # its index along their first dim, when that stacks experts


expected_shapes = parameter_shapes  # {paraxis parameter name: shape}, the model's order


def hf_sources(cfg: ModelConfig, gpt2_prefix: str = GPT2_PREFIX,
               fused_experts: bool = False) -> dict[str, Source]:
    """{paraxis name: its Source}, in the model's order; a mixture of experts as Mixtral's
    per-expert keys, or with `fused_experts` as transformers' stacked tensors."""
    if cfg.is_moe:
        check_mixtral_form(cfg)
    sources = {}
    for name in expected_shapes(cfg):
        if cfg.style == "llama" and name.startswith("blocks."):
            block, _, suffix = name.partition(".")[2].partition(".")
            sources[name] = (_expert_source(cfg, block, suffix, fused_experts)
                             if suffix.startswith("moe.") else
                             Source(f"model.layers.{block}.{LLAMA_BLOCK[suffix]}"))
        elif cfg.style == "llama":
            sources[name] = Source(LLAMA_TOP[name])
        elif name.startswith("blocks."):
            _, block, suffix = name.split(".", 2)
            theirs, transposed, slot = GPT2_BLOCK[suffix]
            sources[name] = Source(f"{gpt2_prefix}h.{block}.{theirs}", transposed,
                                   slot * cfg.d_model)
        else:
            sources[name] = Source(gpt2_prefix + GPT2_TOP[name])
    return sources


def _expert_source(cfg: ModelConfig, block: str, suffix: str, fused: bool) -> Source:
    """Where `blocks.{block}.{suffix}` (`moe.router.weight`, `moe.experts.{e}.{part}.weight`)
    lives in a Mixtral checkpoint."""
    layer = f"model.layers.{block}."
    if suffix == "moe.router.weight":
        return Source(layer + (FUSED_ROUTER if fused else MIXTRAL_ROUTER))
    expert, part = suffix.split(".")[2:4]
    if fused:
        theirs, slot = FUSED_EXPERT[part]
        return Source(layer + theirs, offset=slot * cfg.d_ff_expert, expert=int(expert))
    return Source(f"{layer}block_sparse_moe.experts.{expert}.{MIXTRAL_EXPERT[part]}.weight")


def hf_tensors(cfg: ModelConfig, gpt2_prefix: str = GPT2_PREFIX, fused_experts: bool = False
               ) -> dict[str, tuple[tuple[int, ...], dict[str, Source]]]:
    """{Hugging Face name: (its shape, {paraxis name: Source} of the boxes that tile it)}, in
    the order of the model's parameters."""
    shapes = expected_shapes(cfg)
    parts: dict[str, dict[str, Source]] = {}
    for ours, source in hf_sources(cfg, gpt2_prefix, fused_experts).items():
        parts.setdefault(source.name, {})[ours] = source
    tensors = {}
    for theirs, boxes in parts.items():
        first, source = next(iter(boxes.items()))
        rows = max(box.offset + shapes[ours][0] for ours, box in boxes.items())
        shape = (rows, *shapes[first][1:])
        shape = shape[::-1] if source.transposed else shape
        if source.expert is not None:
            shape = (1 + max(box.expert for box in boxes.values()), *shape)
        tensors[theirs] = (shape, boxes)
    return tensors


def their_index(source: Source, index: tuple[slice, ...]) -> tuple[int | slice, ...]:
    """The region of the Hugging Face tensor that holds region `index` of ours (slices with
    concrete start and stop): shifted by the offset, reversed when stored transposed, and
    led by the expert's index when they stack experts (which drops that dim)."""
    first = slice(index[0].start + source.offset, index[0].stop + source.offset)
    shifted = (first, *index[1:])
    shifted = shifted[::-1] if source.transposed else shifted
    return shifted if source.expert is None else (source.expert, *shifted)
