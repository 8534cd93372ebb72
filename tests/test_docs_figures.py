"""The figures docs/pipelines.md and docs/planner.md quote as a command's output, checked
against what the command prints now.

Every figure is read from the doc's own text (a sentence, a table or a code block, found by
the words around it), never copied here, so a change to the code or to the doc alone fails.
Each test runs one command or a few (in process: `paraxis.cli.main`, or the function the
command calls) and checks all the figures the docs quote from them. A quoted figure agrees
with a printed one when it is the printed one rounded to the digits the doc gives.
Measurements the docs date (a benchmark run, a probe on a VM) are not checked here.
"""

from __future__ import annotations

import json
import re
import shlex
from decimal import Decimal
from functools import cache
from pathlib import Path

import pytest

from paraxis.cli import build_parser, main
from paraxis.spec.model_config import PRESETS

ROOT = Path(__file__).resolve().parents[1]
WORDS = {"two": 2, "four": 4, "eight": 8, "sixteen": 16}
GB = 1e9


@cache
def raw(doc: str) -> str:
    return (ROOT / "docs" / doc).read_text()


@cache
def prose(doc: str) -> str:
    """The doc with every run of whitespace one space, so a sentence matches across lines."""
    return " ".join(raw(doc).split())


def quoted(doc: str, pattern: str) -> re.Match:
    found = re.search(pattern, prose(doc))
    assert found, (f"docs/{doc} no longer says /{pattern}/: reword this test with the doc, "
                   "or put back what the doc said")
    return found


def table(doc: str, header: str) -> list[list[str]]:
    """The cells of the markdown table whose header row starts with `header`."""
    lines = raw(doc).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def agrees(quote: str | int | float, printed: str | float) -> bool:
    """`quote` is `printed` rounded to the digits the doc gives (ties either way)."""
    q = Decimal(str(quote).replace(",", ""))
    p = Decimal(str(printed).replace(",", ""))
    return abs(p - q) <= Decimal(5).scaleb(q.as_tuple().exponent - 1)


def argv(command: str) -> list[str]:
    """A doc's `paraxis ...` command line as main's arguments."""
    words = shlex.split(command)
    assert words[0] == "paraxis", command
    return words[1:]


def run(capsys, args: list[str]) -> str:
    main(args)
    out, err = capsys.readouterr()
    return out + err


class Plan:
    """What `paraxis plan` prints: the first row of its table, the memory line, the bullets."""

    def __init__(self, text: str):
        self.text = text
        lines = text.splitlines()
        header = next(line for line in lines if line.startswith("┃ #"))
        first = next(line for line in lines if line.startswith("│ 1 │"))
        self.row = dict(zip([c.strip() for c in header.strip("┃").split("┃")],
                            [c.strip() for c in first.strip("│").split("│")], strict=True))
        memory = next(line for line in lines if line.startswith("memory of #1"))
        self.memory = dict(re.findall(r"(\w+) ([\d.]+)", memory.split(":", 1)[1]))
        self.bullets = [line[2:] for line in lines if line.startswith("• ")]

    def bullet(self, pattern: str) -> re.Match:
        found = next((m for b in self.bullets if (m := re.search(pattern, b))), None)
        assert found, f"paraxis plan no longer prints /{pattern}/:\n" + "\n".join(self.bullets)
        return found


def plan(capsys, command: str, *extra: str) -> Plan:
    return Plan(run(capsys, argv(command) + list(extra)))


# docs/pipelines.md


