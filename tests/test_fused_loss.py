"""`--fused-loss`: the LM head and the loss as one kernel that never holds the logits
(`parallel.tensor.cross_entropy.linear_cross_entropy`): the same loss and gradients as the
head followed by F.cross_entropy, eager and compiled; no tensor as large as the logits; the
same training as the unfused head; refused where it cannot run."""

from __future__ import annotations

import re
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import paraxis.parallel.tensor.cross_entropy as kernel
import paraxis.spec.kernels as spec_kernels
from paraxis.dist.groups import build_groups
from paraxis.dist.testing import gpu_count, run_distributed
from paraxis.kernels.accumulate import add_matmul_
from paraxis.parallel.tensor.cross_entropy import linear_cross_entropy
from paraxis.parallelize import build_engine
from paraxis.spec.errors import ParaxisError
from paraxis.spec.kernels import check_fused_loss
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.runtime_options import RuntimeOptions
from tests.test_tp_loss import LargestTensor

VOCAB, WIDTH = 101, 32


def _inputs(dtype: torch.dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 20, WIDTH, generator=generator).to(dtype).requires_grad_()
    w = (torch.randn(VOCAB, WIDTH, generator=generator) / 6).to(dtype).requires_grad_()
    targets = torch.randint(0, VOCAB, (2, 20), generator=generator)
    targets[0, :3] = -100  # ignored: in neither the mean nor the gradient
    return x, w, targets


def _unfused(x, w, targets):
    logits = (x.float() @ w.float().t()).view(-1, VOCAB)
    return F.cross_entropy(logits, targets.view(-1))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_fused_loss_is_the_head_and_cross_entropy(monkeypatch, compiled):
    monkeypatch.setattr(kernel, "chunk_rows", lambda width: 7)  # 40 tokens: 6 chunks
    # aot_eager: traced as torch.compile traces it (the compiled branch's expressions), run
    # by eager kernels, so the suite pays no code generation for it
    fused = torch.compile(linear_cross_entropy, fullgraph=True, backend="aot_eager") \
        if compiled else linear_cross_entropy
    for dtype, tolerance in ((torch.float32, 1e-6), (torch.bfloat16, 2e-2)):
        x, w, targets = _inputs(dtype)
        loss = fused(x, w, targets)
        grads = torch.autograd.grad(loss * 2.5, (x, w))  # a scaled loss scales both
        expected = _unfused(x, w, targets)
        wants = torch.autograd.grad(expected * 2.5, (x, w))
        torch.testing.assert_close(loss.float(), expected, rtol=tolerance, atol=1e-6)
        for grad, want in zip(grads, wants, strict=True):
            assert grad.dtype == dtype
            torch.testing.assert_close(grad.float(), want.float(), rtol=tolerance,
                                       atol=tolerance * want.abs().max().item())


def test_fused_loss_never_makes_the_logits(monkeypatch):
    """One chunk's logits at most: the unfused head makes (tokens x vocab) at once."""
    monkeypatch.setattr(kernel, "chunk_rows", lambda width: 8)
    x, w, targets = _inputs(torch.float32)
    with LargestTensor() as largest:
        linear_cross_entropy(x, w, targets).backward()
    assert largest.numel == max(8 * VOCAB, VOCAB * WIDTH)
    assert 40 * VOCAB > largest.numel


