"""Expert parallelism: every layout with ep > 1 trains tiny-moe like one device.

Checked in fp32 and dropless, for 10 steps: first, on step 0, every token's
chosen experts in every MoE block equal the single-device ones; then the losses are within
1e-5 of one device's step by step (the gradient norms within 5e-5, relatively), for

- dp4 x ep4, dp4 x ep2 with ZeRO-1, dp2 x ep2 x tp2 with ZeRO-2, dp2 x ep2 x pp2 with
  full recompute (the all-to-alls run again in backward), dp2 x cp2 x ep2 with ZeRO-3,
  dp2 x ep2 x tp2 with the experts split over tp (etp = 2) and ZeRO-3 (one launch of 4
  ranks);
- dp2 x ep2 x tp2 (sequence parallel) x pp2 with ZeRO-1 (8 ranks; under SP the MoE block
  gathers the whole sequence, so the experts see what they see without SP);
- cp2 x ep2 and dp2 (2 ranks);
- `paraxis train --model tiny-moe --nproc 4 --dp 4 --ep 4`, the command line end to end.

Checkpoints cross ep, tp, etp, pp and dp: dp4 x ep2 (ZeRO-1), dp2 x ep2 x tp2 (ZeRO-2, and
etp = 2 with ZeRO-3) and dp2 x ep2 x pp2 resume the step-5 checkpoint of dp2 x cp2 x ep2
(ZeRO-3), dp2 (ep = 1) resumes cp2 x ep2's, and one device resumes both, each going on like
one device (pp2, with 2 microbatches, like one device resuming over the same global
microbatches). The ZeRO-3 checkpoint also exports to a Mixtral directory whose logits in
transformers are one device's of the checkpoint.

The routing statistics are per microbatch step over the dp x cp ranks (parallel/experts/layer.py):
with M > 1 microbatches the global microbatch m is the union of every dp rank's microbatch m, so one
device's reference accumulates over those same token sets (`_reference`).

The all-to-all bytes each rank measures equal `placement.all_to_all_bytes` of the send
matrix built from the per-expert counts every rank dispatched (four all-to-alls per block:
dispatch and combine, forward and backward), and the planner's
`plan.experts.measured_all_to_all_bytes` of those counts; under a capacity factor that
every expert overflows, they equal the planner's `dispatch_bytes` without any counts. The
model-state bytes the runtime reports are those of the rank's own dense weights and
experts, and the planner's fp32 states of the layout (`_assert_states` names the two
things the planner leaves out).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from paraxis.dist.groups import ParallelGroups, build_groups
from paraxis.dist.testing import RankContext, as_layout, flag_args, one_thread, run_on_ranks
from paraxis.engine.optimizer import storage_bytes
from paraxis.model.checkpoint import load_checkpoint, save_checkpoint
from paraxis.model.checkpoint.convert import export_hf
from paraxis.model.inference import load_for_inference
from paraxis.model.transformer import parameter_shapes
from paraxis.parallel.context.chunks import local_part
from paraxis.parallel.experts.expert_parallel import AllToAllCounter
from paraxis.parallel.experts.layer import MoE
from paraxis.parallel.tensor.apply import tp_split_dim
from paraxis.parallelize import build_engine
from paraxis.plan.experts import dispatch_bytes, measured_all_to_all_bytes, routing_share
from paraxis.plan.memory import model_state_bytes, stage_local_params
from paraxis.spec.errors import ParaxisError
from paraxis.spec.expert_placement import ALL_TO_ALLS_PER_BLOCK, all_to_all_bytes, send_matrix
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.partition import partition_layers
from paraxis.spec.precision import FP32_ADAM
from paraxis.train.config import RunConfig
from paraxis.train.loop import run_training
from paraxis.train.metrics import moe_step_metrics

CFG = PRESETS["tiny-moe"].replace(z_loss_coef=1e-3)  # with ST-MoE's router z-loss
BATCH, SEQ, STEPS, LR = 8, 32, 10, 2e-3
# Gradient norms: relative. Over 10 steps fp32 sums in other orders drift apart: on an Intel
# Xeon (AVX-512) VM, dp=2 alone (only the all-reduce's order differs) reached
# 1.4e-5 and dp2 x ep2 x tp2 1.5e-5, step 6 or 9 (under 1e-5 on AMD EPYC VMs)
LOSS_TOL, NORM_TOL = 1e-5, 5e-5
FOUR = ["dp=4,ep=4", "dp=2,cp=2,ep=2,zero=3", "dp=4,ep=2,zero=1", "dp=2,ep=2,tp=2,zero=2",
        "dp=2,ep=2,pp=2,microbatches=2,recompute=full", "dp=2,ep=2,tp=2,etp=2,zero=3"]
EIGHT = ["dp=2,ep=2,tp=2,sp=true,pp=2,microbatches=2,zero=1"]
# layout -> the layout whose step-5 checkpoint it resumes after its own run (same launch)
RESUMES = {"dp=4,ep=2,zero=1": "dp=2,cp=2,ep=2,zero=3", "dp=2": "cp=2,ep=2",
           "dp=2,ep=2,tp=2,zero=2": "dp=2,cp=2,ep=2,zero=3",
           "dp=2,ep=2,tp=2,etp=2,zero=3": "dp=2,cp=2,ep=2,zero=3",
           "dp=2,ep=2,pp=2,microbatches=2,recompute=full": "dp=2,cp=2,ep=2,zero=3"}
# dp4 x ep4 also runs a step of tiny-moe under this capacity factor: each rank's 64 tokens
# make 128 assignments, 16 per expert on average, capped at ceil(0.15 * 64 * 2 / 8) = 3
# (a cap the planner must round up as the runtime does: 2.4 unrounded)
CAPACITY, CAP = 0.15, 3


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, CFG.vocab_size, (BATCH, SEQ + 1),
                           generator=torch.Generator().manual_seed(100 + step))
    return tokens[:, :-1], tokens[:, 1:]


def _share(tensor: torch.Tensor, layout: Layout, dp_rank: int, cp_rank: int) -> torch.Tensor:
    """The rows of `dp_rank`, and under cp its two chunks of each (what `paraxis train`
    gives a rank)."""
    per_dp = BATCH // layout.dp
    rows = tensor[dp_rank * per_dp:(dp_rank + 1) * per_dp]
    return local_part(rows, cp_rank, layout.cp) if layout.cp > 1 else rows


def _global_microbatch_order(dp: int, micro: int) -> torch.Tensor:
    """Row order that puts global microbatch m (every dp rank's microbatch m) in one device's
    m-th chunk of the batch."""
    per_micro = BATCH // (dp * micro)
    return torch.tensor([d * (BATCH // dp) + m * per_micro + i for m in range(micro)
                         for d in range(dp) for i in range(per_micro)])


def _record_routing(model: torch.nn.Module) -> dict[str, list[np.ndarray]]:
    """Each MoE block's chosen experts of every forward while `recording` is on, by the
    block's single-device name (as numpy arrays: they travel back from the ranks)."""
    chosen: dict[str, list[np.ndarray]] = {}
    for name, module in model.named_modules():
        if isinstance(module, MoE):
            key = name[name.index("blocks."):]
            chosen[key] = []

            def route(tokens: torch.Tensor, logits: torch.Tensor | None = None,
                      layer: MoE = module, key: str = key) -> tuple:
                weights, picked, probs = MoE.route(layer, tokens, logits)
                if getattr(layer, "recording", False):
                    chosen[key].append(picked.detach().numpy().copy())
                return weights, picked, probs

            module.route = route
    return chosen


def _train(layout: Layout, groups: ParallelGroups, steps: range = range(STEPS),
           order: torch.Tensor | None = None, load: str | None = None,
           save: str | None = None) -> dict:
    """`steps` of training at `layout`: losses, gradient norms, step 0's routing, and the
    all-to-all traffic and model-state bytes of this rank."""
    engine = build_engine(CFG, layout, groups, "cpu", seed=0)
    if load is not None:
        load_checkpoint(engine, load, CFG.to_dict(), groups.rank)
    chosen = _record_routing(engine.model)
    out: dict = {"losses": [], "norms": [], "chosen": chosen, "memory": engine.memory_report(),
                 "params": [(n, p.numel()) for n, p in engine.named_parameters()]}
    for step in steps:
        x, y = (t if order is None else t[order] for t in _batch(step))
        x, y = (_share(t, layout, groups.dp_rank, groups.cp_rank) for t in (x, y))
        for layer in (m for m in engine.model.modules() if isinstance(m, MoE)):
            layer.recording = step == steps[0]
        with AllToAllCounter() as counter, _host_reads() as reads:
            loss = engine.forward_backward(x, y)
        if step == steps[0]:  # the gradients exist: every model state counted
            out["host_reads"] = len(reads)
            out["states"] = engine.memory_report()
            out["counters"] = storage_bytes(t for state in engine.optimizer.state.values()
                                            for key, t in state.items() if key == "step")
        out["losses"].append(loss)
        out["norms"].append(engine.clip_grad_norm(1.0))
        engine.optimizer_step(LR)
        engine.zero_grad()
        if step == steps[0]:
            out["traffic"] = ([(e.phase, e.purpose, e.nbytes) for e in counter.events],
                              counter.dispatched)
        if save is not None and step + 1 == 5:
            save_checkpoint(engine, save, 5, CFG.to_dict())
    return out


@contextlib.contextmanager
def _host_reads() -> Iterator[list[str]]:
    """Every `Tensor.tolist()` the MoE blocks' code makes while active (each one a host sync
    on a GPU), by the function that made it."""
    reads: list[str] = []
    tolist = torch.Tensor.tolist

    def counted(tensor: torch.Tensor) -> list:
        caller = sys._getframe(1).f_code
        if "paraxis/parallel/experts/" in caller.co_filename.replace("\\", "/"):
            reads.append(caller.co_name)
        return tolist(tensor)

    torch.Tensor.tolist = counted  # type: ignore[method-assign]
    try:
        yield reads
    finally:
        torch.Tensor.tolist = tolist  # type: ignore[method-assign]


def _capacity_step(layout: Layout, groups: ParallelGroups
                   ) -> tuple[int, list[list[int]], list[int]]:
    """Step 0 of tiny-moe with a `CAPACITY` factor: the bytes this rank sent in its
    all-to-alls, the per-expert counts it dispatched (what stayed under the cap), and the
    step's `dropped_tokens` metric (every rank's drops, per block)."""
    cfg = CFG.replace(capacity_factor=CAPACITY)
    engine = build_engine(cfg, layout, groups, "cpu", seed=0)
    x, y = (_share(t, layout, groups.dp_rank, groups.cp_rank) for t in _batch(0))
    with AllToAllCounter() as counter:
        engine.forward_backward(x, y)
    dropped = moe_step_metrics(engine.model, groups, cfg)["dropped_tokens"]
    return counter.nbytes(), counter.dispatched, dropped


def _saved(root: str, layout: str) -> str:
    return f"{root}/{as_layout(layout)}/step-00000005"


def _on_ranks(ctx: RankContext, root: str) -> dict:
    """This layout's 10 steps (saving at step 5), and the resumption `RESUMES` asks for."""
    result = _train(ctx.layout, ctx.groups, save=f"{root}/{ctx.layout}")
    result["coords"] = (ctx.groups.dp_rank, ctx.groups.cp_rank, ctx.groups.ep_rank,
                        ctx.layout.group_of(ctx.rank, "ep"), ctx.groups.pp_rank,
                        ctx.groups.tp_rank)
    if str(ctx.layout) == str(as_layout("dp=4,ep=4")):
        result["capacity"] = _capacity_step(ctx.layout, ctx.groups)
    source = {str(as_layout(k)): v for k, v in RESUMES.items()}.get(str(ctx.layout))
    if source is not None:
        result["resumed"] = _train(ctx.layout, ctx.groups, range(5, STEPS),
                                   load=_saved(root, source))
    return result


_REFERENCES: dict[tuple[int, int], dict] = {}


def _reference(layout: Layout) -> dict:
    """One device's run over the same global microbatches as `layout` (cached)."""
    key = (layout.dp, layout.microbatches)
    if key not in _REFERENCES:
        one = Layout(microbatches=layout.microbatches)
        with one_thread():
            _REFERENCES[key] = _train(one, build_groups(one),
                                      order=_global_microbatch_order(*key))
    return _REFERENCES[key]


def _assert_routing(layout: Layout, result: dict, reference: dict) -> None:
    """This rank's chosen experts on step 0 are one device's for the same tokens (under SP
    with whole experts, its own sequence shard's: `routing_share`)."""
    dp_rank, cp_rank = result["coords"][:2]
    shards, tp_rank = routing_share(CFG, layout), result["coords"][5]
    micro, per_dp = layout.microbatches, BATCH // layout.dp
    assert result["chosen"], "no MoE block on this rank"
    for name, calls in result["chosen"].items():
        wanted = []
        for m in range(micro):
            want = torch.from_numpy(reference["chosen"][name][m])
            want = want.view(layout.dp, per_dp // micro, SEQ, -1)[dp_rank]
            if layout.cp > 1:
                want = local_part(want, cp_rank, layout.cp)
            if shards > 1:
                want = want.chunk(shards, dim=1)[tp_rank]
            wanted.append(want.reshape(-1, CFG.top_k))
        if layout.recompute == "full":  # each microbatch routed again in its backward
            assert len(calls) == 2 * micro, name
            assert all(any(torch.equal(torch.from_numpy(c), w) for w in wanted)
                       for c in calls), f"{layout} {name}"
            assert all(any(torch.equal(torch.from_numpy(c), w) for c in calls)
                       for w in wanted), f"{layout} {name}"
            continue
        assert len(calls) == micro, name
        for m, picked in enumerate(calls):
            assert torch.equal(torch.from_numpy(picked), wanted[m]), \
                f"{layout} {name} microbatch {m}"


def _assert_losses(what: str, result: dict, reference: dict, first: int = 0) -> None:
    want_losses = reference["losses"][first:]
    want_norms = reference["norms"][first:]
    assert len(result["losses"]) == len(want_losses), what
    worst = max(abs(a - b) for a, b in zip(result["losses"], want_losses, strict=True))
    assert worst <= LOSS_TOL, f"{what}: losses differ by {worst:.2e}"
    norms = max(abs(a / b - 1) for a, b in zip(result["norms"], want_norms, strict=True))
    assert norms <= NORM_TOL, f"{what}: gradient norms differ by {norms:.2e} (relative)"


def _assert_traffic(layout: Layout, by_rank: list[dict]) -> None:
    """Bytes each rank sent in step 0's all-to-alls equal the placement's count from the
    per-expert counts every rank of its EP group dispatched, forward by forward (under full
    recompute each microbatch's forward runs twice, its backward once)."""
    bytes_per_row = CFG.d_model * 4
    passes = 2 if layout.recompute == "full" else 1
    for rank, result in enumerate(by_rank):
        events, _ = result["traffic"]
        group = result["coords"][3]
        me = group.index(rank)
        dispatched = [by_rank[r]["traffic"][1] for r in group]
        forwards = len(dispatched[0])
        assert forwards == passes * layout.microbatches * len(result["chosen"])
        # one host sync per block's forward: the sent and received counts read together
        assert result["host_reads"] == forwards, (layout, result["host_reads"], forwards)
        # each rank routes its tokens of a microbatch: under SP with whole experts only its
        # sequence shard's (a 1/tp share), as the planner prices it
        tokens = BATCH // (layout.dp * layout.microbatches) * SEQ // layout.cp
        assert all(sum(counts) == tokens // routing_share(CFG, layout) * CFG.top_k
                   for counts in dispatched[me]), layout
        sent = received = 0
        for j in range(forwards):
            sends = send_matrix([counts[j] for counts in dispatched], layout.ep)
            sent += all_to_all_bytes(sends, CFG.d_model, 4)[me]
            received += sum(row[me] for i, row in enumerate(sends) if i != me) * bytes_per_row
        measured = {(phase, purpose): sum(n for p, q, n in events if (p, q) == (phase, purpose))
                    for phase in ("forward", "backward") for purpose in ("dispatch", "combine")}
        assert measured == {("forward", "dispatch"): sent,
                            ("backward", "combine"): sent // passes,
                            ("forward", "combine"): received,
                            ("backward", "dispatch"): received // passes}
        # the planner's count from the same per-source per-expert counts: 4 all-to-alls per
        # forward; full recompute repeats the forward's 2 (each forward is listed twice)
        planned = sum(measured_all_to_all_bytes(CFG, [counts[j] for counts in dispatched],
                                                layout.ep, 4)[me] for j in range(forwards))
        assert 2 * passes * sum(measured.values()) == (passes + 1) * planned, (layout, rank)
    total = sum(sum(n for *_, n in r["traffic"][0]) for r in by_rank)
    per_block = sum(sum(all_to_all_bytes(send_matrix(
        [by_rank[r]["traffic"][1][j] for r in group], layout.ep), CFG.d_model, 4))
        for group in layout.groups("ep") for j in range(len(by_rank[group[0]]["traffic"][1])))
    # dispatch and combine, forward and backward: 4 per block and microbatch (recompute: 6)
    assert total * passes == (2 * passes + 2) * per_block


def _assert_capacity(layout: Layout, by_rank: list[dict]) -> None:
    """Under a capacity factor every expert overflows on every rank, so each dispatches
    exactly the cap, and each rank's all-to-all bytes are the planner's uncounted price:
    `dispatch_bytes` of the rank's tokens per microbatch, 4 all-to-alls per block."""
    cfg = CFG.replace(capacity_factor=CAPACITY)
    tokens = BATCH // layout.dp * SEQ
    for nbytes, dispatched, dropped in (r["capacity"] for r in by_rank):
        assert len(dispatched) == CFG.n_moe_layers
        assert all(count == CAP for counts in dispatched for count in counts), dispatched
        # the metric counts what no rank dispatched: every assignment of the global batch
        # less the cap each expert took on each rank
        assert dropped == [BATCH * SEQ * CFG.top_k - layout.dp * CFG.n_experts * CAP] \
            * CFG.n_moe_layers
        assert nbytes == CFG.n_moe_layers * ALL_TO_ALLS_PER_BLOCK * dispatch_bytes(
            cfg, layout.ep, tokens, 4)


def _planned_states(layout: Layout, stage: int) -> dict[str, float]:
    """The planner's fp32 model states of a rank of pipeline stage `stage`: its share of the
    dense weights ZeRO-sharded over dp*cp, of the experts over dp*cp/ep (as layout_memory
    adds them)."""
    local, experts = stage_local_params(CFG, layout, SEQ)[stage]
    replicas = layout.dp * layout.cp
    dense = model_state_bytes(round(local), replicas, layout.zero, FP32_ADAM)
    routed = model_state_bytes(round(experts), replicas // layout.ep, layout.zero, FP32_ADAM)
    return {kind: dense[kind] + routed[kind] for kind in dense}


def _assert_states(layout: Layout, by_rank: list[dict]) -> None:
    """Model-state bytes each rank holds (counted tensor storages, gradients present) are
    the planner's plus two things it leaves out, each counted exactly here: the RMSNorm
    weights, whole on every tp rank where the planner divides them by tp like the matrices
    (2 per block and the final one on the last stage), and AdamW's step counters, a 4-byte
    tensor per optimized tensor (measured by the rank). ZeRO pads nothing here: every
    unit's size divides by its shard count."""
    split = partition_layers(CFG, layout.pp)
    for rank, result in enumerate(by_rank):
        stage = result["coords"][4]
        norms = CFG.d_model * (2 * len(split.blocks_of(stage)) + split.has_head(stage))
        planned = _planned_states(layout, stage)
        unpriced = model_state_bytes(norms * (layout.tp - 1) // layout.tp,
                                     layout.dp * layout.cp, layout.zero, FP32_ADAM)
        unpriced["optimizer"] += result["counters"]
        measured = result["states"]
        for kind in measured:
            assert measured[kind] == planned[kind] + unpriced[kind], \
                (str(layout), rank, kind, measured[kind], planned[kind], unpriced[kind])


def _assert_memory(layout: Layout, result: dict) -> None:
    """Parameter bytes are the rank's dense weights (a TP slice) plus its n_experts/ep experts
    whole, or under ZeRO-3 its shard of them; AdamW's two moments cover the rank's shard
    (ZeRO-1/2/3: dense weights over dp*cp ranks, experts over the dp*cp/ep holding them)."""
    names = dict(result["params"])
    experts = [n for n in names if ".experts." in n]
    assert len({n.split(".experts.")[1].split(".")[0] for n in experts}) == CFG.n_experts \
        // layout.ep
    whole = sum(names.values())
    dense = sum(v for n, v in names.items() if ".experts." not in n)
    shard = dense / (layout.dp * layout.cp) + (whole - dense) / (layout.dp * layout.cp
                                                                 // layout.ep)
    pad = 64 * 4  # a few elements of padding per ZeRO unit
    if layout.zero == 3:
        assert abs(result["memory"]["params"] - 4 * shard) <= pad
    else:
        assert result["memory"]["params"] == 4 * whole
    state = 2 * whole if layout.zero == 0 else 2 * shard
    assert abs(result["memory"]["optimizer"] - 4 * state) <= 2 * pad + 4 * 1024  # + steps


@pytest.mark.parametrize("layouts", [FOUR, EIGHT, ["cp=2,ep=2", "dp=2"]],
                         ids=["4-ranks", "8-ranks", "2-ranks"])
def test_expert_parallel_layouts_train_like_one_device(layouts, tmp_path):
    results = run_on_ranks(layouts, _on_ranks, str(tmp_path), timeout_s=400)
    on_one_device: set[str] = set()
    for text, by_rank in zip(layouts, results, strict=True):
        layout = as_layout(text)
        reference = _reference(layout)
        for result in by_rank:
            _assert_routing(layout, result, reference)
        assert all(r["losses"] == by_rank[0]["losses"] for r in by_rank), text
        _assert_losses(text, by_rank[0], reference)
        if layout.ep > 1:
            _assert_traffic(layout, by_rank)
            _assert_states(layout, by_rank)
        if "capacity" in by_rank[0]:
            _assert_capacity(layout, by_rank)
            for result in by_rank:
                _assert_memory(layout, result)
        if "resumed" in by_rank[0]:  # another ep's checkpoint, here and on one device
            what = f"{RESUMES[text]} checkpoint at {text}"
            resumed = by_rank[0]["resumed"]
            if layout.microbatches == 1:
                _assert_losses(what, resumed, _reference(Layout()), 5)
            else:  # one device resumes with the same global microbatches
                with one_thread():
                    one = Layout(microbatches=layout.microbatches)
                    again = _train(one, build_groups(one), range(5, STEPS),
                                   _global_microbatch_order(layout.dp, layout.microbatches),
                                   load=_saved(str(tmp_path), RESUMES[text]))
                _assert_losses(what, resumed, again)
            if RESUMES[text] in on_one_device:
                continue
            on_one_device.add(RESUMES[text])
            with one_thread():
                one = _train(Layout(), build_groups(Layout()), range(5, STEPS),
                             load=_saved(str(tmp_path), RESUMES[text]))
            _assert_losses(f"{RESUMES[text]} checkpoint on one device", one,
                           _reference(Layout()), 5)
    if "dp=2,cp=2,ep=2,zero=3" in layouts:
        _assert_exports_to_mixtral(_saved(str(tmp_path), "dp=2,cp=2,ep=2,zero=3"),
                                   tmp_path / "mixtral")


def _assert_exports_to_mixtral(checkpoint: str, out: Path) -> None:
    """An expert-parallel ZeRO-3 run's checkpoint exports to a Mixtral directory whose
    logits in transformers are one device's of the same checkpoint (skipped without
    transformers, a test-only dependency)."""
    if importlib.util.find_spec("transformers") is None:
        return
    from transformers import MixtralForCausalLM

    export_hf(checkpoint, out)
    _, ours = load_for_inference(checkpoint)
    theirs = MixtralForCausalLM.from_pretrained(out).eval()
    idx = torch.randint(0, CFG.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert float((theirs(idx).logits - ours(idx)).abs().max()) <= 1e-5


def test_cli_dp4_ep4_matches_one_device(tmp_path):
    flags = dict(model="tiny-moe", seq_len=SEQ, steps=STEPS, global_batch=BATCH, warmup=2,
                 eval_every=0, device="cpu", quiet=True)
    with one_thread():  # in this process: no start-up cost
        one = run_training(RunConfig.from_flags(**flags))
    metrics = tmp_path / "ep4.jsonl"
    command = [sys.executable, "-m", "paraxis", "train", "--nproc", "4", "--dp", "4", "--ep",
               "4", "--metrics-file", str(metrics), *flag_args(flags)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    ep4 = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert len(ep4) == len(one) == STEPS
    for a, b in zip(one, ep4, strict=True):
        assert abs(a["loss"] - b["loss"]) <= LOSS_TOL, (a["step"], a["loss"], b["loss"])
        # the metrics: every expert's tokens of the global batch, and the aux loss. The first
        # step routes with the same weights, so the same counts; after it the weights differ
        # in their last bits (the gradients summed in another order), which can move a token
        # whose two best experts tie within them (seen on a 16-core Intel host: one token of
        # 512 at step 6), so at most 1% of a block's tokens change expert
        moved = [sum(abs(x - y) for x, y in zip(p, q, strict=True)) // 2
                 for p, q in zip(a["expert_tokens"], b["expert_tokens"], strict=True)]
        if a["step"] == one[0]["step"]:
            assert a["expert_tokens"] == b["expert_tokens"]
        assert max(moved) <= BATCH * SEQ * CFG.top_k // 100, (a["step"], moved)
        assert a["aux_loss"] == pytest.approx(b["aux_loss"], abs=1e-6)
    counts = ep4[0]["expert_tokens"]
    assert len(counts) == CFG.n_moe_layers
    assert all(sum(row) == BATCH * SEQ * CFG.top_k for row in counts)


def test_bad_expert_layouts_are_one_line_errors():
    for layout, model, message in (
            (Layout(dp=2, ep=2), PRESETS["tiny-llama"], "needs a mixture-of-experts model"),
            (Layout(dp=3, ep=3), CFG, "must divide the number of experts")):
        with pytest.raises(ParaxisError, match=message) as error:
            layout.validate(model=model)
        assert "\n" not in str(error.value)
    with pytest.raises(ParaxisError, match="must divide dp\\*cp"):
        Layout.parse("dp=4,ep=3")


def test_layout_expert_groups(tmp_path):
    layout = Layout(dp=4, tp=2, ep=2)
    assert layout.groups("ep") == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert layout.groups("expert_dp") == [[0, 4], [2, 6], [1, 5], [3, 7]]
    assert str(layout) == "dp=4,tp=2,pp=1,ep=2,zero=0"
    assert Path(tmp_path).exists()


def test_the_tp_plan_splits_no_moe_weight():
    """Experts, router and shared experts stay whole on every TP rank (the MoE block is
    replicated over tp); the dense blocks' MLPs are still split."""
    names = parameter_shapes(PRESETS["tiny-moe-shared"])
    moe = [n for n in names if ".moe." in n]
    assert moe and all(tp_split_dim(n) is None for n in moe)
    assert tp_split_dim("blocks.0.mlp.up.weight") == 0  # tiny-moe-shared's dense block


def test_step_metrics_count_each_microbatch_once_under_full_recompute():
    """Counted as backward passes a block: full recompute runs its forward twice, the
    count stays one per microbatch (and evaluation counts nothing)."""
    figures = []
    with one_thread():
        for recompute in ("none", "full"):
            layout = Layout(microbatches=2, recompute=recompute)
            groups = build_groups(layout)
            engine = build_engine(CFG, layout, groups, "cpu", seed=0)
            engine.forward_backward(*_batch(0))
            engine.evaluate(*_batch(1))
            figures.append(moe_step_metrics(engine.model, groups, CFG))
    assert figures[0] == figures[1]
    assert all(sum(row) == BATCH * SEQ * CFG.top_k for row in figures[0]["expert_tokens"])
    assert figures[0]["aux_loss"] > 0
