"""The reference model: a decoder-only transformer in one readable file.

Plain PyTorch, no parallelism inside: tensor and pipeline parallelism are applied from the
outside (`paraxis.parallelize`) by building a part of the model (a pipeline stage)
or replacing the modules named here (tensor parallelism), so this file stays a model you can
hold in your head.

Context parallelism is the one axis that reaches inside: under it a rank holds two chunks of
every sequence (`paraxis.parallel.context.chunks`), so its tokens' positions are not
0..s-1 and its attention needs the other ranks' keys. `Transformer.set_context_parallel`
hands the parts that care (positions, the attention core) a `SequenceSplit`; without one
(every layout with cp = 1) the code below runs exactly as on one device.

Document packing (`paraxis.parallel.context.packing`, `Transformer.set_packing`) keeps attention and
positions within each document of a window: the forward finds the documents from the token ids and
hands every block their mask (under context parallelism from the whole rows' ids, which the cp group
gathers: `packing.split_documents`).

Initialisation is a function of (seed, parameter name) alone (`init_parameter`): a pipeline
stage that builds only its own blocks, or a TP rank that fills only its shard, starts from
exactly the single-device weights.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from paraxis.kernels.activation import swiglu
from paraxis.kernels.embedding import Embedding
from paraxis.kernels.linear import project, stacked_layers
from paraxis.model.init_weights import init_parameter
from paraxis.parallel.context.attention import context_parallel_attention
from paraxis.parallel.context.chunks import positions as chunk_positions
from paraxis.parallel.context.hierarchical import CpLevels
from paraxis.parallel.context.packing import (
    Documents,
    find_documents,
    packed_attention,
    split_documents,
)
from paraxis.parallel.experts.layer import MoE
from paraxis.parallel.tensor.cross_entropy import VocabParallelCrossEntropy, linear_cross_entropy
from paraxis.spec.errors import ParaxisError
from paraxis.spec.kernels import RUNTIME_KERNEL
from paraxis.spec.model_config import ModelConfig


@dataclass(frozen=True)
class SequenceSplit:
    """This rank's share of every sequence under context parallelism: rank `rank` of the
    `size` ranks of `group` holds chunks rank and 2*size-1-rank of 2*size; attention
    brings the other ranks' K/V by `variant` ("ring", "all_gather" or
    "all_to_all": `context_parallel.balance.VARIANTS`)."""

    group: dist.ProcessGroup | None
    rank: int
    size: int
    variant: str = "ring"
    levels: CpLevels | None = None  # two-level cp (layout.cp_a2a): the attention's groups

    def positions(self, local_len: int, device: torch.device) -> torch.Tensor:
        """The global positions of this rank's `local_len` tokens, in local order."""
        return chunk_positions(local_len * self.size, self.rank, self.size, device=device)


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.style == "gpt2":
        return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
    return nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)