def test_compiled_fused_loss_holds_one_chunks_logits_at_a_time(monkeypatch):
    """Compiled (inductor's own code, not aot_eager), the chunks run one after another: no
    chunk's gradient waits for a reduction over every target, which the compiler fuses into
    the last chunk's pass, so that every chunk's logits were alive at once."""
    from tools.probes.fused_loss_peak import inputs, peak_and_grads

    # 500 tokens: 5 chunks (5.4 chunks' logits alive at the peak when they waited; 2.4 now)
    monkeypatch.setattr(kernel, "chunk_rows", lambda width: 100)
    x, w, targets = inputs(500, 2048, 32)
    peak, grads = peak_and_grads(x, w, targets, compiled=True)
    chunk, logits = 100 * 2048 * 4, 500 * 2048 * 4
    assert peak < 3.5 * chunk < logits, (peak, chunk)
    F.cross_entropy(x @ w.t(), targets).backward()
    torch.testing.assert_close(grads, (x.grad, w.grad), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_planner_prices_the_eager_forwards_peak(monkeypatch, dtype):
    """What the eager fused forward makes and holds at once is what the planner holds for
    the loss at the backward's start: `spec.kernels.fused_loss_bytes` (the fp32 dL/dW and
    the saved dL/dx, fp32 under fp16, with one chunk's logits and workspace or the chunks'
    dL/dx joined, and no second chunk's logits alive) and, in 16 bits, the head's gradient,
    the size of dL/dW's cast beside its fp32 sum at the forward's end (a wide vocabulary:
    the peak, as on Llama 3): an upper bound by the chunk's or the cast's bytes, which are
    not alive at once. Counted op by op (`_Alive`); add_matmul_'s product on a CPU is not,
    as CUDA adds in the GEMM's epilogue."""
    from paraxis.spec.kernels import fused_loss_bytes

    for tokens, vocab, width, rows in ((64, 1024, 32, 4), (256, 1024, 32, 16),
                                       (256, 128, 8, 16)):
        monkeypatch.setattr(kernel, "chunk_rows", lambda _, rows=rows: rows)
        monkeypatch.setattr(spec_kernels, "chunk_rows", lambda _, rows=rows: rows)
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(tokens, width, generator=generator).to(dtype).requires_grad_()
        w = torch.randn(vocab, width, generator=generator).to(dtype).requires_grad_()
        targets = torch.randint(0, vocab, (tokens,), generator=generator)
        with _Alive(x, w, targets) as alive:
            linear_cross_entropy(x, w, targets)
        e = x.element_size()
        saved = 4 if dtype == torch.float16 else e
        priced = fused_loss_bytes(tokens, vocab, width, e, saved) \
            + (saved * vocab * width if saved < 4 else 0)  # the head's gradient
        vectors = 64 * tokens  # a few per-token numbers: losses, masks, targets
        assert 0.75 * priced <= alive.peak <= priced + vectors, (tokens, vocab, alive.peak,
                                                                priced)


class _Alive(TorchDispatchMode):
    """The most bytes the tensors ops make hold at once (a storage counted while a tensor
    of it lives; the inputs' own storages and what an op makes inside itself unseen)."""

    def __init__(self, *inputs: torch.Tensor) -> None:
        super().__init__()
        self.inputs = {t.untyped_storage().data_ptr() for t in inputs}
        self.alive: dict[int, tuple[int, weakref.ref]] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                storage = leaf.untyped_storage()
                if storage.data_ptr() not in self.inputs:
                    self.alive.setdefault(storage.data_ptr(),
                                          (storage.nbytes(), weakref.ref(leaf)))
        self.alive = {k: v for k, v in self.alive.items() if v[1]() is not None}
        self.peak = max(self.peak, sum(size for size, _ in self.alive.values()))
        return out


def test_evaluation_makes_no_gradients(monkeypatch):
    """Without autograd (evaluation) the fused loss is the chunked logits' mean loss alone:
    one GEMM a chunk, no dL/dx nor fp32 dL/dW."""
    monkeypatch.setattr(kernel, "chunk_rows", lambda width: 8)
    x, w, targets = _inputs(torch.float32)
    with torch.no_grad(), _Ops() as ops:
        loss = linear_cross_entropy(x, w, targets)
    assert ops.names.count("aten.mm") == 5 and "paraxis.add_matmul_" not in ops.names
    torch.testing.assert_close(loss, _unfused(x, w, targets))


class _Ops(TorchDispatchMode):
    """The ops run, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def test_compiled_fused_loss_adds_each_chunks_weight_gradient_in_turn(monkeypatch):
    """Compiled, each chunk's share of dL/dW is made, added into the one fp32 sum and freed
    before the next chunk's (`kernels.accumulate`), all into one buffer: the compiler does
    not wait to add them in one pass (on CUDA it kept every chunk's vocabulary x width
    product alive for it) nor copy the sum."""
    from torch._inductor.utils import run_and_get_code

    monkeypatch.setattr(kernel, "chunk_rows", lambda width: 7)  # 40 tokens: 6 chunks
    torch._dynamo.reset()
    fused = torch.compile(linear_cross_entropy, fullgraph=True)
    x, w, targets = _inputs(torch.float32)
    _, codes = run_and_get_code(lambda: fused(x, w, targets).backward())
    code = "\n".join(codes)  # the forward's graph and the backward's
    # the buffer each call adds into (the last chunk's may be a view of it)
    sums = re.findall(r"ops\.paraxis\.add_matmul_\.default\((?:reinterpret_tensor\()?(\w+)",
                      code)
    assert len(sums) == 6 and len(set(sums)) == 1, sums
    grads = x.grad, w.grad
    x.grad = w.grad = None
    _unfused(x, w, targets).backward()
    torch.testing.assert_close(grads, (x.grad, w.grad), rtol=1e-5, atol=1e-7)


def _add_matmul_errors(device: str) -> list[float]:
    """add_matmul_ on `device` for (accumulator, inputs) dtypes (fp32, fp32), (fp32, bf16),
    (bf16, bf16): the accumulator's change against the exact product (fp64), over its size.
    Each call adds into the tensor it was given (the GEMM's epilogue, or an add after it)."""
    generator = torch.Generator().manual_seed(5)
    a64, b64 = torch.randn(64, 96, generator=generator, dtype=torch.float64), \
        torch.randn(96, 48, generator=generator, dtype=torch.float64)
    start = torch.randn(64, 48, generator=generator, dtype=torch.float64)
    errors = []
    for acc_dtype, dtype in ((torch.float32, torch.float32), (torch.float32, torch.bfloat16),
                             (torch.bfloat16, torch.bfloat16)):
        a, b = a64.to(device, dtype), b64.to(device, dtype)
        acc = start.to(device, acc_dtype)
        before = acc.data_ptr()
        add_matmul_(acc, a.t().contiguous().t(), b)  # a transposed view, as the loss gives
        assert acc.data_ptr() == before and acc.dtype == acc_dtype
        exact = start + a.double().cpu() @ b.double().cpu()
        errors.append(((acc.double().cpu() - exact).norm() / exact.norm()).item())
    return errors


def test_add_matmul_sums_into_its_accumulator_in_its_dtype():
    fp32, bf16_into_fp32, bf16 = _add_matmul_errors("cpu")
    assert fp32 < 1e-6 and bf16_into_fp32 < 4e-3 and bf16 < 8e-3, (fp32, bf16_into_fp32, bf16)


@pytest.mark.skipif(gpu_count() == 0, reason="needs a CUDA GPU")
def test_on_a_gpu_add_matmul_adds_bf16_products_into_fp32_in_the_gemm():
    """On CUDA the fp32 sum of bf16 products is cuBLAS's epilogue (`addmm(out_dtype=fp32)`):
    the product is never rounded to bf16, which alone costs the CPU's product-then-add about
    1.7e-3 of the sum here. In a spawned rank (the suite's process sees no GPU)."""
    (gpu,) = run_distributed(_add_matmul_errors, 1, ("cuda",), device="cuda")
    assert gpu[0] < 1e-5 and gpu[1] < 1e-5 and gpu[2] < 8e-3, gpu


def test_fused_loss_trains_as_the_unfused_head():
    """Three fp32 steps of a GPT-2 (tied embedding) and a Llama model: the same losses and
    gradient norms, and weights equal to fp32 rounding."""
    for name in ("tiny", "tiny-llama"):
        cfg = PRESETS[name]
        generator = torch.Generator().manual_seed(3)
        tokens = torch.randint(0, cfg.vocab_size, (4, 17), generator=generator)
        x, y = tokens[:, :-1], tokens[:, 1:]
        runs = []
        for fused in (False, True):
            layout = Layout.parse("microbatches=2")
            engine = build_engine(cfg, layout, build_groups(layout), "cpu", seed=0,
                                  options=RuntimeOptions(fused_loss=fused))
            numbers = []
            for _ in range(3):
                loss, norm = engine.train_step(x, y, 1e-2, 1.0)
                numbers += [float(loss), float(norm)]
                engine.zero_grad()
            runs.append((numbers, [p.detach().clone() for p in engine.model.parameters()]))
        assert runs[1][0] == pytest.approx(runs[0][0], rel=1e-5), name
        for fused_param, param in zip(runs[1][1], runs[0][1], strict=True):
            torch.testing.assert_close(fused_param, param, rtol=1e-5, atol=1e-6)


def test_fused_loss_is_refused_where_it_cannot_run():
    check_fused_loss(1, 2)
    with pytest.raises(ParaxisError, match="tp=2 splits it"):
        check_fused_loss(2, 0)
    with pytest.raises(ParaxisError, match="ZeRO-3"):
        check_fused_loss(1, 3)


def test_the_planner_prices_what_the_fused_loss_keeps():
    """GPU.loss_kernel "fused-linear": the last stage keeps dL/dx, an fp32 dL/dW and one
    chunk instead of the logits and their gradient; where the runtime refuses the fused loss
    (tp > 1, ZeRO-3) the planner prices the chunked one."""
    from paraxis.plan.hardware import build_cluster
    from paraxis.plan.memory import layout_memory
    from paraxis.spec.kernels import fused_loss_bytes, loss_bytes

    cfg, seq, micro = PRESETS["gpt2-124m"], 1024, 8
    tokens = seq * micro
    for text, fused in (("dp=1", True), ("tp=2", False), ("dp=2,zero=3", False)):
        layout = Layout.parse(text)
        chunked = layout_memory(cfg, layout, seq, micro)["activations"]
        priced = layout_memory(cfg, layout, seq, micro,
                               loss_kernel="fused-linear")["activations"]
        saved = loss_bytes(tokens, cfg.vocab_size, 2) - fused_loss_bytes(
            tokens, cfg.vocab_size, cfg.d_model, 2)
        assert chunked - priced == pytest.approx(saved if fused else 0.0), text
    assert saved > 5e8  # GPT-2's 50K vocabulary at 8K tokens: over half a GB
    with pytest.raises(ParaxisError, match="loss_kernel='fast' is unknown"):
        build_cluster("h100-sxm-80gb", 1, 1, {"loss_kernel": "fast"})


def test_the_planner_prices_the_fused_loss_s_fp32_weight_gradient_passes():
    """The fused head and loss add each chunk's dL/dW into one fp32 tensor (read and written
    a chunk) and do all their GEMMs in the forward: the planner's head takes as long as the
    chunked one's plus those bytes at the GPU's memory rate, the forward holding all but the
    backward's scaling; where the runtime refuses the fused loss (tp > 1), nothing changes.
    Llama 3's head at 8K tokens: 16 chunks, 79 GB a step (the docstring's figure)."""
    from paraxis.plan.hardware import build_cluster
    from paraxis.plan.head import head_times
    from paraxis.plan.rates import layer_rates
    from paraxis.spec.kernels import chunk_rows, fused_loss_traffic

    cfg = PRESETS["llama3-8b"]
    assert -(-8192 // chunk_rows(cfg.vocab_size)) == 16
    assert sum(fused_loss_traffic(8192, cfg.vocab_size, cfg.d_model, 2)) / 1e9 == \
        pytest.approx(79, abs=0.5)
    for text, fused in (("dp=1", True), ("dp=2,zero=2", True), ("tp=2", False)):
        layout = Layout.parse(text)
        plain, priced = (head_times(cfg, layout, build_cluster("h200", 1, 8, {
            "kernels": "compiled", "loss_kernel": kernel}), 2, 4096)
            for kernel in ("chunked", "fused-linear"))
        if not fused:
            assert priced == plain, text
            continue
        hbm = layer_rates(build_cluster("h200", 1, 8), 1)[2]
        forward, backward = fused_loss_traffic(8192, cfg.vocab_size, cfg.d_model, 2)
        assert priced["forward"] == pytest.approx(
            plain["forward"] + plain["backward"] + forward / hbm), text
        assert priced["backward"] == pytest.approx(backward / hbm), text
        assert priced["forward"] + priced["backward"] > 1.1 * (
            plain["forward"] + plain["backward"])
    # in fp32 the fp32 dL/dW is cast to nothing
    assert fused_loss_traffic(8192, cfg.vocab_size, cfg.d_model, 4)[0] == pytest.approx(
        cfg.vocab_size * cfg.d_model * (4 + 8 * 16 + 8) + 8192 * cfg.d_model * 16)
    # ZeRO-3 refuses the fused head: priced unfused, the same alone or after ZeRO-2 in a memo
    from paraxis.plan.cost import evaluate

    fused = build_cluster("h200", 1, 8, {"loss_kernel": "fused-linear"})
    zero3 = Layout.parse("dp=8,zero=3")
    alone = evaluate(cfg, zero3, fused, 4096, 16).step_time_s
    memo: dict = {}
    evaluate(cfg, Layout.parse("dp=8,zero=2"), fused, 4096, 16, memo=memo)
    assert evaluate(cfg, zero3, fused, 4096, 16, memo=memo).step_time_s == alone


def test_paraxis_plan_prices_the_fused_loss_when_asked():
    """`paraxis plan --fused-loss`: the runtime's flag, priced as the hardware file's
    loss_kernel = "fused-linear" is."""
    from paraxis.plan.inputs import PlanInputs

    common = {"model": "gpt2-124m", "gpus": 1, "gpu": "h200", "global_batch": 16,
              "seq_len": 1024}
    plain, fused = (PlanInputs(**common, fused_loss=flag).cluster() for flag in (False, True))
    assert plain.gpu.loss_kernel == "chunked" and fused.gpu.loss_kernel == "fused-linear"


def test_a_search_for_the_fused_loss_keeps_to_layouts_that_run_it():
    """`paraxis plan --fused-loss` and `paraxis train --layout auto --fused-loss` search only
    tp=1 and ZeRO 0-2, where the runtime runs the fused loss; asking for more is refused."""
    from paraxis.plan.hardware import build_cluster
    from paraxis.plan.search import Constraints, search

    cfg = PRESETS["llama2-7b"]
    cluster = build_cluster("h100-sxm-80gb", 8, 8)
    free = search(cfg, cluster, 4096, 64)
    assert any(e.layout.tp > 1 or e.layout.zero == 3 for e in free.ranked)
    fused = search(cfg, cluster, 4096, 64, Constraints(fused_loss=True))
    assert fused.ranked and all(e.layout.tp == 1 and e.layout.zero < 3 for e in fused.ranked)
    for limits in ({"tp": 2}, {"zero": 3}):
        with pytest.raises(ParaxisError, match="--fused-loss"):
            Constraints(fused_loss=True, **limits)


def test_the_docs_figures_of_the_fused_loss():
    """docs/precision.md's size of the unfused head's logits (their gradient over them), and
    docs/gpu/README.md's planner saving, for GPT-2 124M at 16 x 1024 in bf16: read from the
    docs' text and recomputed here."""
    import re
    from pathlib import Path

    from paraxis.plan.memory import layout_memory

    docs = Path(__file__).resolve().parents[1] / "docs"
    cfg, seq, micro = PRESETS["gpt2-124m"], 1024, 16
    precision = " ".join((docs / "precision.md").read_text().split())
    held = float(re.search(r"in bf16: ([\d.]+) GB for GPT-2 124M at 16 x 1024", precision)[1])
    assert held == round(2 * seq * micro * cfg.vocab_size / 1e9, 1)
    gpu = " ".join((docs / "gpu" / "README.md").read_text().split())
    saved = float(re.search(r"([\d.]+) GiB less at GPT-2 124M's 16 x 1024", gpu)[1])
    chunked = layout_memory(cfg, Layout(), seq, micro)["activations"]
    fused = layout_memory(cfg, Layout(), seq, micro, loss_kernel="fused-linear")["activations"]
    assert saved == round((chunked - fused) / 2**30, 1)
