"""The vocab-parallel loss: equal to the plain cross-entropy, and no tensor of full logits.

Two independent witnesses: every tensor any op produces during the head + loss (forward and
backward, seen by a dispatch mode), and every tensor autograd saves (saved_tensors_hooks).
"""

import weakref

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from paraxis.dist.testing import on_ranks
from paraxis.model.transformer import build_model
from paraxis.parallel.tensor import apply_tensor_parallel
from paraxis.parallel.tensor.cross_entropy import (
    VocabParallelCrossEntropy,
    vocab_parallel_cross_entropy,
)
from paraxis.spec.model_config import PRESETS


class LargestTensor(TorchDispatchMode):
    """Remember the largest tensor (in elements) that any op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.numel = max(self.numel, leaf.numel())
        return out


@on_ranks("tp=2")
def test_loss_equals_cross_entropy_and_its_gradient(ctx):
    rank, tp = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 16, generator=generator) * 4
    targets = torch.randint(0, 16, (3, 5), generator=generator)
    full = logits.clone().requires_grad_()
    F.cross_entropy(full.view(-1, 16), targets.view(-1)).backward()
    shard = logits.chunk(tp, dim=-1)[rank].clone().requires_grad_()
    loss = vocab_parallel_cross_entropy(shard, targets, dist.group.WORLD)
    loss.backward()
    expected = F.cross_entropy(logits.view(-1, 16), targets.view(-1))
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)
    torch.testing.assert_close(shard.grad, full.grad.chunk(tp, dim=-1)[rank], rtol=1e-5,
                               atol=1e-7)


@on_ranks("tp=2")
def test_full_logits_never_exist_in_the_loss(ctx):
    cfg = PRESETS["tiny-llama"]  # untied head: vocab 256, d_model 64
    tp = dist.get_world_size()
    model = apply_tensor_parallel(build_model(cfg, seed=0), dist.group.WORLD)
    batch, seq = 4, 32
    hidden = torch.randn(batch, seq, cfg.d_model, requires_grad=True)
    targets = torch.randint(0, cfg.vocab_size, (batch, seq))
    shard_numel = batch * seq * cfg.vocab_size // tp
    saved: list[int] = []
    with LargestTensor() as largest, torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(t.numel()) or t, lambda t: t):
        logits = model.logits(hidden)
        assert logits.shape == (batch, seq, cfg.vocab_size // tp)
        model.loss_fn(logits, targets).backward()
    assert largest.numel == shard_numel  # the logits shard is the largest tensor made
    assert max(saved) == shard_numel  # and the largest kept for backward
    assert batch * seq * cfg.vocab_size > shard_numel


class Alive(TorchDispatchMode):
    """The most bytes held at once by the tensors ops return, while the caller keeps them."""

    def __init__(self) -> None:
        super().__init__()
        self.alive, self.peak = {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.untyped_storage().nbytes():
                storage = leaf.untyped_storage()
                key = storage.data_ptr()
                if key not in self.alive:
                    self.alive[key] = (storage.nbytes(), weakref.ref(leaf))
        self.alive = {k: v for k, v in self.alive.items() if v[1]() is not None}
        self.peak = max(self.peak, sum(size for size, _ in self.alive.values()))
        return out


def _bf16_logits(monkeypatch, vocab: int, chunk: int, seed: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """4 x 16 bf16 logits of `vocab` and their targets, one of them ignored, with the loss
    cut into chunks of `chunk` tokens."""
    import paraxis.parallel.tensor.cross_entropy as kernel

    monkeypatch.setattr(kernel, "chunk_rows", lambda width: chunk)
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randn(4, 16, vocab, generator=generator) * 3).bfloat16().requires_grad_()
    targets = torch.randint(0, vocab, (4, 16), generator=generator)
    targets[seed % 4, 3] = -100
    return logits, targets


def test_the_loss_holds_its_logits_their_gradient_and_one_chunk(monkeypatch):
    """paraxis.spec.kernels on one device: bf16 logits in, the loss and gradient of
    F.cross_entropy on their fp32 values (over several chunks), and at most the logits'
    gradient and one chunk's fp32 workspace made at once beside the logits."""
    rows, vocab, chunk = 64, 96, 16
    logits, targets = _bf16_logits(monkeypatch, vocab, chunk, seed=1)
    expected = F.cross_entropy(logits.float().view(-1, vocab), targets.view(-1))
    (want,) = torch.autograd.grad(expected, logits)
    with Alive() as alive:
        loss = vocab_parallel_cross_entropy(logits, targets, None)
        (grad,) = torch.autograd.grad(loss, logits)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)
    assert grad.dtype == torch.bfloat16
    torch.testing.assert_close(grad, want, rtol=0, atol=0)
    # the gradient (bf16) and one fp32 chunk, plus per-token vectors; the old kernel made an
    # fp32 copy of all the logits (4x the bf16 logits' bytes) before anything else
    logits_bytes = rows * vocab * 2
    assert alive.peak <= logits_bytes + chunk * vocab * 4 * 2 + 64 * rows * 4


def test_the_models_loss_writes_the_gradient_over_its_logits(monkeypatch):
    """The model's loss (`VocabParallelCrossEntropy`, whose logits the head made for it
    alone): the same gradient, written over the logits a chunk at a time, so nothing of the
    logits' size is made beside them; called as a function, the logits are left as given."""
    rows, vocab, chunk = 64, 512, 8
    given, targets = _bf16_logits(monkeypatch, vocab, chunk, seed=4)
    before = given.detach().clone()
    (want,) = torch.autograd.grad(vocab_parallel_cross_entropy(given, targets, None), given)
    assert torch.equal(given, before)  # a function's caller keeps its logits as they were
    logits = given.detach() * 1  # made for the loss, as the head's are
    logits.requires_grad_()
    with Alive() as alive:
        loss = VocabParallelCrossEntropy(None)(logits, targets)
        (grad,) = torch.autograd.grad(loss, logits)
    assert torch.equal(grad, want)
    assert grad.untyped_storage().data_ptr() == logits.untyped_storage().data_ptr()
    # the logits (their views count them), one fp32 chunk and per-token vectors: no second
    # logits' worth (148,996 bytes, the logits twice, as a function; 83,808 here)
    logits_bytes = rows * vocab * 2
    assert alive.peak <= logits_bytes + chunk * vocab * 4 + 64 * rows * 4 < 2 * logits_bytes


def test_the_compiled_loss_is_the_same_loss():
    """Under `--compile` the loss runs as whole-tensor expressions the compiler fuses (no fp32
    chunks): the loss and gradient of F.cross_entropy on the fp32 values, ignored targets
    too, in one graph."""
    generator = torch.Generator().manual_seed(2)
    targets = torch.randint(0, 101, (3, 37), generator=generator)
    targets[0, :5] = -100
    compiled = torch.compile(lambda z, t: vocab_parallel_cross_entropy(z, t, None),
                             fullgraph=True, backend="aot_eager")  # traced, eager kernels
    for dtype in (torch.float32, torch.bfloat16):
        logits = (torch.randn(3, 37, 101, generator=generator) * 3).to(dtype).requires_grad_()
        loss = compiled(logits, targets)
        (grad,) = torch.autograd.grad(loss, logits)
        expected = F.cross_entropy(logits.float().view(-1, 101), targets.view(-1))
        (want,) = torch.autograd.grad(expected, logits)
        torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)
        assert grad.dtype == dtype
        torch.testing.assert_close(grad, want, rtol=1e-6, atol=1e-8)
