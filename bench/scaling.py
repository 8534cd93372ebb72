"""Step time as the model grows (hidden x1, x2, x4) and as ranks grow (1, 2, 4, 8), for data
and for pipeline parallelism, measured next to the planner's prediction; one picture.

The global batch stays fixed (strong scaling): more ranks split the same work. On a machine
with fewer cores than ranks the ranks share the cores, so the step cannot keep shrinking;
the planner models that sharing (paraxis/plan/cost.py), and the picture shows both.
"""

from __future__ import annotations

from pathlib import Path

from bench.predicted_vs_measured import measure_around, predict
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig

IMAGE = "img/scaling.png"


def model(hidden: int, layers: int = 8) -> ModelConfig:
    """small-llama's proportions at another width: 32-wide heads, 2 heads per kv head,
    d_ff = 2.75 d_model (704 / 256)."""
    heads = max(1, hidden // 32)
    return ModelConfig(f"llama-h{hidden}", "llama", 256, layers, hidden, heads,
                       max(1, heads // 2), round(2.75 * hidden), 256)


def setting(quick: bool) -> dict:
    if quick:
        return {"quick": True, "hidden": [32, 64], "base_hidden": 32, "ranks": [1, 2],
                "layers": 2,
                "global_batch": 4, "seq_len": 32, "microbatches": 2, "steps": 1,
                "warmup": 1, "repeats": 1}
    return {"quick": False, "hidden": [128, 256, 512], "base_hidden": 256,
            "ranks": [1, 2, 4, 8], "layers": 8,
            "global_batch": 16, "seq_len": 64, "microbatches": 8, "steps": 4, "warmup": 2,
            "repeats": 1}


def layout_for(kind: str, ranks: int, microbatches: int) -> Layout:
    if kind == "dp" or ranks == 1:
        return Layout(dp=ranks)
    return Layout(pp=ranks, microbatches=microbatches, schedule="1f1b")


def _point(kind: str, axis: str, hidden: int, ranks: int, s: dict, profile: dict,
           measured: dict, log) -> dict:  # noqa: ANN001
    cfg = model(hidden, s["layers"])
    layout = layout_for(kind, ranks, s["microbatches"])
    layout = layout.validate(ranks, cfg, s["global_batch"], s["seq_len"])
    key = (str(layout), hidden)  # a point on both curves (1 rank, base hidden) runs once
    if key not in measured:
        seconds, _, available = measure_around(cfg, layout, s)
        predicted = predict(cfg, layout, profile, s["global_batch"], s["seq_len"],
                            {"available_cores": available})
        measured[key] = (seconds, predicted.step_time_s, available)
        log(f"  {layout}, hidden {hidden}: measured {seconds:.3f} s, predicted "
            f"{predicted.step_time_s:.3f} s with {available:.2f} cores available")
    seconds, predicted_s, available = measured[key]
    return {"kind": kind, "axis": axis, "hidden": hidden, "ranks": ranks,
            "available_cores": available,
            "layout": str(layout), "measured_step_s": seconds,
            "predicted_step_s": predicted_s, "error": predicted_s / seconds - 1}


def run(quick: bool, profile: dict, image_dir: Path, log=print) -> dict:  # noqa: ANN001
    s = setting(quick)
    points: list[dict] = []
    measured: dict = {}
    for kind in ("dp", "pp"):
        for hidden in s["hidden"]:
            points.append(_point(kind, "hidden", hidden, 2, s, profile, measured, log))
        for ranks in s["ranks"]:
            points.append(_point(kind, "ranks", s["base_hidden"], ranks, s, profile, measured,
                                 log))
    path = Path(image_dir) / IMAGE
    path.parent.mkdir(parents=True, exist_ok=True)
    plot(points, path)
    return {"setting": s, "points": points, "image": IMAGE}


def plot(points: list[dict], path: Path) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from paraxis.show.viz.style import AXIS_COLOUR, new_figure, save_figure

    seconds = FuncFormatter(lambda y, _: f"{y:g} s")

    fig, (by_hidden, by_ranks) = new_figure(11, 4.2, ncols=2)
    for ax, axis, xlabel in ((by_hidden, "hidden", "hidden size (d_model), 2 ranks"),
                             (by_ranks, "ranks", "ranks (same global batch)")):
        for kind in ("dp", "pp"):
            mine = sorted((p for p in points if p["axis"] == axis and p["kind"] == kind),
                          key=lambda p: p[axis])
            xs = [p[axis] for p in mine]
            colour = AXIS_COLOUR[kind]
            ax.plot(xs, [p["measured_step_s"] for p in mine], "o-", color=colour,
                    label=f"{kind.upper()} measured")
            ax.plot(xs, [p["predicted_step_s"] for p in mine], "s--", color=colour,
                    markerfacecolor="white", label=f"{kind.upper()} predicted")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(seconds)
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(xlabel)
        ax.set_ylabel("step time (log scale)")
        ax.grid(color="#dddddd", linewidth=0.6, which="both")
        ax.set_axisbelow(True)
        ax.legend(fontsize=8)
    by_hidden.set_title("Step time as the model grows")
    by_ranks.set_title("Step time as ranks grow")
    save_figure(fig, str(path))


def render(data: dict) -> str:
    s = data["setting"]
    lines = [
        "## Scaling: measured next to predicted",
        "",
        f"![step time vs hidden size and vs ranks]({data['image']})",
        "",
        f"Llama-style models of {s['layers']} layers (small-llama's proportions), global batch "
        f"{s['global_batch']} x {s['seq_len']} tokens, fp32; DP is dp=n (ZeRO-0), PP is pp=n "
        f"1F1B with {s['microbatches']} microbatches. Left: hidden size at 2 ranks; right: "
        f"ranks at hidden {s['base_hidden']}. Measured: median of {s['steps']} steps, "
        "slowest rank. Predicted on the profile `python -m bench` calibrated just before "
        "these points ran (the calibration section shows the newest, which may be later), "
        "with the cores our ranks got around each point (column cores); the compute rates "
        "are the calibration's.",
        "",
        "| kind | varied | hidden | ranks | cores | layout | measured | predicted | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in data["points"]:
        lines.append(f"| {p['kind'].upper()} | {p['axis']} | {p['hidden']} | {p['ranks']} | "
                     f"{p['available_cores']:.2f} | `{p['layout']}` | "
                     f"{p['measured_step_s']:.3f} s | "
                     f"{p['predicted_step_s']:.3f} s | {p['error']:+.0%} |")
    return "\n".join(lines) + "\n"
