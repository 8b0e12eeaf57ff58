"""The supported PyTorch range: one place in code, agreeing with the Makefile and the pins,
and a one-line message (not a worker's error) on a torch too old for a run on processes."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT

from course_utils import versions
from course_utils.distributed import run_fsdp, run_pipeline
from course_utils.distributed.pipelining import course_schedule, v_placement
from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import SCHEDULES


def test_range_agrees_with_the_makefile_and_the_pin():
    makefile = (ROOT / "Makefile").read_text()
    assert f"COMPAT_TORCH ?= {versions.OLDEST_TORCH}\n" in makefile
    assert f"torch=={versions.NEWEST_TESTED_TORCH}\n" in (ROOT / "requirements.txt").read_text()


def test_every_pytorch_class_the_course_runs_has_its_first_release():
    for name, info in SCHEDULES.items():
        if info.pytorch:
            assert info.pytorch in versions.FIRST_RELEASE, name
    # The oldest supported release runs every API; only the V placement on gloo is newer.
    first = {key: versions.release(r) for key, (r, _) in versions.FIRST_RELEASE.items()}
    oldest = versions.release(versions.OLDEST_TORCH)
    assert {key for key, r in first.items() if r > oldest} == {"V placement on gloo"}
    assert first["pipelines on gloo"] == oldest


@pytest.mark.parametrize(
    ("version", "expected"),
    [("2.9.0+cu128", (2, 9)), ("2.13.0", (2, 13)), ("2.10.0a0+git1234", (2, 10)), ("3.0", (3, 0))],
)
def test_release(version, expected):
    assert versions.release(version) == expected


def test_v_placement_is_the_v_schedules():
    v = {name for name in SCHEDULES if v_placement(course_schedule(name, 2, 4).device_of_stage())}
    assert v == {"zb-v", "dualpipe-v"}


def test_an_older_torch_gets_one_line_naming_the_release(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.8.0+cu128")
    assert versions.lacks("fully_shard") is None  # 2.6
    message = versions.lacks("ScheduleDualPipeV")
    assert message and "\n" not in message
    assert "ScheduleDualPipeV needs PyTorch 2.9 or newer" in message
    assert "this is torch 2.8.0+cu128" in message
    with pytest.raises(CourseInputError, match="needs PyTorch 2.9"):
        versions.require("ScheduleDualPipeV")


@pytest.mark.parametrize(
    ("version", "schedule", "needs"),
    [
        ("2.5.1", "zb-v", r"ScheduleZBVZeroBubble needs PyTorch 2\.6"),
        ("2.9.1+cu128", "1f1b", r"CPU processes \(gloo\) needs PyTorch 2\.10"),
        ("2.10.0+cu128", "zb-v", r"V schedule on CPU processes .* needs PyTorch 2\.12"),
        ("2.11.0", "dualpipe-v", r"needs PyTorch 2\.12"),
    ],
)
def test_run_pipeline_stops_before_any_process_starts(monkeypatch, version, schedule, needs):
    monkeypatch.setattr(torch, "__version__", version)
    with pytest.raises(CourseInputError, match=needs):
        run_pipeline(schedule, workers=2)  # no cluster, no port: it must stop before spawning


def test_v_schedule_through_csv_needs_2_12_too(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.10.0")
    with pytest.raises(CourseInputError, match=r"needs PyTorch 2\.12"):
        run_pipeline(course_schedule("zb-v", 2, 4), workers=2)


def test_fsdp2_on_an_older_torch(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.5.0")
    with pytest.raises(CourseInputError, match=r"fully_shard needs PyTorch 2\.6"):
        run_fsdp(workers=2)


def test_support_note():
    assert versions.support_note(versions.NEWEST_TESTED_TORCH + "+cpu") is None
    assert versions.support_note("2.12.0") is None
    old = versions.support_note("2.9.1")
    assert old and "older than 2.10.0" in old and "⚠️" in old and "lessons 11 and 13" in old
    for partial in ("2.10.0+cu128", "2.11.0"):
        note = versions.support_note(partial)
        assert note and "ZB-V and DualPipeV on threads only" in note and "2.12" in note
    assert "newer than 2.13.0" in versions.support_note("2.14.1")
