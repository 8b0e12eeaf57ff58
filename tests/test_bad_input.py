"""Nothing a user types can crash, hang or flood the machine.

Every command gets its bad inputs in a real subprocess: each must end with exit code 2 and
one line on stderr naming the flag the user typed, no traceback, nothing on stdout, within
a second of CPU time and under 500 MB (the child's own `getrusage` figures, which do not
depend on how busy the machine is; a wall-clock limit guards against hangs).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NB = str(ROOT / "solutions" / "03_bubble_tradeoff.ipynb")

BAD = [
    # schedule: sizes, numbers, names
    (["schedule", "1f1b", "--stages", "1000000", "--microbatches", "1000000"], "--max-actions"),
    (["schedule", "1f1b", "--stages", "0", "--microbatches", "4"], "--stages"),
    (["schedule", "1f1b", "--stages", "4", "--microbatches", "4", "--forward-cost", "1e308",
      "--backward-cost", "1e308"], "--forward-cost"),
    (["schedule", "1f1b", "--stages", "4", "--microbatches", "4", "--p2p-cost", "inf"],
     "--p2p-cost"),
    (["schedule", "1f1b", "--stages", "4", "--microbatches", "4", "--forward-cost", "nan"],
     "--forward-cost"),
    (["schedule", "1f1b", "--stages", "4", "--microbatches", "4", "--max-actions", "-1"],
     "--max-actions"),
    (["schedule", "zigzag", "--stages", "4", "--microbatches", "4"], "schedule must be one of"),
    # gantt
    (["gantt", "gpipe", "-p", "100000", "-m", "4", "-o", "x.png"], "--max-actions"),
    (["gantt", "gpipe", "-p", "4", "-m", "4", "-o", "/proc/x.png"], "-o"),
    (["gantt", "gpipe", "-p", "4", "-m", "4", "-o", "chart.bmp"], "-o"),
    (["gantt", "gpipe", "-p", "4", "-m", "4", "-o", "/no/such/folder/chart.png"], "-o"),
    # run
    (["run", "1f1b", "--stages", "64", "--microbatches", "64"], "--stages"),
    (["run", "1f1b", "--stages", "2", "--microbatches", "4", "--fail-at", "xyz"], "--fail-at"),
    (["run", "1f1b", "--stages", "2", "--microbatches", "4", "--fail-at", "9F9"], "--fail-at"),
    (["run", "1f1b", "--stages", "0"], "--stages"),
    (["run", "1f1b", "--gantt", "/proc/x.png"], "--gantt"),
    (["run", "1f1b", "--gantt", "out.jpg"], "--gantt"),
    (["run", "1f1b", "--batch-size", "100000000"], "--batch-size"),
    (["run", "1f1b", "--microbatches", "100000"], "--microbatches"),
    # data-parallel and tensor-parallel
    (["data-parallel", "--steps", "1000000000"], "--steps"),
    (["data-parallel", "--workers", "0"], "--workers"),
    (["data-parallel", "--workers", "1000"], "--workers"),
    (["data-parallel", "--batch", "1000000000"], "--batch"),
    (["data-parallel", "--allreduce", "tree"], "--allreduce"),
    (["tensor-parallel", "--workers", "0"], "--workers"),
    (["tensor-parallel", "--workers", "100000"], "--workers"),
    # plan
    (["plan", "search", "--params", "70B", "--layers", "80", "--hidden", "8192", "--heads", "64",
      "--seq", "2048", "--global-batch", "512", "--gpus", "1000000000", "--gpu-memory-gib", "80"],
     "--gpus"),
    (["plan", "memory", "--params", "7B", "--gpu-memory-gib", "nan"], "--gpu-memory-gib"),
    (["plan", "memory", "--params", "7B", "--gpu-memory-gib", "inf"], "--gpu-memory-gib"),
    (["plan", "memory", "--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32",
      "--seq", "2048", "--pp", "2000", "--microbatches", "1999"], "--pp"),
    (["plan", "memory", "--params", "1e400"], "--params"),
    (["plan", "search", "--params", "70B", "--layers", "80", "--hidden", "8192", "--heads", "64",
      "--seq", "2048", "--global-batch", "512", "--gpus", "64", "--gpu-memory-gib", "80",
      "--efficiency", "nan"], "--efficiency"),
    # distributed: checked before any process starts
    (["distributed", "--workers", "9"], "--workers"),
    (["distributed", "--timeout", "inf"], "--timeout"),
    (["distributed", "--timeout", "nan"], "--timeout"),
    (["distributed", "--pipeline", "zb-h1", "--csv", "--workers", "1000"], "--workers"),
    (["distributed", "--pipeline", "zigzag"], "--pipeline"),
    (["distributed", "--steps", "1000000"], "--steps"),
    (["distributed", "--port", "99999"], "--port"),
    # grade
    (["grade", NB, "--timeout", "nan"], "--timeout"),
    (["grade", NB, "--cell-timeout", "nan"], "--cell-timeout"),
    (["grade", NB, "--call-timeout", "inf"], "--call-timeout"),
    (["grade", NB, "--csv", "/tmp"], "--csv"),
    (["grade", NB, "-j", "0"], "-j"),
    (["grade", "missing.ipynb"], "missing.ipynb"),
    # fsdp, moe, context-parallel
    (["fsdp", "--workers", "0"], "--workers"),
    (["fsdp", "--steps", "1000000"], "--steps"),
    (["moe", "--workers", "2", "--experts", "3", "--top-k", "1"], "--experts"),
    (["moe", "--workers", "2", "--experts", "4", "--top-k", "1", "--capacity-factor", "nan"],
     "--capacity-factor"),
    (["context-parallel", "--workers", "2", "--seq", "1000001"], "--seq"),
    (["context-parallel", "--workers", "0", "--seq", "64"], "--workers"),
]  # fmt: skip

RUNNER = """
import resource, subprocess, sys, json, time
start = time.monotonic()
out = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=30)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"code": out.returncode, "out": out.stdout, "err": out.stderr,
                  "cpu": usage.ru_utime + usage.ru_stime, "mb": usage.ru_maxrss / 1024,
                  "wall": time.monotonic() - start}))
