"""What a full recomputation reruns: the runtime's checkpoint stops once the tensors the
backward reads are rebuilt, so a block's down projection is never rerun, and the planner
prices that rerun (`GPU.recompute_rerun`), not the whole forward, for paraxis's runtime."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

from paraxis.kernels.fp8 import Fp8Gemm, fp8_linear
from paraxis.model.transformer import build_model
from paraxis.plan.compute import layer_gemm_shapes
from paraxis.plan.cost import evaluate
from paraxis.plan.explain import assumptions_line
from paraxis.plan.hardware import build_cluster
from paraxis.plan.layer_cost import layer_times
from paraxis.plan.rates import DEFAULT_OVERLAP, down_projection_seconds, layer_rates, overlap_on
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.precision import PRECISIONS

GEMMS = ("mm", "addmm", "bmm", "baddbmm")


class _Gemms(TorchDispatchMode):
    """Counts the matrix products the ops under it run."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.count += func.overloadpacket.__name__ in GEMMS
        return func(*args, **(kwargs or {}))


def _backward_gemms(model: torch.nn.Module, tokens: torch.Tensor) -> int:
    loss = model(tokens, targets=tokens)
    with _Gemms() as gemms:
        loss.backward()
    return gemms.count


@pytest.mark.parametrize("name", ["tiny", "tiny-llama"])
@pytest.mark.parametrize("layers", [1, 2])
def test_the_runtime_reruns_all_of_a_block_but_its_down_projection(name, layers) -> None:
    cfg = PRESETS[name]
    model = build_model(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (2, 16))
    x = torch.randn(2, 16, cfg.d_model)
    with _Gemms() as block:
        model.blocks[0](x)
    plain = _backward_gemms(model, tokens)
    model.set_recompute("full", layers)
    rerun = _backward_gemms(model, tokens) - plain
    # every block's forward again, but for the last down projection of each checkpoint
    assert block.count >= 3
    assert rerun == cfg.n_layers * block.count - cfg.n_layers // layers


def test_the_compiled_block_reruns_all_but_its_down_projection_too() -> None:
    """Under torch.compile the partitioner decides what the backward recomputes: not the
    down projection either (its output is read by nothing the backward needs)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    def gemms_of(graphs: dict, name: str):
        def compiler(module, inputs):  # noqa: ANN001, ANN202
            graphs[name] = sum(
                getattr(getattr(node.target, "overloadpacket", None), "__name__", "") in GEMMS
                for node in module.graph.nodes if node.op == "call_function")
            return make_boxed_func(module.forward)
        return compiler

    cfg, counts = PRESETS["tiny"], []
    for recompute in (False, True):
        torch._dynamo.reset()
        block = build_model(cfg).blocks[0]
        block.recompute = recompute
        graphs: dict = {}
        backend = aot_autograd(fw_compiler=gemms_of(graphs, "forward"),
                               bw_compiler=gemms_of(graphs, "backward"),
                               partition_fn=min_cut_rematerialization_partition)
        torch.compile(block, backend=backend)(
            torch.randn(2, 16, cfg.d_model, requires_grad=True)).sum().backward()
        counts.append(graphs)
    plain, checkpointed = counts
    assert plain["forward"] >= 3
    # torch 2.11's partitioner (the GPU image's) keeps the q/k/v projection's output too and
    # reruns one GEMM fewer; from 2.12 on it reruns it, as the planner prices the run
    kept = 2 if torch.__version__ < "2.12" else 1
    assert checkpointed["backward"] - plain["backward"] == plain["forward"] - kept


def _full(cfg, cluster, **layout):
    return layer_times(cfg, Layout(recompute="full", **layout), cluster, 2048, 4)


def test_the_planner_prices_the_rerun_the_runtime_runs() -> None:
    cfg = PRESETS["llama2-7b"]
    eager = build_cluster("h100-sxm-80gb", 8, 8, {"kernels": "eager"})
    whole = build_cluster("h100-sxm-80gb", 8, 8, {"kernels": "eager",
                                                  "recompute_rerun": "whole"})
    rate = layer_rates(eager, 1)[0]
    down = down_projection_seconds(cfg, eager, 1, rate) * 2048 * 4
    # the down projection, one of the layer's four GEMMs, 3/8 of its weights' FLOPs
    k, n = layer_gemm_shapes(cfg)[-1]
    assert down > 0 and k * n == cfg.d_ff * cfg.d_model
    assert (_full(cfg, whole)["backward"] - _full(cfg, eager)["backward"]
            == pytest.approx(down, rel=1e-9))
    # only the last block of a grouped checkpoint stops short
    assert (_full(cfg, whole)["backward"] - _full(cfg, eager, recompute_layers=2)["backward"]
            == pytest.approx(down / 2, rel=1e-9))
    # Megatron's fused runtime ("auto") reruns the whole forward; "needed" asks otherwise
    fused = build_cluster("h100-sxm-80gb", 8, 8)
    needed = build_cluster("h100-sxm-80gb", 8, 8, {"recompute_rerun": "needed"})
    assert _full(cfg, fused)["gpu_rerun"] == _full(cfg, fused)["gpu_forward"]
    assert _full(cfg, needed)["gpu_rerun"] < _full(cfg, needed)["gpu_forward"]


def test_a_search_prices_each_checkpoint_group_as_its_own_rerun() -> None:
    # a search shares per-block times between layouts (`evaluate`'s memo): a checkpoint of
    # two blocks reruns more than one of each block, and must not take its price
    cfg = PRESETS["llama2-7b"]
    cluster = build_cluster("h100-sxm-80gb", 8, 8, {"kernels": "eager"})
    memo: dict = {}
    for group in (1, 2, 4):
        layout = Layout(dp=8, zero=1, microbatches=4, recompute="full", recompute_layers=group)
        alone = evaluate(cfg, layout, cluster, 2048, 64)
        shared = evaluate(cfg, layout, cluster, 2048, 64, memo=memo)
        assert shared.step_time_s == alone.step_time_s


def test_an_fp8_linear_is_rerun_as_it_saves_after_its_gemm() -> None:
    """An autograd Function saves its inputs when its forward has returned: the rerun stops
    after the FP8 down projection's GEMM, which the planner then prices again."""
    gemm = Fp8Gemm("tensorwise")
    w1, w2 = (torch.randn(32, 32, requires_grad=True) for _ in range(2))

    def block(x: torch.Tensor, linear) -> torch.Tensor:
        return x + linear(torch.relu(linear(x, w1)), w2)

    def gemms(linear) -> tuple[int, int, int]:
        """(forward, backward, backward of the checkpointed block) GEMMs."""
        counts = []
        for recompute in (False, True):
            x = torch.randn(16, 32, requires_grad=True)
            with _Gemms() as forward:
                y = checkpoint(block, x, linear, use_reentrant=False) if recompute \
                    else block(x, linear)
            with _Gemms() as backward:
                y.sum().backward()
            counts += [forward.count, backward.count]
        return counts[0], counts[1], counts[3]

    forward, backward, checkpointed = gemms(lambda x, w: x @ w.t())
    assert checkpointed - backward == forward - 1  # aten: the last GEMM is not rerun
    forward, backward, checkpointed = gemms(lambda x, w: fp8_linear(x, w, None, gemm))
    assert checkpointed - backward == forward  # FP8: every GEMM runs again
    cfg = PRESETS["llama2-7b"]
    eager = build_cluster("h100-sxm-80gb", 8, 8, {"kernels": "eager"})
    times = layer_times(cfg, Layout(recompute="full"), eager, 2048, 4,
                        precision=PRECISIONS["fp8"])
    assert times["gpu_rerun"] == times["gpu_forward"]