def test_pipelines_schedule_bubbles_and_idle_time(capsys) -> None:
    size = quoted("pipelines.md", r"At P = (\d+), M = (\d+) and F = 1, backward 2")
    stages, microbatches = size.groups()
    m = quoted("pipelines.md",
               r"`paraxis schedule` prints a bubble of ([\d.]+)% for 1F1B, ([\d.]+)% for ZB-H1 "
               r"and ([\d.]+)% for ZB-V; with the last stage twice as slow "
               r"\(`--stage-scale ([\d,]+)`\), ([\d.]+)%, ([\d.]+)% and ([\d.]+)%: .*?"
               r"\(idle per stage ([\d./]+), ([\d./]+) and ([\d./]+) of steps of ([\d.]+), "
               r"([\d.]+) and ([\d.]+)\)")
    even, scale, scaled = m.groups()[:3], m.group(4), m.groups()[4:7]
    idle, steps = m.groups()[7:10], m.groups()[10:13]
    for i, kind in enumerate(("1f1b", "zb-h1", "zb-v")):
        args = ["schedule", "--kind", kind, "--stages", stages, "--microbatches", microbatches]
        assert f"bubble fraction: {even[i]}% " in run(capsys, args)
        out = run(capsys, args + ["--stage-scale", scale])
        assert f"bubble fraction: {scaled[i]}% " in out
        assert (f"idle time per stage: {idle[i].replace('/', ', ')} "
                f"(of a step of {steps[i]})") in out
    # the V on a shallow model with a large vocabulary: stage 0 (embedding and head) idles least
    busy = quoted("pipelines.md", r"\(`(paraxis schedule [^`]*)` shows stage (\d+) the busy one")
    out = run(capsys, argv(busy.group(1)))
    idle_s = [float(x) for x in re.search(r"idle time per stage: ([\d., ]+) \(", out)
              .group(1).split(", ")]
    assert idle_s.index(min(idle_s)) == int(busy.group(2)), idle_s


def test_pipelines_zero3_table_planner_columns() -> None:
    # The probe's runtime columns need 4 ranks; its planner columns are these functions of
    # the probe's own model (tools/probes/zero3_pipeline.py computes them the same way).
    from paraxis.plan.memory import model_state_bytes, stage_params
    from paraxis.plan.zero3 import zero3_pipeline_volume
    from paraxis.spec.layout import Layout
    from paraxis.spec.precision import FP32_ADAM
    from tools.probes.zero3_pipeline import SEQ, _embedding, model

    setting = quoted("pipelines.md", r"\(a (\d+)M-parameter Llama-style model, fp32, "
                     r"dp=(\d+) x pp=(\d+), 1F1B, M = (\d+), 4 gloo ranks\)")
    params_m, dp, pp, microbatches = (int(x) for x in setting.groups())
    cfg = model(8)
    base = Layout(dp=dp, pp=pp, microbatches=microbatches, schedule="1f1b")
    counts = stage_params(cfg, base.pp, base.virtual_stages, SEQ, base.placement)
    assert round(sum(counts) / 1e6) == params_m
    rows = table("pipelines.md", "| layout | stage | model states MB |")
    assert len(rows) == 6
    for name, stage, states, below, gathered, scattered, *_ in rows:
        stage = int(stage)
        zero = int(name.split()[0].removeprefix("ZeRO-"))
        mine = sum(model_state_bytes(counts[stage], dp, zero, FP32_ADAM).values())
        assert agrees(states, mine / 1e6), (name, stage, states)  # runtime: within 28 bytes
        if zero != 3:
            continue
        zero1 = sum(model_state_bytes(counts[stage], dp, 1, FP32_ADAM).values())
        volume = zero3_pipeline_volume(counts[stage], microbatches, name.split()[1], 4, 4,
                                       _embedding(cfg, stage))
        for cell, bytes_ in ((below, zero1 - mine), (gathered, volume["all_gather"]),
                             (scattered, volume["reduce_scatter"])):
            runtime, planner = re.fullmatch(r"([\d.]+) \(([\d.]+)\)", cell).groups()
            assert runtime == planner and agrees(planner, bytes_ / 1e6), (name, stage, cell)


