"""What the pipeline, ZeRO and grid widgets teach, read back from the page in a browser the
width of a small laptop window (820 px): the step time of the course's fixed batch, the
microbatch trade-off, check answers that follow the controls, chunk labels as
`paraxis schedule` prints them, and drawings that are neither clipped nor overlapping.
"""

import math

import pytest

from paraxis.cli import main
from paraxis.show.lab import facts as F
from paraxis.show.lab.context_facts import CP_DEGREES
from paraxis.show.lab.expert_facts import EP_DEGREES
from paraxis.show.lab.grid_facts import DEGREES
from paraxis.show.lab.page import lab_data, write_lab
from paraxis.show.lab.schedule_facts import (
    MICROBATCHES,
    stage_cost_lists,
)
from paraxis.spec.errors import ParaxisError
from paraxis.spec.schedules import build_schedule
from tests.test_lab import choose, click, hover_rank, open_lab, set_grid, show_pipeline, slide, text

NARROW = 820  # px: a laptop window beside an editor


@pytest.fixture(scope="module")
def data():
    return lab_data()


@pytest.fixture(scope="module")
def browser(tmp_path_factory, data):
    driver = open_lab(write_lab(tmp_path_factory.mktemp("lab"), data), width=NARROW)
    yield driver
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    driver.quit()


def first_number(shown: str) -> float:
    return float(shown.split()[0])


def makespan(kind: str, stages: int, microbatches: int, virtual: int = 1) -> float | None:
    """The library's timeline length in one microbatch's forward-times (None: no schedule)."""
    try:
        schedule = build_schedule(kind, stages, microbatches, virtual)
    except ParaxisError:
        return None
    return schedule.simulate(*stage_cost_lists(stages, None)).makespan


def fixed_batch_step(timeline: float, microbatches: int, overhead: float) -> float:
    """The step of a fixed batch, in whole-batch forwards of one stage: every op of the
    timeline (drawn in one microbatch's forward-times) costs 1/M of the batch's, plus a fixed
    `overhead` of it per microbatch."""
    return timeline * (1 / microbatches + overhead)


def test_fixed_batch_step_shrinks_as_microbatches_grow(browser):
    """Course ch. 4: a fixed global batch cut into M pieces; each piece costs 1/M of it, so
    GPipe's and 1F1B's step is 3 (M + P - 1) / M whole-batch forwards, falling with M."""
    for kind in ("gpipe", "1f1b"):
        for stages in (2, 4, 8):
            steps = []
            for microbatches in (1, 2, 4, 8, 16):
                show_pipeline(browser, kind, stages, microbatches)
                step = first_number(text(browser, "pipe-step"))
                assert math.isclose(step, 3 * (microbatches + stages - 1) / microbatches,
                                    rel_tol=1e-3), (kind, stages, microbatches)
                steps.append(step)
            assert steps == sorted(steps, reverse=True) and len(set(steps)) == len(steps)
    # and the timeline (in one microbatch's forward-times) is that step times M
    show_pipeline(browser, "gpipe", 4, 16)
    assert first_number(text(browser, "pipe-makespan")) == 57
    assert first_number(text(browser, "pipe-step")) == pytest.approx(57 / 16, rel=1e-3)