def test_a_tensor_parallel_rerun_skips_the_down_projections_collective() -> None:
    cfg = PRESETS["llama2-7b"]
    for sp, rerun_calls in ((False, 1 / 2), (True, 3 / 4)):
        layout = dict(tp=8, sequence_parallel=sp)
        eager = build_cluster("h100-sxm-80gb", 8, 8, {"kernels": "eager"})
        whole = build_cluster("h100-sxm-80gb", 8, 8, {"kernels": "eager",
                                                      "recompute_rerun": "whole"})
        forward = layer_times(cfg, Layout(**layout), eager, 2048, 4)["tp_forward"]
        backward = layer_times(cfg, Layout(**layout), eager, 2048, 4)["tp_backward"]
        assert _full(cfg, eager, **layout)["tp_backward"] == pytest.approx(
            backward + rerun_calls * forward)
        assert _full(cfg, whole, **layout)["tp_backward"] == pytest.approx(backward + forward)


def test_a_mixture_of_experts_block_reruns_whole() -> None:
    """Its last saved tensors are the experts' outputs, which the routing weights multiply."""
    cfg = PRESETS["mixtral-8x7b"]
    layout = Layout(dp=8, ep=8, recompute="full")
    eager = build_cluster("h100-sxm-80gb", 8, 8, {"kernels": "eager"})
    whole = build_cluster("h100-sxm-80gb", 8, 8, {"kernels": "eager",
                                                  "recompute_rerun": "whole"})
    assert (layer_times(cfg, layout, eager, 2048, 1, moe=True)
            == layer_times(cfg, layout, whole, 2048, 1, moe=True))


def test_an_unknown_rerun_is_one_line() -> None:
    with pytest.raises(ParaxisError, match="recompute_rerun='sometimes' is unknown; use "
                                           "auto, whole or needed"):
        build_cluster("a100-80gb", 8, 8, {"recompute_rerun": "sometimes"})


def test_the_defence_says_what_the_rerun_assumed() -> None:
    cfg = PRESETS["llama2-7b"]
    layout = Layout(dp=8, zero=1, recompute="full")
    for kernels, said in (("fused", "each checkpointed block's whole forward"),
                          ("eager", "a dense block's but for its down projection")):
        cluster = build_cluster("a100-80gb", 8, 8, {"kernels": kernels})
        best = evaluate(cfg, layout, cluster, 4096, 64)
        assert said in assumptions_line(best, overlap_on(cluster, DEFAULT_OVERLAP), cluster.gpu)
