"""Hugging Face config.json <-> paraxis ModelConfig, for Llama, Mixtral and GPT-2.

`hf_model_config` reads a Hugging Face directory's config.json into a ModelConfig;
`config_json` writes one back.

Reading refuses, in one line naming the file, every setting the reference model
(`paraxis.model.transformer`) cannot reproduce: RoPE scaling, partial rotary, biases or a tied head
on Llama, exact GELU or unusual attention scaling on GPT-2, a sliding window shorter than the
sequences or router noise on Mixtral. Writing spells RoPE's theta both ways (transformers 5 nests it
in rope_parameters), and refuses a mixture of experts Mixtral's format cannot hold (shared experts,
dense blocks). Pure Python, like `paraxis.spec.model_config`.
"""

from __future__ import annotations

import json
from pathlib import Path

from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import ModelConfig, finite

ARCHITECTURES = {"LlamaForCausalLM": "llama", "MixtralForCausalLM": "mixtral",
                 "GPT2LMHeadModel": "gpt2"}


def read_hf_config(path: Path) -> dict[str, object]:
    """config.json -> the ModelConfig fields it describes; refuses what paraxis's model
    cannot express."""
    if not path.is_dir():
        raise ParaxisError(f"{path} is not a directory; give a Hugging Face model directory "
                           "(config.json + model.safetensors)")
    source = path / "config.json"
    doc = read_json(source)
    _check_number_types(doc, source)
    # hand-written configs sometimes name only the model_type ("llama", "mixtral", "gpt2")
    names = doc.get("architectures")
    if names is not None and not (isinstance(names, list)
                                  and all(isinstance(n, str) for n in names)):
        raise ParaxisError(f"{source}: architectures = {_shown(names)} must be a list of class "
                           'names, e.g. ["LlamaForCausalLM"]; fix config.json')
    arch = (names or [doc.get("model_type")])[0]
    style = ARCHITECTURES.get(arch) or (arch if arch in ARCHITECTURES.values() else None)
    if style is None:
        raise ParaxisError(f"{source}: architecture {arch!r} is not supported; paraxis "
                           f"imports {', '.join(ARCHITECTURES)}")
    build = {"llama": _llama_config, "mixtral": _mixtral_config, "gpt2": _gpt2_config}[style]
    return build(doc, source, path.resolve().name)


# The keys read as counts and as real numbers; a value of another type (a quoted "4", a
# boolean) is named in one line before anything computes with it.
WHOLE_NUMBER_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "intermediate_size", "max_position_embeddings",
                     "head_dim", "n_embd", "n_layer", "n_head", "n_positions", "n_inner",
                     "num_local_experts", "num_experts_per_tok", "sliding_window")
REAL_NUMBER_KEYS = ("rms_norm_eps", "layer_norm_epsilon", "rope_theta", "router_aux_loss_coef",
                    "router_jitter_noise", "partial_rotary_factor")


# The keys whose null means what transformers makes of it: as many KV heads as heads, no
# window, hidden_size / heads, 4 x n_embd. Any other number key is a number when present.
NULL_MEANS_DEFAULT = ("num_key_value_heads", "sliding_window", "head_dim", "n_inner")
ROPE_KEYS = ("rope_parameters", "rope_scaling")  # objects holding rope_theta and its kin
BOOLEAN_KEYS = ("attention_bias", "mlp_bias", "tie_word_embeddings", "scale_attn_weights",
                "scale_attn_by_inverse_layer_idx", "add_cross_attention")


