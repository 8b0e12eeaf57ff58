"""A timeline as a Chrome trace: the JSON trace-event format that Perfetto and chrome://tracing
open, so a course run can be read in the tools a real cluster's profiles are read in.

The file holds `traceEvents` (the format of Google's "Trace Event Format" document):

- one process per timeline, named with its clock ("1f1b · measured, virtual clock");
- one track (a trace "thread") per device for its compute, `device 0`, and one per device for
  its communication stream (collectives, transfers), `device 0 · comm`; a stream whose
  events overlap (several transfers in flight at once) gets more tracks, `device 0 · comm 2`,
  since a track draws only events that nest;
- one complete event ("ph": "X") per timeline event, named with the course's action name
  (`2F0`, `0REDUCE_GRAD`), its label, kind, device, start and end in `args`.

Times: the format counts microseconds. A measured timeline's seconds become microseconds
exactly as recorded; a simulated timeline's cost units are drawn as 1 unit = 1 ms. Which
clock timed the run (virtual: per-thread CPU time and emulated links; wall: timestamps on
this machine) is in the process name and in `otherData`, with the modelled links.
`timeline_from_trace` reads a file back into the `Timeline` it was written from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from course_utils.actions import KIND_NAMES, Action
from course_utils.errors import CourseInputError

if TYPE_CHECKING:
    from course_utils.timeline import Event, Timeline

MICROSECONDS = {"s": 1e6, "units": 1e3}  # per unit of the timeline: 1 unit is drawn as 1 ms
PID = 1


def clock_of(timeline: Timeline) -> str:
    """The clock that timed the timeline, in words: "virtual clock", "wall clock" or
    "simulated" (the simulator's cost units)."""
    if timeline.source != "measured":
        return "simulated"
    clock = timeline.meta.get("clock")
    return f"{clock} clock" if clock else "measured"


def _tracks(timeline: Timeline) -> tuple[list[str], list[tuple[Event, int]]]:
    """Track names in drawing order, and each event with its track's index: per device its
    compute, then its communication, each spread over as few tracks as keep events nested."""
    per_stream: dict[tuple[int, bool], list[Event]] = {}
    for e in timeline.events:
        per_stream.setdefault((e.device, not e.action.is_compute), []).append(e)
    names: list[str] = []
    placed: list[tuple[Event, int]] = []
    for device, comm in sorted(per_stream):
        lane_ends: list[float] = []  # per track of this stream: when its last event ends
        first = len(names)
        for e in sorted(per_stream[device, comm], key=lambda e: (e.start, -e.end)):
            lane = next((k for k, end in enumerate(lane_ends) if end <= e.start), None)
            if lane is None:
                lane = len(lane_ends)
                lane_ends.append(e.end)
                base = f"device {device}" + (" · comm" if comm else "")
                names.append(base if lane == 0 else f"{base} {lane + 1}")
            lane_ends[lane] = e.end
            placed.append((e, first + lane))
    return names, placed


def chrome_trace(timeline: Timeline, title: str | None = None) -> dict:
    """The timeline as a Chrome trace (a dict to dump as JSON)."""
    scale = MICROSECONDS.get(timeline.unit)
    if scale is None:
        raise CourseInputError(f"timeline unit must be one of {', '.join(MICROSECONDS)}")
    clock = clock_of(timeline)
    name = title or timeline.name or "timeline"
    names, placed = _tracks(timeline)
    events: list[dict] = [
        {"ph": "M", "pid": PID, "tid": 0, "name": "process_name",
         "args": {"name": f"{name} · {timeline.source}, {clock}"}},
    ]  # fmt: skip
    for tid, track in enumerate(names, start=1):
        events.append(
            {"ph": "M", "pid": PID, "tid": tid, "name": "thread_name", "args": {"name": track}}
        )
        events.append(
            {"ph": "M", "pid": PID, "tid": tid, "name": "thread_sort_index",
             "args": {"sort_index": tid}}
        )  # fmt: skip
    for e, index in sorted(placed, key=lambda x: (x[0].start, x[1])):
        args: dict = {
            "action": str(e.action),
            "kind": KIND_NAMES[e.action.kind],
            "device": e.device,
            "start": e.start,
            "end": e.end,
            "unit": timeline.unit,
        }
        if e.label is not None:
            args["label"] = e.label
        events.append(
            {
                "ph": "X",
                "pid": PID,
                "tid": index + 1,
                "name": str(e.action),
                "cat": "compute" if e.action.is_compute else "communication",
                "ts": e.start * scale,
                "dur": (e.end - e.start) * scale,
                "args": args,
            }
        )
    meta = {k: v for k, v in timeline.meta.items() if isinstance(v, str | int | float | bool)}
    other = {
        "name": name,
        "source": timeline.source,
        "clock": clock,
        "unit": timeline.unit,
        "microseconds_per_unit": scale,
        "num_devices": timeline.num_devices,
        "stages": timeline.stages,
        "microbatches": timeline.microbatches,
        "chunks": timeline.chunks,
        "makespan": timeline.makespan,
        "meta": meta,
    }
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_chrome_trace(timeline: Timeline, path: str | Path, title: str | None = None) -> Path:
    """Write the timeline's Chrome trace to `path` (JSON) and return the path."""
    out = Path(path)
    text = json.dumps(chrome_trace(timeline, title), allow_nan=False)
    out.write_text(text + "\n", encoding="utf-8")
    return out


def timeline_from_trace(trace: dict | str | Path) -> Timeline:
    """The `Timeline` a Chrome trace of `chrome_trace` was written from (a dict, or a file)."""
    from course_utils.timeline import Event, Timeline

    data = trace if isinstance(trace, dict) else json.loads(Path(trace).read_text("utf-8"))
    other = data.get("otherData", {})
    events = [
        Event(
            e["args"]["device"],
            Action.parse(e["args"]["action"]),
            e["args"]["start"],
            e["args"]["end"],
            e["args"].get("label"),
        )
        for e in data["traceEvents"]
        if e.get("ph") == "X"
    ]
    meta = dict(other.get("meta", {}))
    return Timeline(
        events,
        other.get("num_devices") or 1 + max((e.device for e in events), default=0),
        name=other.get("name", ""),
        source=other.get("source", "measured"),
        unit=other.get("unit", "s"),
        meta=meta,
        stages=other.get("stages"),
        microbatches=other.get("microbatches"),
        chunks=other.get("chunks") or 1,
    )
