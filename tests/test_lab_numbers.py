"""The lab's numbers as a reader sees them: the hardware they rest on is the planner's, each
is printed with a sensible precision and never with an exponent, each states its limit
(data parallelism's memory), and the drawings that carry them (the ring's arrows and labels,
the pipeline's stage names, the mixture of experts' colours, context parallelism's figures
in a narrow window) show them whole. One headless session for all of it, as tests/test_lab.py
drives the page.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from paraxis.cli import main
from paraxis.plan.comm import ring_all_reduce_time
from paraxis.plan.compute import model_flops_per_token
from paraxis.plan.hardware import CLUSTERS, GPUS
from paraxis.plan.inputs import DEFAULT_GPU
from paraxis.plan.memory import model_state_bytes, zero_table
from paraxis.plan.ring_steps import simulate_ring
from paraxis.show.lab import context_facts as C
from paraxis.show.lab import expert_facts as X
from paraxis.show.lab import facts as F
from paraxis.show.lab import schedule_facts as S
from paraxis.show.lab.page import lab_data, write_lab
from paraxis.spec.model_config import PRESETS
from tests.test_lab import choose, click, open_lab, set_grid, slide, text

# The widgets this file reads, by section id.
SECTIONS = ("w-scaling", "w-dp", "w-ring", "w-tp", "w-pipe", "w-zero", "w-grid", "w-faults",
            "w-cp", "w-moe")
MAX_DIGITS = 4


@pytest.fixture(scope="module")
def data():
    return lab_data()


@pytest.fixture(scope="module")
def browser(tmp_path_factory, data):
    """The page in its own headless session (the other lab tests have theirs)."""
    driver = open_lab(write_lab(tmp_path_factory.mktemp("lab"), data))
    yield driver
    driver.quit()


def figure(shown: str, unit: str) -> float:
    """The first number before `unit` in a text ('85.9 GB on ...', 'GB') as a float."""
    return float(re.search(rf"(-?[\d.]+) {re.escape(unit)}", shown).group(1))


def significant_digits(number: str) -> int:
    """'0.0168' 3, '26.25' 4, '1120' 3, '12.00' 4: leading zeros never count, an integer's
    trailing zeros neither."""
    digits = number.lstrip("-").replace(",", "")
    if "." in digits:
        return len(digits.replace(".", "").lstrip("0"))
    return len(digits.lstrip("0").rstrip("0"))


# The text of the widgets of SECTIONS, as a reader sees it.
SHOWN = "return arguments[0].map((id) => document.getElementById(id).innerText).join('\\n')"


def badly_printed(shown: str) -> list[str]:
    """Every number in `shown` (widgets' text) with more than MAX_DIGITS significant digits or
    an exponent, with the text around it."""
    # a list of ranks ("[0,16,32,48]") is numbers, not one with thousands separators
    shown = re.sub(r"\[[\d,]+\]", lambda m: m.group(0).replace(",", ", "), shown)
    bad = [m.group(0) for m in re.finditer(r".{0,30}\d(?:\.\d+)?[eE][+-]?\d.{0,10}", shown)]
    for m in re.finditer(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?", shown):
        if significant_digits(m.group(0)) > MAX_DIGITS:
            bad.append(shown[max(0, m.start() - 30):m.end() + 10])
    return bad


class Moves:
    """A test's moves on the page, played in one script: each input and click is handled as
    it comes (the widgets redraw in their event handlers; only "play" runs on a timer), so one
    round trip to the browser makes them all and reads every scan, where one per move took
    most of a minute. Takes the calls tests/test_lab.py's helpers make on a driver."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, list]] = []  # (script body, its arguments)
        self._query = ""  # the element `find_element` named, for `click`

    def execute_script(self, script: str, *args: object) -> None:
        self.steps.append((script, list(args)))

    def find_element(self, by: str, value: str) -> Moves:
        self._query = (f"document.getElementById({json.dumps(value)})" if by == "id" else
                       f"document.querySelector({json.dumps(value)})")
        return self

    def click(self) -> None:
        self.steps.append((f"{self._query}.click();", []))

    def scan(self, where: str) -> None:
        self.steps.append((f"return [{json.dumps(where)}, (function () {{ {SHOWN} }})"
                           ".apply(null, arguments)];", [list(SECTIONS)]))

    def play(self, driver) -> list[tuple[str, str]]:
        """Make the moves; each scan's (where, text shown), in order."""
        steps, self.steps = self.steps, []
        return driver.execute_script(
            "const out = [];"
            "for (const [body, args] of arguments[0]) {"
            "  const got = new Function(body).apply(null, args);"
            "  if (got !== undefined) out.push(got); }"
            "return out;", steps)


# ------------------------------------------------------------------------ the hardware


def test_the_lab_s_hardware_is_the_planner_s():
    gpu = GPUS[DEFAULT_GPU]
    hardware = F.hardware_facts()
    assert CLUSTERS[F.LAB_CLUSTER]["gpu"] == DEFAULT_GPU  # the cluster holds the lab's GPU
    assert (hardware["gpu"], hardware["memory_bytes"], hardware["nvlink_Bps"],
            hardware["peak_flops"]) == (DEFAULT_GPU, gpu.memory_bytes,
                                        gpu.nvlink_bandwidth_Bps, gpu.peak_flops)
    assert F.BASE_GPU_BYTES == gpu.memory_bytes  # the scaling chart's 2020 point
    assert F.NVLINK_BPS == gpu.nvlink_bandwidth_Bps
    assert F.TP_LINKS == {"NVLink": gpu.nvlink_bandwidth_Bps / 1e9,
                          "InfiniBand": CLUSTERS["dgx-a100"]["inter_node_bandwidth_Bps"] / 1e9,
                          "PCIe": CLUSTERS["pcie-box"]["nvlink_bandwidth_Bps"] / 1e9,
                          "Ethernet": CLUSTERS["ethernet-1nic"]["inter_node_bandwidth_Bps"]
                          / 1e9}


def test_the_page_states_the_planner_s_gpu_memory_and_links(browser):
    gpu = GPUS[DEFAULT_GPU]
    for element in ("dp-capacity", "dp-link", "scaling-gpu", "tp-setting"):
        assert DEFAULT_GPU in text(browser, element), element  # named beside its figures
    capacity = text(browser, "dp-capacity")
    assert figure(capacity, "GB") == pytest.approx(gpu.memory_bytes / 1e9, rel=5e-4)
    assert f"{gpu.memory_bytes / 2**30:.0f} GiB" in capacity  # the planner's "86 GB = 80 GiB"
    assert figure(text(browser, "scaling-gpu"), "GB") == pytest.approx(gpu.memory_bytes / 1e9,
                                                                       rel=5e-4)
    assert figure(text(browser, "dp-link"), "GB/s") == gpu.nvlink_bandwidth_Bps / 1e9
    note = text(browser, "tp-link-note")
    for name, (preset, bandwidth) in F.TP_LINK_PRESETS.items():
        slide(browser, "tp-link", list(F.TP_LINKS), name)
        assert figure(text(browser, "tp-link-value"), "GB/s") == bandwidth / 1e9
        assert f"{name} {bandwidth / 1e9:g} GB/s ({preset})" in note
    for cluster in ("dgx-a100", "dgx-h100"):  # InfiniBand generations, each its own rail
        rail = CLUSTERS[cluster]["inter_node_bandwidth_Bps"]
        assert f"({8 * rail / 1e9:g} Gb/s, {cluster})" in note
        assert f"{rail / 1e9:g} GB/s" in note


# ------------------------------------------------------------------ data parallelism


def test_data_parallel_says_when_the_model_does_not_fit(browser):
    gpu = GPUS[DEFAULT_GPU]
    limit = gpu.memory_bytes - gpu.reserved_bytes
    click(browser, "dp-reset")
    for gpus, billions in ((1, 1), (8, 1), (4, 7), (8, 13), (2, 13), (1, 7)):
        slide(browser, "dp-gpus-n", F.DP_GPUS, gpus)
        slide(browser, "dp-model", F.DP_MODEL_B, billions)
        params = billions * 10**9
        states = sum(model_state_bytes(params, gpus, 0).values())
        said = text(browser, "dp-fit")
        if states <= limit:
            assert said.startswith("Fits: ")
            used, reserved, capacity = map(float, re.findall(r"([\d.]+) GB", said)[:3])
            assert used + reserved <= capacity  # rounded alike: never above when it fits
            continue
        assert said.startswith("Does not fit: ")
        assert "Data parallelism alone cannot train this model" in said
        fitting = [(f"ZeRO-{row['zero']}", row["total"]) for row in zero_table(params, gpus)
                   if row["zero"] and row["total"] <= limit]
        if gpus > 1 and states / gpus <= limit:
            fitting.append((f"TP or PP over {gpus} GPUs", states / gpus))
        for name, per_gpu in fitting:
            assert f"{name} (" in said and f"{per_gpu / 1e9:.4g} GB a GPU" in said, name
        if not fitting:  # the fewest GPUs that hold it sharded
            least = max(2, math.ceil(states / limit))
            assert f"needs at least {least} GPUs" in said
    slide(browser, "dp-gpus-n", F.DP_GPUS, 4)
    slide(browser, "dp-model", F.DP_MODEL_B, 7)


# ---------------------------------------------------------------------------- the ring


def test_ring_status_says_what_the_sums_are(browser):
    for ranks in (2, 4, 8):
        slide(browser, "ring-ranks", F.RING_RANKS, ranks)
        click(browser, "ring-reset")
        said = text(browser, "ring-status")
        finished = [int(chunk[0]) for chunk in simulate_ring(ranks).steps[-1].values[0]]
        assert "digits" not in said
        assert f"= {ranks * (ranks + 1) // 2} times 10^(c mod 3)" in said
        assert said.endswith(": " + ", ".join(map(str, finished)) + ".")


def ring_drawing(driver) -> dict:
    return driver.execute_script("""
        const svg = document.getElementById('ring-svg');
        const box = (e) => { const r = e.getBoundingClientRect();
                             return [r.left, r.top, r.right, r.bottom]; };
        return {markers: svg.querySelectorAll('defs marker#arrow').length,
                arrows: [...svg.querySelectorAll('line.send')].map(
                    (l) => l.getAttribute('marker-end')),
                labels: [...svg.querySelectorAll('text.sendlabel')].map(box),
                circles: [...svg.querySelectorAll('circle.node')].map(box)};""")


def overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_ring_arrows_keep_their_arrowhead_and_labels_clear_the_gpus(browser):
    for ranks in (2, 4, 8):
        slide(browser, "ring-ranks", F.RING_RANKS, ranks)
        click(browser, "ring-reset")
        for _ in range(2 * (ranks - 1)):  # every step of both phases
            click(browser, "ring-step")
            drawn = ring_drawing(browser)
            assert drawn["markers"] == 1  # the redraw keeps the arrowhead's definition
            assert drawn["arrows"] == ["url(#arrow)"] * ranks
            assert len(drawn["labels"]) == ranks and len(drawn["circles"]) == ranks
            for label in drawn["labels"]:
                assert not any(overlap(label, circle) for circle in drawn["circles"]), ranks
            labels = drawn["labels"]
            assert not any(overlap(a, b) for i, a in enumerate(labels) for b in labels[i + 1:])


def test_all_reduce_times_compare_reduce_to_one_with_the_ring():
    for ranks, gigabytes, bandwidth in ((2, 1, 25), (8, 2, 25), (5, 0.5, 400)):
        times = F.all_reduce_times(gigabytes * 1e9, ranks, bandwidth * 1e9)
        # the root takes (N - 1) X in and sends (N - 1) X out through its one link
        assert times["naive_s"] == pytest.approx(2 * (ranks - 1) * gigabytes / bandwidth)
        assert times["ring_s"] == ring_all_reduce_time(gigabytes * 1e9, ranks, bandwidth * 1e9)
        assert times["naive_s"] / times["ring_s"] == pytest.approx(ranks)
    assert F.all_reduce_times(2e9, 8, 25e9)["ring_s"] == pytest.approx(0.14)  # the course's


def test_ring_widget_shows_both_times(browser, data):
    for ranks, gigabytes, bandwidth in ((8, 2, 25), (3, 0.5, 400), (5, 8, 12.5)):
        slide(browser, "ring-ranks", F.RING_RANKS, ranks)
        slide(browser, "ring-message", F.RING_MESSAGE_GB, gigabytes)
        slide(browser, "ring-bandwidth", F.RING_BANDWIDTH_GBPS, bandwidth)
        times = F.all_reduce_times(gigabytes * 1e9, ranks, bandwidth * 1e9)
        assert data["ring"]["compared"][f"{ranks}/{gigabytes:g}/{bandwidth:g}"] == times
        naive = text(browser, "ring-naive-time")
        assert float(naive.split()[0]) * (1e-3 if naive.endswith("ms") else 1) \
            == pytest.approx(times["naive_s"], rel=5e-3)
        said = text(browser, "ring-naive")
        assert f"At N = {ranks}, X = {gigabytes:g} GB, B = {bandwidth:g} GB/s" in said
        assert f"the ring is {ranks}× faster" in said


# ------------------------------------------------------------------- tensor parallelism


def test_tp_check_weighs_the_all_reduces_against_the_compute(browser):
    cfg, m = PRESETS[F.TP_PRESET], F.TP_MODEL
    # the layers' share of the planner's training FLOPs: all but the LM head's 3 * 2 h V
    per_token = model_flops_per_token(cfg, m["seq_len"]) - 3 * 2 * cfg.d_model * cfg.vocab_size
    flops = per_token * m["seq_len"] * m["batch"]
    assert F.tp_compute()["flops"] == pytest.approx(flops)
    for tp in (2, 8):
        slide(browser, "tp-degree", F.TP_DEGREES, tp)
        click(browser, "tp-check")
        answer = text(browser, "tp-answer")
        compute = flops / (tp * GPUS[DEFAULT_GPU].peak_flops)
        shown = re.search(r"against ([\d.]+) (s|ms) of compute", answer)
        assert float(shown.group(1)) * (1e-3 if shown.group(2) == "ms" else 1) \
            == pytest.approx(compute, rel=5e-3)
        assert DEFAULT_GPU in answer
    titles = [e.text for e in browser.find_elements("css selector", "#tp-ranks .title")]
    assert titles[0] == "GPU 0 · d_ff column 0"  # at TP 8 one column each, never "0–0"


# ------------------------------------------------------------------- all the numbers


def test_no_number_has_more_than_four_digits_or_an_exponent(browser):
    """Every widget of this file through a spread of settings, its check answered."""
    page, moves, scans = browser, Moves(), []
    browser = moves  # the moves below go to the page together (`Moves`)
    scan = moves.scan

    years = [y["year"] for y in F.scaling_facts()["years"]]
    click(browser, "scaling-check")
    for year, billions in zip(years, F.MODEL_SIZES_B, strict=True):
        slide(browser, "scaling-year", years, year)
        slide(browser, "scaling-model", F.MODEL_SIZES_B, billions)
        scan(f"scaling {year} {billions}B")
    for gpus, batch, billions in ((1, 64, 1), (2, 128, 7), (4, 256, 13), (8, 512, 13)):
        slide(browser, "dp-gpus-n", F.DP_GPUS, gpus)
        slide(browser, "dp-batch", F.DP_BATCHES, batch)
        slide(browser, "dp-model", F.DP_MODEL_B, billions)
        click(browser, "dp-reset")
        for phase in range(len(F.DP_PHASES)):
            click(browser, "dp-step")
            scan(f"dp {gpus}/{batch}/{billions} phase {phase + 1}")
    for ranks, gigabytes, bandwidth in ((2, 0.5, 12.5), (5, 2, 25), (8, 8, 900)):
        slide(browser, "ring-ranks", F.RING_RANKS, ranks)
        slide(browser, "ring-message", F.RING_MESSAGE_GB, gigabytes)
        slide(browser, "ring-bandwidth", F.RING_BANDWIDTH_GBPS, bandwidth)
        click(browser, "ring-reset")
        for step in range(2 * (ranks - 1) + 1):
            scan(f"ring {ranks}/{gigabytes}/{bandwidth} step {step}")
            click(browser, "ring-step")
    click(browser, "ring-check")
    for tp in F.TP_DEGREES:
        slide(browser, "tp-degree", F.TP_DEGREES, tp)
        click(browser, "tp-reset")
        click(browser, "tp-step", 5)
        for link in F.TP_LINKS:
            slide(browser, "tp-link", list(F.TP_LINKS), link)
            scan(f"tp {tp} {link}")
        click(browser, "tp-check")
        scan(f"tp {tp} answered")
    for kind, stages, microbatches, virtual, slow in (
            ("gpipe", 4, 8, 1, "none"), ("1f1b", 3, 12, 1, 1), ("interleaved", 4, 12, 3, 2),
            ("interleaved", 3, 6, 4, 0), ("zb-h1", 5, 6, 1, "none"), ("zb-v", 6, 16, 2, 5),
            ("interleaved", 4, 6, 2, "none")):  # the last refused: M not a multiple of P
        browser.find_element("css selector", f"#pipe-kinds button[data-kind='{kind}']").click()
        slide(browser, "pipe-stages", S.STAGES, stages)
        slide(browser, "pipe-mb", S.MICROBATCHES, microbatches)
        if kind == "interleaved":
            slide(browser, "pipe-virtual", S.INTERLEAVED_VIRTUAL, virtual)
        choose(browser, "pipe-slow", slow)
        for overhead in S.MICROBATCH_OVERHEADS:
            slide(browser, "pipe-overhead", S.MICROBATCH_OVERHEADS, overhead)
            scan(f"pipe {kind} P={stages} M={microbatches} v={virtual} slow {slow} o={overhead}")
    click(browser, "pipe-check")
    scan("pipe answered")
    for billions, gpus in ((1, 1), (7, 8), (13, 16), (30, 32), (70, 64), (175, 2)):
        slide(browser, "zero-model", F.ZERO_MODEL_B, billions)
        slide(browser, "zero-gpus", F.ZERO_GPUS, gpus)
        for gpu in F.ZERO_GPU_PRESETS:
            slide(browser, "zero-memory", F.ZERO_GPU_PRESETS, gpu)
            for stage in range(4):
                slide(browser, "zero-stage", [0, 1, 2, 3], stage)
                scan(f"zero {billions}B on {gpus} {gpu} ZeRO-{stage}")
    click(browser, "zero-check")
    scan("zero answered")
    for degrees, per_node, shard in (((4, 4, 4, 1, 1), 4, 0), ((4, 2, 2, 2, 2), 8, 2),
                                     ((4, 1, 4, 2, 4), 8, 2), ((2, 4, 2, 2, 1), 4, 1),
                                     ((4, 1, 4, 2, 4), 8, 1)):  # the last refused: no GPUs
        set_grid(browser, *degrees, per_node, shard)
        scan(f"grid {degrees} {per_node} per node, shard {shard}")
        scans += moves.play(page)  # the moves so far made: the page says what it refused
        world = 0 if text(page, "grid-error") else math.prod(degrees[:4])
        for rank in sorted({0, world // 2 + 1, world - 1} if world else set()):
            browser.execute_script("window.lab.widgets.grid.hover(arguments[0])", rank)
            scan(f"grid {degrees} {per_node} per node, shard {shard}, rank {rank}")
    click(browser, "grid-check")
    scan("grid answered")
    for cp in C.CP_DEGREES:
        for seq in C.SEQ_LENS:
            for variant in C.VARIANTS:
                slide(browser, "cp-degree", C.CP_DEGREES, cp)
                slide(browser, "cp-seq", C.SEQ_LENS, seq)
                slide(browser, "cp-variant", list(C.VARIANTS), variant)
                scan(f"cp {cp} {seq} {variant}")
    click(browser, "cp-check")
    for ep in X.EP_DEGREES:
        for cf in X.CAPACITY_FACTORS:
            slide(browser, "moe-ep", X.EP_DEGREES, ep)
            slide(browser, "moe-cf", X.CAPACITY_FACTORS, cf)
            scan(f"moe {ep} {cf}")
    click(browser, "moe-check")
    scan("all answered")
    scans += moves.play(page)
    assert len(scans) > 300  # every scan above read the page
    bad = [f"{where}: {b}" for where, shown in scans for b in badly_printed(shown)]
    assert bad == []


def test_the_shared_formatter_keeps_digits_and_order(browser):
    cases = [0.14, 26.25, 293.125, 1120, 16777216, 1.75e16 / 1e15, 0.000512, 85.899, -65.7578]
    shown = browser.execute_script("return arguments[0].map((x) => fmt(x, 4))", cases)
    assert shown == ["0.14", "26.25", "293.1", "1120", "16780000", "17.5", "0.000512",
                     "85.9", "-65.76"]
    assert browser.execute_script("return gb(293.125e9)") == "293.1 GB"  # ZeRO-1, 70B on 64
    # a used figure below a capacity never prints above it, whatever the digits
    pairs = [(48.299, 48.305), (85.85, 85.899), (99.95, 99.96), (0.09996, 0.1)]
    for digits in (2, 3, 4):
        printed = browser.execute_script(
            "return arguments[0].map(([a, b]) => [fmt(a, arguments[1]), fmt(b, arguments[1])])",
            pairs, digits)
        assert all(float(used) <= float(capacity) for used, capacity in printed), printed


def test_the_planner_never_prints_a_fitting_layout_above_its_gpu(capsys):
    # 59.06 GB of a 59.09 GB GPU: with the capacity to whole GB it read "59.1 of 59 GB"
    code = main(["plan", "--gpus", "8", "--memory-gb", "59.09", "--layout",
                 "dp=8,tp=1,pp=1,zero=1,microbatches=128"])
    out = capsys.readouterr().out
    assert code == 0
    pairs = re.findall(r"([\d.]+) of ([\d.]+) GB", out)
    assert pairs and all(float(used) <= float(capacity) for used, capacity in pairs), pairs


# ------------------------------------------------------------- pictures and sections


def _contrast(first: str, second: str) -> float:
    """WCAG 2 contrast ratio of two CSS "rgb(r, g, b)" colours."""
    def luminance(css: str) -> float:
        inside = css[css.index("(") + 1:].rstrip(")")
        channels = [float(v) / 255 for v in inside.split(",")[:3]]
        linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
                  for c in channels]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    light, dark = sorted((luminance(first), luminance(second)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def test_moe_bars_have_a_colour_legend(browser):
    for ep, cf in ((2, 1.0), (8, 1.0)):
        slide(browser, "moe-ep", X.EP_DEGREES, ep)
        slide(browser, "moe-cf", X.CAPACITY_FACTORS, cf)
        legend = browser.execute_script(
            "return [...document.querySelectorAll('#moe-legend span')].map("
            "(s) => [s.id, s.getAttribute('data-colour'), s.textContent])")
        ranks = [entry for entry in legend if entry[0] != "moe-legend-dropped"]
        assert [name for _, _, name in ranks] == [f"rank {r}'s tokens" for r in range(ep)]
        for rank, (_, colour, _) in enumerate(ranks):  # each rank's bars wear its colour
            fills = browser.execute_script(
                "return [...document.querySelectorAll('#moe-bars [id^=moe-bar-]')]"
                ".filter((b) => b.id.endsWith('-' + arguments[0])).map((b) => b.getAttribute("
                "'fill'))", rank)
            assert fills and set(fills) == {colour}
        assert legend[-1][0] == "moe-legend-dropped"
        # every chip's text readable on its colour (WCAG contrast of at least 3:1)
        pairs = browser.execute_script(
            "return [...document.querySelectorAll('#moe-legend span')].map((s) => {"
            "const c = getComputedStyle(s); return [c.color, c.backgroundColor]; })")
        for text_colour, background in pairs:
            assert _contrast(text_colour, background) >= 3, (text_colour, background)
        drops = browser.execute_script(
            "return [...document.querySelectorAll('#moe-bars [id^=moe-drop-]')].map("
            "(b) => b.getAttribute('stroke-dasharray'))")
        assert drops and all(drops)  # dropped: dashed outlines, as the legend says
        assert "dashed" in browser.execute_script(
            "return document.getElementById('moe-legend-dropped').style.border")


def test_pipeline_stage_names_clear_the_timeline(browser):
    """A slow stage's longer name ("stage 2 (slow)") ends left of every op and idle bar."""
    browser.find_element("css selector", "#pipe-kinds button[data-kind='1f1b']").click()
    for stages, slow in ((4, 2), (8, 7), (2, "none")):
        slide(browser, "pipe-stages", S.STAGES, stages)
        choose(browser, "pipe-slow", slow)
        names, bars = browser.execute_script("""
            const svg = document.getElementById('pipe-svg');
            const box = (e) => e.getBoundingClientRect();
            return [[...svg.querySelectorAll(':scope > text.tick')].map((t) => box(t).right),
                    [...svg.querySelectorAll('rect')].map((r) => box(r).left)];""")
        assert len(names) == stages and max(names) < min(bars), (stages, slow)


def test_context_drawing_fits_a_narrow_window(browser):
    width, height = browser.get_window_size().values()
    browser.set_window_size(820, 1400)
    try:
        slide(browser, "cp-degree", C.CP_DEGREES, C.CP_DEGREES[-1])
        last = C.CP_DEGREES[-1] - 1
        edges = browser.execute_script("""
            const right = (e) => e.getBoundingClientRect().right;
            const last = (sel) => [...document.querySelectorAll(sel)].pop();
            return {page: document.documentElement.clientWidth,
                    section: right(document.getElementById('w-cp')),
                    pairs: right(document.getElementById('cp-pairs-contiguous-' + arguments[0])),
                    sequence: right(last('#cp-sequence rect')),
                    matrix: right(last('#cp-matrix [id^=cp-cell]')),
                    table: right(document.getElementById('cp-table'))};""", last)
        for name in ("pairs", "sequence", "matrix", "table"):
            assert edges[name] <= edges["section"] <= edges["page"], (name, edges)
    finally:
        browser.set_window_size(width, height)


def test_fault_tolerance_explains_redundant_computation(browser):
    section = " ".join(text(browser, "w-faults").split())
    for option in ("Checkpoint and restart", "Elastic training", "Redundant computation"):
        assert option in section
    redundant = " ".join(text(browser, "faults-redundant").split())
    assert "two replicas" in redundant
    assert "doubles the compute" in redundant  # what it costs ...
    assert "without a restart and without losing a step" in redundant  # ... and what it buys


def test_scaling_chart_dots_are_the_largest_published_sizes(browser):
    years = [y["year"] for y in F.scaling_facts()["years"]]
    # each a parameter count its authors published that year, larger than the usual picks
    assert F.LARGEST_PUBLISHED[2020] == ("GShard (MoE)", 600e9)  # GPT-3: 175B
    assert F.LARGEST_PUBLISHED[2023] == ("PanGu-Σ (MoE)", 1.085e12)  # Falcon-180B: 180B
    slide(browser, "scaling-year", years, 2023)
    assert "PanGu-Σ (MoE), has 1.085T" in text(browser, "scaling-year-out")


def test_no_errors_in_the_console(browser):
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
