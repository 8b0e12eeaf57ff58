"""torch.profiler on the course's runs (course_utils.measure.profiler): the profiler's rows
carry the course's action names, match the course's devices, and read back as plain rows;
on real processes every rank writes its own trace (`train --profile DIR`)."""

from __future__ import annotations

import json

import pytest
import torch

from course_utils.errors import CourseInputError
from course_utils.measure.profiler import (
    profile_step,
    ranks_timeline,
    read_profile,
    read_rank_profiles,
)
from course_utils.models import MLP, loss_fn, partition
from course_utils.pipeline import make_schedule
from course_utils.pipeline.executor import PipelineExecutor
from course_utils.threads import trace


def write(path, events) -> None:
    path.write_text(json.dumps({"traceEvents": events}))


def x(name, tid, ts, dur, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def test_a_trace_reads_as_actions_and_operators_with_self_times(tmp_path):
    path = tmp_path / "t.json"
    write(path, [
        x("0F0", 7, 0, 100, "user_annotation"),
        x("aten::linear", 7, 10, 50), x("aten::addmm", 7, 20, 30),
        x("aten::mm", 7, 70, 20),
        x("PP:1B0", 8, 50, 100, "user_annotation"),  # PyTorch's runtime's mark
        x("aten::mm", 8, 60, 10), x("aten::mm", 8, 200, 10),  # the second is outside 1B0
        x("ProfilerStep#1", 7, 0, 500, "user_annotation"),  # not an action
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "x"}},
    ])  # fmt: skip
    profile = read_profile(path)
    assert [a.name for a in profile.actions] == ["0F0", "1B0"] and profile.threads() == [7, 8]
    assert profile.operators_in("0F0") == {"aten::linear": 1, "aten::addmm": 1, "aten::mm": 1}
    assert profile.operators_in("1B0") == {"aten::mm": 1}
    assert profile.self_us(7) == {"aten::linear": 20.0, "aten::addmm": 30.0, "aten::mm": 20.0}
    assert profile.most_self_time(7, 1) == [("aten::addmm", 30.0)]
    assert profile.busy_us(7) == 100 and profile.busy_us(8) == 100
    with pytest.raises(CourseInputError, match="no action '2F0'"):
        profile.operators_in("2F0")


def test_single_stage_marks_of_a_rank_and_the_ranks_side_by_side(tmp_path):
    write(tmp_path / "rank0.json", [x("Forward 0", 1, 0, 10, "user_annotation"),
                                    x("Backward 0", 1, 30, 20, "user_annotation")])  # fmt: skip
    write(tmp_path / "rank1.json", [x("Forward 0", 5, 12, 10, "user_annotation"),
                                    x("PP:1B0", 5, 22, 6, "user_annotation")])  # fmt: skip
    (tmp_path / "notes.json").write_text("{}")  # not a rank's trace: left alone
    profiles = read_rank_profiles(tmp_path)
    assert list(profiles) == [0, 1]
    assert [a.name for a in profiles[1].actions] == ["1F0", "1B0"]
    tl = ranks_timeline(profiles)
    assert tl.num_devices == 2 and tl.meta["clock"] == "wall"
    starts = {str(e.action): (e.device, e.start, e.end) for e in tl.events}
    assert starts["1F0"] == (1, pytest.approx(12e-6), pytest.approx(22e-6))
    assert starts["0B0"][1] == pytest.approx(30e-6)
    with pytest.raises(CourseInputError, match="no rank"):
        read_rank_profiles(tmp_path / "notes.json")


def test_a_profiled_step_marks_every_action_on_its_devices_thread(tmp_path):
    torch.manual_seed(0)
    mlp = MLP(d_in=16, d_hidden=32, d_out=4, depth=3)
    x_, y_ = torch.randn(16, 16), torch.randint(4, (16,))
    gpipe = make_schedule("gpipe", 2, 4)
    with PipelineExecutor(partition(mlp, 2), 2, loss_fn, clock="wall") as executor:
        executor.step(gpipe, x_, y_)
        step = profile_step(lambda: executor.step(gpipe, x_, y_), tmp_path / "p.json", False)
        with pytest.raises(RuntimeError):  # the marks end with the profiler, even on error
            profile_step(_fail, tmp_path / "q.json")
    assert trace.marker is None
    profile = read_profile(tmp_path / "p.json")
    ours = step.timeline
    rows = profile.devices(ours)
    assert sorted(rows.values()) == [0, 1] and len(profile.threads()) == 2
    bars = {str(e.action): e for e in ours.events if e.action.is_compute}
    assert sorted(a.name for a in profile.actions) == sorted(bars)  # each action once
    for a in profile.actions:
        assert rows[a.tid] == bars[a.name].device
        assert a.dur <= bars[a.name].duration * 1e6 + 1  # the mark lies inside the bar
    # the operators inside: a forward runs addmm, a backward mm (lesson 02's exercise 2.9)
    assert profile.operators_in("1F0")["aten::addmm"] >= 1
    assert profile.operators_in("1B0")["aten::mm"] >= 2
    fig_timeline = profile.as_timeline(rows)
    assert {str(e.action) for e in fig_timeline.events} == set(bars)


def _fail():
    raise RuntimeError("a step that fails")


def test_rows_that_do_not_match_are_said(tmp_path):
    from course_utils.actions import Action
    from course_utils.timeline import Event, Timeline

    write(tmp_path / "t.json", [x("0F0", 3, 0, 5, "user_annotation"),
                                x("1F0", 3, 6, 5, "user_annotation")])  # fmt: skip
    tl = Timeline([Event(0, Action(0, "F", 0), 0, 1), Event(1, Action(1, "F", 0), 1, 2)], 2)
    with pytest.raises(CourseInputError, match="thread 3 ran actions of devices 0 and 1"):
        read_profile(tmp_path / "t.json").devices(tl)


@pytest.mark.slow
@pytest.mark.torch_api
def test_every_torchrun_rank_writes_its_trace_of_the_last_step(tmp_path):
    from course_utils.distributed.launch import launch

    launch(parallel="pipeline", schedule="1f1b", steps=2, profile=tmp_path / "traces")
    profiles = read_rank_profiles(tmp_path / "traces")
    assert list(profiles) == [0, 1]
    want = make_schedule("1f1b", 2, 4).as_strings()
    for rank, profile in profiles.items():  # one step: the course's 1F1B order, once
        assert [a.name for a in sorted(profile.actions, key=lambda a: a.ts)] == want[rank]
        assert profile.operators_in(f"{rank}B0")["aten::mm"] >= 1
    side = ranks_timeline(profiles)
    first = {str(e.action): e for e in side.events}
    assert first["1F0"].start >= first["0F0"].end  # one machine, one clock: in step