def test_pipelines_recompute_table_llama2_13b(capsys) -> None:
    command = quoted("pipelines.md",
                     r"`(paraxis plan --model llama2-13b [^`]*schedule=gpipe,recompute=none)`")
    command = command.group(1)
    steps = {}
    for schedule, recompute, activations, total, step in table(
            "pipelines.md", "| schedule | recompute | activations |"):
        kind = {"GPipe": "gpipe", "1F1B": "1f1b"}[schedule]
        out = plan(capsys, command.replace("schedule=gpipe,recompute=none",
                                           f"schedule={kind},recompute={recompute}"))
        assert agrees(activations, out.memory["activations"]), (schedule, recompute)
        assert agrees(total.split(":")[0], out.memory["total"]), (schedule, recompute)
        assert ("does not fit" in total) == ("✗" in out.row["GB/GPU"]), (schedule, recompute)
        steps[kind, recompute] = out.row["step s"]
        if step:
            assert agrees(step.split()[0], out.row["step s"]), (schedule, recompute)
        if more := re.search(r"\(\+(\d+)%", step):  # full recompute's cost over none
            slower = float(out.row["step s"]) / float(steps[kind, "none"]) - 1
            assert agrees(more.group(1), 100 * slower)
    # recompute_layers=N on the GPipe row with full recompute: kept inputs against rebuilt runs
    m = quoted("pipelines.md",
               r"with N = (\d+) holds ([\d.]+) GB of activations and ([\d.]+) of rebuilt ones "
               r"\(([\d.]+) GB in all, from ([\d.]+)\), with N = (\d+) ([\d.]+) and ([\d.]+) "
               r"\(([\d.]+)\)")
    gpipe_full = command.replace("recompute=none", "recompute=full")
    assert agrees(m.group(5), plan(capsys, gpipe_full).memory["total"])
    for n, activations, rebuilt, total in (m.group(1, 2, 3, 4), m.group(6, 7, 8, 9)):
        out = plan(capsys, gpipe_full + f",recompute_layers={n}")
        assert agrees(activations, out.memory["activations"]), n
        assert agrees(rebuilt, out.memory["buffers"]), n
        assert agrees(total, out.memory["total"]), n


def test_pipelines_block_method_recomputes_just_enough(capsys) -> None:
    m = quoted("pipelines.md", r"needs ([\d.]+) GB a GPU without recompute, takes ([\d.]+) s "
                               r"a step with every block recomputed \(`(paraxis plan --model "
                               r"llama3-8b [^`]*)`\) and ([\d.]+) s with (\d+) of its (\d+) "
                               r"\(`--layout ([^`]*)`\)")
    without, every, command, block, n, blocks, layout = m.groups()
    assert agrees(every, plan(capsys, command).row["step s"])
    out = plan(capsys, re.sub(r"--layout \S+", f"--layout {layout}", command))
    assert agrees(block, out.row["step s"])
    assert out.row["layout"].endswith(f"recompute_method=block,recompute_layers={n}")
    assert PRESETS[re.search(r"--model (\S+)", command).group(1)].n_layers == int(blocks)
    refused = run(capsys, argv(re.sub(r"--layout \S+", "--layout dp=8,zero=3", command))
                  + ["--recompute", "none"])
    assert f"needs {without} GB per GPU" in refused and "no layout" in refused


def test_pipelines_recompute_layers_with_few_in_flight(capsys) -> None:
    m = quoted("pipelines.md", r"goes from ([\d.]+) to ([\d.]+) GB at N = (\d+) "
                               r"\(`(paraxis plan --model llama2-7b [^`]*)`\)")
    without, with_n, n, command = m.groups()
    assert command.endswith(f",recompute_layers={n}")
    assert agrees(with_n, plan(capsys, command).memory["total"])
    assert agrees(without, plan(capsys, command.removesuffix(f",recompute_layers={n}"))
                  .memory["total"])
    m = quoted("pipelines.md", r"([\d.]+) GB a GPU at N = 1 and ([\d.]+) GB at N = 2: "
                               r"`(paraxis plan --model llama3-405b [^`]*)`, and without "
                               r"`recompute_layers=2`")
    at_1, at_2, command = m.groups()
    assert agrees(at_2, plan(capsys, command).memory["total"])
    assert agrees(at_1, plan(capsys, command.replace(",recompute_layers=2", "")).memory["total"])


