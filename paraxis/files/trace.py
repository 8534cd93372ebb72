"""Measured pipeline traces: read them, and write them as Chrome/Perfetto trace JSON.

The runtime's pipeline executor records one dict per action and per message:

    {"rank": 0, "stage": 0, "kind": "F", "microbatch": 3, "chunk": 0,
     "start_s": 12.5031, "end_s": 12.5102}    # kind: "F", "B", "W", "send" or "recv"

(a recv also carries "posted_s", when its irecv went out; the executor posts receives ahead
on gloo, so that is usually before the compute that precedes the wait).

`to_chrome_trace` turns that list into the Trace Event Format (Google, "Trace Event Format"
document: complete events, ph="X", ts/dur in microseconds) that chrome://tracing and
https://ui.perfetto.dev open: one process per rank, one thread for compute and one for
communication.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Callable, Iterable
from pathlib import Path

from paraxis.spec.errors import ParaxisError
from paraxis.spec.schedules import Action, Schedule, Timeline, simulate

TRACE_KEYS = ("rank", "stage", "kind", "microbatch", "chunk", "start_s", "end_s")
COMPUTE_KINDS = ("F", "B", "W")
COMM_KINDS = ("send", "recv")
_LANE = {"compute": 0, "comm": 1}


INDEX_KEYS = ("rank", "stage", "microbatch", "chunk")  # whole numbers from 0
TIME_KEYS = ("start_s", "end_s")


def _is_number(value: object, whole: bool = False) -> bool:
    """Whether `value` is a real number (a whole one where `whole`), not a bool."""
    kind = numbers.Integral if whole else numbers.Real
    return isinstance(value, kind) and not isinstance(value, bool)


def check_events(events: Iterable[dict]) -> list[dict]:
    """The events as a list, each checked for the keys, kinds and numbers above."""
    checked = []
    for i, event in enumerate(events):
        if not isinstance(event, dict):
            raise ParaxisError(f"trace event {i} is {json.dumps(event, default=str)[:40]}, "
                               "not an object; a paraxis trace event is an object with "
                               f"{', '.join(TRACE_KEYS)}")
        missing = [k for k in TRACE_KEYS if k not in event]
        if missing:
            raise ParaxisError(f"trace event {i} lacks {', '.join(missing)}; a paraxis trace "
                               f"event has {', '.join(TRACE_KEYS)}")
        if event["kind"] not in COMPUTE_KINDS + COMM_KINDS:
            raise ParaxisError(f"trace event {i} has kind {event['kind']!r}; expected one of "
                               f"{', '.join(COMPUTE_KINDS + COMM_KINDS)}")
        for key in INDEX_KEYS:
            if not (_is_number(event[key], whole=True) and event[key] >= 0):
                raise ParaxisError(f"trace event {i} has {key} {event[key]!r}; expected a "
                                   "whole number from 0")
        for key in TIME_KEYS:
            if not _is_number(event[key]):
                raise ParaxisError(f"trace event {i} has {key} {event[key]!r}; expected "
                                   "seconds, a number")
        if event["end_s"] < event["start_s"]:
            raise ParaxisError(f"trace event {i} ends before it starts")
        checked.append(event)
    return checked


def event_label(event: dict) -> str:
    """"F3" for microbatch 3's forward; "F3.1" on model chunk 1 (interleaved schedules)."""
    chunk = f".{event['chunk']}" if event.get("chunk") else ""
    return f"{event['kind']}{event['microbatch']}{chunk}"


