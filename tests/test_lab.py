"""The lab page in a real browser (Debian's chromium and chromium-driver, through Selenium).

One headless session for everything: the page's pure functions over every slider setting
in one `execute_script` call, the embedded figures against a fresh call into the library,
and every widget driven through its controls (slider moved + input event, buttons clicked,
the figure read back from the page). `make test` installs chromium and chromedriver where the
machine allows it (.ci/run always does); where they are missing the browser tests are skipped
with one line saying how to install them.
"""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from paraxis.cli import main
from paraxis.plan.comm import ring_all_reduce_time
from paraxis.plan.hardware import GPUS
from paraxis.plan.inputs import DEFAULT_GPU
from paraxis.plan.memory import model_state_bytes, zero_table
from paraxis.plan.ring_steps import simulate_ring
from paraxis.show.lab import facts as F
from paraxis.show.lab.browser import browser_missing, open_browser
from paraxis.show.lab.grid_facts import (
    DEGREES,
    GPUS_PER_NODE,
    grid_key,
    grid_layout,
    grid_settings,
    shard_sizes,
)
from paraxis.show.lab.page import lab_data, write_lab
from paraxis.show.lab.schedule_facts import (
    INTERLEAVED_VIRTUAL,
    MICROBATCHES,
    STAGES,
    python_timelines,
    schedule_settings,
    slow_settings,
)
from paraxis.show.viz.grid import cell_label
from paraxis.spec.errors import ParaxisError
from paraxis.spec.schedules import build_schedule


@pytest.fixture(scope="module")
def data():
    return lab_data()


@pytest.fixture(scope="module")
def page(tmp_path_factory, data):
    return write_lab(tmp_path_factory.mktemp("lab"), data)


def skip_without_browser() -> None:
    if missing := browser_missing():
        pytest.skip(f"the lab's browser tests: {missing}, then make test")


def open_lab(page: Path, **size: int):
    """A headless browser on the lab page `page` (skips where no browser is installed)."""
    skip_without_browser()
    driver = open_browser(**{"height": 1400, **size})
    driver.get(page.resolve().as_uri())
    return driver


def show_pipeline(driver, kind: str, stages: int, microbatches: int, virtual: int = 2,
                  slow: int | None = None) -> None:
    """Set the pipeline widget: schedule kind, P, M, chunks (interleaved) and slow stage."""
    driver.find_element("css selector", f"#pipe-kinds button[data-kind='{kind}']").click()
    slide(driver, "pipe-stages", STAGES, stages)
    slide(driver, "pipe-mb", MICROBATCHES, microbatches)
    if kind == "interleaved":
        slide(driver, "pipe-virtual", INTERLEAVED_VIRTUAL, virtual)
    choose(driver, "pipe-slow", "none" if slow is None else slow)


@pytest.fixture(scope="module")
def browser(page):
    driver = open_lab(page)
    yield driver
    driver.quit()


# ------------------------------------------------------------------------------ helpers


def slide(driver, element_id: str, values: list, value) -> None:
    """Move a slider the way a user does: its index, then the input event."""
    driver.execute_script(
        "const e = document.getElementById(arguments[0]); e.value = arguments[1];"
        "e.dispatchEvent(new Event('input'));", element_id, values.index(value))


def choose(driver, element_id: str, value) -> None:
    driver.execute_script(
        "const e = document.getElementById(arguments[0]); e.value = arguments[1];"
        "e.dispatchEvent(new Event('input'));", element_id, str(value))


def click(driver, element_id: str, times: int = 1) -> None:
    for _ in range(times):
        driver.find_element("id", element_id).click()


def text(driver, element_id: str) -> str:
    return driver.execute_script("return document.getElementById(arguments[0]).textContent",
                                 element_id)


def number(shown: str) -> float:
    """'0.14 s', '60 ms', '38.5 GB' -> seconds or bytes."""
    value, unit = re.fullmatch(r"([-\d.e+]+) (s|ms|GB)", shown.strip()).groups()
    return float(value) * {"s": 1, "ms": 1e-3, "GB": 1e9}[unit]


