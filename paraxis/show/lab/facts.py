"""The numbers the lab page shows, computed here by the library over every slider setting.

The page holds no formula of its own for these: each widget looks its figures up in the
JSON these functions return (`paraxis.show.lab.page` embeds it). A slider's range is the set of
keys below, so the browser test can walk the whole range and compare each figure with a
fresh call into the library. Pipeline timelines and the rank grid live in
`schedule_facts.py` and `grid_facts.py`.
"""

from __future__ import annotations

import math

from paraxis.plan.comm import ring_all_reduce_time, tp_collectives_per_layer
from paraxis.plan.compute import BACKWARD_FLOPS_RATIO, counted_forward_flops_per_token
from paraxis.plan.explain import states_fit
from paraxis.plan.hardware import CLUSTERS, GPU, GPUS
from paraxis.plan.inputs import DEFAULT_GPU
from paraxis.plan.memory import model_state_bytes, zero_table
from paraxis.plan.ring_steps import ring_schedule, simulate_ring
from paraxis.show.viz.tp_split import COLUMN, ROW, SplitWeight
from paraxis.spec.model_config import PRESETS
from paraxis.spec.units import GB

# ----------------------------------------------------------------------- the hardware

# The hardware the lab prices is the planner's: its default GPU (`paraxis plan` without
# --gpu) in the cluster preset built around it (tests/test_lab_numbers.py checks the two
# agree), read from the presets so that the page and the CLI state the same memory and links.
LAB_GPU = GPUS[DEFAULT_GPU]
LAB_CLUSTER = "dgx-a100"


def hardware_facts() -> dict:
    """The preset figures every hardware-dependent number of the page rests on, with the
    preset names the page prints beside them."""
    cluster = CLUSTERS[LAB_CLUSTER]
    return {"gpu": LAB_GPU.name, "memory_bytes": LAB_GPU.memory_bytes,
            "memory_gib": LAB_GPU.memory_bytes / 2**30, "reserved_bytes": LAB_GPU.reserved_bytes,
            "nvlink_Bps": LAB_GPU.nvlink_bandwidth_Bps, "peak_flops": LAB_GPU.peak_flops,
            "cluster": LAB_CLUSTER, "gpus_per_node": cluster["gpus_per_node"],
            "rail_Bps": float(cluster["inter_node_bandwidth_Bps"])}  # type: ignore[arg-type]

# ----------------------------------------------------------------- chapter 0: the gap

# CS 229s "Parallelism Fundamentals", ch. 0: LLM parameters grow ~10x a year (GPT-3, 175B
# in 2020), GPU memory ~2x every 2.5 years (A100, 80 GB in 2020: the planner's a100-80gb).
MODEL_GROWTH_PER_YEAR = 10.0
GPU_MEMORY_DOUBLING_YEARS = 2.5
BASE_YEAR, BASE_PARAMS, BASE_GPU_BYTES = 2020, 175e9, LAB_GPU.memory_bytes
YEARS = list(range(2018, 2026))
MODEL_SIZES_B = [1, 7, 13, 30, 70, 175, 405, 1000]  # billions of parameters
# The largest model each year whose parameter count its authors stated in a paper or report
# of that year, counting models evaluated there as models (a mixture of experts counts every
# expert: each is trained, so each has its 16 bytes). Left out: sizes never published
# (GPT-4, PaLM 2), counts announced without a paper that year (Wu Dao 2.0, 2021; ERNIE 5.0,
# 2025, its report 2026), and runs reported to demonstrate a training system (M6-10T, 10T,
# Lin et al. 2021; BaGuaLu, 14.5T, Ma et al. 2022). The course's 10x a year holds to 2021
# and then breaks: published sizes level off near a trillion.
LARGEST_PUBLISHED = {
    # Shazeer et al. 2018, Mesh-TensorFlow, arXiv:1811.02084 (BERT-Large: 0.34B)
    2018: ("Mesh-TensorFlow Transformer", 5e9),
    2019: ("T5-11B", 11e9),  # Raffel et al. 2019, arXiv:1910.10683
    # Lepikhin et al. 2020, GShard, arXiv:2006.16668: 600B (GPT-3, Brown et al. 2020: 175B)
    2020: ("GShard (MoE)", 600e9),
    # Fedus et al. 2021, Switch Transformers, arXiv:2101.03961 (GLaM, Du et al. 2021: 1.2T)
    2021: ("Switch-C (MoE)", 1.571e12),
    2022: ("PaLM", 540e9),  # Chowdhery et al. 2022, arXiv:2204.02311
    # Ren et al. 2023, PanGu-Sigma, arXiv:2303.10845: 1.085T (Falcon-180B, 2023: 180B)
    2023: ("PanGu-Σ (MoE)", 1.085e12),
    2024: ("DeepSeek-V3 (MoE)", 671e9),  # DeepSeek-AI 2024, arXiv:2412.19437
    2025: ("Kimi K2 (MoE)", 1.04e12),  # Kimi Team 2025, arXiv:2507.20534
}