# docs/planner.md


def test_context_variants_sentence_and_table(capsys) -> None:
    # docs/context.md: the ring against the all-to-all on one node, and the two-level table
    m = quoted("context.md", r"`(paraxis plan --model llama3-8b --gpus 8 [^`]*)` predicts "
                             r"([\d.]+) s a step, ([\d.]+) s with `cp_attention=all_to_all` "
                             r"\(([\d.]+) s of the ring's exchange exposed against ([\d.]+) s")
    command, ring, a2a, ring_cp, a2a_cp = m.groups()
    for layout_extra, step, exposed in (("", ring, ring_cp), (",cp_attention=all_to_all", a2a,
                                                               a2a_cp)):
        words = argv(command)
        words[words.index("--layout") + 1] += layout_extra
        out = Plan(run(capsys, words))
        assert agrees(step, out.row["step s"]) and agrees(exposed, out.row["cp s"])
    command = quoted("context.md", r"\(`(paraxis plan --model llama3-8b --gpus 16 [^`]*) "
                                   r"--layout LAYOUT`").group(1)
    rows = table("context.md", "| LAYOUT |")
    assert len(rows) == 4
    for layout, exposed, step in rows:
        out = plan(capsys, command, "--layout", layout.split("`")[1])
        assert agrees(exposed, out.row["cp s"]) and agrees(step, out.row["step s"]), layout


def test_planner_context_parallel_pick(capsys) -> None:
    m = quoted("planner.md",
               r"\(`(paraxis plan --model llama3-8b [^`]*)`\) it picks dp=(\d+), tp=(\d+), "
               r"cp=(\d+), ZeRO-(\d) \((\d+) s a step, ([\d.]+) s of ([\d.]+) s of K/V traffic "
               r"exposed\) over the best layout without CP \(dp=(\d+), tp=(\d+), pp=(\d+): "
               r"\+([\d.]+)%\)\. Its MFU is ([\d.]+)%")
    command, dp, tp, cp, zero, step, exposed, traffic, *rival, slower, mfu = m.groups()
    out = plan(capsys, command)
    # any CP variant (they tie here; the search keeps the one that holds least)
    assert re.match(rf"dp={dp},tp={tp},pp=1,cp={cp},(cp_\w+=\w+,)*zero={zero},",
                    out.row["layout"]), out.row["layout"]
    assert agrees(step, out.bullet(r"Prediction: ([\d.]+) s per step").group(1))
    kv = out.bullet(r"CP=\d+ .* ([\d.]+) s of traffic per step, ([\d.]+) s \(\d+%\) exposed")
    assert agrees(traffic, kv.group(1)) and agrees(exposed, kv.group(2))
    best = out.bullet(r"Best layout without CP: dp=(\d+),tp=(\d+),pp=(\d+),\S*, \+([\d.]+)%")
    assert best.groups() == (*rival, slower)
    assert agrees(mfu, out.row["MFU"].rstrip("%"))


