"""Document packing (`paraxis.parallel.context.packing`, `--pack-documents`): a packed window never
attends across documents, positions restart per document, the target after an end-of-document
input is masked, and every layout trains the same numbers as one device."""

import functools
import json
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_mask

from paraxis.dist.testing import RankContext, gpu_count, run_distributed, run_on_ranks
from paraxis.engine.contract import LocalEngine
from paraxis.files.model_file import load_model_config
from paraxis.model.transformer import build_model
from paraxis.parallel.context.chunks import local_part
from paraxis.parallel.context.packing import (
    IGNORE_INDEX,
    counted_targets,
    find_documents,
    flex_attention_within,
    loss_weights,
    mask_targets,
    packed_attention,
    weigh,
)
from paraxis.parallel.tensor.cross_entropy import vocab_parallel_cross_entropy
from paraxis.parallelize import build_engine
from paraxis.spec.layout import Layout
from paraxis.spec.runtime_options import RuntimeOptions
from paraxis.train.config import RunConfig

EOS = 0  # the byte tokenizer's end-of-document id


def documents_row(lengths: list[int], seed: int = 0) -> list[torch.Tensor]:
    """Documents of the given lengths (ids 1..255), each ended by EOS."""
    g = torch.Generator().manual_seed(seed)
    return [torch.cat([torch.randint(1, 256, (n,), generator=g), torch.tensor([EOS])])
            for n in lengths]


def test_find_documents_and_mask_targets():
    tokens = torch.tensor([[5, 6, EOS, 7, EOS, EOS, 8]])
    docs = find_documents(tokens, EOS)
    assert docs.ids.tolist() == [[0, 0, 0, 1, 1, 2, 3]]  # an EOS belongs to the doc it ends
    assert docs.positions.tolist() == [[0, 1, 2, 0, 1, 0, 0]]
    mask = docs.attention_mask[0, 0]
    assert mask[3].tolist() == [False, False, False, True, False, False, False]
    assert mask[4].tolist() == [False, False, False, True, True, False, False]
    targets = torch.tensor([[6, EOS, 7, EOS, EOS, 8, 9]])
    masked = mask_targets(tokens, targets, EOS)
    # the EOS stays a target (where a document ends); what follows an EOS is not counted
    assert masked.tolist() == [[6, EOS, IGNORE_INDEX, EOS, IGNORE_INDEX, IGNORE_INDEX, 9]]
    # the CUDA path's flex-attention mask is the same mask, and skips whole blocks
    dense = create_mask(docs.mask_mod, 1, None, 7, 7, device="cpu")
    assert torch.equal(dense, docs.attention_mask)
    window = find_documents(torch.tensor([[1] * 127 + [EOS] + [2] * 128]), EOS)
    assert window.block_mask.to_dense().tolist() == [[[[1, 0], [0, 1]]]]
    counts = counted_targets([masked[:, :4], masked[:, 4:]])
    assert counts == [3, 1]
    weights = loss_weights(counts, total=4, replicas=1)
    assert weights == [3 * 2 / 4, 1 * 2 / 4]


@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])  # learned positions; RoPE
def test_packed_window_equals_documents_one_by_one(model):
    cfg = load_model_config(model)
    net = build_model(cfg, seed=1)
    docs = documents_row([6, 11, 1, 9])
    row = torch.cat(docs)[None]
    x, y = row[:, :-1], row[:, 1:]
    alone = torch.cat([net(d[None]) for d in docs], dim=1)[:, :-1]
    net.set_packing(EOS)
    for recompute in ("none", "selective", "full"):
        net.set_recompute(recompute)
        with torch.enable_grad():
            logits = net(x)
        torch.testing.assert_close(logits, alone, rtol=0, atol=2e-5)
    # CPU runs the flash kernel with the boolean document mask (not the math kernel)
    q = torch.randn(1, 4, 8, 16, requires_grad=True)
    kv = torch.randn(1, 2, 8, 16)
    out = packed_attention(q, kv, kv, find_documents(x[:, :8], EOS), enable_gqa=True)
    assert out.grad_fn.name() == "ScaledDotProductFlashAttentionForCpuBackward0"
    # the loss: the mean over targets not after an EOS, each from its own document alone
    loss = net(x, mask_targets(x, y, EOS))
    kept = x[0] != EOS
    expected = F.cross_entropy(alone[0][kept], y[0][kept])
    torch.testing.assert_close(loss, expected, rtol=0, atol=2e-6)
    assert kept.sum() < x.shape[1]  # some targets were masked


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_the_cuda_flex_path_equals_the_cpu_mask_path():
    docs = find_documents(torch.randint(0, 6, (2, 256), generator=torch.Generator()
                                        .manual_seed(2)), EOS)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, heads, 256, 16, generator=g) for heads in (4, 2, 2))
    # forward only: flex attention has no backward on CPU
    flex = flex_attention_within(q, k, v, docs, enable_gqa=True, compiled=False)
    sdpa = packed_attention(q, k, v, docs, enable_gqa=True)
    torch.testing.assert_close(flex, sdpa, rtol=0, atol=1e-5)