def scaling_facts() -> dict:
    """Per year the course's trend of frontier parameters and the largest published model,
    each with its training-state bytes (the 16 P rule of `model_state_bytes`), against one
    GPU's memory less the runtime's reserve (as `dp_remedies` and the planner count what
    fits); per model size what one GPU lacks."""
    reserve = LAB_GPU.reserved_bytes
    years = []
    for year in YEARS:
        params = BASE_PARAMS * MODEL_GROWTH_PER_YEAR ** (year - BASE_YEAR)
        gpu = BASE_GPU_BYTES * 2 ** ((year - BASE_YEAR) / GPU_MEMORY_DOUBLING_YEARS)
        state = sum(model_state_bytes(int(params), 1, 0).values())
        name, published = LARGEST_PUBLISHED[year]
        published_state = sum(model_state_bytes(int(published), 1, 0).values())
        years.append({"year": year, "params": params, "state_bytes": state, "gpu_bytes": gpu,
                      "gpus_to_hold": math.ceil(state / (gpu - reserve)),
                      "published_name": name, "published_params": published,
                      "published_state_bytes": published_state,
                      "published_gpus_to_hold": math.ceil(published_state / (gpu - reserve))})
    models = []
    for billions in MODEL_SIZES_B:
        states = model_state_bytes(int(billions * 1e9), 1, 0)
        total = sum(states.values())
        models.append({"billions": billions, "weights_bytes": states["params"],
                       "state_bytes": total,
                       "gpus_to_hold": math.ceil(total / (BASE_GPU_BYTES - reserve))})
    return {"years": years, "models": models, "gpu_bytes": BASE_GPU_BYTES,
            "reserved_bytes": reserve, "hardware": hardware_facts()}


# ------------------------------------------------------------ chapter 1: data parallel

DP_GPUS = [1, 2, 4, 8]
DP_BATCHES = [64, 128, 256, 512]
DP_MODEL_B = [1, 7, 13]
# Up to 8 GPUs: one node of the lab's cluster, its GPUs' NVLink (each way, per GPU)
NVLINK_BPS = LAB_GPU.nvlink_bandwidth_Bps
DP_PHASES = ["replicate", "partition data", "forward + backward", "all-reduce gradients",
             "update"]


def fits_on_gpu(state_bytes: float, gpu: GPU = LAB_GPU) -> bool:
    """`plan.explain.states_fit` on the lab's GPU unless told another."""
    return states_fit(state_bytes, gpu)


