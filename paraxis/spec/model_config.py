"""Model shapes: the one description of a decoder-only transformer.

Pure Python (no torch): the planner counts parameters and FLOPs from the same object the
runtime builds the model from, so `ModelConfig.num_params()` is checked against the real
`torch` model in the tests.

Two styles:
- "gpt2": LayerNorm, GELU MLP, learned positions, biases, LM head tied to the embedding.
- "llama": RMSNorm, SwiGLU MLP, rotary positions (RoPE), grouped-query attention, no biases,
  untied LM head.

A llama-style model may be a mixture of experts (`n_experts > 0`): each block past the first
`first_dense_layers` replaces its MLP by a router and `n_experts` SwiGLU experts of width
`d_ff_expert`, of which each token uses `top_k` (Mixtral: 8 experts, top 2), plus
`n_shared_experts` that every token uses (DeepSeek-MoE). `num_params()` counts every expert;
`num_active_params()` counts what one token touches, which is what its FLOPs follow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass

from paraxis.spec.errors import ParaxisError
from paraxis.spec.hashing import hash_once, state_unhashed

# ---------------------------------------------- the mixture-of-experts fields, checked


def check_experts(cfg: ModelConfig) -> None:
    """The mixture-of-experts fields of `cfg`, checked (one line naming the fix each)."""
    if not (cfg.expert_bias_rate >= 0 and math.isfinite(cfg.expert_bias_rate)):
        raise ParaxisError(f"expert_bias_rate must be >= 0 and finite, got "
                           f"{cfg.expert_bias_rate!r}; DeepSeek-V3 used 0.001")
    if cfg.router_score not in ("softmax", "sigmoid"):
        raise ParaxisError(f"router_score {cfg.router_score!r} is unknown; use softmax or "
                           "sigmoid")
    if not isinstance(cfg.expert_bias, bool):
        raise ParaxisError(f"expert_bias must be true or false, got {cfg.expert_bias!r}")
    values = (cfg.n_shared_experts, cfg.capacity_factor, cfg.aux_loss_coef, cfg.z_loss_coef)
    if min(values) < 0 or not all(map(finite, values)):
        raise ParaxisError("n_shared_experts, capacity_factor, aux_loss_coef and "
                           "z_loss_coef must be finite and >= 0")
    if cfg.n_experts == 0:
        if cfg.first_dense_layers:
            raise ParaxisError("first_dense_layers counts the blocks before the experts' and "
                               "needs n_experts > 0; drop it or set n_experts")
        if (cfg.expert_bias or cfg.route_groups or cfg.route_group_limit
                or cfg.router_score != "softmax"):
            raise ParaxisError("expert_bias, route_groups, route_group_limit and router_score "
                               "need a mixture of experts (n_experts > 0); drop them or set "
                               "n_experts")
        if cfg.top_k or cfg.n_shared_experts or cfg.d_ff_expert:
            raise ParaxisError("top_k, d_ff_expert and n_shared_experts need n_experts > 0; "
                               "set n_experts for a mixture of experts or drop them")
        return
    if cfg.style != "llama":
        raise ParaxisError("mixtures of experts are llama-style (SwiGLU experts); set style "
                           "llama or n_experts 0")
    for field in ("n_experts", "top_k", "d_ff_expert"):
        value = getattr(cfg, field)
        if not isinstance(value, int) or value < 1:
            raise ParaxisError(f"model {field}={value!r} must be a positive integer for a "
                               "mixture of experts")
    if cfg.top_k > cfg.n_experts:
        raise ParaxisError(f"top_k {cfg.top_k} exceeds n_experts {cfg.n_experts}; route "
                           "each token to at most n_experts experts")
    if not 0 <= cfg.first_dense_layers < cfg.n_layers:
        raise ParaxisError(f"first_dense_layers {cfg.first_dense_layers} must be within "
                           f"0..n_layers-1 ({cfg.n_layers - 1}): a mixture of experts needs "
                           "a block with experts")
    _check_groups(cfg)


def _check_groups(cfg: ModelConfig) -> None:
    groups, limit = cfg.route_groups, cfg.route_group_limit
    if not groups and not limit:
        return
    if not (isinstance(groups, int) and isinstance(limit, int) and 1 <= limit <= groups
            and cfg.n_experts % groups == 0):
        raise ParaxisError(f"route_groups {groups!r} must divide n_experts "
                           f"({cfg.n_experts}) and route_group_limit {limit!r} be within "
                           f"1..route_groups; e.g. route_groups 8, route_group_limit 4 "
                           "(DeepSeek-V3)")
    if cfg.top_k % limit or cfg.top_k // limit > cfg.n_experts // groups:
        raise ParaxisError(f"top_k {cfg.top_k} must be a multiple of route_group_limit "
                           f"{limit}, and top_k / route_group_limit at most a group's "
                           f"{cfg.n_experts // groups} experts (each kept group is scored "
                           "by its best top_k / route_group_limit experts)")


def routing_text(cfg: ModelConfig) -> str:
    """How a token picks its experts, in words: the scores, top-k, the groups, the bias."""
    how = f"top {cfg.top_k} of {cfg.n_experts} by {cfg.router_score} scores"
    if cfg.route_groups:
        how += (f", within the best {cfg.route_group_limit} of {cfg.route_groups} expert "
                "groups")
    if cfg.expert_bias:
        how += (f", chosen with the aux-loss-free routing bias (rate "
                f"{cfg.expert_bias_rate:g})")
    return how


# ------------------------------------------------------------------ model shapes

STYLES = ("gpt2", "llama")
MAX_LAYERS = 10_000
MAX_DIMENSION = 2**31  # any one width, count or length of a model


@dataclass(frozen=True)
class ModelConfig:
    __hash__ = hash_once  # a search hashes it in every cached price it asks for: once
    __getstate__ = state_unhashed

    name: str
    style: str
    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    max_seq_len: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # Mixture of experts (all zero: a dense model). See paraxis/parallel/experts/layer.py.
    n_experts: int = 0  # routed experts per MoE block
    top_k: int = 0  # experts each token is routed to
    d_ff_expert: int = 0  # hidden width of one expert (and of one shared expert)
    n_shared_experts: int = 0  # experts every token goes through (DeepSeek-MoE)
    first_dense_layers: int = 0  # the first blocks keep a dense MLP of width d_ff
    capacity_factor: float = 0.0  # 0: dropless; else tokens per expert <= cf * T * k / E
    aux_loss_coef: float = 0.01  # load-balancing loss weight (Switch Transformer eq. 4)
    z_loss_coef: float = 0.0  # router z-loss weight (ST-MoE eq. 5; Megatron --moe-z-loss-coeff)
    # aux-loss-free balancing (DeepSeek-V3 Sec. 2.1.2; parallel/experts/layer.py): a routing
    # bias per expert, moved by expert_bias_rate after every step (DeepSeek-V3: 0.001, then 0
    # for its last 500B tokens: the rate may change when a run resumes; 0 freezes the bias)
    expert_bias: bool = False
    expert_bias_rate: float = 0.001
    # the router's scores: "softmax" over the experts (Mixtral) or "sigmoid" per expert
    # (DeepSeek-V3 eq. 15), the chosen ones' renormalised to weights either way
    router_score: str = "softmax"
    # group-limited routing (DeepSeek-V3's node-limited routing; Megatron-LM's
    # --moe-router-num-groups / --moe-router-group-topk): experts cut into route_groups equal
    # groups, each token chooses inside its best route_group_limit of them (0: no groups)
    route_groups: int = 0
    route_group_limit: int = 0

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ParaxisError(f"model style {self.style!r} is unknown; use gpt2 or llama")
        for field in ("vocab_size", "n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff",
                      "max_seq_len"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ParaxisError(f"model {field}={value!r} must be a positive integer")
            if value > MAX_DIMENSION:  # past it the planner's float arithmetic overflows
                raise ParaxisError(f"model {field}={value:.3g} is over {MAX_DIMENSION:,}; give "
                                   "the model's real size")
        if self.n_layers > MAX_LAYERS:  # every planner and memory check walks the layers
            raise ParaxisError(f"model n_layers={self.n_layers:,} is over {MAX_LAYERS:,} (the "
                               "largest published models have under 200); give the model's "
                               "real layer count")
        for field, meaning in (("norm_eps", "the epsilon under a norm's square root"),
                               ("rope_theta", "rotary positions' base")):
            value = getattr(self, field)
            if not isinstance(value, int | float) or not finite(value) or value <= 0:
                raise ParaxisError(f"model {field}={value!r} must be a positive number "
                                   f"({meaning}); the default is {getattr(ModelConfig, field)}")
        if self.d_model % self.n_heads:
            raise ParaxisError(f"d_model {self.d_model} is not divisible by n_heads "
                               f"{self.n_heads}; choose n_heads dividing d_model (head size "
                               "d_model / n_heads)")
        if self.n_heads % self.n_kv_heads:
            raise ParaxisError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads "
                               f"{self.n_kv_heads}; choose n_kv_heads dividing n_heads")
        if self.style == "llama" and self.head_dim % 2:
            raise ParaxisError(f"a llama-style head of {self.head_dim} dimensions (d_model "
                               f"{self.d_model} / n_heads {self.n_heads}) is odd, and rotary "
                               "positions rotate pairs of dimensions; choose an even head size")
        if self.style == "gpt2" and self.n_kv_heads != self.n_heads:
            raise ParaxisError("gpt2-style models use n_kv_heads == n_heads; set them equal or "
                               "use style llama for grouped-query attention")
        check_experts(self)

    # --------------------------------------------------------------- derived shape facts

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def tied_embeddings(self) -> bool:
        return self.style == "gpt2"

    @property
    def has_bias(self) -> bool:
        return self.style == "gpt2"

    @property
    def learned_positions(self) -> bool:
        return self.style == "gpt2"

    def check_seq_len(self, seq_len: int) -> None:
        """Learned positions end at the table's length; rotary positions do not (long-context
        training takes a RoPE model past its pretraining context: Llama 3.1 8K -> 128K)."""
        if seq_len > self.max_seq_len and self.learned_positions:
            raise ParaxisError(f"--seq-len {seq_len} is over {self.name}'s context of "
                               f"{self.max_seq_len} (learned positions); use --seq-len "
                               f"{self.max_seq_len} or less")

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def is_moe_layer(self, index: int) -> bool:
        """Block `index` routes its tokens to experts (else it has a dense MLP)."""
        return self.is_moe and index >= self.first_dense_layers

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.first_dense_layers if self.is_moe else 0

    def expert_params(self) -> int:
        """One routed (or shared) expert: a SwiGLU MLP of width d_ff_expert."""
        return 3 * self.d_model * self.d_ff_expert

    def moe_replicated_params(self) -> int:
        """An MoE block's feed-forward parameters that every EP rank holds: the router and
        the shared experts (the routed experts are split over ep)."""
        return self.d_model * self.n_experts + self.n_shared_experts * self.expert_params()

    def layer_params(self, index: int = 0, active: bool = False) -> int:
        """Parameters of transformer block `index` (all its experts, or with `active` the
        ones one token uses: top_k routed plus the shared)."""
        d, kv = self.d_model, self.kv_dim
        attn = d * d + 2 * d * kv + d * d  # q, k, v, o projections
        if self.style == "gpt2":
            attn += d + 2 * kv + d  # their biases
            mlp = 2 * d * self.d_ff + self.d_ff + d  # up and down, with biases
            norms = 2 * 2 * d  # two LayerNorms, weight and bias
        elif self.is_moe_layer(index):
            routed = self.top_k if active else self.n_experts
            mlp = self.moe_replicated_params() + routed * self.expert_params()
            norms = 2 * d
        else:
            mlp = 3 * d * self.d_ff  # gate, up, down (SwiGLU)
            norms = 2 * d  # two RMSNorms, weight only
        return attn + mlp + norms

    def blocks_params(self, active: bool = False) -> int:
        return sum(self.layer_params(i, active) for i in range(self.n_layers))

    def embedding_params(self) -> int:
        """Token (and learned position) embedding."""
        positions = self.max_seq_len * self.d_model if self.learned_positions else 0
        return self.vocab_size * self.d_model + positions

    def head_params(self) -> int:
        """Final norm plus the LM head (zero extra when tied to the embedding)."""
        final_norm = 2 * self.d_model if self.style == "gpt2" else self.d_model
        lm_head = 0 if self.tied_embeddings else self.vocab_size * self.d_model
        return final_norm + lm_head

    def num_params(self) -> int:
        return self.embedding_params() + self.blocks_params() + self.head_params()

    def num_active_params(self) -> int:
        """Parameters one token passes through (equal to num_params for a dense model)."""
        return self.embedding_params() + self.blocks_params(active=True) + self.head_params()

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    def shape_key(self) -> str:
        """A short hash of every field but the name: what the model is, whatever it is
        called (a calibration measured at its shapes is this model's, and only its)."""
        fields = {k: v for k, v in self.to_dict().items() if k != "name"}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]

    def replace(self, **changes: object) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    # ---------------------------------------------------------------------- lookup

    @classmethod
    def from_dict(cls, data: dict[str, object], source: str = "model description") -> ModelConfig:
        if not isinstance(data, dict):
            raise ParaxisError(f"{source}: a model description is a table of key = value "
                               f"(a JSON object), not a {type(data).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ParaxisError(f"{source}: unknown key(s) {', '.join(unknown)}; known keys are "
                               f"{', '.join(sorted(fields))}")
        data = dict(data)
        data.setdefault("name", source)
        if data.get("style") == "gpt2":
            data.setdefault("n_kv_heads", data.get("n_heads"))
        missing = sorted(f for f in ("style", "vocab_size", "n_layers", "d_model", "n_heads",
                                     "n_kv_heads", "d_ff", "max_seq_len") if f not in data)
        if missing:
            raise ParaxisError(f"{source}: missing key(s) {', '.join(missing)}")
        _check_types(data, source)
        return cls(**data)  # type: ignore[arg-type]