def close(shown: str, expected: float) -> bool:
    return math.isclose(number(shown), expected, rel_tol=5e-3)  # the page shows 3-6 digits


# ------------------------------------------------------- the whole range, in one call each


def test_pipeline_functions_match_the_library_over_every_setting(browser):
    schedules = []
    for kind, p, m, v in schedule_settings():
        try:
            build_schedule(kind, p, m, v)
        except ParaxisError:
            continue
        schedules.append((kind, p, m, v))
    settings = [[*schedule, slow] for schedule in schedules for slow in slow_settings(schedule[1])]
    assert len(settings) > 1000
    shown = iter(browser.execute_script("return window.lab.pipelineAll(arguments[0])", settings))
    for schedule in schedules:
        for slow, library in zip(slow_settings(schedule[1]), python_timelines(*schedule),
                                 strict=True):
            page_figures, where = next(shown), (*schedule, slow)
            assert page_figures["fraction"] == library["fraction"], where
            assert page_figures["peak"] == library["peak"], where
            assert math.isclose(page_figures["makespan"], library["makespan"]), where
            assert math.isclose(page_figures["bubble"], library["bubble"], abs_tol=1e-12), where
            events = [t for stage in library["events"] for event in stage for t in event]
            assert len(page_figures["events"]) == len(events), where
            assert all(math.isclose(a, b, abs_tol=1e-9)
                       for a, b in zip(page_figures["events"], events, strict=True)), where


def test_embedded_figures_are_the_library_s(browser, data):
    embedded = browser.execute_script("return window.lab.DATA")
    assert embedded == json.loads(json.dumps(data))
    # and the library's figures are the course's
    assert [r["total"] / 1e9 for r in embedded["zero"]["tables"]["7/8"]] == [112, 38.5, 26.25,
                                                                              14]
    assert embedded["ring"]["times"]["8/2/25"] == pytest.approx(0.14)


def test_page_is_self_contained(page):
    html = page.read_text()
    # the only URL is the SVG namespace, a name that is never fetched
    assert set(re.findall(r"https?://[^\s\"'<>)]+", html)) == {"http://www.w3.org/2000/svg"}
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", html)
    assert page.stat().st_size < 3e6


