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
from paraxis.plan.hardware import CLUSTERS, GPUS
from paraxis.plan.memory import model_state_bytes, zero_table
from paraxis.plan.ring_steps import ring_schedule, simulate_ring
from paraxis.show.viz.tp_split import COLUMN, ROW, SplitWeight
from paraxis.spec.units import GB

# ----------------------------------------------------------------- chapter 0: the gap

# CS 229s "Parallelism Fundamentals", ch. 0: LLM parameters grow ~10x a year (GPT-3, 175B
# in 2020), GPU memory ~2x every 2.5 years (A100, 80 GB in 2020).
MODEL_GROWTH_PER_YEAR = 10.0
GPU_MEMORY_DOUBLING_YEARS = 2.5
BASE_YEAR, BASE_PARAMS, BASE_GPU_BYTES = 2020, 175e9, 80 * GB
YEARS = list(range(2018, 2026))
MODEL_SIZES_B = [1, 7, 13, 30, 70, 175, 405, 1000]  # billions of parameters
# The largest model each year whose parameter count its authors published (a mixture of
# experts counts every expert: each is trained, so each has its 16 bytes). The course's 10x a
# year holds to GPT-3 and then breaks: published sizes level off near a trillion.
LARGEST_PUBLISHED = {
    2018: ("BERT-Large", 0.34e9),  # Devlin et al. 2018
    2019: ("T5-11B", 11e9),  # Raffel et al. 2019
    2020: ("GPT-3", 175e9),  # Brown et al. 2020
    2021: ("Switch-C (MoE)", 1.571e12),  # Fedus et al. 2021 (Megatron-Turing NLG: 530B dense)
    2022: ("PaLM", 540e9),  # Chowdhery et al. 2022
    2023: ("Falcon-180B", 180e9),  # Almazrouei et al. 2023 (GPT-4's size is unpublished)
    2024: ("DeepSeek-V3 (MoE)", 671e9),  # DeepSeek-AI 2024
    2025: ("Kimi K2 (MoE)", 1.04e12),  # Kimi Team 2025
}


def scaling_facts() -> dict:
    """Per year the course's trend of frontier parameters and the largest published model,
    each with its training-state bytes (the 16 P rule of `model_state_bytes`), against one
    GPU's memory; per model size what one GPU lacks."""
    years = []
    for year in YEARS:
        params = BASE_PARAMS * MODEL_GROWTH_PER_YEAR ** (year - BASE_YEAR)
        gpu = BASE_GPU_BYTES * 2 ** ((year - BASE_YEAR) / GPU_MEMORY_DOUBLING_YEARS)
        state = sum(model_state_bytes(int(params), 1, 0).values())
        name, published = LARGEST_PUBLISHED[year]
        published_state = sum(model_state_bytes(int(published), 1, 0).values())
        years.append({"year": year, "params": params, "state_bytes": state, "gpu_bytes": gpu,
                      "gpus_to_hold": math.ceil(state / gpu), "published_name": name,
                      "published_params": published, "published_state_bytes": published_state,
                      "published_gpus_to_hold": math.ceil(published_state / gpu)})
    models = []
    for billions in MODEL_SIZES_B:
        states = model_state_bytes(int(billions * 1e9), 1, 0)
        total = sum(states.values())
        models.append({"billions": billions, "weights_bytes": states["params"],
                       "state_bytes": total, "gpus_to_hold": math.ceil(total / BASE_GPU_BYTES)})
    return {"years": years, "models": models, "gpu_bytes": BASE_GPU_BYTES}


# ------------------------------------------------------------ chapter 1: data parallel