def test_planner_mixture_of_experts_pick(capsys) -> None:
    sizes = quoted("planner.md", r"\(Mixtral 8x7B: ([\d.]+)B, ([\d.]+)B active\)")
    m = quoted("planner.md",
               r"\(`(paraxis plan --model mixtral-8x7b [^`]*)`\) it picks dp=(\d+), tp=(\d+), "
               r"pp=(\d+) with each expert split over tp=\d+ like the dense MLP \(etp=(\d+)\) "
               r"and ZeRO-(\d) sharded within groups of (\d+) dp ranks\s+\(([\d.]+) s a step\)"
               r".*?the best layout with EP \(dp=(\d+), pp=(\d+), ep=(\d+).*?\) is ([\d.]+)% "
               r"slower.*?\(`(--expert-imbalance 1)`\) EP wins: the same command picks dp=(\d+), "
               r"pp=(\d+), ep=(\d+) \(([\d.]+) s a step,\s+([\d.]+) s of all-to-alls exposed\)")
    (command, dp, tp, pp, etp, zero, shard, step, ep_dp, ep_pp, ep, slower, balanced, b_dp,
     b_pp, b_ep, b_step, all_to_all) = m.groups()
    out = plan(capsys, command)
    assert f"({sizes.group(1)}B params, {sizes.group(2)}B active per token)" in out.text
    assert out.row["layout"].startswith(f"dp={dp},tp={tp},pp={pp},etp={etp},zero={zero},"
                                        f"dp_shard={shard},")
    assert agrees(step, out.row["step s"])
    with_ep = out.bullet(r"the best layout with EP, (\S+), is \+([\d.]+)%")
    assert with_ep.group(1).startswith(f"dp={ep_dp},tp=1,pp={ep_pp},ep={ep},zero=3,")
    assert with_ep.group(2) == slower
    out = plan(capsys, command, *balanced.split())
    assert out.row["layout"].startswith(f"dp={b_dp},tp=1,pp={b_pp},ep={b_ep},zero=3,"
                                        "zero3_reshard=step,")
    assert agrees(b_step, out.row["step s"])
    assert agrees(all_to_all, out.bullet(r"EP=\d+ .* ([\d.]+) s per step, all exposed").group(1))


def test_planner_llama2_70b_picks(capsys) -> None:
    m = quoted("planner.md",
               r"`(paraxis plan --model llama2-70b --gpus 256 [^`]*)`\): .*? picks TP = (\d+) "
               r"\(dp=(\d+), tp=(\d+), pp=(\d+), interleaved, no recompute with the flash "
               r"kernel, ZeRO-3 keeping each chunk for the step: ([\d.]+) s per step\) over the "
               r"course's TP = 8 \(best: \+([\d.]+)%, within the A100's held-out ±([\d.]+)%")
    command, tp_word, dp, tp, pp, step, tp8, band = m.groups()
    out = plan(capsys, command)
    assert tp_word == tp
    assert out.row["layout"].startswith(f"dp={dp},tp={tp},pp={pp},zero=3,zero3_reshard=step,")
    assert "schedule=interleaved" in out.row["layout"] and "recompute" not in out.row["layout"]
    assert agrees(step, out.row["step s"])
    assert out.bullet(r"Rejected TP=8 .*: \+([\d.]+)% \(within the ±([\d.]+)% band\)").groups() \
        == (tp8, band)
    m = quoted("planner.md",
               r"`(paraxis plan --model llama2-70b --gpus 1024 [^`]*)` picks dp=(\d+), "
               r"tp=(\d+), pp=(\d+) \(interleaved, (\d+) chunks a stage, ([\d.]+) s per step\), "
               r"with NVIDIA's own shape, dp=(\d+), tp=(\d+), pp=(\d+), ([\d.]+)% behind \(a tie "
               r"within the H100's held-out ±([\d.]+)%\) and the best TP = 8 ([\d.]+)% behind")
    command, dp, tp, pp, chunks, step, *nvidia, behind, band, tp8 = m.groups()
    out = plan(capsys, command)
    assert out.row["layout"].startswith(f"dp={dp},tp={tp},pp={pp},")
    assert f"schedule=interleaved,virtual_stages={chunks}," in out.row["layout"]
    assert agrees(step, out.row["step s"])
    nvidia_dp, nvidia_tp, nvidia_pp = nvidia
    rival = out.bullet(rf"Rejected dp={nvidia_dp},tp={nvidia_tp},pp={nvidia_pp},\S*: "
                       r"\+([\d.]+)% \(within the ±([\d.]+)% band\)")
    assert rival.groups() == (behind, band)
    assert out.bullet(r"Rejected TP=8 .*: \+([\d.]+)% \(").group(1) == tp8