def test_the_lab_tests_run_their_pages_tests_without_selenium(tmp_path):
    # A GPU image without selenium collects every lab module: its browser tests skip with
    # one line, the page's own tests run (selenium imported at a module's top would make
    # that module, and every module importing from it, an error).
    block = tmp_path / "sitecustomize.py"
    block.write_text("import sys\nsys.modules['selenium'] = None\n")
    root = Path(__file__).resolve().parents[1]
    modules = sorted(p.stem for p in Path(__file__).parent.glob("test_lab*.py"))
    code = "".join(f"import tests.{m}\n" for m in modules) + (
        "from paraxis.show.lab.browser import browser_missing\nprint(browser_missing())\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=root,
                          env={**os.environ, "PYTHONPATH": f"{tmp_path}:{root}"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(modules) >= 4
    assert done.stdout.strip() == "the lab's browser needs selenium; pip install -e '.[dev]'"


# ------------------------------------------------------------------ widget by widget


def test_scaling_gap(browser):
    years = [y["year"] for y in F.scaling_facts()["years"]]
    for year, name, shown in ((2018, "Mesh-TensorFlow Transformer", "5B"),
                              (2023, "PanGu-Σ (MoE)", "1.085T"), (2025, "Kimi K2 (MoE)", "1.04T")):
        slide(browser, "scaling-year", years, year)
        params = F.LARGEST_PUBLISHED[year][1]
        state = sum(model_state_bytes(int(params), 1, 0).values())
        gpu = F.BASE_GPU_BYTES * 2 ** ((year - F.BASE_YEAR) / F.GPU_MEMORY_DOUBLING_YEARS)
        said = text(browser, "scaling-year-out")
        assert f"largest published, {name}, has {shown}" in said
        # what fits counts a GPU less the runtime's reserve, as the DP and ZeRO widgets do
        needed = math.ceil(state / (gpu - F.LAB_GPU.reserved_bytes))
        assert f"at least {needed} GPU{'s' if needed > 1 else ''} just" in said
        assert f"the trend's GPU holds {float(f'{gpu / 1e9:.3g}'):g} GB" in said
    # the course's trend, past where it held, is shown in words, never with an exponent
    assert "17.5 quadrillion parameters" in said
    for billions, state_gb in ((7, "112 GB"), (70, "1120 GB"), (175, "2800 GB")):
        slide(browser, "scaling-model", F.MODEL_SIZES_B, billions)
        assert f"Adam {state_gb}" in text(browser, "scaling-model-out")
    click(browser, "scaling-check")
    assert "1120 GB" in text(browser, "scaling-answer")
    # 175B: 2800 GB over 33 GPUs would be 84.85 GB each, over the 85.9 GB less 2 GB reserved
    slide(browser, "scaling-model", F.MODEL_SIZES_B, 175)
    assert "34 GPUs' memory, each less the runtime's 2 GB reserve" in text(
        browser, "scaling-model-out")
    slide(browser, "scaling-model", F.MODEL_SIZES_B, 1000)  # a thousand billion reads 1T
    assert text(browser, "scaling-model-out").startswith("1T parameters")
    assert text(browser, "scaling-model-value") == "1T"


def test_data_parallel(browser):
    click(browser, "dp-reset")
    for gpus, batch, billions in ((8, 256, 7), (4, 128, 1), (2, 512, 13)):
        slide(browser, "dp-gpus-n", F.DP_GPUS, gpus)
        slide(browser, "dp-batch", F.DP_BATCHES, batch)
        slide(browser, "dp-model", F.DP_MODEL_B, billions)
        assert text(browser, "dp-per-gpu") == str(batch // gpus)
        states = model_state_bytes(billions * 10**9, gpus, 0)
        assert close(text(browser, "dp-memory"), sum(states.values()))
        assert close(text(browser, "dp-allreduce"),
                     ring_all_reduce_time(states["grads"], gpus, F.NVLINK_BPS))
    toy = F.toy_gradients(2, 512)
    click(browser, "dp-step", 3)  # each GPU's own gradient, then their average
    grads = [e.text for e in browser.find_elements("css selector", "#dp-gpus .cell.grad")]
    assert [g.split(" = ")[0] for g in grads] == ["g0", "g1"]
    assert all(math.isclose(float(g.split(" = ")[1]), value, rel_tol=5e-4)  # 4 digits
               for g, value in zip(grads, toy["local"], strict=True))
    click(browser, "dp-step")
    assert text(browser, "dp-phase") == "Phase 4/5: all-reduce gradients"
    assert math.isclose(toy["averaged"], toy["full"])  # the same update as one device's
    averaged, full = re.findall(r"-?\d+\.\d+", text(browser, "dp-toy"))
    assert math.isclose(float(averaged), toy["averaged"], rel_tol=5e-4)
    assert math.isclose(float(full), toy["full"], rel_tol=5e-4)
    assert len(browser.find_elements("css selector", "#dp-gpus .gpu")) == 2
    click(browser, "dp-check")
    assert text(browser, "dp-answer") == "32 examples per GPU."


def test_ring_all_reduce(browser):
    for ranks, gigabytes, bandwidth in ((8, 2, 25), (8, 2, 12.5), (4, 1, 100)):
        slide(browser, "ring-ranks", F.RING_RANKS, ranks)
        slide(browser, "ring-message", F.RING_MESSAGE_GB, gigabytes)
        slide(browser, "ring-bandwidth", F.RING_BANDWIDTH_GBPS, bandwidth)
        assert close(text(browser, "ring-time"),
                     ring_all_reduce_time(gigabytes * 1e9, ranks, bandwidth * 1e9))
    slide(browser, "ring-ranks", F.RING_RANKS, 8)
    slide(browser, "ring-message", F.RING_MESSAGE_GB, 2)
    slide(browser, "ring-bandwidth", F.RING_BANDWIDTH_GBPS, 25)
    assert text(browser, "ring-time") == "0.14 s"  # the course's worked example
    slide(browser, "ring-ranks", F.RING_RANKS, 4)
    sim = simulate_ring(4)
    for step in (1, 3, 6):  # chunk by chunk: after 3 steps each GPU owns one finished chunk
        click(browser, "ring-reset")
        click(browser, "ring-step", step)
        assert text(browser, "ring-status").startswith(f"Step {step}/6")
        cells = browser.find_elements("css selector", "#ring-table td.chunk")
        shown = [float(e.text) for e in cells]
        assert shown == [c[0] for rank in sim.steps[step - 1].values for c in rank]
        finished = len(browser.find_elements("css selector", "#ring-table td.chunk.full"))
        assert finished == sum(len(c) == 4 for rank in sim.steps[step - 1].contributors
                               for c in rank)
    assert finished == 16
    click(browser, "ring-check")
    assert "0.14 s" in text(browser, "ring-answer")


def test_tensor_parallel_mlp(browser):
    for tp in (1, 2, 4):
        slide(browser, "tp-degree", F.TP_DEGREES, tp)
        click(browser, "tp-reset")
        click(browser, "tp-step", 5)
        mlp = F.tp_mlp(tp)
        titles = [e.text for e in browser.find_elements("css selector", "#tp-ranks .title")]
        assert titles == [f"GPU {i} · d_ff columns {r['columns'][0]}–{r['columns'][1] - 1}"
                          if r["columns"][1] - r["columns"][0] > 1
                          else f"GPU {i} · d_ff column {r['columns'][0]}"
                          for i, r in enumerate(mlp["ranks"])]
        cells = [float(e.text) for e in browser.find_elements(
            "css selector", "#tp-out table.done td")]
        assert cells == [round(v, 2) for row in mlp["single"] for v in row]
        assert text(browser, "tp-diff") in ("0 (the same bits)", "below 0.000001 (float "
                                            "rounding: the sums run in another order)")
    traffic = F.tp_traffic()
    for link in ("NVLink", "PCIe", "Ethernet"):
        slide(browser, "tp-link", list(F.TP_LINKS), link)
        assert close(text(browser, "tp-time"), traffic["times"][f"4/{link}"])
    click(browser, "tp-check")
    assert "128 all-reduces" in text(browser, "tp-answer")
    # at TP 1 nothing is all-reduced: the count says so, and the check answers at TP 8
    slide(browser, "tp-degree", F.TP_DEGREES, 1)
    assert text(browser, "tp-answer") == ""  # the answer was for TP 4
    assert "nothing to all-reduce" in text(browser, "tp-count")
    click(browser, "tp-check")
    assert "at TP 8 one step's 128 all-reduces" in text(browser, "tp-answer")


def test_pipeline_schedules(browser):
    def show(*setting) -> None:
        show_pipeline(browser, *setting)

    show("gpipe", 4, 4)
    assert text(browser, "pipe-bubble") == "3/7 = 42.9%"
    assert text(browser, "pipe-peak").startswith("4 4 4 4")
    show("gpipe", 4, 16)
    assert text(browser, "pipe-bubble") == "3/19 = 15.8%"
    show("1f1b", 4, 16)
    assert text(browser, "pipe-peak").startswith("4 3 2 1")  # 1F1B holds at most P
    for kind, p, m, v, slow in (("interleaved", 4, 8, 2, None), ("zb-h1", 4, 8, 1, None),
                                ("zb-v", 4, 8, 2, None), ("1f1b", 4, 8, 1, 3),
                                ("zb-h1", 6, 12, 1, 0)):
        show(kind, p, m, v, slow)
        library = python_timelines(kind, p, m, v)[slow_settings(p).index(slow)]
        assert text(browser, "pipe-bubble").startswith(library["fraction"] + " = "), kind
        assert math.isclose(float(text(browser, "pipe-makespan").split()[0]),
                            library["makespan"], rel_tol=1e-3)
    show("interleaved", 4, 6, 2)
    with pytest.raises(ParaxisError) as error:
        build_schedule("interleaved", 4, 6, 2)  # the library's reason, and the M that run
    assert text(browser, "pipe-error") == f"{error.value} (on the slider: M = 4, 8, 12, 16)"
    assert text(browser, "pipe-virtual-value") == "2"
    show("interleaved", 5, 6, 2)
    assert text(browser, "pipe-error").endswith("(no M on the slider runs it at P = 5: choose "
                                                 "another P)")
    show("interleaved", 4, 8, 4)
    for kind, v in (("zb-v", "2"), ("gpipe", "1")):  # the v a kind runs, not the slider's
        show(kind, 4, 8)
        assert text(browser, "pipe-virtual-value") == v, kind
    show("gpipe", 4, 8)
    click(browser, "pipe-play")  # the timeline draws itself over time, then stays whole
    def blocks(_=None) -> int:
        return len(browser.find_elements("css selector", "#pipe-svg g"))

    from selenium.webdriver.support.ui import WebDriverWait  # lazy: selenium is optional

    assert blocks() < 4 * 16  # 4 stages x (8 forwards + 8 backwards)
    WebDriverWait(browser, 20).until(lambda _: blocks() == 4 * 16)  # then the whole step
    click(browser, "pipe-check")
    assert text(browser, "pipe-answer") == "P = 4, M = 8: bubble 3/11 = 27.3%."


def test_zero_calculator(browser):
    for billions, gpus in ((7, 8), (13, 16), (70, 64)):
        slide(browser, "zero-model", F.ZERO_MODEL_B, billions)
        slide(browser, "zero-gpus", F.ZERO_GPUS, gpus)
        for row in zero_table(billions * 10**9, gpus):
            assert close(text(browser, f"zero-{row['zero']}"), row["total"])
    slide(browser, "zero-model", F.ZERO_MODEL_B, 7)
    slide(browser, "zero-gpus", F.ZERO_GPUS, 8)
    shown = [text(browser, f"zero-{stage}") for stage in range(4)]
    assert shown == ["112 GB", "38.5 GB", "26.25 GB", "14 GB"]  # the course's table
    # the GPU choices are the planner's presets, each named with its memory
    assert sorted(F.ZERO_GPU_PRESETS) == sorted(GPUS)
    memories = [GPUS[name].memory_bytes for name in F.ZERO_GPU_PRESETS]
    assert memories == sorted(memories)  # least memory first
    slide(browser, "zero-memory", F.ZERO_GPU_PRESETS, DEFAULT_GPU)
    assert text(browser, "zero-memory-value") == "a100-80gb: 85.9 GB"  # 80 GiB
    limit = browser.find_element("css selector", "#zero-svg text.limit")
    assert [s.text for s in limit.find_elements("css selector", "tspan")] == ["a100-80gb",
                                                                               "85.9 GB"]
    assert [text(browser, f"zero-fit-{s}") for s in range(4)] == ["does not fit", "fits",
                                                                  "fits", "fits"]
    for stage, gpus, gpu in ((0, 8, "a100-80gb"), (3, 8, "a100-80gb"), (2, 64, "v100-32gb"),
                             (3, 16, "h200"), (1, 32, "l40s")):
        slide(browser, "zero-stage", [0, 1, 2, 3], stage)
        slide(browser, "zero-gpus", F.ZERO_GPUS, gpus)
        slide(browser, "zero-memory", F.ZERO_GPU_PRESETS, gpu)
        name, memory = text(browser, "zero-memory-value").split(": ")
        assert name == gpu and close(memory, GPUS[gpu].memory_bytes)
        for row in zero_table(7 * 10**9, gpus):  # fits as the planner's first question says
            said = text(browser, f"zero-fit-{row['zero']}")
            assert said == ("fits" if F.fits_on_gpu(row["total"], GPUS[gpu]) else "does not fit")
        largest = max(b for b in F.ZERO_MODEL_B
                      if F.fits_on_gpu(zero_table(int(b * 1e9), gpus)[stage]["total"], GPUS[gpu]))
        assert text(browser, "zero-largest") == f"{largest}B"
    slide(browser, "zero-gpus", F.ZERO_GPUS, 16)
    slide(browser, "zero-memory", F.ZERO_GPU_PRESETS, "v100-32gb")
    # 7B at ZeRO-1 on 16: 33.25 GB of states within 34.36 GB, but not with the 2 GB reserve
    assert text(browser, "zero-fit-1") == "does not fit"
    click(browser, "zero-check")
    assert text(browser, "zero-answer") == "13B on 16 GPUs: baseline 208 GB, ZeRO-3 13 GB per GPU."


def set_grid(driver, dp, tp, pp, cp=1, ep=1, per_node=4, dp_shard=0) -> None:
    for name, values, value in (("dp", DEGREES, dp), ("tp", DEGREES, tp), ("pp", DEGREES, pp),
                                ("cp", [1, 2], cp), ("ep", [1, 2, 4], ep),
                                ("node", GPUS_PER_NODE, per_node)):
        slide(driver, f"grid-{name}", values, value)
    choose(driver, "grid-shard", dp_shard)


def hover_rank(driver, rank: int) -> list[str]:
    from selenium.webdriver.common.action_chains import ActionChains  # lazy: optional

    ActionChains(driver).move_to_element(driver.find_element("id", f"grid-rank-{rank}")).perform()
    return text(driver, "grid-role").splitlines()


def test_grid_names_every_role(browser):
    # (dp, tp, pp, cp, ep), GPUs per node, the ranks hovered: the course's 4x4x4 grid first
    for degrees, per_node, ranks in (((4, 4, 4, 1, 1), 4, (0, 5, 21, 63)),
                                     ((2, 2, 2, 2, 2), 8, (3, 9, 15)),
                                     ((4, 1, 2, 1, 4), 8, (2, 7))):
        set_grid(browser, *degrees, per_node)
        layout = grid_layout(*degrees)
        assert text(browser, "grid-world") == str(layout.world_size)
        for rank in ranks:
            lines = hover_rank(browser, rank)
            assert lines[0] == cell_label(layout, rank, per_node)
            for axis in ("dp", "pp", "cp", "ep", "tp"):
                group = layout.group_of(rank, axis)
                name = f"{axis.upper()} group "
                expected = [name + json.dumps(group, separators=(",", ":"))] * (len(group) > 1)
                assert [line.split(":")[0] for line in lines if line.startswith(name)] == expected
    # dp = cp = ep = 2: GPU 3's CP and EP groups are the same two GPUs; both are drawn
    set_grid(browser, 2, 2, 2, 2, 2, 8)
    hover_rank(browser, 3)
    twice = browser.find_element("id", "grid-rank-1")
    assert twice.get_attribute("data-axis") == "cp ep"
    assert twice.value_of_css_property("box-shadow").count("rgb") == 2
    set_grid(browser, 1, 2, 2, 1, 2)
    with pytest.raises(ParaxisError) as error:
        grid_layout(1, 2, 2, 1, 2)
    assert text(browser, "grid-error") == str(error.value)
    assert text(browser, "grid-world") == "—"  # not the last valid grid's size
    click(browser, "grid-check")
    assert "[4,5,6,7]" in text(browser, "grid-answer")


def test_grid_facts_of_hybrid_sharding_are_the_layout_s(data):
    layouts = data["grid"]["layouts"]
    hybrid = 0
    for setting in grid_settings():
        plain = layouts[grid_key(*setting)]
        if "error" in plain:
            continue
        assert list(plain["shards"]) == [str(size) for size in shard_sizes(setting[0])]
        for size, shown in plain["shards"].items():
            try:
                layout = grid_layout(*setting, dp_shard=int(size))
            except ParaxisError as error:
                assert shown == {"error": str(error)}
                continue
            hybrid += 1
            assert layout.hybrid and layout.zero == 1
            assert shown == {axis: layout.groups(axis) for axis in ("dp_shard", "dp_replicate")}
            # the page draws a hybrid layout from the plain one's coordinates and groups
            assert plain["coords"] == [[c.dp_rank, c.cp_rank, c.tp_rank, c.pp_rank]
                                       for c in map(layout.coords, range(layout.world_size))]
            assert plain["groups"] == {axis: layout.groups(axis) for axis in plain["groups"]}
    assert hybrid > 40


def test_grid_shows_hybrid_sharding(browser):
    def outlined() -> list[list[int]]:
        return browser.execute_script(
            "return [...document.querySelectorAll('#grid-cells .shardgroup')].map("
            "(e) => e.dataset.ranks.split(' ').map(Number))")

    def options() -> list[str]:
        return browser.execute_script(
            "return [...document.getElementById('grid-shard').options].map((o) => o.text)")

    # (dp, tp, pp, cp, ep), dp_shard, GPUs per node, the ranks hovered
    for degrees, dp_shard, per_node, ranks in (((4, 2, 1, 1, 1), 2, 4, (0, 5, 6)),
                                               ((4, 1, 2, 2, 2), 2, 8, (3, 12)),
                                               ((4, 2, 2, 1, 1), 2, 4, (1, 6))):
        set_grid(browser, *degrees, per_node, dp_shard)
        assert browser.find_element("id", "grid-shard").get_attribute("value") == str(dp_shard)
        layout = grid_layout(*degrees, dp_shard=dp_shard)
        cp = degrees[3]  # a shard group spans dp_shard dp ranks x every cp rank
        assert options() == ["all dp ranks"] + [
            f"{size} dp rank{'s' * (size > 1)}" + (f" x cp {cp} = {size * cp} GPUs" if cp > 1
                                                   else "")
            for size in shard_sizes(layout.dp)]
        assert text(browser, "grid-world") == str(layout.world_size)
        assert sorted(outlined()) == sorted(layout.groups("dp_shard"))
        for rank in ranks:
            lines = hover_rank(browser, rank)
            assert lines[0] == cell_label(grid_layout(*degrees), rank, per_node)
            own, copies = layout.group_of(rank, "dp_shard"), layout.group_of(rank, "dp_replicate")
            shard_lines = [line for line in lines if line.startswith(("ZeRO shard", "DP copies"))]
            assert [line.split(":")[0] for line in shard_lines] == [
                "ZeRO shard group " + json.dumps(own, separators=(",", ":")),
                "DP copies " + json.dumps(copies, separators=(",", ":"))]
            # its copy is the shard group index cell_label prints as "/g" on the static grid
            copy = layout.coords(rank).dp_rank // layout.shard_size
            assert f"/g{copy}" in cell_label(layout, rank, per_node)
            assert shard_lines[1].endswith(f"(this GPU is copy {copy})")
            for other in set(copies) - {rank}:
                axes = browser.find_element("id", f"grid-rank-{other}").get_attribute("data-axis")
                assert "dp_replicate" in axes.split()
            assert browser.execute_script(
                "return [...document.querySelectorAll('#grid-cells .shardgroup.mine')].map("
                "(e) => e.dataset.ranks)") == [" ".join(map(str, own))]
    # a hybrid layout the Layout refuses (ep=4 must divide dp_shard*cp = 2): its error, no grid
    set_grid(browser, 4, 1, 1, 1, 4, 4, 2)
    with pytest.raises(ParaxisError) as error:
        grid_layout(4, 1, 1, 1, 4, dp_shard=2)
    assert text(browser, "grid-error") == str(error.value)
    assert text(browser, "grid-world") == "—"
    # every dp rank (plain): no outline, no shard lines; dp = 1 offers no hybrid choice
    set_grid(browser, 4, 2, 1, 1, 1, 4, 0)
    assert outlined() == []
    assert not [line for line in hover_rank(browser, 5) if "shard" in line or "copies" in line]
    set_grid(browser, 4, 2, 1, 1, 1, 4, 2)
    slide(browser, "grid-dp", DEGREES, 1)
    assert options() == ["all dp ranks"] and outlined() == []
    assert browser.find_element("id", "grid-shard").get_attribute("disabled") is not None
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_no_errors_in_the_console(browser):
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_command_writes_the_page(tmp_path, capsys):
    assert main(["lab", "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "lab.html").exists()
    assert str((tmp_path / "out" / "lab.html").resolve()) in capsys.readouterr().out
    (tmp_path / "file").write_text("")
    assert main(["lab", "--out", str(tmp_path / "file")]) == 2
    assert "is a file" in capsys.readouterr().err