def test_microbatch_overhead_puts_the_best_m_inside_the_range(browser, data):
    """With a fixed cost per microbatch the fixed batch's step has a minimum at an interior
    M; the widget names it, as a model."""
    overheads = data["pipeline"]["overheads"]
    show_pipeline(browser, "gpipe", 4, 4)
    interior = 0
    for overhead in overheads:
        slide(browser, "pipe-overhead", overheads, overhead)
        steps = {m: fixed_batch_step(makespan("gpipe", 4, m), m, overhead) for m in MICROBATCHES}
        best = min(steps, key=steps.get)
        said = text(browser, "pipe-best")
        assert f"M = {best}" in said and "model" in said, (overhead, said)
        assert math.isclose(first_number(text(browser, "pipe-step-overhead")), steps[4],
                            rel_tol=1e-3)
        marked = browser.execute_script(
            "return [...document.querySelectorAll('#pipe-curve .best')].map((e) => e.dataset.m)")
        assert marked == [str(best)]
        if overhead == 0:
            assert best == MICROBATCHES[-1]  # no overhead: more microbatches always help
        interior += MICROBATCHES[0] < best < MICROBATCHES[-1]
    assert interior >= 2
    # interleaved needs M a multiple of P: the curve has only those points
    show_pipeline(browser, "interleaved", 4, 8, 2)
    points = browser.execute_script(
        "return [...document.querySelectorAll('#pipe-curve .point')].map((e) => +e.dataset.m)")
    assert points == [m for m in MICROBATCHES if m % 4 == 0]
    show_pipeline(browser, "interleaved", 5, 8, 2)  # no M on the slider is a multiple of 5
    assert "No M on the slider" in text(browser, "pipe-best")
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_check_answers_follow_the_controls(browser):
    click(browser, "pipe-check")
    assert text(browser, "pipe-answer") == "P = 4, M = 8: bubble 3/11 = 27.3%."
    slide(browser, "pipe-mb", MICROBATCHES, 16)
    assert text(browser, "pipe-answer") in ("", "P = 4, M = 16: bubble 3/19 = 15.8%.")
    click(browser, "pipe-check")
    browser.find_element("css selector", "#pipe-kinds button[data-kind='1f1b']").click()
    assert text(browser, "pipe-answer") == ""

    click(browser, "grid-check")
    assert "[4,5,6,7]" in text(browser, "grid-answer")
    slide(browser, "grid-tp", DEGREES, 2)
    hover = [line for line in hover_rank(browser, 5) if line.startswith("TP group")]
    answer = text(browser, "grid-answer")
    assert answer == "" or hover[0].split(":")[0].removeprefix("TP group ") in answer
    click(browser, "grid-check")
    choose(browser, "grid-shard", 2)
    assert text(browser, "grid-answer") == ""
    set_grid(browser, 4, 4, 4)

    slide(browser, "zero-stage", [0, 1, 2, 3], 1)
    click(browser, "zero-check")  # asks about ZeRO-3: the figures shown are ZeRO-3's
    assert browser.find_element("id", "zero-stage-value").text == "ZeRO-3"
    slide(browser, "zero-model", F.ZERO_MODEL_B, 70)
    assert text(browser, "zero-answer") == ""

    slide(browser, "tp-degree", F.TP_DEGREES, 1)
    click(browser, "tp-check")  # answered at the largest TP: the slider moves there
    assert browser.find_element("id", "tp-degree-value").text == str(F.TP_DEGREES[-1])
    assert f"at TP {F.TP_DEGREES[-1]} " in text(browser, "tp-answer")

    # the chapter 0-2 checks name the settings they were asked at too
    for check, answer, control, values, value in (
            ("scaling-check", "scaling-answer", "scaling-model", F.MODEL_SIZES_B, 13),
            ("dp-check", "dp-answer", "dp-gpus-n", F.DP_GPUS, 2),
            ("dp-check", "dp-answer", "dp-batch", F.DP_BATCHES, 64),
            ("ring-check", "ring-answer", "ring-message", F.RING_MESSAGE_GB, 8),
            ("ring-check", "ring-answer", "ring-bandwidth", F.RING_BANDWIDTH_GBPS, 100),
            ("cp-check", "cp-answer", "cp-degree", CP_DEGREES, 8),
            ("moe-check", "moe-answer", "moe-ep", EP_DEGREES, 2)):
        click(browser, check)
        assert text(browser, answer), check
        slide(browser, control, values, value)
        assert text(browser, answer) == "", (check, control)


def cli_rows(capsys, kind: str, stages: int, microbatches: int, virtual: int) -> list[list[str]]:
    """Each stage's ops in order as `paraxis schedule` prints them (a cell per time slot:
    an op spans its slots; '.' is idle)."""
    assert main(["schedule", "--kind", kind, "--stages", str(stages), "--microbatches",
                 str(microbatches), "--virtual", str(virtual)]) == 0
    rows = []
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("stage "):
            cells = line.split("|", 1)[1].split()
            rows.append([c for i, c in enumerate(cells) if c != "." and
                         (i == 0 or cells[i - 1] != c)])
    return rows


