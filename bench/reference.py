"""The compiled reference: the same models written as plainly and as fast as PyTorch allows.

What paraxis's one-GPU step is judged against (`bench/gpu.py`): the best single-device
training loop one can write in plain PyTorch, in the style of nanoGPT and torchtitan's
Llama. One GEMM for q, k and v (and for SwiGLU's gate and up), SDPA (flash or cuDNN on a
GPU), `F.cross_entropy` on the logits, fp32 parameters under bf16 autocast, torch's fused
AdamW, clipping without a host sync, and `torch.compile` of the whole model. It reads a
paraxis ModelConfig, so both sides train the same shapes, but shares no code with paraxis.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from paraxis.spec.model_config import ModelConfig


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.qkv = nn.Linear(cfg.d_model, cfg.d_model + 2 * cfg.kv_dim, bias=cfg.has_bias)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.has_bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
                ) -> torch.Tensor:
        batch, seq, _ = x.shape
        cfg = self.cfg
        q, k, v = self.qkv(x).split([cfg.d_model, cfg.kv_dim, cfg.kv_dim], dim=-1)
        q = q.view(batch, seq, cfg.n_heads, cfg.head_dim).transpose(1, 2)
        k = k.view(batch, seq, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        v = v.view(batch, seq, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=cfg.n_kv_heads != cfg.n_heads)
        return self.out(y.transpose(1, 2).reshape(batch, seq, cfg.d_model))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.swiglu = cfg.style == "llama"
        width = 2 * cfg.d_ff if self.swiglu else cfg.d_ff
        self.up = nn.Linear(cfg.d_model, width, bias=cfg.has_bias)  # gate and up together
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.has_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            gate, up = self.up(x).chunk(2, dim=-1)
            return self.down(F.silu(gate) * up)
        return self.down(F.gelu(self.up(x), approximate="tanh"))


def norm(cfg: ModelConfig) -> nn.Module:
    if cfg.style == "gpt2":
        return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
    return nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm1, self.attn = norm(cfg), Attention(cfg)
        self.norm2, self.mlp = norm(cfg), MLP(cfg)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
                ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope)
        return x + self.mlp(self.norm2(x))


class Reference(nn.Module):
    """A decoder-only transformer (GPT-2 or Llama style) for one device."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model) if (
            cfg.learned_positions) else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm_f = norm(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tied_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        seq = idx.shape[1]
        x = self.tok_emb(idx)
        positions = torch.arange(seq, device=idx.device)
        rope = None
        if self.pos_emb is not None:
            x = x + self.pos_emb(positions)
        else:
            inv_freq = 1.0 / self.cfg.rope_theta ** (torch.arange(
                0, self.cfg.head_dim, 2, device=idx.device, dtype=torch.float32)
                / self.cfg.head_dim)
            angles = torch.outer(positions.float(), inv_freq)
            angles = torch.cat((angles, angles), dim=-1)
            rope = (angles.cos().to(x.dtype), angles.sin().to(x.dtype))
        for block in self.blocks:
            x = block(x, rope)
        logits = self.lm_head(self.norm_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def float8(model: Reference) -> Reference | None:
    """The reference with torchao's float8 training (tensorwise scales, as torchtitan's
    default) on every block GEMM, the LM head left in bf16 as torchtitan and paraxis leave it;
    None where torchao is not installed."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError:
        return None
    config = Float8LinearConfig.from_recipe_name("tensorwise")
    return convert_to_float8_training(model, config=config,
                                      module_filter_fn=lambda _, name: name != "lm_head")


def reference_adamw(model: nn.Module, lr: float = 1e-3) -> torch.optim.AdamW:
    """The plain loop's optimizer: torch's fused AdamW, decay 0.1 on matrices only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True)


def training_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float,
                  lr: float = 1e-3, compile: bool = True,
                  loss_of: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
                  | None = None) -> Callable[[], None]:
    """One step as a careful plain loop runs it: bf16 autocast forward and backward (on a
    GPU), clipping on the device (no host sync), fused AdamW with decay on matrices.
    `loss_of(model, x, y)`: the model's loss, where it is not `model(x, y)` (transformers)."""
    autocast = torch.bfloat16 if x.device.type == "cuda" else None
    forward_backward, rest = training_phases(model, x, y, clip, lr, compile, loss_of, autocast)

    def step() -> None:
        forward_backward()
        rest()

    return step


def training_phases(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float,
                    lr: float = 1e-3, compile: bool = True,
                    loss_of: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
                    | None = None, autocast: torch.dtype | None = torch.bfloat16
                    ) -> tuple[Callable[[], None], Callable[[], None]]:
    """`training_step` in its two phases: (forward and backward under `autocast`, None for
    none; the rest: clipping, AdamW, zero_grad)."""
    optimizer = reference_adamw(model, lr)
    forward = torch.compile(model) if compile else model
    loss_of = loss_of or (lambda m, a, b: m(a, b))
    device = x.device.type

    def forward_backward() -> None:
        with torch.autocast(device, dtype=autocast or torch.bfloat16,
                            enabled=autocast is not None):
            loss = loss_of(forward, x, y)
        loss.backward()

    def rest() -> None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return forward_backward, rest


def hf_model(cfg: ModelConfig) -> tuple[nn.Module, Callable] | None:
    """The same model as Hugging Face transformers builds it (GPT2LMHeadModel, or
    LlamaForCausalLM with SDPA attention), and how to get its loss; None where transformers
    is not installed."""
    try:
        import transformers
    except ImportError:
        return None
    if cfg.style == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=cfg.vocab_size, n_positions=cfg.max_seq_len, n_embd=cfg.d_model,
            n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.d_ff,
            activation_function="gelu_new", layer_norm_epsilon=cfg.norm_eps,
            attn_implementation="sdpa", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
            num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
            num_key_value_heads=cfg.n_kv_heads, max_position_embeddings=cfg.max_seq_len,
            rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta, tie_word_embeddings=False,
            attn_implementation="sdpa")
        model = transformers.LlamaForCausalLM(config)

    def loss_of(forward: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # labels are the inputs shifted inside the model; pass the next tokens already
        # shifted through its plain logits instead, the same loss as the other sides
        logits = forward(input_ids=x, use_cache=False).logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), y.reshape(-1))

    return model, loss_of