def finite(value: float) -> bool:
    """math.isfinite, and False for an integer too large for a float (10**400), where
    isfinite raises."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _check_types(data: dict[str, object], source: str) -> None:
    """Each value of the field's type: a string norm_eps or `n_layers: true` (a bool is an
    int in Python, so that trained one layer) is named, not trained with."""
    for f in dataclasses.fields(ModelConfig):
        if f.name not in data:
            continue
        value, kind = data[f.name], f.type
        ok = (isinstance(value, str) if kind == "str" else
              isinstance(value, bool) if kind == "bool" else
              isinstance(value, int) and not isinstance(value, bool) if kind == "int" else
              isinstance(value, int | float) and not isinstance(value, bool)
              and finite(value))
        if not ok:
            raise ParaxisError(f"{source}: {f.name} = {value!r} must be {_KIND_WORDS[kind]}")


_KIND_WORDS = {"str": "a string", "int": "a whole number (not true/false or a quoted number)",
               "float": "a finite number (not a quoted one)", "bool": "true or false"}


def _gpt2(name: str, layers: int, d: int, heads: int, vocab: int = 50304,
          seq: int = 1024) -> ModelConfig:
    return ModelConfig(name, "gpt2", vocab, layers, d, heads, heads, 4 * d, seq)


def _llama(name: str, layers: int, d: int, heads: int, kv: int, ff: int, vocab: int,
           seq: int, theta: float = 10000.0) -> ModelConfig:
    return ModelConfig(name, "llama", vocab, layers, d, heads, kv, ff, seq, 1e-5, theta)


# Byte-level vocabulary (256) for the small configs, so the demo needs no tokenizer download.
# Real sizes use their published shapes (GPT-2 vocab padded to 50304 as Megatron/nanoGPT do).
PRESETS: dict[str, ModelConfig] = {c.name: c for c in (
    ModelConfig("tiny", "gpt2", 256, 4, 64, 4, 4, 256, 128),
    ModelConfig("tiny-llama", "llama", 256, 4, 64, 4, 2, 192, 128),
    ModelConfig("small", "gpt2", 256, 6, 256, 8, 8, 1024, 256),
    ModelConfig("small-llama", "llama", 256, 6, 256, 8, 4, 704, 256),
    _gpt2("gpt2-124m", 12, 768, 12),
    _gpt2("gpt2-350m", 24, 1024, 16),
    _gpt2("gpt2-774m", 36, 1280, 20),
    _gpt2("gpt2-1.5b", 48, 1600, 25),
    _gpt2("gpt3-175b", 96, 12288, 96, vocab=51200, seq=2048),
    _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
    _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
    _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 500000.0),
    _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 500000.0),
    _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192, 500000.0),
)}
PRESETS["llama-7b"] = PRESETS["llama2-7b"].replace(name="llama-7b")


def _moe(base: ModelConfig, name: str, experts: int, top_k: int, d_ff_expert: int,
         shared: int = 0, dense: int = 0) -> ModelConfig:
    return base.replace(name=name, n_experts=experts, top_k=top_k, d_ff_expert=d_ff_expert,
                        n_shared_experts=shared, first_dense_layers=dense)


# Mixtures of experts. tiny-moe has Mixtral's form (every block routed, top 2, no shared
# expert, d_ff = d_ff_expert as Mixtral's config.json has one width); tiny-moe-shared adds
# DeepSeek-MoE's shared expert and a first dense block.
# Published shapes: Mixtral (Jiang et al. 2024; config.json of mistralai/Mixtral-8x7B-v0.1 and
# 8x22B-v0.1) and DeepSeek-V3 (DeepSeek-AI 2024, Table/Sec. 4.2: 61 layers, 256 routed experts
# of width 2048 plus 1 shared, top 8, first 3 blocks dense). DeepSeek's multi-head latent
# attention is modelled as plain 128-head attention (about the same parameters per layer:
# 205M here, 187M for MLA); its MTP module is not modelled. Its routing (Sec. 2.1.2, 4.2:
# sigmoid scores, 8 groups of which a token uses 4, the aux-loss-free bias at 0.001) is
# router_score "sigmoid", route_groups 8, route_group_limit 4, expert_bias true; the
# preset keeps Mixtral's softmax routing, as the held-out runs priced with it (NeMo
# AutoModel's, with a forced-balanced gate) did not route that way.
for _config in (
    _moe(ModelConfig("tiny-moe", "llama", 256, 4, 64, 4, 2, 96, 128), "tiny-moe", 8, 2, 96),
    _moe(ModelConfig("tiny-moe", "llama", 256, 4, 64, 4, 2, 192, 128), "tiny-moe-shared",
         8, 2, 48, shared=1, dense=1),
    _moe(_llama("", 32, 4096, 32, 8, 14336, 32000, 32768, 1e6), "mixtral-8x7b", 8, 2, 14336),
    _moe(_llama("", 56, 6144, 48, 8, 16384, 32768, 65536, 1e6), "mixtral-8x22b", 8, 2, 16384),
    _moe(_llama("", 61, 7168, 128, 128, 18432, 129280, 4096, 10000.0), "deepseek-v3-style",
         256, 8, 2048, shared=1, dense=3),
):
    PRESETS[_config.name] = _config


def model_from_params(num_params: float, seq_len: int = 2048,
                      vocab_size: int = 51200) -> ModelConfig:
    """A generic GPT-style shape for a parameter count (`paraxis plan --params 7e9`).

    Width follows the aspect ratio d_model / n_layers = 128 shared by GPT-3 175B (12288/96) and
    Llama-2 7B (4096/32); a block holds 12 d_model^2 parameters (Kaplan et al. 2020, Sec. 2.1).
    Width is a multiple of 1024 past 1024 so the heads (of 128) divide by tp up to 8.
    """
    if not 1e6 <= num_params <= 1e13:  # nan fails both
        raise ParaxisError(f"--params {num_params:g} must be a number within 1e6..1e13 "
                           "(10 trillion: 5x the largest model published)")
    # 12 L d^2 = N with d = 128 L  ->  L = (N / (12 * 128^2))^(1/3)
    d_model = 128 * (num_params / (12 * 128**2)) ** (1 / 3)
    step = 1024 if d_model >= 1024 else 128
    d_model = max(step, round(d_model / step) * step)
    per_layer = 12 * d_model**2 + 13 * d_model
    n_layers = max(1, round((num_params - vocab_size * d_model) / per_layer))
    return ModelConfig(f"generic-{num_params / 1e9:g}b", "gpt2", vocab_size, n_layers, d_model,
                       d_model // 128, d_model // 128, 4 * d_model, seq_len)
