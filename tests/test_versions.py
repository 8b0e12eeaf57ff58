"""The supported PyTorch range: one place in code, agreeing with the Makefile and the pins,
and a one-line message (not a worker's ImportError) on a torch older than an API needs."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import ROOT

from course_utils import versions
from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import SCHEDULES


def test_range_agrees_with_the_makefile_and_the_pin():
    makefile = (ROOT / "Makefile").read_text()
    assert f"COMPAT_TORCH ?= {versions.OLDEST_TORCH}\n" in makefile
    assert f"torch=={versions.NEWEST_TESTED_TORCH}\n" in (ROOT / "requirements.txt").read_text()


def test_every_pytorch_class_the_course_runs_has_its_first_release():
    module = "torch.distributed.pipelining.schedules"
    for name, info in SCHEDULES.items():
        if info.pytorch:
            assert (module, info.pytorch) in versions.FIRST_RELEASE, name
    newest = max(versions.release(v) for v in versions.FIRST_RELEASE.values())
    assert newest == versions.release(versions.OLDEST_TORCH)  # the oldest supported has all


@pytest.mark.parametrize(
    ("version", "expected"),
    [("2.9.0+cu128", (2, 9)), ("2.13.0", (2, 13)), ("2.10.0a0+git1234", (2, 10)), ("3.0", (3, 0))],
)
def test_release(version, expected):
    assert versions.release(version) == expected


def test_an_older_torch_gets_one_line_naming_the_release(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.8.0+cu128")
    versions.require("torch.distributed.fsdp", "fully_shard", "FSDP2")  # 2.6: fine
    with pytest.raises(CourseInputError) as info:
        versions.require(
            "torch.distributed.pipelining.schedules", "ScheduleDualPipeV", "the dualpipe-v pipeline"
        )
    message = str(info.value)
    assert "\n" not in message
    assert "needs PyTorch 2.9 or newer" in message and "torch 2.8.0+cu128" in message


def test_run_pipeline_stops_before_spawning_on_an_older_torch(monkeypatch):
    from course_utils.distributed import run_pipeline

    monkeypatch.setattr(torch, "__version__", "2.5.1")
    with pytest.raises(CourseInputError, match=r"zb-v pipeline .*needs PyTorch 2\.6"):
        run_pipeline("zb-v", workers=2)


def test_pipelines_need_2_10_on_gloo(monkeypatch):
    """2.9.x aborts both processes in the stages' first handshake on gloo (int64 vs float32)."""
    from course_utils.distributed import run_pipeline

    monkeypatch.setattr(torch, "__version__", "2.9.1+cu128")
    with pytest.raises(CourseInputError, match=r"CPU processes \(gloo\) needs PyTorch 2\.10"):
        run_pipeline("1f1b", workers=2)


def test_support_note():
    assert versions.support_note(versions.OLDEST_TORCH) is None
    assert versions.support_note(versions.NEWEST_TESTED_TORCH + "+cpu") is None
    old = versions.support_note("2.6.0")
    assert old and "older than 2.10.0" in old and "⚠️" in old
    assert "newer than 2.13.0" in versions.support_note("2.14.1")
    assert re.search(r"lessons 11 and 13", old)