def to_chrome_trace(events: Iterable[dict]) -> dict:
    """A Trace Event Format object: {"traceEvents": [...], "displayTimeUnit": "ms"}."""
    events = check_events(events)
    origin = min((e["start_s"] for e in events), default=0.0)
    out: list[dict] = []
    ranks = sorted({(e["rank"], e["stage"]) for e in events})
    for rank, stage in ranks:
        out.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                    "args": {"name": f"rank {rank} (stage {stage})"}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                    "args": {"sort_index": rank}})
        for lane, tid in _LANE.items():
            out.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                        "args": {"name": lane}})
    for e in events:
        lane = "compute" if e["kind"] in COMPUTE_KINDS else "comm"
        out.append({
            "name": event_label(e), "cat": lane, "ph": "X", "pid": e["rank"],
            "tid": _LANE[lane],
            "ts": round((e["start_s"] - origin) * 1e6, 3),
            "dur": round((e["end_s"] - e["start_s"]) * 1e6, 3),
            "args": {"stage": e["stage"], "microbatch": e["microbatch"],
                     "chunk": e["chunk"], "kind": e["kind"]},
        })
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def from_chrome_trace(trace: dict | list) -> list[dict]:
    """Back from Trace Event Format (as `to_chrome_trace` writes it) to paraxis events: its
    complete events (ph "X"), each with a numeric ts and dur in microseconds."""
    raw = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(raw, list):
        raise ParaxisError("a Chrome trace's traceEvents must be a list of events, not "
                           f"{json.dumps(raw, default=str)[:40]}")
    events = []
    for i, e in enumerate(raw):
        if not isinstance(e, dict):
            raise ParaxisError(f"Chrome trace event {i} is {json.dumps(e, default=str)[:40]}, "
                               "not an object")
        if e.get("ph") != "X":
            continue
        args = e.get("args", {})
        bad = [key for key in ("ts", "dur") if not _is_number(e.get(key))]
        if bad or not isinstance(args, dict) or not isinstance(e.get("name", ""), str):
            raise ParaxisError(f"Chrome trace event {i} is not a complete event as paraxis "
                               "writes them (numeric ts and dur in microseconds, pid, a name "
                               "and an args object)")
        start = e["ts"] / 1e6
        events.append({"rank": e.get("pid"), "stage": args.get("stage", e.get("pid")),
                       "kind": args.get("kind", e.get("name", "")[:1]),
                       "microbatch": args.get("microbatch", 0), "chunk": args.get("chunk", 0),
                       "start_s": start, "end_s": start + e["dur"] / 1e6})
    return check_events(events)


def write_chrome_trace(events: Iterable[dict], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(to_chrome_trace(events)))
    return path


def load_trace(path: str | Path) -> list[dict]:
    """Read a trace file: a JSON list of paraxis events, or a Chrome trace we wrote. A file
    that is neither, or holds no events, is refused in one line naming it."""
    path = Path(path)
    fix = ("give the trace.json a pipeline run (pp > 1) writes beside its metrics, or a "
           "Chrome trace paraxis wrote")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ParaxisError(f"cannot read trace {path}: {error}; {fix}") from None
    if not isinstance(data, dict | list):
        raise ParaxisError(f"trace {path} holds a JSON {type(data).__name__}, not a list of "
                           f"events or a Chrome trace; {fix}")
    chrome = isinstance(data, dict) or (data and isinstance(data[0], dict) and "ph" in data[0])
    try:
        events = from_chrome_trace(data) if chrome else check_events(data)
    except ParaxisError as error:
        raise ParaxisError(f"trace {path}: {error}; {fix}") from None
    if not events:
        raise ParaxisError(f"trace {path} holds no events; {fix}")
    return events


def busy_fraction(events: Iterable[dict]) -> dict[int, float]:
    """Per rank: compute time / (last end - first start over all ranks). The measured bubble
    of a rank is 1 - this."""
    events = list(events)
    if not events:
        return {}
    start = min(e["start_s"] for e in events)
    span = max(e["end_s"] for e in events) - start
    busy: dict[int, float] = {}
    for e in events:
        busy.setdefault(e["rank"], 0.0)
        if e["kind"] in COMPUTE_KINDS:
            busy[e["rank"]] += e["end_s"] - e["start_s"]
    return {rank: (t / span if span > 0 else 0.0) for rank, t in sorted(busy.items())}


def traced_count(events: Iterable[dict], field: str) -> int:
    """How many pipeline stages or chunks (`field`) a trace's compute events name."""
    return 1 + max((e[field] for e in events if e["kind"] in COMPUTE_KINDS), default=-1)


def traced_placement(events: Iterable[dict]) -> str:
    """Where a trace's run placed its chunks: "v" (zb-v: the second chunk comes back up the
    stages, so the last stage runs it first) or "loop" (interleaved: it starts again at
    stage 0), from the stage of the first forward of chunk 1; "loop" with one chunk."""
    seconds = [e for e in events if e["kind"] == "F" and e["chunk"] == 1]
    if not seconds:
        return "loop"
    first = min(seconds, key=lambda e: (e["microbatch"], e["start_s"]))
    return "v" if first["stage"] > 0 and first["stage"] == traced_count(events, "stage") - 1 \
        else "loop"