def _check_number_types(doc: dict, source: Path, where: str = "") -> None:
    for key in WHOLE_NUMBER_KEYS:
        value = doc.get(key, 0)
        if (value is not None or key not in NULL_MEANS_DEFAULT) and (
                not isinstance(value, int) or isinstance(value, bool)):
            raise ParaxisError(f"{source}: {where}{key} = {_shown(value)} must be a whole "
                               "number (not null, a quoted number or true/false); fix "
                               "config.json")
    for key in REAL_NUMBER_KEYS:
        value = doc.get(key, 0.0)
        if not isinstance(value, int | float) or isinstance(value, bool) or not finite(value):
            raise ParaxisError(f"{source}: {where}{key} = {_shown(value)} must be a finite "
                               "number; fix config.json")
    for key in BOOLEAN_KEYS:
        if key in doc and not isinstance(doc[key], bool):
            raise ParaxisError(f"{source}: {where}{key} = {_shown(doc[key])} must be true or "
                               "false; fix config.json")
    for key in ROPE_KEYS if not where else ():
        rope = doc.get(key)
        if rope is not None and not isinstance(rope, dict):
            raise ParaxisError(f"{source}: {key} = {_shown(rope)} must be an object "
                               "(rope_type, rope_theta, ...) or null; fix config.json")
        _check_number_types(rope or {}, source, f"{key}.")


def _shown(value: object) -> str:
    return "null" if value is None else repr(value)


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
                        "plain Llama/Mixtral/GPT-2 architecture imports")


# What transformers assumes for a key config.json leaves out (LlamaConfig, MixtralConfig).
LLAMA_DEFAULTS = {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                  "num_key_value_heads": None}  # None: as many as the attention heads
MIXTRAL_DEFAULTS = {"max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-5,
                    "rope_theta": 1e6, "num_key_value_heads": 8}


def _llama_config(doc: dict, source: Path, name: str,
                  defaults: dict[str, object] = LLAMA_DEFAULTS) -> dict[str, object]:
    d_model, heads = _need(doc, source, "hidden_size"), _need(doc, source, "num_attention_heads")
    if heads < 1:
        raise ParaxisError(f"{source}: num_attention_heads = {heads} must be at least 1; fix "
                           "config.json")
    if doc.get("hidden_act", "silu") not in ("silu", "swish"):
        raise unsupported(source, f"hidden_act {doc['hidden_act']!r} (SwiGLU needs silu)")
    for flag in ("attention_bias", "mlp_bias", "tie_word_embeddings"):
        if doc.get(flag):
            raise unsupported(source, f"{flag}=true")
    if doc.get("head_dim") not in (None, d_model // heads):
        raise unsupported(source, f"head_dim {doc['head_dim']} != hidden_size / heads")
    # transformers >= 5 nests theta in rope_parameters; older files use rope_theta and
    # rope_scaling. Anything but plain RoPE (linear, dynamic, yarn, llama3 scaling) is refused.
    for key in ROPE_KEYS:  # transformers merges the two spellings: neither may scale
        given = doc.get(key) or {}
        rope_type = given.get("rope_type", given.get("type", "default"))
        if rope_type != "default":
            raise unsupported(source, f"rope scaling {rope_type!r} ({key})")
    rope = doc.get("rope_parameters") or doc.get("rope_scaling") or {}
    if rope.get("partial_rotary_factor", doc.get("partial_rotary_factor", 1.0)) != 1.0:
        raise unsupported(source, "partial_rotary_factor != 1")
    theta = rope.get("rope_theta", doc.get("rope_theta", defaults["rope_theta"]))
    return dict(
        name=name, style="llama", vocab_size=_need(doc, source, "vocab_size"),
        n_layers=_need(doc, source, "num_hidden_layers"), d_model=d_model, n_heads=heads,
        n_kv_heads=heads if (kv := doc.get("num_key_value_heads", defaults[
            "num_key_value_heads"])) is None else kv,
        d_ff=_need(doc, source, "intermediate_size"),
        max_seq_len=doc.get("max_position_embeddings", defaults["max_position_embeddings"]),
        norm_eps=float(doc.get("rms_norm_eps", defaults["rms_norm_eps"])),
        rope_theta=float(theta))


def _mixtral_config(doc: dict, source: Path, name: str) -> dict[str, object]:
    """Llama's attention and norms, and in every block a router (softmax, top-k,
    renormalise: what `paraxis.parallel.experts.layer.MoE.route` does) over `num_local_experts`
    SwiGLU
    experts of width `intermediate_size`."""
    fields = _llama_config(doc, source, name, MIXTRAL_DEFAULTS)
    window, longest = doc.get("sliding_window"), fields["max_seq_len"]
    if window is not None:  # paraxis trains RoPE models past max_position_embeddings too
        hint = (" (a window of max_position_embeddings or more changes nothing up to that "
                "length)" if window >= longest else "")
        raise unsupported(source, f"sliding_window {window} (paraxis attends to the whole "
                          f"sequence, at any --seq-len); set sliding_window to null{hint}")
    if doc.get("router_jitter_noise"):
        raise unsupported(source, f"router_jitter_noise {doc['router_jitter_noise']} (paraxis "
                          "routes without noise); set it to 0")
    # router_aux_loss_coef is the coefficient whether or not output_router_logits asks
    # transformers to add the loss; paraxis always adds it (0 turns it off).
    return {**fields, "n_experts": _need(doc, source, "num_local_experts"),
            "top_k": _need(doc, source, "num_experts_per_tok"), "d_ff_expert": fields["d_ff"],
            "aux_loss_coef": float(doc.get("router_aux_loss_coef", 0.001))}


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
        n_kv_heads=heads, d_ff=4 * d_model if doc.get("n_inner") is None else doc["n_inner"],
        max_seq_len=_need(doc, source, "n_positions"),
        norm_eps=float(doc.get("layer_norm_epsilon", 1e-5)))