def rotary(x: torch.Tensor, theta: float, positions: torch.Tensor | None = None,
           *others: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Rotate pairs of channels by a position-dependent angle (RoPE, Su et al. 2021).

    x: (batch, heads, seq, head_dim); positions: each token's position (default 0..seq-1;
    a context-parallel rank's tokens sit elsewhere in the sequence; packed documents give
    (batch, 1, seq), each row's own). Uses the "rotate half" pairing (channel i with
    i + head_dim/2), as Llama's Hugging Face implementation does. `others` (the keys, after
    the queries) are rotated by the same angles, computed once; then all come back.
    """
    seq, head_dim = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=x.device,
                                            dtype=torch.float32) / head_dim)
    steps = (torch.arange(seq, device=x.device, dtype=torch.float32) if positions is None
             else positions.to(device=x.device, dtype=torch.float32))
    angles = steps.unsqueeze(-1) * inv_freq  # torch.outer's product, for any leading shape
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    rotated = tuple(_rotate(t, cos, sin) for t in (x, *others))
    return rotated if others else rotated[0]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class Attention(nn.Module):
    STACKED = ("q", "k", "v")  # projections of one input: one GEMM (`kernels.linear.project`)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.head_dim = cfg.head_dim
        bias = cfg.has_bias
        # Separate q/k/v weights: splitting them by heads for TP is then a plain slice; the
        # forward runs them as one GEMM (`kernels.linear.project`).
        self.q = nn.Linear(cfg.d_model, cfg.d_model, bias=bias)
        self.k = nn.Linear(cfg.d_model, cfg.kv_dim, bias=bias)
        self.v = nn.Linear(cfg.d_model, cfg.kv_dim, bias=bias)
        self.o = nn.Linear(cfg.d_model, cfg.d_model, bias=bias)
        self.recompute_core = False  # selective recompute (Korthikanti et al. 2022, sec. 4)
        self.split: SequenceSplit | None = None  # context parallelism (set_context_parallel)

    def forward(self, x: torch.Tensor, documents: Documents | None = None) -> torch.Tensor:
        batch, seq, _ = x.shape
        # Head counts come from the projection widths, so a TP rank that holds a slice of the
        # heads runs this same code.
        q, k, v = (t.view(batch, seq, -1, self.head_dim).transpose(1, 2)
                   for t in project(x, stacked_layers(self)))
        if self.recompute_core and torch.is_grad_enabled():
            out = checkpoint(self._core, q, k, v, documents, use_reentrant=False)
        else:
            out = self._core(q, k, v, documents)
        return self.o(out.transpose(1, 2).reshape(batch, seq, -1))

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              documents: Documents | None = None) -> torch.Tensor:
        if self.split is not None:
            return self._context_parallel_core(q, k, v, self.split, documents)
        if documents is not None:
            return self._packed_core(q, k, v, documents)
        if self.cfg.style == "llama":
            q, k = rotary(q, self.cfg.rope_theta, None, k)
        # The kernel is one fact shared with the planner (paraxis/spec/kernels.py): a
        # flash-style SDPA that keeps q, k, v, the output and the log-sum-exp for backward,
        # with grouped-query K and V at kv-head width (no copy repeated to every head).
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              enable_gqa=RUNTIME_KERNEL.kv_heads_native)

    def _packed_core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     documents: Documents) -> torch.Tensor:
        """Attention within each document: RoPE at the positions in the document, and the
        document mask (`packing.packed_attention`; the kernels: `paraxis.spec.kernels`)."""
        if self.cfg.style == "llama":
            positions = documents.positions.unsqueeze(1)  # (batch, 1, seq): every head
            q, k = rotary(q, self.cfg.rope_theta, positions, k)
        return packed_attention(q, k, v, documents, RUNTIME_KERNEL.kv_heads_native)

    def _context_parallel_core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               split: SequenceSplit, documents: Documents | None = None
                               ) -> torch.Tensor:
        """The same attention when this rank holds two chunks of each sequence: RoPE at the
        tokens' global positions (packed: their positions in their documents), the other
        chunks' K/V (kv-head width) from the cp group (packed: within each document)."""
        if self.cfg.style == "llama":
            positions = (split.positions(q.shape[2], q.device) if documents is None
                         else documents.positions.unsqueeze(1))
            q, k = rotary(q, self.cfg.rope_theta, positions, k)
        return context_parallel_attention(q, k, v, split.levels or split.group, split.variant,
                                          documents=None if documents is None
                                          else documents.cp_chunks)