def test_chunks_are_labelled_as_the_cli_labels_them_with_a_legend(browser, capsys):
    def labels() -> list[list[str]]:
        return browser.execute_script(
            "const rows = [];"
            "for (const g of document.querySelectorAll('#pipe-svg g.op')) {"
            "  (rows[+g.dataset.stage] = rows[+g.dataset.stage] || []).push(g.dataset.op); }"
            "return rows;")

    def legend() -> list[list[str]]:
        return browser.execute_script(
            "return [...document.querySelectorAll('#pipe-legend .chunk')].map("
            "(e) => [e.dataset.chunk, getComputedStyle(e.querySelector('.swatch'))"
            ".backgroundColor])")

    def fills(chunk: str) -> set[str]:  # the forward blocks' colours of one chunk, as rgb()
        return set(browser.execute_script(
            "const probe = document.createElement('span'); document.body.appendChild(probe);"
            "const out = [...document.querySelectorAll('#pipe-svg g.op')]"
            ".filter((g) => g.dataset.op.startsWith('F') && g.dataset.op.endsWith(arguments[0]))"
            ".map((g) => { probe.style.backgroundColor = g.querySelector('rect')"
            ".getAttribute('fill'); return getComputedStyle(probe).backgroundColor; });"
            "probe.remove(); return out;", chunk))

    for kind, stages, microbatches, virtual in (("interleaved", 4, 8, 2), ("zb-v", 4, 8, 2),
                                                ("interleaved", 2, 4, 3)):
        show_pipeline(browser, kind, stages, microbatches, virtual)
        assert labels() == cli_rows(capsys, kind, stages, microbatches, virtual), kind
        chunks = legend()
        assert [c for c, _ in chunks] == ["abc"[c] for c in range(virtual)]
        for chunk, colour in chunks:
            assert fills(chunk) == {colour}, (kind, chunk)
        assert len({colour for _, colour in chunks}) == virtual  # a shade per chunk
    show_pipeline(browser, "1f1b", 4, 8)
    assert labels() == cli_rows(capsys, "1f1b", 4, 8, 1)  # one chunk: no suffix
    assert legend() == []


def test_pipeline_drawing_fits_a_narrow_window(browser):
    """At 820 px the last op of the drain (where 1F1B's bubble is) is inside the widget."""
    def last_op_inside(kind: str) -> bool:
        return browser.execute_script(
            "const box = document.getElementById('w-pipe').getBoundingClientRect();"
            "let last = null, end = -1;"
            "for (const g of document.querySelectorAll('#pipe-svg g')) {"
            "  const r = g.querySelector('rect').getBoundingClientRect();"
            "  if (r.right > end) { end = r.right; last = r; } }"
            "return last.left >= box.left && last.right <= box.right && last.width > 0;")

    assert browser.execute_script("return window.innerWidth") <= NARROW
    for kind, stages, microbatches in (("1f1b", 4, 8), ("gpipe", 8, 16), ("zb-v", 6, 12)):
        show_pipeline(browser, kind, stages, microbatches)
        assert last_op_inside(kind), kind


def test_zero_gpu_label_never_overlaps_a_bar(browser):
    """The GPU-memory line's label clears every bar, bar label and the chosen stage's frame."""
    def overlaps() -> list:
        return browser.execute_script(
            "const label = document.querySelector('#zero-svg text.limit');"
            "const box = label.getBoundingClientRect();"
            "const svg = document.getElementById('zero-svg').getBoundingClientRect();"
            "const hit = [...document.querySelectorAll('#zero-svg rect, #zero-svg text')]"
            ".filter((e) => e !== label).map((e) => [e.textContent, e.getBoundingClientRect()])"
            ".filter(([_, b]) => b.left < box.right && box.left < b.right &&"
            "  b.top < box.bottom && box.top < b.bottom).map(([t, b]) => [t, b.left, b.top]);"
            "if (box.left < svg.left || box.right > svg.right || box.top < svg.top ||"
            "    box.bottom > svg.bottom) hit.push('outside');"
            "return hit;")

    for stage in (3, 0):
        slide(browser, "zero-stage", [0, 1, 2, 3], stage)
        for billions, gpus, gpu in ((70, 64, "a100-80gb"), (7, 8, "h100-pcie-80gb"),
                                    (175, 1, "v100-32gb"), (1, 64, "h200"),
                                    (13, 16, "a100-40gb"), (1, 1, "v100-32gb")):
            slide(browser, "zero-model", F.ZERO_MODEL_B, billions)
            slide(browser, "zero-gpus", F.ZERO_GPUS, gpus)
            slide(browser, "zero-memory", F.ZERO_GPU_PRESETS, gpu)
            assert overlaps() == [], (stage, billions, gpus, gpu)