def test_planner_error_bands() -> None:
    # the band every prediction prints (plan/uncertainty.py)
    from paraxis.plan.uncertainty import CPU_BAND, GPU_BAND, HELD_OUT_BY_GPU, HELD_OUT_GPU_BAND

    m = quoted("planner.md",
               r"([\d.]+)% for A100s \((\d+) runs\), ([\d.]+)% for H100s \((\d+) runs\), "
               r"([\d.]+)% \(all (\d+)\) for other GPUs; the ([\d.]+)% of the (\d+) runs it was "
               r"fitted on .*? ([\d.]+)% for this machine's CPU ranks \(the (\d+) benchmarked "
               r"layouts .*?largest ([\d.]+)%;")
    bands = (HELD_OUT_BY_GPU["a100"], HELD_OUT_BY_GPU["h100"], HELD_OUT_GPU_BAND, GPU_BAND)
    for i, band in enumerate(bands):
        rms, runs = m.group(2 * i + 1, 2 * i + 2)
        assert agrees(rms, 100 * band.rms) and int(runs) == band.runs, band
    assert agrees(m.group(9), 100 * CPU_BAND.rms) and int(m.group(10)) == CPU_BAND.runs
    assert agrees(m.group(11), 100 * CPU_BAND.largest)


def test_planner_auto_defence(monkeypatch) -> None:
    from paraxis.commands.train import config_from_args
    from paraxis.train.auto_layout import plan_for

    command = quoted("planner.md", r"`(paraxis train --nproc 2 --layout auto [^`]*)` starts "
                                   r"with:").group(1)
    block = raw("planner.md").split("starts with:\n\n```\n", 1)[1].split("```", 1)[0]
    expected = []  # continuation lines (indented) belong to the line above
    for line in block.splitlines():
        if line.startswith(" "):
            expected[-1] += " " + line.strip()
        else:
            expected.append(line)
    monkeypatch.chdir(ROOT)  # the command names docs/hardware-profile.json from the root
    cfg = config_from_args(build_parser().parse_args(argv(command)))
    choice, source, _ = plan_for(cfg, cfg.launch.nproc)
    printed = [f"paraxis: {line}" for line in choice.defence(source)]
    assert len(printed) == len(expected), printed
    for want, got in zip(expected, printed, strict=True):
        at = 0
        for part in want.split("..."):  # "..." stands for what the doc leaves out
            at = got.find(part, at)
            assert at >= 0, f"docs/planner.md quotes {want!r}; paraxis prints {got!r}"
            at += len(part)


def test_planner_auto_layout_of_the_08b_model(tmp_path, monkeypatch, capsys) -> None:
    from bench.scale import MODEL
    from paraxis.commands.train import config_from_args
    from paraxis.train.auto_layout import plan_for

    flags = quoted("planner.md", r"the 0\.8B Llama of `bench/scale\.py` \(`bench\.scale\.MODEL` "
                                 r"in a model file\) on (\d+) ranks, with `([^`]+)` "
                                 r"\([^)]*\): `([^`]+)`; "
                                 r"on (\d+) ranks it picks a tensor x pipeline layout of "
                                 r"([\d.]+) GB per rank")
    ranks, options, message, more_ranks, gb = flags.groups()
    model_file = tmp_path / "llama-0.8b.json"
    model_file.write_text(json.dumps(MODEL.to_dict()))
    monkeypatch.chdir(ROOT)
    args = ["train", "--model", str(model_file), "--nproc", ranks, "--layout", "auto",
            *shlex.split(options)]
    assert main(args) == 2
    assert f"paraxis: error: {message}\n" in capsys.readouterr().err
    args[args.index("--nproc") + 1] = more_ranks
    cfg = config_from_args(build_parser().parse_args(args))
    choice, _, _ = plan_for(cfg, int(more_ranks))
    assert choice.layout.tp > 1 and choice.layout.pp > 1, choice.layout
    assert agrees(gb, choice.best.memory["total"] / GB)


