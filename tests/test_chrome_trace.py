"""Chrome traces (course_utils.chrome_trace): a timeline written for Perfetto and
chrome://tracing, from `Timeline.write_chrome_trace` and from every timed command's --trace."""

from __future__ import annotations

import json

import pytest

from course_utils.actions import Action
from course_utils.chrome_trace import chrome_trace, timeline_from_trace
from course_utils.cli import main
from course_utils.pipeline import CostModel, make_schedule, simulate
from course_utils.timeline import Event, Timeline

REL = 1e-9  # microseconds from seconds: float rounding only


def complete_events(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def track_names(trace: dict) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}


def check_schema(trace: dict, timeline: Timeline | None = None) -> None:
    """What Perfetto and chrome://tracing need, and what the course promises: every event
    on a named track of one process, every track nested (no two of its events overlap),
    every event inside the step, compute on one track per device."""
    assert isinstance(trace["traceEvents"], list) and trace["displayTimeUnit"] == "ms"
    names = track_names(trace)
    events = complete_events(trace)
    assert events, "no events"
    scale = trace["otherData"]["microseconds_per_unit"]
    starts = [e["args"]["start"] for e in events]
    ends = [e["args"]["end"] for e in events]
    for e in events:
        assert set(e) >= {"ph", "pid", "tid", "ts", "dur", "name", "cat", "args"}
        assert e["tid"] in names and e["pid"] == 1
        assert e["name"] == e["args"]["action"] == str(Action.parse(e["name"]))
        assert e["dur"] >= 0
        assert e["ts"] == pytest.approx(e["args"]["start"] * scale, rel=REL, abs=1e-9)
        assert e["dur"] == pytest.approx(
            (e["args"]["end"] - e["args"]["start"]) * scale, rel=REL, abs=1e-9
        )
        # inside the step
        assert min(starts) <= e["args"]["start"] <= e["args"]["end"] <= max(ends)
        device = e["args"]["device"]
        comm = e["cat"] == "communication"
        assert names[e["tid"]].startswith(f"device {device}" + (" · comm" if comm else ""))
    for tid in names:  # a track's events never overlap, so they nest
        mine = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["tid"] == tid)
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(mine, mine[1:], strict=False)), tid
    compute_tracks: dict[int, set[int]] = {}
    for e in events:
        if e["cat"] == "compute":
            compute_tracks.setdefault(e["args"]["device"], set()).add(e["tid"])
    assert all(len(tracks) == 1 for tracks in compute_tracks.values()), compute_tracks
    if timeline is not None:
        assert len(events) == len(timeline.events)  # one event per action
        assert sorted(compute_tracks) == sorted(
            {e.device for e in timeline.events if e.action.is_compute}
        )
        want = sorted((str(e.action), e.device, e.duration) for e in timeline.events)
        got = sorted((e["name"], e["args"]["device"], e["dur"] / scale) for e in events)
        for (a, d, w), (b, d2, g) in zip(want, got, strict=True):
            assert (a, d) == (b, d2) and g == pytest.approx(w, rel=REL, abs=1e-12)


def test_a_simulated_schedule_is_one_track_per_device_in_cost_units_as_ms():
    tl = simulate(make_schedule("1f1b", 3, 4), CostModel(forward=1.0, backward=2.0))
    trace = chrome_trace(tl)
    check_schema(trace, tl)
    assert trace["otherData"]["clock"] == "simulated"
    assert sorted(track_names(trace).values()) == ["device 0", "device 1", "device 2"]
    first = min(complete_events(trace), key=lambda e: (e["ts"], e["tid"]))
    assert first["name"] == "0F0" and first["dur"] == 1000.0  # 1 unit = 1 ms = 1000 us
    back = timeline_from_trace(trace)
    assert sorted(back.events, key=lambda e: (e.start, e.device)) == sorted(
        tl.events, key=lambda e: (e.start, e.device)
    )
    assert back.makespan == tl.makespan and back.bubble_fraction == tl.bubble_fraction