class MLP(nn.Module):
    STACKED = ("gate", "up")  # SwiGLU's: one GEMM (`kernels.linear.project`)

    def __init__(self, cfg: ModelConfig, hidden: int | None = None) -> None:
        super().__init__()
        self.swiglu = cfg.style == "llama"
        bias = cfg.has_bias
        hidden = cfg.d_ff if hidden is None else hidden  # an expert has its own width
        self.up = nn.Linear(cfg.d_model, hidden, bias=bias)
        if self.swiglu:
            self.gate = nn.Linear(cfg.d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, cfg.d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            gate, up = project(x, stacked_layers(self))  # one GEMM
            return self.down(swiglu(gate, up))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class Block(nn.Module):
    """Attention then a feed-forward part: a dense MLP (`mlp`), or in a mixture of experts'
    routed blocks a router and experts (`moe`, paraxis/parallel/experts/layer.py)."""

    def __init__(self, cfg: ModelConfig, index: int = 0) -> None:
        super().__init__()
        self.norm1 = make_norm(cfg)
        self.attn = Attention(cfg)
        self.norm2 = make_norm(cfg)
        if cfg.is_moe_layer(index):
            self.moe = MoE(cfg, lambda width: MLP(cfg, width))
        else:
            self.mlp = MLP(cfg)
        self.recompute = False  # full recompute: keep only the block's input for backward

    def forward(self, x: torch.Tensor, documents: Documents | None = None) -> torch.Tensor:
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(self._forward, x, documents, use_reentrant=False)
        return self._forward(x, documents)

    def _forward(self, x: torch.Tensor, documents: Documents | None = None) -> torch.Tensor:
        x = self._attend(x, documents)
        feed_forward = self._modules["moe" if "moe" in self._modules else "mlp"]
        return x + feed_forward(self.norm2(x))

    def _attend(self, x: torch.Tensor, documents: Documents | None = None) -> torch.Tensor:
        """The attention half with its norm and residual: what `--compile` compiles in a
        routed block, whose experts' token counts depend on the data."""
        return x + self.attn(self.norm1(x), documents)


class Blocks(nn.ModuleList):
    """The model's blocks, registered under their global index: a part holding blocks 4-7
    names its parameters `blocks.5.attn.q.weight`, exactly as the whole model does, while
    iteration, len() and [i] (position in this part) behave like a list."""

    def __init__(self, blocks: dict[int, Block]) -> None:
        super().__init__()
        for index, block in blocks.items():
            self.add_module(str(index), block)

    def __getitem__(self, index: int) -> Block:  # type: ignore[override]
        return list(self._modules.values())[index]


def run_blocks(blocks: list[Block], x: torch.Tensor, documents: Documents | None
               ) -> torch.Tensor:
    """Blocks in a row: the region one grouped checkpoint recomputes."""
    for block in blocks:
        x = block(x, documents)
    return x


class Transformer(nn.Module):
    """The whole model, or a part of it: `blocks` (global indices, default all), with or
    without the embedding (`embed`) and the final norm, LM head and loss (`head`).

    A pipeline stage is such a part (`Transformer(cfg, blocks=range(4, 8), embed=False)`),
    an ordinary model object: tensor parallelism, recompute and checkpointing see the same
    attribute and parameter names as on one device. GPT-2 ties the LM head to the token
    embedding; a part with the head but not the embedding holds its own copy, marked
    `pp_duplicate` and initialised as `tok_emb.weight` (`single_device_name`), which the
    pipeline keeps equal to the first stage's (`pipeline_parallel.tied`).
    """

    def __init__(self, cfg: ModelConfig, blocks: range | None = None, embed: bool = True,
                 head: bool = True) -> None:
        super().__init__()
        self.cfg = cfg
        self.has_embedding = embed
        self.has_head = head
        self.split: SequenceSplit | None = None  # context parallelism (set_context_parallel)
        self.end_of_document: int | None = None  # document packing (set_packing)
        self.recompute_group = 1  # blocks per checkpoint under grouped full recompute
        # the LM head and loss as one kernel that never holds the logits (--fused-loss; one
        # device's whole vocabulary: tensor parallelism keeps the vocab-parallel loss)
        self.fused_loss = False
        if embed:
            self.tok_emb = Embedding(cfg.vocab_size, cfg.d_model)
            if cfg.learned_positions:
                self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        indices = range(cfg.n_layers) if blocks is None else blocks
        self.blocks = Blocks({index: Block(cfg, index) for index in indices})
        if head:
            self.norm_f = make_norm(cfg)
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            if cfg.tied_embeddings and embed:
                # GPT-2 ties the output projection to the token embedding (Press & Wolf
                # 2017): one Parameter, listed once by named_parameters() as tok_emb.weight.
                self.lm_head.weight = self.tok_emb.weight
            elif cfg.tied_embeddings:
                self.lm_head.weight.pp_duplicate = True  # counted once (dist/params.py)
            # the vocab-parallel loss on one device's whole vocabulary (paraxis.spec.kernels);
            # tensor parallelism swaps in one over its TP group
            self.loss_fn = VocabParallelCrossEntropy(None)

    # The three pieces a part may own: embed (first stage), blocks, head (last).

    def embed(self, idx: torch.Tensor, documents: Documents | None = None) -> torch.Tensor:
        x = self.tok_emb(idx)
        if self.cfg.learned_positions:
            if documents is not None:
                positions = documents.positions
            elif self.split is not None:
                positions = self.split.positions(idx.shape[1], idx.device)
            else:
                positions = torch.arange(idx.shape[1], device=idx.device)
            x = x + self.pos_emb(positions)
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm_f(x))

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None,
                tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids (with the embedding) or the residual stream in; the residual stream
        out, or with the head the logits, or the mean cross-entropy loss given targets.
        Packing: `tokens`, the ids the residual stream came from, tell a part without the
        embedding where the documents are; targets come masked (`packing.mask_targets`)."""
        documents = self.documents(x if self.has_embedding else tokens)
        if self.has_embedding:
            x = self.embed(x, documents)
        group = self.recompute_group
        if group > 1 and torch.is_grad_enabled():
            blocks = list(self.blocks)
            for first in range(0, len(blocks), group):
                x = checkpoint(run_blocks, blocks[first:first + group], x, documents,
                               use_reentrant=False)
        else:
            for block in self.blocks:
                x = block(x, documents)
        if not self.has_head:
            return x
        return self.head(x, targets)

    def head(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """The final norm, the LM head and, given targets, the loss: one region for
        `--compile`, which fuses the loss's passes over the logits."""
        if targets is not None and self.fused_loss:
            return linear_cross_entropy(self.norm_f(x), self.lm_head.weight, targets)
        logits = self.logits(x)
        return logits if targets is None else self.loss_fn(logits, targets)

    def documents(self, tokens: torch.Tensor | None) -> Documents | None:
        """The documents of `tokens` when packing (None otherwise)."""
        if self.end_of_document is None:
            return None
        if tokens is None:
            raise ParaxisError("a packed model part without the embedding needs the token ids "
                               "of its input: call it as part(x, tokens=ids)")
        if self.split is not None:  # a document may start in another cp rank's chunk
            split = self.split
            return split_documents(tokens, self.end_of_document, split.group, split.rank,
                                   split.size)
        return find_documents(tokens, self.end_of_document).ready()

    def set_packing(self, end_of_document: int | None) -> None:
        """Keep attention and positions within each document, documents ending at id
        `end_of_document` (None: the whole window is one sequence, the default)."""
        self.end_of_document = end_of_document

    def set_context_parallel(self, split: SequenceSplit | None) -> None:
        """Run on this rank's two chunks of every sequence (None: the whole sequence). The
        caller passes local token ids and targets (`chunks.local_part`); the loss is then
        the mean over the local tokens."""
        self.split = split
        for block in self.blocks:
            block.attn.split = split

    def set_recompute(self, mode: str, layers: int = 1, method: str = "uniform") -> None:
        """"none", "selective" (attention core only) or "full" (whole blocks). Full with
        `layers` > 1: one checkpoint per run of `layers` consecutive blocks of this part
        (Megatron-LM's uniform method, --recompute-num-layers): only each run's input is
        kept, and its backward recomputes the whole run at once (the course's sqrt(L) rule
        at layers = sqrt(L)). Full with `method` "block": only this part's first `layers`
        blocks are checkpoints, each its own, and the rest keep their activations
        (Megatron-LM's block method: recompute as few blocks as memory needs)."""
        block_method = mode == "full" and method == "block"
        for index, block in enumerate(self.blocks):
            block.recompute = mode == "full" and (index < layers if block_method
                                                  else layers == 1)
            block.attn.recompute_core = mode == "selective"
        self.recompute_group = layers if mode == "full" and not block_method else 1