DP_GPUS = [1, 2, 4, 8]
DP_BATCHES = [64, 128, 256, 512]
DP_MODEL_B = [1, 7, 13]
NVLINK_BPS = 25 * GB  # the course's ring example: "B = 25 GB/s (NVLink)"
DP_PHASES = ["replicate", "partition data", "forward + backward", "all-reduce gradients",
             "update"]


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
    every replica holds all 16 P bytes) and the gradient all-reduce on NVLink."""
    settings = {}
    for gpus in DP_GPUS:
        for batch in DP_BATCHES:
            for billions in DP_MODEL_B:
                params = int(billions * 1e9)
                states = model_state_bytes(params, gpus, 0)
                settings[f"{gpus}/{batch}/{billions}"] = {
                    "per_gpu": batch // gpus,
                    "memory_bytes": sum(states.values()),
                    "grad_bytes": states["grads"],
                    "all_reduce_s": ring_all_reduce_time(states["grads"], gpus, NVLINK_BPS),
                    "toy": toy_gradients(gpus, batch)}
    return {"gpus": DP_GPUS, "batches": DP_BATCHES, "models": DP_MODEL_B,
            "phases": DP_PHASES, "settings": settings}


# ----------------------------------------------------------------- chapter 2: the ring

RING_RANKS = list(range(2, 9))
RING_MESSAGE_GB = [0.5, 1, 2, 4, 8]
RING_BANDWIDTH_GBPS = [12.5, 25, 50, 100, 200, 400, 900]


def ring_facts() -> dict:
    """Every step of `simulate_ring` for each ring size (one element per chunk, the
    simulator's default inputs) and the ring's time (`ring_all_reduce_time`, the planner's
    formula) for every ring size, message and bandwidth on the sliders."""
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
    times = {f"{n}/{x:g}/{b:g}": ring_all_reduce_time(x * GB, n, b * GB)
             for n in RING_RANKS for x in RING_MESSAGE_GB for b in RING_BANDWIDTH_GBPS}
    return {"ranks": RING_RANKS, "message_gb": RING_MESSAGE_GB,
            "bandwidth_gbps": RING_BANDWIDTH_GBPS, "rings": rings, "times": times}


# -------------------------------------------------------------------- chapter 5: ZeRO

ZERO_MODEL_B = [1, 3, 7, 13, 30, 70, 175]
ZERO_GPUS = [1, 2, 4, 8, 16, 32, 64]
GPU_MEMORY_GB = [24, 40, 80, 141]


def zero_facts() -> dict:
    """`zero_table` (the library's ZeRO calculator) for every model size and GPU count."""
    tables = {f"{b:g}/{n}": zero_table(int(b * 1e9), n)
              for b in ZERO_MODEL_B for n in ZERO_GPUS}
    return {"models": ZERO_MODEL_B, "gpus": ZERO_GPUS, "gpu_memory_gb": GPU_MEMORY_GB,
            "tables": tables}


# ---------------------------------------------------------- chapter 3: tensor parallel

TP_DEGREES = [1, 2, 4, 8]
# Links of the course's chapters 3 and 7, GB/s one way per GPU (what a ring step sends at),
# read from the planner's presets: NVLink 4 of an H100 (the course's "900 GB/s" counts both
# ways), one 200 Gb/s InfiniBand rail per GPU (DGX A100; the course's "200-400 GB/s" is a
# node's eight), PCIe Gen4 x16 (the course's "64 GB/s" counts both ways), one 100 Gb/s
# Ethernet NIC.
TP_LINKS = {"NVLink": GPUS["h100-sxm-80gb"].nvlink_bandwidth_Bps / GB,
            "InfiniBand": float(CLUSTERS["dgx-a100"]["inter_node_bandwidth_Bps"]) / GB,
            "PCIe": float(CLUSTERS["pcie-box"]["nvlink_bandwidth_Bps"]) / GB,
            "Ethernet": float(CLUSTERS["ethernet-1nic"]["inter_node_bandwidth_Bps"]) / GB}
# The step the traffic figure prices: a 7B-like model (Llama-2 7B shapes), one sequence.
TP_MODEL = {"layers": 32, "d_model": 4096, "seq_len": 2048, "batch": 1, "bytes": 2}


def tp_traffic() -> dict:
    """Seconds of TP all-reduces per training step: `tp_collectives_per_layer` collectives
    of one layer's activations (batch x seq x d_model) per layer, each a ring all-reduce."""
    m = TP_MODEL
    activation_bytes = m["batch"] * m["seq_len"] * m["d_model"] * m["bytes"]
    counts = tp_collectives_per_layer(sequence_parallel=False)
    per_layer = counts["forward"]["all_reduce"] + counts["backward"]["all_reduce"]
    times = {f"{tp}/{name}": m["layers"] * per_layer
             * ring_all_reduce_time(activation_bytes, tp, gbps * GB)
             for tp in TP_DEGREES for name, gbps in TP_LINKS.items()}
    return {"activation_bytes": activation_bytes, "per_layer": per_layer,
            "per_step": m["layers"] * per_layer, "times": times}


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
    return {"degrees": TP_DEGREES, "links": TP_LINKS, "model": TP_MODEL,
            "traffic": tp_traffic(), "mlp": {str(tp): tp_mlp(tp) for tp in TP_DEGREES}}