def test_overlapping_communication_gets_another_track_and_the_clock_is_named(tmp_path):
    events = [
        Event(0, Action(0, "F", 0), 0.0, 1.0),
        Event(0, Action(0, "SEND_F", 0), 1.0, 3.0),
        Event(0, Action(0, "F", 1), 1.0, 2.0),
        Event(0, Action(0, "SEND_F", 1), 2.0, 4.0),  # in flight beside 0SEND_F0
        Event(1, Action(1, "F", 0), 3.0, 4.0, "stage 1"),
    ]
    tl = Timeline(events, 2, name="two sends", source="measured", unit="s",
                  meta={"clock": "virtual", "links": "emulated links"})  # fmt: skip
    path = tl.write_chrome_trace(tmp_path / "t.json")
    trace = json.loads(path.read_text())
    check_schema(trace, tl)
    names = track_names(trace)
    assert sorted(names.values()) == [
        "device 0",
        "device 0 · comm",
        "device 0 · comm 2",
        "device 1",
    ]
    sends = {e["name"]: names[e["tid"]] for e in complete_events(trace) if "SEND" in e["name"]}
    assert sends == {"0SEND_F0": "device 0 · comm", "0SEND_F1": "device 0 · comm 2"}
    assert trace["otherData"]["clock"] == "virtual clock"
    assert trace["otherData"]["meta"]["links"] == "emulated links"
    process = next(e for e in trace["traceEvents"] if e["name"] == "process_name")
    assert "virtual clock" in process["args"]["name"]
    label = next(e for e in complete_events(trace) if e["name"] == "1F0")["args"]["label"]
    assert label == "stage 1"
    assert set(timeline_from_trace(path).events) == set(tl.events)


# Every timed command at a small size: (argv, the devices it runs on)
COMMANDS = {
    "run": (["run", "1f1b", "--devices", "2", "--microbatches", "3", "--model", "mlp"], 2),
    "data-parallel": (["data-parallel", "--workers", "2", "--batch", "64", "--steps", "1"], 2),
    "tensor-parallel": (["tensor-parallel", "--workers", "2", "--tokens", "16", "--d-model",
                         "8"], 2),
    "fsdp": (["fsdp", "--workers", "2", "--steps", "2"], 2),
    "context-parallel": (["context-parallel", "--workers", "3", "--seq", "12", "--heads", "1",
                          "--dim", "4"], 3),
    "ulysses": (["context-parallel", "--workers", "2", "--seq", "8", "--heads", "2", "--dim",
                 "4", "--ulysses"], 2),
    "moe": (["moe", "--workers", "2", "--tokens", "16"], 2),
}  # fmt: skip


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_timed_command_writes_the_trace_of_its_measured_step(name, tmp_path, capsys):
    argv, devices = COMMANDS[name]
    path = tmp_path / "step.json"
    assert main([*argv, "--trace", str(path), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)  # stdout stays JSON with --trace
    trace = json.loads(path.read_text())
    check_schema(trace)
    events = complete_events(trace)
    assert {e["args"]["device"] for e in events if e["cat"] == "compute"} == set(range(devices))
    clock = "wall clock" if name == "ulysses" else "virtual clock"
    assert trace["otherData"]["clock"] == clock and trace["otherData"]["source"] == "measured"
    if name != "ulysses":
        assert "links" in trace["otherData"]["meta"]  # what the virtual clock modelled
    # the trace is the step the command measured: its makespan, and (where the command
    # prints them) its very events
    span = max(e["args"]["end"] for e in events) - min(e["args"]["start"] for e in events)
    assert figures["measured_step_s"] == pytest.approx(span, rel=REL)
    if "events" in figures:
        printed = sorted(
            (e["action"], e["device"], e["end"] - e["start"]) for e in figures["events"]
        )
        traced = sorted((e["name"], e["args"]["device"], e["dur"] / 1e6) for e in events)
        assert [p[:2] for p in printed] == [t[:2] for t in traced]
        for p, t in zip(printed, traced, strict=True):
            assert t[2] == pytest.approx(p[2], rel=REL, abs=1e-12)
    loaded = timeline_from_trace(path)
    assert loaded.makespan == pytest.approx(span, rel=REL) and loaded.source == "measured"


def test_the_trace_is_said_in_the_printed_report_and_runs_on_the_wall_clock(tmp_path, capsys):
    path = tmp_path / "wall.json"
    argv = ["tensor-parallel", "--workers", "2", "--tokens", "16", "--d-model", "8"]
    assert main([*argv, "--clock", "wall", "--trace", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {path} (Chrome trace of the measured step, wall clock" in out
    trace = json.loads(path.read_text())
    check_schema(trace)
    assert trace["otherData"]["clock"] == "wall clock"


@pytest.mark.parametrize(
    "value, words",
    [
        ("{tmp}", "is a folder"),
        ("{tmp}/", "is a folder"),
        ("{tmp}/missing/step.json", "does not exist"),
        ("{tmp}/step.txt", "must end in .json"),
        ("/proc/step.json", "takes no new files"),
        ("", "needs a file name"),
    ],
)
@pytest.mark.parametrize("command", ["run", "data-parallel", "fsdp", "context-parallel", "moe",
                                     "tensor-parallel"])  # fmt: skip
def test_a_bad_trace_is_one_line_and_exit_2_before_any_work(
    command, value, words, tmp_path, capsys
):
    assert main([command, *(["gpipe"] if command == "run" else []),
                 "--trace", value.format(tmp=tmp_path)]) == 2  # fmt: skip
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "--trace" in lines[0] and words in lines[0], lines
    assert "Traceback" not in captured.err