def _flex_and_sdpa_on_cuda(dtype: torch.dtype) -> tuple[list[float], list[float]]:
    """Output and q, k, v gradients of the CUDA path (compiled flex attention over the block
    mask) and of SDPA with the boolean mask, both in `dtype`, each against SDPA in fp32:
    max abs differences in fp32, relative norms in bf16."""
    g = torch.Generator().manual_seed(2)
    docs = find_documents(torch.randint(0, 12, (2, 512), generator=g).cuda(), EOS).ready()
    q32, k32, v32 = (torch.randn(2, heads, 512, 64, generator=g).cuda() for heads in (8, 2, 2))
    grad = torch.randn(2, 8, 512, 64, generator=g).cuda()

    def run(attention, dtype):
        q, k, v = (t.to(dtype).requires_grad_() for t in (q32, k32, v32))
        out = attention(q, k, v)
        return [out, *torch.autograd.grad(out, (q, k, v), grad.to(dtype))]

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=docs.attention_mask,
                                              enable_gqa=True)

    def errors(got):
        if dtype == torch.float32:
            return [(a - r).abs().max().item() for a, r in zip(got, reference, strict=True)]
        return [((a.float() - r).norm() / r.norm()).item()
                for a, r in zip(got, reference, strict=True)]

    reference = run(sdpa, torch.float32)
    flex = run(lambda q, k, v: packed_attention(q, k, v, docs, enable_gqa=True), dtype)
    return errors(flex), errors(run(sdpa, dtype))