def test_planner_hardware_profile_figures() -> None:
    # docs/hardware-profile.json is what `paraxis calibrate` wrote; the doc quotes its timings
    # and what the planner prices from them
    from paraxis.plan.comm import collective_time, group_link
    from paraxis.plan.inputs import PlanInputs

    m = quoted("planner.md", r"\(8 ranks on 2 cores, docs/hardware-profile\.json: ([\d.]+) ms "
                             r"for one element, ([\d.]+) ms for 16 KB; pairs ([\d.]+) and "
                             r"([\d.]+) ms\)")
    profile = json.loads((ROOT / "docs" / "hardware-profile.json").read_text())
    scalar = profile["cluster"]["scalar_call_s"]["8"]
    timed = {n: dict(rows) for n, rows in
             profile["calibration"]["collectives"]["8"]["all_reduce"].items()}
    for quote, seconds in zip(m.groups(), (scalar["8"], timed["8"][16384.0], scalar["2"],
                                          timed["2"][16384.0]), strict=True):
        assert agrees(quote, 1e3 * seconds), (quote, seconds)
    m = quoted("planner.md", r"the one committed now times 32 MiB at (\d+) ms and prices 26 MB "
                             r"at (\d+) ms")
    assert agrees(m.group(1), 1e3 * timed["8"][float(32 << 20)])
    cluster = PlanInputs(model="tiny", gpus=8, gpus_per_node=8,
                         hardware=str(ROOT / "docs" / "hardware-profile.json")).cluster()
    price = collective_time("all_reduce", 26e6, 8, group_link(range(8), cluster))
    assert agrees(m.group(2), 1e3 * price)


def test_planner_validation_figures() -> None:
    # `python -m validation`'s rows the planner text quotes: Korthikanti's Table 4, Llama 3
    from paraxis.plan.cost import Overlap
    from validation.heldout_runs import LLAMA3_RUNS
    from validation.korthikanti_table4 import TABLE_4, layer_ms
    from validation.validate_heldout import price

    m = quoted("planner.md", r"is reproduced within (\d+)% with this overlap; without it the "
                             r"backward \(no recomputation\) comes out (\d+)-(\d+)% too slow")
    within, low, high = (int(x) for x in m.groups())
    errors = []
    for sequence_parallel, recompute, forward_ms, backward_ms in TABLE_4:
        forward, backward = layer_ms(sequence_parallel, recompute, Overlap())
        errors += [abs(forward / forward_ms - 1), abs(backward / backward_ms - 1)]
    assert agrees(within, 100 * max(errors)) or 100 * max(errors) <= within
    exposed = sorted(100 * (layer_ms(sp, recompute, Overlap(tp=False))[1] / backward_ms - 1)
                     for sp, recompute, _, backward_ms in TABLE_4 if recompute == "none")
    assert agrees(low, exposed[0]) and agrees(high, exposed[-1]), exposed
    m = quoted("planner.md", r"The 128K row \(CP 16\) comes out ([+-]\d+)% \((\d+) against (\d+) "
                             r"tokens/s per GPU\), the two 8K rows without CP (\d+)-(\d+)% too "
                             r"slow")
    error, priced, published, low, high = m.groups()
    rows = {run.name: (run, price(run)) for run in LLAMA3_RUNS}
    run, result = next(rows[n] for n in rows if "128K" in n)
    assert agrees(error, 100 * result.error)
    assert agrees(priced, result.tokens_per_gpu_s) and agrees(published, run.tokens_per_gpu_s)
    short = sorted(-100 * result.error for name, (_, result) in rows.items() if "128K" not in name)
    assert agrees(low, short[0]) and agrees(high, short[-1]), short


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
