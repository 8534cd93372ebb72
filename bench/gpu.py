"""One GPU: paraxis's single-device step beside the best plain PyTorch and Hugging Face
transformers, on the same shapes, batch, optimizer and clipping, in one run.

The sides of every run (all listed here before any of them ran on a GPU):

- paraxis: the one-device engine `paraxis train` builds (bf16 parameters with fp32 masters,
  AdamW, clipping at 1.0), eager;
- paraxis --compile: the same engine with its blocks and head compiled;
- paraxis fp8 --compile: the same, its block GEMMs in FP8 (`--precision fp8`, tensorwise
  scales; on a GPU without FP8 tensor cores the side says so and the others run);
- reference: the compiled plain loop of `bench/reference.py` (one q/k/v GEMM, SDPA,
  `F.cross_entropy`, fused AdamW, `torch.compile` of the whole model, bf16 autocast);
- transformers: GPT2LMHeadModel or LlamaForCausalLM (SDPA attention) compiled, with the same
  optimizer and clipping, where transformers is installed;
- paraxis --compile --fused-loss: the compiled engine with the LM head and loss fused
  (`--fused-loss`: the logits never whole);
- reference fp8: the compiled reference with torchao's float8 training (tensorwise), where
  torchao is installed (a lent GPU's image lacks it: gpu_session.sh says how to carry it);
- paraxis autocast-bf16 --compile: the compiled engine with fp32 parameters, gradients and
  AdamW under bf16 autocast (`--precision autocast-bf16`: the reference's recipe, 16 bytes
  a parameter with fp32 gradients, no 16-bit copy of the weights kept through the step).

Columns: tokens/s, the ratio to the best peer (reference or transformers), MFU
(`plan.compute.mfu`, the planner's FLOP count over the device's peak), peak allocated
memory, and CUDA kernels per step (torch.profiler, one step). Beside paraxis's rows stands
`plan.cost.evaluate` for the same run on the GPU's preset: eager kernels for the eager side,
fused ones for the compiled side; nothing in the planner is fitted to these runs.

On a machine without CUDA the full-size part is not run (a CPU tells nothing about a GPU);
`--quick` runs every side on the CPU at a tiny size, uncompiled, so the code cannot rot.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import torch

from bench.common import engine_step, measure_steps, token_batch
from bench.reference import Reference, float8, hf_model, training_step
from paraxis.dist.groups import build_groups
from paraxis.parallelize import build_engine
from paraxis.plan.compute import mfu
from paraxis.plan.cost import Estimate, evaluate
from paraxis.plan.hardware import build_cluster, get_gpu
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS, ModelConfig
from paraxis.spec.precision import MIXED_ADAM, PRECISIONS
from paraxis.spec.runtime_options import RuntimeOptions
from paraxis.train.calibrate.measure import cpu_model_name
from paraxis.train.metrics import device_peak_flops
from paraxis.train.run_hardware import gpu_for_device_name

# (model, sequences, tokens each): GPT-2 124M at two batches, and an 8-layer slice of
# Llama 3 8B (GQA, SwiGLU, a 128K vocabulary) at 4K tokens.
FULL = {"runs": [("gpt2-124m", 16, 1024), ("gpt2-124m", 8, 1024), ("llama3-8b/8", 2, 4096)],
        "steps": 20, "warmup": 5, "compile": True}
QUICK = {"runs": [("tiny", 2, 64), ("tiny-llama", 2, 64)], "steps": 2, "warmup": 1,
         "compile": False}
SIDES = ("paraxis", "paraxis --compile", "paraxis fp8 --compile", "reference",
         "transformers", "reference fp8", "paraxis --compile --fused-loss",
         "paraxis autocast-bf16 --compile")
PEERS = ("reference", "transformers")
CLIP = 1.0


def model(name: str) -> ModelConfig:
    """A preset, or "preset/L": the preset cut to its first L layers."""
    base, _, layers = name.partition("/")
    cfg = PRESETS[base]
    return cfg.replace(name=name, n_layers=int(layers)) if layers else cfg


def run(quick: bool) -> dict:
    if not torch.cuda.is_available():
        if not quick:
            return {"skipped": "no CUDA device on this machine (torch.cuda.is_available() is "
                               "False); run `python -m bench --only gpu` on a GPU machine"}
        return measure_all(torch.device("cpu"), QUICK)
    return measure_all(torch.device("cuda", torch.cuda.current_device()),
                       QUICK if quick else FULL)


def measure_all(device: torch.device, setting: dict) -> dict:
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    preset = gpu_for_device_name(name) if cuda else None
    runs = [measure(device, model_name, batch, seq, setting, preset)
            for model_name, batch, seq in setting["runs"]]
    return {"device": name, "preset": preset.name if preset else None,
            "peak_flops": device_peak_flops(device), "steps": setting["steps"],
            "compiled": setting["compile"], "torch": torch.__version__,
            "cuda": torch.version.cuda if cuda else None,
            # the host's CPU: a step of few tokens is the host's, and lent hosts differ by
            # half in their time a kernel (docs/gpu/README.md, "The fifth H200 run")
            "host_cpu": cpu_model_name(), "runs": runs}


def measure(device: torch.device, model_name: str, batch: int, seq: int, setting: dict,
            preset) -> dict:
    """One run, every side in turn (each freed before the next is built)."""
    cfg = model(model_name)
    x, y = token_batch(cfg.vocab_size, batch, seq, device)
    sides = {}
    for side in setting.get("sides", SIDES):
        started = time.perf_counter()
        try:
            sides[side] = measure_side(side, cfg, x, y, setting, device)
        except Exception as error:  # one side failing (a compiler error) keeps the others
            first = (str(error).splitlines() or [""])[0]  # a bare assert has no message
            sides[side] = {"error": f"{type(error).__name__}: {first}"}
        finally:
            # the side's figures as it ends: a part stopped at its time limit keeps them
            measured = sides.get(side, {})
            figures = measured.get("error", "failed")
            if "step_time_s" in measured:
                kernels = measured["kernels_per_step"]
                phases = measured.get("peak_by_phase") or {}
                figures = (f"{measured['step_time_s'] * 1e3:,.1f} ms a step, peak memory "
                           f"{_gib(measured['peak_memory_bytes'])}, "
                           + ("-" if kernels is None else f"{kernels:,}") + " kernels"
                           + "".join(f", {phase} {_gib(value)}"
                                     for phase, value in phases.items()))
            print(f"{model_name} {batch} x {seq}, {side}: {figures} "
                  f"({time.perf_counter() - started:,.0f} s with compiling)", flush=True)
            gc.collect()
            torch._dynamo.reset()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    peak = device_peak_flops(device)
    for result in sides.values():
        if "tokens_per_s" in result:
            result["mfu"] = mfu(cfg, seq, result["tokens_per_s"], 1, peak) if peak else None
    best_peer = max((sides.get(p, {}).get("tokens_per_s", 0.0) for p in PEERS), default=0.0)
    for result in sides.values():
        if "tokens_per_s" in result and best_peer:
            result["ratio_to_best_peer"] = result["tokens_per_s"] / best_peer
    if preset is not None:
        for side, estimate in planned(cfg, batch, seq, preset.name).items():
            if "error" in sides.get(side, {"error": "not run"}):
                continue
            sides[side]["planner_step_time_s"] = estimate.step_time_s
            sides[side]["planner_memory_bytes"] = estimate.memory["total"]
            sides[side]["planner_allocated_bytes"] = allocated_bytes(estimate)
    return {"model": cfg.name, "params": cfg.num_params(), "batch": batch, "seq": seq,
            "sides": sides}


# paraxis's sides as the planner prices them: (kernels, precision); the loss kernel follows
# the side's name, the optimizer is paraxis's own AdamW
PLANNED = {"paraxis": ("eager", MIXED_ADAM), "paraxis --compile": ("compiled", MIXED_ADAM),
           "paraxis fp8 --compile": ("compiled", PRECISIONS["fp8"]),
           "paraxis --compile --fused-loss": ("compiled", MIXED_ADAM),
           "paraxis autocast-bf16 --compile": ("compiled", PRECISIONS["autocast-bf16"])}


def planned(cfg: ModelConfig, batch: int, seq: int, gpu: str) -> dict[str, Estimate]:
    """`plan.cost.evaluate` of each paraxis side on the GPU preset `gpu` (no GPU needed:
    `python -m bench.gpu --planner h200`)."""
    out = {}
    for side, (kernels, precision) in PLANNED.items():
        runtime = {"kernels": kernels, "optimizer_kernel": "paraxis",
                   "loss_kernel": "fused-linear" if side.endswith("--fused-loss")
                   else "chunked"}
        out[side] = evaluate(cfg, Layout(), build_cluster(gpu, 1, 1, runtime), seq, batch,
                             precision)
    return out


def allocated_bytes(estimate: Estimate) -> float:
    """The planner's peak as torch's allocator counts it: its total less the reserve (the
    CUDA context and the allocator's slack, which max_memory_allocated leaves out)."""
    return estimate.memory["total"] - estimate.memory["reserved"]


def measure_side(side: str, cfg: ModelConfig, x: torch.Tensor, y: torch.Tensor,
                 setting: dict, device: torch.device) -> dict:
    step = build_side(side, cfg, x, y, setting["compile"], device)
    if step is None:
        return {"error": ("torchao" if side.endswith("fp8") else "transformers")
                + " is not installed"}
    measured = measure_steps(step, setting["steps"], setting["warmup"], device)
    tokens = x.numel()
    engine = getattr(step, "engine", None)
    return {"step_time_s": measured["step_time_s"],
            "tokens_per_s": tokens / measured["step_time_s"],
            "peak_memory_bytes": measured["peak_memory_bytes"] if device.type == "cuda"
            else None,
            "kernels_per_step": kernels_per_step(step) if device.type == "cuda" else None,
            "peak_by_phase": _phases(engine, x, y, device)}


def _phases(engine, x: torch.Tensor, y: torch.Tensor, device: torch.device
            ) -> dict[str, int] | None:
    """`phase_peaks` where there is a paraxis engine on a GPU; an error there costs the side
    only this figure."""
    if engine is None or device.type != "cuda":
        return None
    try:
        return phase_peaks(engine, x, y, device)
    except Exception as error:  # the side's step time and memory stand without it
        print(f"peak by phase not measured: {type(error).__name__}: {error}", flush=True)
        return None


def phase_peaks(engine, x: torch.Tensor, y: torch.Tensor, device: torch.device
                ) -> dict[str, int]:
    """Peak allocated bytes of one more step, by phase: the states alone (the step's
    start), forward and backward, then clipping and the optimizer step (where a peak
    above the first's is the optimizer's own temporaries)."""
    torch.cuda.synchronize(device)
    peaks = {"states": torch.cuda.memory_allocated(device)}
    torch.cuda.reset_peak_memory_stats(device)
    engine.forward_backward_on_device(x, y)
    torch.cuda.synchronize(device)
    peaks["forward_backward"] = torch.cuda.max_memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    engine.clip_grad_norm_on_device(CLIP)
    engine.optimizer_step(1e-3)
    torch.cuda.synchronize(device)
    peaks["optimizer"] = torch.cuda.max_memory_allocated(device)
    engine.zero_grad()
    return peaks


def build_side(side: str, cfg: ModelConfig, x: torch.Tensor, y: torch.Tensor,
               compile: bool, device: torch.device) -> Callable[[], None] | None:
    if side.startswith("paraxis"):
        compiled = compile and "--compile" in side
        precision = ("fp8" if "fp8" in side else "autocast-bf16" if "autocast" in side
                     else "bf16" if device.type == "cuda" else "fp32")
        engine = build_engine(cfg, Layout(), build_groups(Layout()), device, seed=0,
                              options=RuntimeOptions(
                                  precision=precision, compile=compiled,
                                  fused_loss=side.endswith("--fused-loss")))
        step = engine_step(engine, x, y, clip=CLIP)
        step.engine = engine  # type: ignore[attr-defined]  # for `phase_peaks`
        return step
    if side == "reference":
        return training_step(Reference(cfg).to(device), x, y, CLIP, compile=compile)
    if side == "reference fp8":
        model = float8(Reference(cfg).to(device))
        return None if model is None else training_step(model, x, y, CLIP, compile=compile)
    built = hf_model(cfg)
    if built is None:
        return None
    hf, loss_of = built
    return training_step(hf.to(device), x, y, CLIP, compile=compile, loss_of=loss_of)


def kernels_per_step(step: Callable[[], None]) -> int:
    """CUDA kernels one step launches (torch.profiler's device events)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sum(1 for event in prof.events() if event.device_type == DeviceType.CUDA)


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:,.1f} GiB"


def render(section: dict) -> str:
    head = "## One GPU: paraxis beside the compiled reference and transformers\n\n"
    if "skipped" in section:
        return head + f"Not run: {section['skipped']}.\n"
    if section["runs"] and "sides" not in section["runs"][0]:
        return render_paraxis_alone(section)
    peak = section["peak_flops"]
    lines = [
        head + "One training step (forward, backward, clip at 1.0, AdamW) on "
        + section["device"] + ", every side on the same batch: paraxis's one-device engine "
        "(bf16 parameters, fp32 masters), eager and `--compile`; the compiled plain loop of "
        "bench/reference.py; Hugging Face transformers compiled. Ratio: tokens/s over the "
        "best peer's. MFU: the planner's model FLOPs (`plan.compute.mfu`) over the peak dense "
        "bf16 FLOP/s" + (f" ({peak / 1e12:,.0f} TFLOP/s)" if peak else "") + ". Planner: "
        f"`plan.cost.evaluate` on the {section['preset'] or '(none)'} preset; error = planner "
        "/ measured - 1; its peak is the bytes it forecasts less its reserve, what "
        "`max_memory_allocated` counts. The runs were listed before any ran on a GPU."
        + ("" if section.get("compiled") else " Quick run on the CPU: nothing compiled, "
           "fp32 (the autocast-bf16 side: bf16 autocast)."), "",
        "| run | side | step | tokens/s | ratio | MFU | peak memory | kernels/step "
        "| planner step | error | planner peak | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in section["runs"]:
        run_name = f"{r['model']} ({r['params'] / 1e6:,.0f}M), {r['batch']} x {r['seq']}"
        for side, s in r["sides"].items():
            if "error" in s:
                lines.append(f"| {run_name} | {side} | not run: {s['error']} |"
                             + " |" * 9)
                continue
            planned = s.get("planner_step_time_s")
            ratio = s.get("ratio_to_best_peer")
            lines.append(
                f"| {run_name} | {side} | {s['step_time_s'] * 1e3:,.1f} ms "
                f"| {s['tokens_per_s']:,.0f} | "
                + ("-" if ratio is None else f"{ratio:.2f}") + " | "
                + ("-" if s.get("mfu") is None else f"{s['mfu']:.1%}")
                + f" | {_gib(s['peak_memory_bytes'])} | "
                + ("-" if s["kernels_per_step"] is None else f"{s['kernels_per_step']:,}")
                + " | " + ("-" if planned is None else f"{planned * 1e3:,.1f} ms")
                + " | " + ("-" if planned is None
                           else f"{planned / s['step_time_s'] - 1:+.0%}")
                + " | " + _planned_peak(s) + " |")
    host = f", host CPU {section['host_cpu']}" if section.get("host_cpu") else ""
    lines += ["", f"torch {section['torch']}, CUDA {section['cuda']}{host}; median of "
              f"{section['steps']} steps after warm-up (compiling happens in the warm-up)."]
    return "\n".join(lines) + "\n"


def _planned_peak(side: dict) -> str:
    """The planner's peak allocated bytes and its error against the measured peak, as two
    table cells ("-" where either is missing)."""
    planned, measured = side.get("planner_allocated_bytes"), side.get("peak_memory_bytes")
    if planned is None:
        return "- | -"
    return f"{_gib(planned)} | " + ("-" if not measured else f"{planned / measured - 1:+.1%}")


def render_paraxis_alone(section: dict) -> str:
    """A section this bench wrote before it had peers (paraxis's eager step alone, beside
    the planner), as it was measured: kept until the next GPU run replaces it."""
    lines = ["## One GPU: paraxis's bf16 step alone (before the side-by-side bench)\n\n"
             f"Measured on {section['device']} (torch {section['torch']}, CUDA "
             f"{section['cuda']}, median of {section['steps']} steps): the one-device engine "
             "under bf16 autocast, eager, beside `plan.cost.evaluate` on the "
             f"{section['preset']} preset with eager kernels (error = planner / measured - 1). "
             "The runtime has changed since (docs/gpu/README.md); `python -m bench --only gpu` "
             "on a GPU replaces this table.", "",
             "| model | batch x seq | step | tokens/s | MFU | planner step | error | peak memory "
             "|", "|---|---|---|---|---|---|---|---|"]
    for r in section["runs"]:
        planned = r.get("planner_step_time_s")
        lines.append(
            f"| {r['model']} ({r['params'] / 1e6:,.0f}M) | {r['batch']} x {r['seq']} "
            f"| {r['step_time_s'] * 1e3:,.1f} ms | {r['tokens_per_s']:,.0f} | "
            + ("-" if r.get("mfu") is None else f"{r['mfu']:.1%}") + " | "
            + ("-" if planned is None else f"{planned * 1e3:,.1f} ms | "
               f"{planned / r['step_time_s'] - 1:+.0%}")
            + f" | {_gib(r.get('peak_memory_bytes'))} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import argparse
    import json
    from pathlib import Path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, any device")
    parser.add_argument("--out", type=Path, help="write gpu-step.md and .json here")
    parser.add_argument("--runs", help="which of the full runs, by position from 0 "
                        "(\"0,2\"; default all): a lent GPU's 10-minute calls fit a part")
    parser.add_argument("--sides", help="which sides, by position in SIDES from 0 (default "
                        "all)")
    parser.add_argument("--planner", metavar="GPU", help="print only the planner's step time "
                        "and memory of paraxis's sides on this GPU preset (e.g. h200), for "
                        "every full run; no GPU needed")
    args = parser.parse_args()
    if args.out is not None and (args.out.is_file() or any(
            parent.is_file() for parent in args.out.parents)):
        parser.error(f"--out {args.out}: give a folder (gpu-step.md and gpu-step.json are "
                     "written in it), not a file or a path through one")
    if args.planner:
        try:
            get_gpu(args.planner)
        except ParaxisError as error:
            parser.error(f"--planner: {error}")
        for model_name, batch, seq in FULL["runs"]:
            for side, estimate in planned(model(model_name), batch, seq, args.planner).items():
                print(f"{model_name} {batch} x {seq}, {side}: planner "
                      f"{estimate.step_time_s * 1e3:,.1f} ms, "
                      f"{_gib(estimate.memory['total'])}")
        raise SystemExit(0)
    if args.sides:
        try:
            FULL["sides"] = QUICK["sides"] = [SIDES[int(i)] for i in args.sides.split(",")]
        except (ValueError, IndexError):
            parser.error(f"--sides {args.sides}: give positions 0-{len(SIDES) - 1}, "
                         "comma-separated")
    if args.runs:
        try:
            FULL["runs"] = [FULL["runs"][int(i)] for i in args.runs.split(",")]
        except (ValueError, IndexError):
            parser.error(f"--runs {args.runs}: give positions 0-{len(FULL['runs']) - 1}, "
                         "comma-separated")
    result = run(args.quick)
    print(render(result), end="")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu-step.md").write_text(render(result))
        (args.out / "gpu-step.json").write_text(json.dumps(result, indent=1) + "\n")