@pytest.mark.skipif(gpu_count() == 0, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_a_gpu_the_compiled_flex_path_equals_sdpa_with_the_mask(dtype):
    """On CUDA `packed_attention` runs flex attention, compiled, over the block mask: forward
    and backward equal SDPA with the boolean mask (fp32: to rounding; bf16: no further from
    an fp32 reference than SDPA's own bf16 result). Ran on an H100 (docs/gpu/README.md).
    In a spawned rank: the suite's own process sees no GPU (paraxis.dist.testing.hide_gpus)."""
    ((flex, plain),) = run_distributed(_flex_and_sdpa_on_cuda, 1, (dtype,), device="cuda")
    if dtype == torch.float32:
        assert max(flex) < 2e-5, flex
    else:
        assert all(f <= 1.1 * p + 1e-4 for f, p in zip(flex, plain, strict=True)), (flex, plain)


def test_vocab_parallel_loss_ignores_masked_targets():
    logits = torch.randn(2, 5, 16, requires_grad=True)
    targets = torch.randint(0, 16, (2, 5))
    targets[0, 1] = targets[1, 3] = IGNORE_INDEX
    ours = vocab_parallel_cross_entropy(logits, targets, None)
    (grad,) = torch.autograd.grad(ours, logits)
    theirs = F.cross_entropy(logits.view(-1, 16), targets.view(-1))
    (expected,) = torch.autograd.grad(theirs, logits)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(grad, expected)
    # A microbatch with no counted target (all inputs end documents) weighs 0 and must add
    # 0 to every gradient, as F.cross_entropy's does, not 0 * (0 / 0) = NaN.
    nothing = torch.full_like(targets, IGNORE_INDEX)
    (grad,) = torch.autograd.grad(weigh(vocab_parallel_cross_entropy(logits, nothing, None),
                                        0.0), logits)
    assert torch.equal(grad, torch.zeros_like(grad))


STEPS, BATCH, SEQ, SEED, LR = 2, 4, 32, 5, 3e-3


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Windows whose rows hold very different numbers of documents (rows 0-1: many short
    ones; rows 2-3: few), so data-parallel shares and microbatches mask different counts."""
    out = []
    for step in range(STEPS):
        rows = []
        for row in range(BATCH):
            lengths = [3, 5, 2, 4, 6, 1, 7, 2] if row < 2 else [20, 30]
            rows.append(torch.cat(documents_row(lengths, seed=10 * step + row))[:SEQ + 1])
        tokens = torch.stack(rows)
        out.append((tokens[:, :-1], tokens[:, 1:]))
    return out


def train(engine, rows: slice, cp_rank: int = 0, cp: int = 1) -> tuple[list[float], list[float]]:
    """Train on this share: `rows` of each batch, and under cp its rank's two chunks."""
    losses, norms = [], []
    for x, y in batches():
        x, y = (local_part(t[rows], cp_rank, cp) if cp > 1 else t[rows] for t in (x, y))
        losses.append(engine.forward_backward(x, y))
        norms.append(engine.clip_grad_norm(1.0))
        engine.optimizer_step(LR)
        engine.zero_grad()
    return losses, norms


@functools.cache
def reference(model: str) -> tuple[list[float], list[float]]:
    cfg = load_model_config(model)
    net = build_model(cfg, seed=SEED)
    net.set_packing(EOS)
    engine = LocalEngine(net, Layout(), end_of_document=EOS)
    return train(engine, slice(None))


LAYOUTS = {"dp=2,zero=3,microbatches=2,recompute=full": "tiny",
           "tp=2,sp=true,microbatches=2": "tiny-llama", "pp=2,microbatches=2": "tiny",
           "dp=2,ep=2": "tiny-moe",
           # context parallelism: documents cross the chunks and the ranks (RoPE, learned
           # positions), by each way of bringing K/V to the queries
           "cp=2": "tiny-llama", "cp=2,cp_attention=all_gather,recompute=selective": "tiny",
           "cp=2,cp_attention=all_to_all": "tiny-llama"}
# cp beside dp (the loss weighed over dp x cp) and pp (each stage gathers its ids)
LAYOUTS_4 = {"cp=2,dp=2,zero=1": "tiny-llama", "cp=2,pp=2,microbatches=2": "tiny",
             "cp=4,cp_a2a=2": "tiny-llama"}  # two-level cp


def _rank_body(ctx: RankContext) -> tuple[list[float], list[float]]:
    cfg = load_model_config(next(m for k, m in {**LAYOUTS, **LAYOUTS_4}.items()
                                 if Layout.parse(k) == ctx.layout))
    engine = build_engine(cfg, ctx.layout, ctx.groups, "cpu", seed=SEED, seq_len=SEQ,
                          options=RuntimeOptions(end_of_document=EOS))
    share = BATCH // ctx.layout.dp
    return train(engine, slice(ctx.groups.dp_rank * share, (ctx.groups.dp_rank + 1) * share),
                 ctx.groups.cp_rank, ctx.layout.cp)


@pytest.mark.parametrize("layouts", [LAYOUTS, LAYOUTS_4], ids=["2-ranks", "4-ranks"])
def test_packed_training_matches_one_device_on_every_layout(layouts):
    per_layout = run_on_ranks(list(layouts), _rank_body, timeout_s=170)
    unpacked = reference_unpacked("tiny")
    for (layout, model), per_rank in zip(layouts.items(), per_layout, strict=True):
        ref_losses, ref_norms = reference(model)
        for losses, norms in per_rank:
            assert losses == pytest.approx(ref_losses, rel=2e-5), layout
            assert norms == pytest.approx(ref_norms, rel=2e-4), layout
    assert reference("tiny")[0][0] != pytest.approx(unpacked, rel=1e-3)  # packing changes it


def reference_unpacked(model: str) -> float:
    engine = LocalEngine(build_model(load_model_config(model), seed=SEED), Layout())
    x, y = batches()[0]
    return engine.forward_backward(x, y)


def test_packing_refuses_data_without_end_of_document():
    RunConfig.from_flags(pack_documents=True, layout="cp=2").check()  # refused before
    result = subprocess.run(
        [sys.executable, "-m", "paraxis", "train", "--model", "tiny", "--steps", "1",
         "--seq-len", "16", "--global-batch", "2", "--device", "cpu", "--quiet",
         "--pack-documents"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "end-of-document" in lines[0], result.stderr


def test_training_packs_a_jsonl_corpus_by_its_end_of_document_id(tmp_path, monkeypatch):
    from paraxis.train.loop import run_training

    monkeypatch.setenv("PARAXIS_DATA_CACHE", str(tmp_path / "cache"))
    g = torch.Generator().manual_seed(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon"]
    lines = [json.dumps({"text": " ".join(words[int(i)] for i in torch.randint(0, 5, (n,),
                                                                              generator=g))})
             for n in torch.randint(2, 12, (400,), generator=g).tolist()]
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    losses = {}
    for pack in (False, True):
        cfg = RunConfig.from_flags(model="tiny", steps=1, global_batch=4, seq_len=32,
                                   quiet=True, device="cpu", data=str(tmp_path / "c.jsonl"),
                                   pack_documents=pack)
        losses[pack] = [r["loss"] for r in run_training(cfg)]
    assert all(math.isfinite(v) for v in losses[True])
    assert losses[True][0] != pytest.approx(losses[False][0], rel=1e-5)  # packing is on
    # end to end under context parallelism: each rank's loader reads its two chunks of
    # every row, and the run trains the one-device packed numbers
    metrics = tmp_path / "cp2.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "paraxis", "train", "--model", "tiny", "--steps", "1",
         "--global-batch", "4", "--seq-len", "32", "--quiet", "--device", "cpu", "--data",
         str(tmp_path / "c.jsonl"), "--pack-documents", "--nproc", "2", "--cp", "2",
         "--metrics-file", str(metrics)], capture_output=True, text=True, timeout=170)
    assert result.returncode == 0, result.stderr
    split = [json.loads(line)["loss"] for line in metrics.read_text().splitlines()
             if '"loss"' in line]
    assert split == pytest.approx(losses[True], rel=2e-5)
