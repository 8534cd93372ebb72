"""Hugging Face config.json <-> paraxis ModelConfig, for Llama and GPT-2.

Reading gives the ModelConfig fields as a dict (`model_config.hf_model_config` builds the
ModelConfig from them), so this module needs ModelConfig only as a type and the import runs
one way: `model_config` reads a Hugging Face directory through this module.

Reading refuses, in one line naming the file, every setting the reference model
(`paraxis.model`) cannot reproduce: RoPE scaling, partial rotary, biases or a tied head on
Llama, exact GELU or unusual attention scaling on GPT-2. Writing spells RoPE's theta both
ways (transformers 5 nests it in rope_parameters). Pure Python, like `paraxis.model_config`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from paraxis.errors import ParaxisError

if TYPE_CHECKING:
    from paraxis.model_config import ModelConfig

ARCHITECTURES = {"LlamaForCausalLM": "llama", "GPT2LMHeadModel": "gpt2"}


def read_hf_config(path: Path) -> dict[str, object]:
    """config.json -> the ModelConfig fields it describes; refuses what paraxis's model
    cannot express."""
    if not path.is_dir():
        raise ParaxisError(f"{path} is not a directory; give a Hugging Face model directory "
                           "(config.json + model.safetensors)")
    source = path / "config.json"
    doc = read_json(source)
    # hand-written configs sometimes name only the model_type ("llama", "gpt2")
    arch = (doc.get("architectures") or [doc.get("model_type")])[0]
    style = ARCHITECTURES.get(arch) or (arch if arch in ARCHITECTURES.values() else None)
    if style is None:
        raise ParaxisError(f"{source}: architecture {arch!r} is not supported; paraxis "
                           f"imports {' and '.join(ARCHITECTURES)}")
    build = _llama_config if style == "llama" else _gpt2_config
    return build(doc, source, path.resolve().name)


def read_json(path: Path) -> dict:
    """A JSON object from `path`, or a one-line error naming the file."""
    if not path.is_file():
        raise ParaxisError(f"{path} does not exist; a Hugging Face model directory holds "
                           "config.json next to its weights")
    try:
        doc = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise ParaxisError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(doc, dict):
        raise ParaxisError(f"{path} must hold a JSON object")
    return doc


def _need(doc: dict, source: Path, key: str) -> object:
    if key not in doc:
        raise ParaxisError(f"{source}: missing key {key!r}")
    return doc[key]


def unsupported(source: Path, what: str) -> ParaxisError:
    return ParaxisError(f"{source}: {what} is not supported by paraxis's model; only the "
                        "plain Llama/GPT-2 architecture imports")


def _llama_config(doc: dict, source: Path, name: str) -> dict[str, object]:
    d_model, heads = _need(doc, source, "hidden_size"), _need(doc, source, "num_attention_heads")
    if doc.get("hidden_act", "silu") not in ("silu", "swish"):
        raise unsupported(source, f"hidden_act {doc['hidden_act']!r} (SwiGLU needs silu)")
    for flag in ("attention_bias", "mlp_bias", "tie_word_embeddings"):
        if doc.get(flag):
            raise unsupported(source, f"{flag}=true")
    if doc.get("head_dim") not in (None, d_model // heads):
        raise unsupported(source, f"head_dim {doc['head_dim']} != hidden_size / heads")
    # transformers >= 5 nests theta in rope_parameters; older files use rope_theta and
    # rope_scaling. Anything but plain RoPE (linear, dynamic, yarn, llama3 scaling) is refused.
    rope = doc.get("rope_parameters") or doc.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise unsupported(source, f"rope scaling {rope_type!r}")
    if rope.get("partial_rotary_factor", doc.get("partial_rotary_factor", 1.0)) != 1.0:
        raise unsupported(source, "partial_rotary_factor != 1")
    theta = rope.get("rope_theta", doc.get("rope_theta", 10000.0))
    return dict(
        name=name, style="llama", vocab_size=_need(doc, source, "vocab_size"),
        n_layers=_need(doc, source, "num_hidden_layers"), d_model=d_model, n_heads=heads,
        n_kv_heads=doc.get("num_key_value_heads") or heads,
        d_ff=_need(doc, source, "intermediate_size"),
        max_seq_len=doc.get("max_position_embeddings", 2048),
        norm_eps=float(doc.get("rms_norm_eps", 1e-6)), rope_theta=float(theta))


def _gpt2_config(doc: dict, source: Path, name: str) -> dict[str, object]:
    # gelu_new and gelu_pytorch_tanh are both the tanh approximation; exact gelu is not.
    act = doc.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        raise unsupported(source, f"activation_function {act!r} (paraxis uses tanh GELU)")
    if not doc.get("scale_attn_weights", True) or doc.get("scale_attn_by_inverse_layer_idx"):
        raise unsupported(source, "attention scaling other than 1/sqrt(head_dim)")
    if doc.get("add_cross_attention"):
        raise unsupported(source, "add_cross_attention=true")
    if not doc.get("tie_word_embeddings", True):
        raise unsupported(source, "tie_word_embeddings=false")
    d_model = _need(doc, source, "n_embd")
    heads = _need(doc, source, "n_head")
    return dict(
        name=name, style="gpt2", vocab_size=_need(doc, source, "vocab_size"),
        n_layers=_need(doc, source, "n_layer"), d_model=d_model, n_heads=heads,
        n_kv_heads=heads, d_ff=doc.get("n_inner") or 4 * d_model,
        max_seq_len=_need(doc, source, "n_positions"),
        norm_eps=float(doc.get("layer_norm_epsilon", 1e-5)))


# ------------------------------------------------------------------------------ writing


def llama_json(cfg: ModelConfig) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
        # both spellings: transformers >= 5 reads rope_parameters, older ones rope_theta
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
        "bos_token_id": None, "eos_token_id": None,
    }


def gpt2_json(cfg: ModelConfig) -> dict:
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg.vocab_size, "n_positions": cfg.max_seq_len, "n_embd": cfg.d_model,
        "n_layer": cfg.n_layers, "n_head": cfg.n_heads, "n_inner": cfg.d_ff,
        "activation_function": "gelu_new", "layer_norm_epsilon": cfg.norm_eps,
        # paraxis's model has no dropout; zero keeps a transformers fine-tune the same model
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "scale_attn_weights": True, "tie_word_embeddings": True,
        "bos_token_id": None, "eos_token_id": None,
    }