def dp_remedies(params: int, gpus: int) -> dict:
    """What holds a model that plain data parallelism cannot, on `gpus` GPUs: each ZeRO stage
    (`zero_table`) and TP or PP splitting the model `gpus` ways (every GPU the whole states of
    1/gpus of the parameters), those that fit with their bytes per GPU; and the fewest GPUs
    over which ZeRO-3 (or TP x PP, the same bytes) fits, with its bytes per GPU."""
    options = []
    if gpus > 1:
        options = [{"name": f"ZeRO-{row['zero']}", "bytes": row["total"]}
                   for row in zero_table(params, gpus)[1:]]
        options.append({"name": f"TP or PP over {gpus} GPUs",
                        "bytes": sum(model_state_bytes(params // gpus, 1, 0).values())})
    # ZeRO-3 holds 16 P / n bytes a GPU (`zero_table`): fits from n = 16 P / spare memory
    whole = sum(model_state_bytes(params, 1, 0).values())
    least = max(2, math.ceil(whole / (LAB_GPU.memory_bytes - LAB_GPU.reserved_bytes)))
    return {"fitting": [o for o in options if fits_on_gpu(o["bytes"])], "least_gpus": least,
            "least_bytes": zero_table(params, least)[3]["total"]}


def toy_gradients(gpus: int, batch: int) -> dict:
    """Chapter 1's claim made concrete: y = w x, squared loss, w = 0. Each GPU's gradient
    over its sub-batch, their average (what the all-reduce leaves on every GPU) and the
    gradient of the whole batch on one device: the last two are the same number."""
    xs = [1 + i % 5 for i in range(batch)]
    ys = [3 * x + (i % 3) - 1 for i, x in enumerate(xs)]

    def grad(items: list[int]) -> float:
        # d/dw mean (w x - y)^2 at w = 0 is mean(-2 x y)
        return sum(-2 * xs[i] * ys[i] for i in items) / len(items)

    per = batch // gpus
    local = [grad(list(range(g * per, (g + 1) * per))) for g in range(gpus)]
    return {"local": local, "averaged": sum(local) / gpus, "full": grad(list(range(batch)))}


def dp_facts() -> dict:
    """Per (GPUs, global batch, model size): examples per GPU, memory per GPU (no sharding:
    every replica holds all 16 P bytes), whether that fits the lab's GPU and what would,
    and the gradient all-reduce on its NVLink."""
    settings = {}
    for gpus in DP_GPUS:
        for batch in DP_BATCHES:
            for billions in DP_MODEL_B:
                params = int(billions * 1e9)
                states = model_state_bytes(params, gpus, 0)
                memory = sum(states.values())
                settings[f"{gpus}/{batch}/{billions}"] = {
                    "per_gpu": batch // gpus,
                    "memory_bytes": memory,
                    "fits": fits_on_gpu(memory),
                    "remedies": None if fits_on_gpu(memory) else dp_remedies(params, gpus),
                    "grad_bytes": states["grads"],
                    "all_reduce_s": ring_all_reduce_time(states["grads"], gpus, NVLINK_BPS),
                    "toy": toy_gradients(gpus, batch)}
    return {"gpus": DP_GPUS, "batches": DP_BATCHES, "models": DP_MODEL_B,
            "phases": DP_PHASES, "hardware": hardware_facts(), "settings": settings}


# ----------------------------------------------------------------- chapter 2: the ring

RING_RANKS = list(range(2, 9))
RING_MESSAGE_GB = [0.5, 1, 2, 4, 8]
RING_BANDWIDTH_GBPS = [12.5, 25, 50, 100, 200, 400, 900]


def all_reduce_times(message_bytes: float, gpus: int, bandwidth_Bps: float) -> dict:
    """Chapter 2's comparison for one all-reduce of `message_bytes` on every GPU: reduce to
    one GPU and send back, against the ring (`ring_all_reduce_time`, the planner's formula).

    Reduce to one: the root receives the other gpus - 1 messages through its one link, then
    sends the sum back to each of them, so (gpus - 1) X crosses that link each way in turn,
    2 (gpus - 1) X / B, "O(NX) through one bottleneck" (ch. 2). The ring: every GPU sends
    2 (gpus - 1) X / gpus, all links busy at once."""
    return {"naive_s": 2 * (gpus - 1) * message_bytes / bandwidth_Bps,
            "naive_root_bytes": 2 * (gpus - 1) * message_bytes,
            "ring_s": ring_all_reduce_time(message_bytes, gpus, bandwidth_Bps),
            "ring_bytes_per_gpu": 2 * (gpus - 1) * message_bytes / gpus}


def ring_facts() -> dict:
    """Every step of `simulate_ring` for each ring size (one element per chunk, the
    simulator's default inputs) and, for every ring size, message and bandwidth on the
    sliders, the ring's time and reduce-to-one's (`all_reduce_times`)."""
    rings = {}
    for ranks in RING_RANKS:
        sim = simulate_ring(ranks)
        rings[str(ranks)] = {
            "initial": [[chunk[0] for chunk in rank] for rank in sim.initial],
            "steps": [{"phase": step.phase,
                       "sends": [[t.src, t.dst, t.chunk] for t in step.transfers],
                       "values": [[chunk[0] for chunk in rank] for rank in step.values],
                       "contributors": [[sorted(c) for c in rank] for rank in step.contributors]}
                      for step in sim.steps],
            "step_count": len(ring_schedule(ranks))}
    compared = {f"{n}/{x:g}/{b:g}": all_reduce_times(x * GB, n, b * GB)
                for n in RING_RANKS for x in RING_MESSAGE_GB for b in RING_BANDWIDTH_GBPS}
    return {"ranks": RING_RANKS, "message_gb": RING_MESSAGE_GB,
            "bandwidth_gbps": RING_BANDWIDTH_GBPS, "rings": rings,
            "times": {key: c["ring_s"] for key, c in compared.items()}, "compared": compared}


# -------------------------------------------------------------------- chapter 5: ZeRO

ZERO_MODEL_B = [1, 3, 7, 13, 30, 70, 175]
ZERO_GPUS = [1, 2, 4, 8, 16, 32, 64]
# The GPU slider: the planner's GPU presets (`paraxis plan --gpu`), least memory first.
ZERO_GPU_PRESETS = sorted(GPUS, key=lambda name: (GPUS[name].memory_bytes, name))


def zero_facts() -> dict:
    """`zero_table` (the library's ZeRO calculator) for every model size and GPU count, and
    the memory of each GPU preset with what the planner holds back on it (`fits_on_gpu`:
    the states fit when they and the reserve fit within the memory)."""
    tables = {f"{b:g}/{n}": zero_table(int(b * 1e9), n)
              for b in ZERO_MODEL_B for n in ZERO_GPUS}
    presets = {name: {"memory_bytes": GPUS[name].memory_bytes,
                      "reserved_bytes": GPUS[name].reserved_bytes}
               for name in ZERO_GPU_PRESETS}
    return {"models": ZERO_MODEL_B, "gpus": ZERO_GPUS, "gpu_presets": ZERO_GPU_PRESETS,
            "gpu_memory": presets, "default_gpu": DEFAULT_GPU, "tables": tables}


# ---------------------------------------------------------- chapter 3: tensor parallel

TP_DEGREES = [1, 2, 4, 8]
# Links of the course's chapters 3 and 7, GB/s one way per GPU (what a ring step sends at),
# read from the planner's presets, each with the preset it comes from: the lab GPU's NVLink
# (NVLink 3 of an A100: the course's "900 GB/s" is NVLink 4 of an H100 counting both ways),
# one HDR InfiniBand rail (200 Gb/s) per GPU of a DGX A100 (the course's "200-400 GB/s" is a
# node's eight rails), PCIe Gen4 x16 (the course's "64 GB/s" counts both ways), one 100 Gb/s
# Ethernet NIC.
TP_LINK_PRESETS = {"NVLink": (f"{DEFAULT_GPU}'s NVLink", LAB_GPU.nvlink_bandwidth_Bps),
                   "InfiniBand": (f"{LAB_CLUSTER}: one HDR rail per GPU",
                                  CLUSTERS[LAB_CLUSTER]["inter_node_bandwidth_Bps"]),
                   "PCIe": ("pcie-box: PCIe Gen4 x16",
                            CLUSTERS["pcie-box"]["nvlink_bandwidth_Bps"]),
                   "Ethernet": ("ethernet-1nic: one 100 Gb/s NIC",
                                CLUSTERS["ethernet-1nic"]["inter_node_bandwidth_Bps"])}
TP_LINKS = {name: float(bps) / GB  # type: ignore[arg-type]
            for name, (_, bps) in TP_LINK_PRESETS.items()}
# The step the traffic and compute figures price: Llama 2 7B's layers, one sequence, bf16.
TP_PRESET = "llama2-7b"
TP_MODEL = {"layers": PRESETS[TP_PRESET].n_layers, "d_model": PRESETS[TP_PRESET].d_model,
            "seq_len": 2048, "batch": 1, "bytes": 2}


def tp_traffic() -> dict:
    """Seconds of TP all-reduces per training step: `tp_collectives_per_layer` collectives
    of one layer's activations (batch x seq x d_model) per layer, each a ring all-reduce at
    the link's full rate."""
    m = TP_MODEL
    activation_bytes = m["batch"] * m["seq_len"] * m["d_model"] * m["bytes"]
    counts = tp_collectives_per_layer(sequence_parallel=False)
    per_layer = counts["forward"]["all_reduce"] + counts["backward"]["all_reduce"]
    times = {f"{tp}/{name}": m["layers"] * per_layer
             * ring_all_reduce_time(activation_bytes, tp, gbps * GB)
             for tp in TP_DEGREES for name, gbps in TP_LINKS.items()}
    return {"activation_bytes": activation_bytes, "per_layer": per_layer,
            "per_step": m["layers"] * per_layer, "times": times}


def tp_compute() -> dict:
    """Seconds of the same layers' forward and backward per step on each of `tp` GPUs at
    the lab GPU's peak FLOP/s (the rate the traffic figure gives its links): the planner's
    FLOPs per token and layer (`counted_forward_flops_per_token`), backward twice the
    forward (`BACKWARD_FLOPS_RATIO`), split evenly over the tp ranks."""
    m = TP_MODEL
    weights, scores = counted_forward_flops_per_token(PRESETS[TP_PRESET], m["seq_len"])
    flops = (1 + BACKWARD_FLOPS_RATIO) * (weights + scores) * m["layers"] * m["seq_len"] \
        * m["batch"]
    return {"flops": flops, "peak_flops": LAB_GPU.peak_flops,
            "times": {str(tp): flops / (tp * LAB_GPU.peak_flops) for tp in TP_DEGREES}}


def gelu(x: float) -> float:
    # Hendrycks & Gimpel 2016: x * Phi(x), the exact form (torch's default)
    return 0.5 * x * (1 + math.erf(x / math.sqrt(2)))


def tp_mlp(tp: int) -> dict:
    """Megatron's MLP (Shoeybi et al. 2019, sec. 3) on a 2 x 4 input, split over `tp` ranks
    the way `viz.tp_split` slices the model's weights: up is column-parallel (each rank owns
    d_ff / tp output features, so GeLU runs locally), down is row-parallel (each rank owns
    the matching input rows and makes a partial sum), then one all-reduce adds the partials.
    Returns every rank's slices and the all-reduced output next to one device's."""
    d_model, d_ff = 4, 8
    x = [[1, -1, 2, 0], [0, 2, -1, 1]]
    w_up = [[(i * 3 + j * 2) % 5 - 2 for j in range(d_ff)] for i in range(d_model)]
    w_down = [[(i * 2 + j * 3) % 5 - 2 for j in range(d_model)] for i in range(d_ff)]

    def matmul(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
        return [[sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))]
                for i in range(len(a))]

    up = SplitWeight("blocks.0.mlp.up.weight", d_ff, d_model, COLUMN)
    down = SplitWeight("blocks.0.mlp.down.weight", d_model, d_ff, ROW)
    ranks = []
    for rank in range(tp):
        a, b = up.slice_of(rank, tp)  # output features of up
        c, d = down.slice_of(rank, tp)  # input features of down: the same d_ff slice
        hidden = matmul(x, [row[a:b] for row in w_up])
        activated = [[gelu(v) for v in row] for row in hidden]
        partial = matmul(activated, w_down[c:d])
        ranks.append({"columns": [a, b], "rows": [c, d], "hidden": hidden,
                      "activated": activated, "partial": partial})
    reduced = [[sum(r["partial"][i][j] for r in ranks) for j in range(d_model)]
               for i in range(len(x))]
    single = matmul([[gelu(v) for v in row] for row in matmul(x, w_up)], w_down)
    return {"x": x, "w_up": w_up, "w_down": w_down, "ranks": ranks, "reduced": reduced,
            "single": single}


def tp_facts() -> dict:
    return {"degrees": TP_DEGREES, "links": TP_LINKS,
            "link_presets": {name: preset for name, (preset, _) in TP_LINK_PRESETS.items()},
            "model": {**TP_MODEL, "preset": TP_PRESET}, "hardware": hardware_facts(),
            # what the note beside the links compares the course's both-ways figures with
            "nvlink_Bps": {name: GPUS[name].nvlink_bandwidth_Bps
                           for name in (DEFAULT_GPU, "h100-sxm-80gb")},
            "rail_Bps": {name: CLUSTERS[name]["inter_node_bandwidth_Bps"]
                         for name in ("dgx-a100", "dgx-h100")},
            "traffic": tp_traffic(), "compute": tp_compute(),
            "mlp": {str(tp): tp_mlp(tp) for tp in TP_DEGREES}}