# ------------------------------------------------------------------------------ writing


def config_json(cfg: ModelConfig) -> dict:
    """The config.json transformers reads `cfg` from: GPT-2, Llama, or Mixtral for a mixture
    of experts (refused in one line when Mixtral's format cannot hold it)."""
    if cfg.style == "gpt2":
        return gpt2_json(cfg)
    return mixtral_json(cfg) if cfg.is_moe else llama_json(cfg)


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


def check_mixtral_form(cfg: ModelConfig) -> None:
    """Refuse, in one line naming the change, an MoE model Mixtral's format cannot hold."""
    if cfg.n_shared_experts:
        raise ParaxisError(f"model {cfg.name} has n_shared_experts={cfg.n_shared_experts}, "
                           "but Mixtral's format (MixtralForCausalLM) has no shared experts; "
                           "export a model with n_shared_experts 0")
    if cfg.first_dense_layers:
        raise ParaxisError(f"model {cfg.name} has first_dense_layers={cfg.first_dense_layers}, "
                           "but every block of Mixtral's format (MixtralForCausalLM) routes to "
                           "experts; export a model with first_dense_layers 0")
    if cfg.router_score != "softmax" or cfg.route_groups:
        raise ParaxisError(f"model {cfg.name} routes with router_score={cfg.router_score} and "
                           f"route_groups={cfg.route_groups}, but Mixtral's format routes by a "
                           "softmax over all experts; export a model with router_score softmax "
                           "and route_groups 0")
    if cfg.expert_bias:
        raise ParaxisError(f"model {cfg.name} routes with a per-expert bias (expert_bias "
                           "true), but Mixtral's format has no routing bias "
                           "and would choose other experts; export a model trained without it")


def mixtral_json(cfg: ModelConfig) -> dict:
    """Llama's fields with the experts': intermediate_size is one expert's width. There is no
    capacity factor in Mixtral's format: transformers routes every token (dropless)."""
    check_mixtral_form(cfg)
    llama = {k: v for k, v in llama_json(cfg).items() if k not in ("attention_bias", "mlp_bias")}
    return {
        **llama, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
        "intermediate_size": cfg.d_ff_expert, "num_local_experts": cfg.n_experts,
        "num_experts_per_tok": cfg.top_k, "router_aux_loss_coef": cfg.aux_loss_coef,
        "output_router_logits": False, "router_jitter_noise": 0.0, "sliding_window": None,
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


def hf_model_config(path: Path) -> ModelConfig:
    """A Hugging Face model directory -> its ModelConfig (config.json, read by `read_hf_config`;
    a shape the model cannot take is an error naming the file)."""
    fields = read_hf_config(path)
    try:
        return ModelConfig(**fields)  # type: ignore[arg-type]
    except ParaxisError as error:
        raise ParaxisError(f"{path / 'config.json'}: {error}") from None