def trace_costs(events: Iterable[dict], stages: int, chunks: int,
                virtual_stage: Callable[[int, int], int]
                ) -> tuple[list[float], list[float], list[float]]:
    """Mean seconds of one microbatch's forward, whole backward (B + W) and W on each virtual
    stage, measured: the costs `schedules.simulate` takes, so a run's own trace can be
    replayed, slow stages included. `virtual_stage(stage, chunk)` is the schedule's."""
    spans: dict[tuple[str, int], list[float]] = {}
    events = [e for e in check_events(events) if e["kind"] in COMPUTE_KINDS]
    for field, given, flag in (("stage", stages, "--stages"), ("chunk", chunks, "--virtual")):
        traced = traced_count(events, field)
        if events and traced != given:  # a stage with no events would cost nothing
            raise ParaxisError(f"the trace's run had {traced} pipeline {field}s, not {given}: "
                               f"give {flag} {traced}")
    for e in events:
        key = (e["kind"], virtual_stage(e["stage"], e["chunk"]))
        spans.setdefault(key, []).append(e["end_s"] - e["start_s"])

    def mean(kind: str, index: int) -> float:
        values = spans.get((kind, index), [])
        return sum(values) / len(values) if values else 0.0

    count = stages * chunks
    if not any(("F", v) in spans for v in range(count)):
        raise ParaxisError("the trace has no forward events; record one with a pipeline run "
                           "(pp > 1), which writes trace.json beside its metrics")
    missing = [v for v in range(count) for kind in ("F", "B") if (kind, v) not in spans]
    if missing:
        raise ParaxisError(f"the trace has no forward or backward of virtual stage "
                           f"{missing[0]} (of {count}): record a whole step of a pipeline run")
    forward = [mean("F", v) for v in range(count)]
    weight = [mean("W", v) for v in range(count)]
    backward = [mean("B", v) + w for v, w in enumerate(weight)]
    return forward, backward, weight


def replay(events: Iterable[dict], schedule: Schedule, comm_s: float = 0.0) -> Timeline:
    """One measured step run again through `schedule.simulate` with the step's own costs:
    each compute at the time it took, each send holding its stage as long as posting it did
    (the slowest rank of a stage counts), each stage's clock starting where that stage entered
    the step, and each message `comm_s` on the wire. What the measured step idles beyond this
    replay is neither the schedule's order nor its actions' times: messages slower than
    `comm_s`, and the executor's own gaps between actions. Unlike a simulation from mean
    costs, it holds where actions vary from one to the next (ranks that slow each other, a
    busy host). A rank's events of one kind are its stage's actions of that kind, in order."""
    events = check_events(events)
    if not events:
        raise ParaxisError("an empty trace has no step to replay")
    origin = min(e["start_s"] for e in events)
    entered = [0.0] * schedule.num_stages
    seconds: dict[Action, float] = {}
    for rank in sorted({e["rank"] for e in events}):
        mine = sorted((e for e in events if e["rank"] == rank), key=lambda e: e["start_s"])
        stage = mine[0]["stage"]
        if not 0 <= stage < schedule.num_stages:
            raise ParaxisError(f"the trace has stage {stage}; the {schedule.kind} schedule "
                               f"has {schedule.num_stages} stages")
        entered[stage] = max(entered[stage], mine[0]["start_s"] - origin)
        for kind in (*COMPUTE_KINDS, "send"):
            done = [e for e in mine if e["kind"] == kind]
            planned = [a for a in schedule.stages[stage] if a.kind == kind]
            if len(done) != len(planned):
                raise ParaxisError(f"rank {rank} ran {len(done)} {kind} actions where the "
                                   f"{schedule.kind} schedule has {len(planned)} on stage "
                                   f"{stage}; replay one whole step of that schedule")
            for event, action in zip(done, planned, strict=True):
                took = event["end_s"] - event["start_s"]
                seconds[action] = max(seconds.get(action, 0.0), took)
    return simulate(schedule, comm_cost=comm_s, action_seconds=seconds, start_s=entered)