def single_device_name(name: str, param: nn.Parameter) -> str:
    """The name a parameter has on one device: a part's copy of the tied embedding is
    `tok_emb.weight` (it is that tensor); every other name is already the same."""
    return "tok_emb.weight" if getattr(param, "pp_duplicate", False) else name


def single_device_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(single-device name, parameter) of every parameter of the model parts in `module` (a
    Transformer, or a container of pipeline parts), each once; a module holding no
    Transformer keeps its own names."""
    parts = [m for m in module.modules() if isinstance(m, Transformer)] or [module]
    seen: dict[int, tuple[str, nn.Parameter]] = {}
    for part in parts:
        for name, param in part.named_parameters():
            seen.setdefault(id(param), (single_device_name(name, param), param))
    return list(seen.values())


def single_device_buffers(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(single-device name, buffer) of every persistent buffer of the model parts in
    `module` (an MoE block's routing bias, `blocks.N.moe.expert_bias`): training state that
    is not a parameter, which checkpoints keep."""
    parts = [m for m in module.modules() if isinstance(m, Transformer)] or [module]
    return [(f"{prefix}.{key}" if prefix else key, buffer)
            for part in parts for prefix, sub in part.named_modules()
            for key, buffer in sub._buffers.items()
            if buffer is not None and key not in sub._non_persistent_buffers_set]


def parameter_shapes(cfg: ModelConfig, buffers: bool = False) -> dict[str, tuple[int, ...]]:
    """{single-device parameter name: shape} in the model's order, from the model built on
    the meta device (no memory); with `buffers`, then the buffers' too."""
    return dict(_shapes(cfg, buffers))


@functools.cache
def _shapes(cfg: ModelConfig, buffers: bool) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """`parameter_shapes`, built once a process for each model (a fifth of a second)."""
    with torch.device("meta"):
        model = Transformer(cfg)
    tensors = [*model.named_parameters(), *(single_device_buffers(model) if buffers else [])]
    return tuple((name, tuple(t.shape)) for name, t in tensors)


def state_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """`parameter_shapes` and the buffers' (`single_device_buffers`): every tensor of
    training state a checkpoint holds."""
    return parameter_shapes(cfg, buffers=True)


def init_parameters(model: nn.Module, cfg: ModelConfig, seed: int) -> None:
    for name, param in single_device_parameters(model):
        init_parameter(name, param, cfg, seed)


def build_model(cfg: ModelConfig, seed: int = 0, device: str | torch.device = "cpu",
                dtype: torch.dtype = torch.float32, blocks: range | None = None,
                embed: bool = True, head: bool = True) -> Transformer:
    """The model (or a part of it, see `Transformer`) with the seed's single-device weights."""
    model = Transformer(cfg, blocks, embed, head)
    init_parameters(model, cfg, seed)
    return model.to(device=device, dtype=dtype)