"""


def run_command(args: list[str], cwd: Path) -> dict:
    import json

    out = subprocess.run(
        [sys.executable, "-c", RUNNER, sys.executable, "-m", "course_utils", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("args, flag", BAD, ids=[" ".join(a[:3]) + f" {f}" for a, f in BAD])
def test_bad_input_is_one_line_exit_2_fast_and_small(args, flag, tmp_path):
    result = run_command(args, tmp_path)
    err = result["err"]
    assert result["code"] == 2, (result["code"], err[-500:])
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert flag in lines[0], lines[0]
    assert result["out"] == ""
    assert result["cpu"] < 1.0, f"{result['cpu']:.2f} s of CPU to say no"
    assert result["mb"] < 500, f"{result['mb']:.0f} MB to say no"
    assert result["wall"] < 20  # not a speed claim: a hang would blow far past it
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_every_command_documents_its_limits():
    import contextlib
    import io

    from course_utils.cli import COMMANDS, main

    for name in ("schedule", "gantt", "run", "plan", "data-parallel", "tensor-parallel",
                 "distributed", "fsdp", "moe", "context-parallel"):  # fmt: skip
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            assert main([name, "--help"]) == 0
        assert "limit" in text.getvalue().lower() or "at most" in text.getvalue(), name
    assert set(COMMANDS) >= {"schedule", "gantt", "run", "plan", "grade"}


def test_json_output_is_always_valid_json(capsys):
    import json

    from course_utils.cli import main

    assert main(["schedule", "zb-h1", "--stages", "3", "--microbatches", "4", "--json",
                 "--weight-cost", "0"]) == 0  # fmt: skip
    json.loads(capsys.readouterr().out)  # no NaN or Infinity even with a zero W


def test_resource_limits_are_what_the_test_reads():
    # RUSAGE_CHILDREN is the waited-for children's: the runner waits for the command.
    assert resource.RUSAGE_CHILDREN is not None


API_MISUSE = [
    (lambda: __import__("course_utils.pipeline", fromlist=["x"]).CostModel(weight_fraction="0.5"),
     "weight_fraction"),
    (lambda: __import__("course_utils.pipeline", fromlist=["x"]).CostModel(stage_forward=5),
     "stage_forward"),
    (lambda: __import__("course_utils.pipeline", fromlist=["x"]).simulate([["0F0", "0B0"]]),
     "schedule must be a Schedule"),
    (lambda: __import__("course_utils.pipeline", fromlist=["x"]).simulate(
        __import__("course_utils.pipeline", fromlist=["x"]).make_schedule("gpipe", 2, 2), "x"),
     "costs must be a CostModel"),
    (lambda: __import__("course_utils.parallel.costs", fromlist=["x"]).ring_allreduce_time(
        "1e9", 4, 1e9), "nbytes"),
    (lambda: __import__("course_utils.plan", fromlist=["x"]).memory("x"), "model must be"),
]  # fmt: skip


@pytest.mark.parametrize("call, words", API_MISUSE)
def test_python_api_misuse_raises_the_courses_error_naming_the_argument(call, words):
    from course_utils.errors import CourseInputError

    with pytest.raises(CourseInputError, match=words) as info:
        call()
    assert "\n" not in str(info.value)
