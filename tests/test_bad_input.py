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
from conftest import skip_without
from gradingkit import NO_SANDBOX
from measured import measure, run_course

ROOT = Path(__file__).resolve().parents[1]
NB = str(ROOT / "solutions" / "03_bubble_tradeoff.ipynb")

BAD = [
    # schedule: sizes, numbers, names
    (["schedule", "1f1b", "--devices", "1000000", "--microbatches", "1000000"], "--max-actions"),
    (["schedule", "1f1b", "--devices", "0", "--microbatches", "4"], "--devices"),
    (["schedule", "1f1b", "--devices", "4", "--microbatches", "4", "--forward-cost", "1e308",
      "--backward-cost", "1e308"], "--forward-cost"),
    (["schedule", "1f1b", "--devices", "4", "--microbatches", "4", "--p2p-cost", "inf"],
     "--p2p-cost"),
    (["schedule", "1f1b", "--devices", "4", "--microbatches", "4", "--forward-cost", "nan"],
     "--forward-cost"),
    (["schedule", "1f1b", "--devices", "4", "--microbatches", "4", "--max-actions", "-1"],
     "--max-actions"),
    (["schedule", "zigzag", "--devices", "4", "--microbatches", "4"], "schedule must be one of"),
    # gantt
    (["gantt", "gpipe", "-p", "100000", "-m", "4", "-o", "x.png"], "--max-actions"),
    (["gantt", "gpipe", "-p", "4", "-m", "4", "-o", "/proc/x.png"], "-o"),
    (["gantt", "gpipe", "-p", "4", "-m", "4", "-o", "chart.bmp"], "-o"),
    (["gantt", "gpipe", "-p", "4", "-m", "4", "-o", "/no/such/folder/chart.png"], "-o"),
    # run
    (["run", "1f1b", "--devices", "64", "--microbatches", "64"], "--devices"),
    (["run", "1f1b", "--devices", "2", "--microbatches", "4", "--fail-at", "xyz"], "--fail-at"),
    (["run", "1f1b", "--devices", "2", "--microbatches", "4", "--fail-at", "9F9"], "--fail-at"),
    (["run", "1f1b", "--devices", "0"], "--devices"),
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


@pytest.mark.parametrize("args, flag", BAD, ids=[" ".join(a[:3]) + f" {f}" for a, f in BAD])
def test_bad_input_is_one_line_exit_2_fast_and_small(args, flag, tmp_path):
    result = run_course(args, tmp_path)
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

    assert main(["schedule", "zb-h1", "--devices", "3", "--microbatches", "4", "--json",
                 "--weight-cost", "0"]) == 0  # fmt: skip
    json.loads(capsys.readouterr().out)  # no NaN or Infinity even with a zero W


def test_the_runner_sees_a_childs_cpu_time_and_memory(tmp_path):
    """The limits above are read from the child's own rusage (`os.wait4`): a child that burns
    half a second of CPU and fills 300 MB is measured doing so, so a command that did the
    same would fail them; a child that closes its streams first is measured all the same."""
    hog = (
        "import time\nx = b'x' * (300 * 2**20)\nt = time.process_time()\n"
        "while time.process_time() - t < 0.5:\n    pass"
    )
    for streams in ({}, {"stdout": "closed", "stderr": "closed"}):
        result = measure([sys.executable, "-c", hog], tmp_path, **streams)
        assert result["code"] == 0, result["err"]
        assert result["cpu"] >= 0.5 and result["mb"] >= 300, (streams, result)
    hang = measure([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path, timeout=1)
    assert hang["code"] < 0 and hang["err"].endswith("TIMED OUT") and hang["wall"] < 30, hang
    # A child forked from this test process would report its memory as the child's own peak
    # (Linux keeps the peak across exec): with 600 MB here, a plain Python still measures small.
    ballast = b"x" * (600 * 2**20)
    small = measure([sys.executable, "-c", "pass"], tmp_path)
    assert small["code"] == 0 and small["mb"] < 100 < len(ballast) / 1e6, small


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


# ---------------------------------------------------------------------------------------------
# Issue 26: each class of misuse in a table of its own (the examples, then at least
# three more of each), run in a real child: exit code, one line, no traceback, under a second
# of CPU and 500 MB for a refusal. Placeholders: {nb} a solved notebook, {tmp} the test's
# folder, {long} a name over 255 bytes, {fifo} a FIFO, {ro} a read-only folder.

MB_REFUSAL = 500
LONG = "a" * 300
# A pipe closed early: 141 (128 + SIGPIPE) when a write fails; 0 when the one big write was
# cut short instead (Python's buffered writer then reports the part written, not an error)
QUIET = (0, 141)

# (args, expected exit code, words of the one line, stdout mode, stderr mode, env)
OUTPUT_ERRORS = [
    # the issue's
    (["schedule", "1f1b", "--devices", "2", "--microbatches", "2"], 2, "cannot write the output",
     "full", "capture", {}),
    (["schedule", "1f1b", "--devices", "2", "--microbatches", "2"], 2, "standard output is closed",
     "closed", "capture", {}),
    (["schedule", "1f1b", "--devices", "40", "--microbatches", "400"], QUIET, None,
     "early", "capture", {}),
    (["gantt", "1f1b", "-p", "2", "-m", "2", "-o", "{long}.png"], 2, "-o",
     "capture", "capture", {}),
    (["run", "1f1b", "--gantt", "{tmp}/{long}.png"], 2, "--gantt", "capture", "capture", {}),
    (["grade", "{nb}", "--csv", "{long}.csv"], 2, "--csv", "capture", "capture", {}),
    (["grade", "{nb}", "--csv", "/proc/version"], 2, "--csv", "capture", "capture", {}),
    (["grade", "{nb}", "--csv", "/dev/full"], 2, "not a regular file", "capture", "capture", {}),
    (["grade", "{nb}", "--csv", "{ro}/grades.csv"], 2, "--csv", "capture", "capture", {}),
    (["gantt", "1f1b", "-p", "2", "-m", "2", "-o", "c.png"], 2, "MPLBACKEND",
     "capture", "capture", {"MPLBACKEND": "nosuchbackend"}),
    (["gantt", "1f1b", "-p", "2", "-m", "2", "-o", "newdir.png/"], 2, "names a folder",
     "capture", "capture", {}),
    (["run", "1f1b", "--gantt", ""], 2, "--gantt needs a file name", "capture", "capture", {}),
    # stderr closed: the error is the one line on stdout
    (["schedule", "1f1b", "--devices", "0", "--microbatches", "2"], 2, "--devices",
     "capture", "closed", {}),
    # more of our own
    (["schedule", "zb-h1", "--devices", "100", "--microbatches", "400", "--json"], QUIET, None,
     "early", "capture", {}),
    (["plan", "search", "--params", "70B", "--layers", "80", "--hidden", "8192", "--heads", "64",
      "--seq", "2048", "--global-batch", "512", "--gpus", "64"], QUIET, None,
     "early", "capture", {}),
    (["plan", "memory", "--params", "7B"], 2, "cannot write the output", "full", "capture", {}),
    (["plan", "memory", "--params", "7B"], 2, "standard output is closed", "closed", "capture", {}),
    (["schedule", "1f1b", "--devices", "x", "--microbatches", "2"], 2, "--devices",
     "capture", "closed", {}),
    (["gantt", "1f1b", "-p", "2", "-m", "2", "-o", "{fifo}"], 2, "not a regular file",
     "capture", "capture", {}),
    (["gantt", "1f1b", "-p", "2", "-m", "2", "-o", "/sys/c.png"], 2, "-o",
     "capture", "capture", {}),
    (["gantt", "1f1b", "-p", "2", "-m", "2", "-o", "{ro}/c.png"], 2, "-o",
     "capture", "capture", {}),
    (["grade", "{nb}", "--similarity", "/dev/null"], 2, "--similarity", "capture", "capture", {}),
    (["grade", "{nb}", "--feedback", "/proc/feedback"], 2, "--feedback", "capture", "capture", {}),
    (["grade", "{nb}", "--stats", "s.png"], 2, "MPLBACKEND", "capture", "capture",
     {"MPLBACKEND": "TkAgg2"}),
    (["run", "1f1b", "--gantt", "c.svg"], 2, "MPLBACKEND", "capture", "capture",
     {"MPLBACKEND": "nosuchbackend"}),
    (["run", "1f1b", "--gantt", "{tmp}/sub/"], 2, "names a folder", "capture", "capture", {}),
]  # fmt: skip

# (args, words of the one line): the flag named as the user typed it, refused in < 1 s of CPU
TYPED_AND_FAST = [
    # the issue's: -v, --batch-size (typed --batch), -m; refusals of grade paths before import
    (["gantt", "1f1b", "-p", "2", "-m", "2", "-v", "2", "-o", "c.png"], "-v 2 do not fit 1f1b"),
    (["run", "1f1b", "--batch", "7"], "--batch must be a positive multiple of --microbatches"),
    (["gantt", "gpipe", "-p", "2", "-m", "0", "-o", "c.png"], "-m must be"),
    (["grade", "{nb}", "--csv", "/proc/version"], "--csv"),
    (["grade", "{tmp}/missing.ipynb"], "does not exist"),
    # more of our own
    (["gantt", "interleaved", "-p", "2", "-m", "3", "-v", "2", "-o", "c.png"], "-p 2, -m 3, -v 2"),
    (["run", "1f1b", "--micro", "0"], "--micro must be"),
    (["schedule", "1f1b", "--stag", "0", "--microbatches", "2"], "--stag must be"),
    (["grade", "{nb}", "-j", "9"], "-j must be an integer from 1 to 3"),
    (["run", "1f1b", "--microbatches=0"], "--microbatches must be"),
    (["grade", "{nb}", "--roster", "{fifo}"], "--roster"),
    (["grade", "{tmp}/{long}.ipynb"], "submission"),
]  # fmt: skip

# (args, words): numbers out of range (each one line naming the flag)
NUMBERS = [
    (["run", "1f1b", "--seed", "18446744073709551616"], "--seed"),
    (["plan", "memory", "--params", "7B", "--pp", "4", "--microbatches", "0"], "--microbatches"),
    (["run", "1f1b", "--seed", "-1"], "--seed"),
    (["moe", "--seed", "2147483648"], "--seed"),
    (["data-parallel", "--steps", "21"], "--steps"),
    (["plan", "memory", "--params", "7B", "--microbatch-size", "0"], "--microbatch-size"),
    (["grade", "{nb}", "--lesson", "0"], "--lesson"),
    (["grade", "{nb}", "--timeout", "1e999"], "--timeout"),
    (["schedule", "1f1b", "--devices", "2", "--microbatches", "2", "--max-actions", "0"],
     "--max-actions"),
]  # fmt: skip

# (args, words): documented limits (memory), refused before any work
LIMITS = [
    (["schedule", "gpipe", "--devices", "3000", "--microbatches", "3000", "--max-actions",
      "1000000000000"], "--max-actions"),
    (["run", "interleaved", "--devices", "8", "--chunks", "4", "--microbatches", "64",
      "--batch-size", "1024"], "--batch-size must be at most 128"),
    (["gantt", "1f1b", "-p", "1000", "-m", "1000", "-o", "c.png", "--max-actions", "10000000"],
     "--max-actions"),
    (["tensor-parallel", "--d-model", "1024", "--tokens", "2048"], "--tokens x --d-model"),
    (["context-parallel", "--heads", "16", "--seq", "368", "--workers", "8"], "--heads x --seq"),
    (["run", "1f1b", "--devices", "4", "--microbatches", "4", "--batch-size", "4096"],
     "--batch-size must be at most 1024"),
    (["data-parallel", "--workers", "17"], "--workers"),
]  # fmt: skip


@pytest.fixture
def places(tmp_path):
    """The placeholders' values, and how to run in a read-only folder."""
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    ro = tmp_path / "read-only"
    ro.mkdir()
    wrap = None
    if os.geteuid() == 0:  # root writes anywhere: a read-only bind mount says no to root too
        wrap = ["bwrap", "--dev-bind", "/", "/", "--ro-bind", str(ro), str(ro)]
    else:
        ro.chmod(0o555)
    work = tmp_path / "work"
    work.mkdir()
    values = {"nb": NB, "tmp": str(work), "long": LONG, "fifo": str(fifo), "ro": str(ro)}
    return values, wrap, work


def _filled(args: list[str], values: dict) -> list[str]:
    return [a.format(**values) for a in args]


def _one_clean_line(result: dict, code: int, words: str | None, where: str = "err") -> None:
    text = result[where]
    assert "Traceback" not in result["err"] + result["out"], result["err"][-800:]
    assert result["code"] in (code if isinstance(code, tuple) else (code,)), (
        result["code"],
        text[-500:],
    )
    lines = text.strip().splitlines()
    if words is None:  # a closed pipe: nothing to say
        assert result["err"] == "", result["err"]
        return
    assert len(lines) == 1, text
    assert words in lines[0], lines[0]
    if code == 2:
        assert result["cpu"] < 1.0, f"{result['cpu']:.2f} s of CPU to say no"
        assert result["mb"] < MB_REFUSAL, f"{result['mb']:.0f} MB to say no"


@pytest.mark.parametrize(
    "args, code, words, stdout, stderr, env",
    OUTPUT_ERRORS,
    ids=[f"{a[0]} {o}/{e} {w}" for a, _, w, o, e, _ in OUTPUT_ERRORS],
)
def test_output_errors_are_one_line_or_quiet(args, code, words, stdout, stderr, env, places):
    values, wrap, work = places
    wrap = wrap if "{ro}" in " ".join(args) else None
    if wrap:
        skip_without("needs_bwrap")  # the read-only folder, as root
    result = run_course(
        _filled(args, values), work, stdout=stdout, stderr=stderr, env=env, wrap=wrap
    )
    _one_clean_line(result, code, words, "out" if stderr == "closed" else "err")
    assert sorted(p.name for p in work.iterdir()) == []  # nothing written, not even a probe


@pytest.mark.parametrize("args, words", TYPED_AND_FAST + NUMBERS + LIMITS)
def test_refusals_name_the_flag_as_typed_fast(args, words, places):
    values, _, work = places
    result = run_course(_filled(args, values), work)
    _one_clean_line(result, 2, words)
    assert result["out"] == ""


def test_refusals_come_before_torch_and_the_grader():
    # what the commands import to say no: never torch, nbformat, jupyter or matplotlib
    code = """
import sys, contextlib, io
from course_utils.cli import main
for argv in (
    ["run", "1f1b", "--seed", "-1"],
    ["grade", sys.argv[1], "--csv", "/dev/full"],
    ["data-parallel", "--workers", "99"],
    ["gantt", "1f1b", "-p", "2", "-m", "2", "-o", "x/"],
):
    with contextlib.redirect_stderr(io.StringIO()):
        assert main(argv) == 2, argv
heavy = [m for m in ("torch", "nbformat", "jupyter_client", "matplotlib") if m in sys.modules]
assert not heavy, heavy
"""
    out = subprocess.run([sys.executable, "-c", code, NB], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert out.returncode == 0, out.stderr


def test_max_actions_rises_only_while_the_memory_fits(monkeypatch):
    from course_utils import validation
    from course_utils.errors import CourseInputError
    from course_utils.pipeline import make_schedule

    # in the budget: raised on purpose, it builds
    assert len(make_schedule("1f1b", 100, 2600, max_actions=600_000).devices) == 100
    # half of the memory available now is the limit where that is less than 1.5 GB
    monkeypatch.setattr(validation, "available_memory", lambda: 200_000_000)
    with pytest.raises(CourseInputError, match="half of the 0.2 GB available now") as info:
        make_schedule("1f1b", 100, 2600, max_actions=600_000)
    assert "max_actions" in str(info.value) and "\n" not in str(info.value)
    # the default limit holds whatever the machine has
    assert make_schedule("1f1b", 4, 8).microbatches == 8
    # a hand-made schedule claiming a billion stages is said to be broken at once
    from course_utils.errors import ScheduleError
    from course_utils.pipeline import Schedule, simulate

    with pytest.raises(ScheduleError, match="need 1,000,000,000,000,000,000 forward actions"):
        simulate(Schedule("x", 10**9, 10**9, ((),)))
    monkeypatch.setattr(validation, "available_memory", lambda: 64 * 10**9)
    with pytest.raises(CourseInputError, match="over the 1.5 GB a run may use"):
        make_schedule("1f1b", 2000, 2000, max_actions=10**12)


def _api():
    """What the API table calls (imported inside the test, so collecting is cheap)."""
    import types

    from torch import nn

    from course_utils import plan
    from course_utils.models import MLP, partition
    from course_utils.parallel.data_parallel import DataParallel
    from course_utils.parallel.tensor_parallel import TensorParallelMLP
    from course_utils.pipeline import (
        Action,
        CostModel,
        Schedule,
        make_schedule,
        schedules,
        simulate,
        validate,
        vshape,
    )
    from course_utils.pipeline.executor import PipelineExecutor
    from course_utils.threads.devices import DeviceThreads

    return types.SimpleNamespace(
        nn=nn, plan=plan, MLP=MLP, partition=partition, DataParallel=DataParallel,
        TensorParallelMLP=TensorParallelMLP, Action=Action, CostModel=CostModel,
        Schedule=Schedule, make_schedule=make_schedule, schedules=schedules, simulate=simulate,
        validate=validate, vshape=vshape, PipelineExecutor=PipelineExecutor,
        DeviceThreads=DeviceThreads,
    )  # fmt: skip


# (call on the namespace above, words the one line must hold: the argument's name)
API_LIMITS_AND_TYPES = [
    # the issue's
    (lambda a: a.make_schedule("gpipe", 100000, 100000), "max_actions"),
    (lambda a: a.make_schedule("interleaved", 2, 2, 10**8), "max_actions"),
    (lambda a: a.plan.search(a.plan.ModelShape(7e9, 32, 4096, 32, 2048), 10**9, 64), "gpus"),
    (lambda a: a.PipelineExecutor(a.partition(a.MLP(4, 8, 2, depth=4), 4), 2000), "num_devices"),
    (lambda a: a.make_schedule(["1f1b"], 2, 2), "schedule must be one of"),
    (lambda a: a.simulate(a.Schedule("x", 2, 2, (("0F0",),))), "Action"),
    (lambda a: a.make_schedule("1f1b", -1, 2), "devices"),
    (lambda a: a.Schedule("x", 2, 2, (), batch_scale=0), "batch_scale"),
    (lambda a: a.make_schedule("1f1b", 2, "2"), "microbatches"),
    (lambda a: a.validate([["0F0"]], stages=1.5, microbatches=1), "stages"),
    (lambda a: a.PipelineExecutor(a.nn.Linear(4, 4), 1), "stages must be a list of modules"),
    (lambda a: a.CostModel(forward=True), "forward cost"),
    (lambda a: a.Action(True, "F", True), "stage"),
    (lambda a: a.CostModel(forward=1e308), "forward cost"),
    # more of our own
    (lambda a: a.make_schedule("zb-v", 10**6, 10**6), "max_actions"),
    (lambda a: a.make_schedule("1f1b", 2000, 2000, max_actions=10**12), "max_actions"),
    (lambda a: a.make_schedule("1f1b", 2, 2, max_actions="big"), "max_actions"),
    (lambda a: a.schedules.gpipe(10**5, 10**5), "max_actions"),
    (lambda a: a.vshape.dualpipe_v_slots(10**4, 10**4), "max_actions"),
    (lambda a: a.simulate(a.make_schedule("1f1b", 2, 2), "fast"), "costs must be a CostModel"),
    (lambda a: a.validate([["0F0"]], stages=10**9, microbatches=10**9), "stages x microbatches"),
    (lambda a: a.Action(0, ["F"], 0), "kind"),
    (lambda a: a.Action(0, "F", 1.5), "micro-batch"),
    (lambda a: a.Action.parse("9" * 5000 + "F0"), "cannot read action"),
    (lambda a: a.CostModel(stage_forward=[1e308]), "stage_forward"),
    (lambda a: a.DeviceThreads(2000), "num_devices"),
    (lambda a: a.DataParallel(a.MLP(4, 8, 2), 100), "workers"),
    (lambda a: a.TensorParallelMLP(a.nn.Linear(4, 16), a.nn.Linear(16, 4), 64), "workers"),
    (lambda a: a.PipelineExecutor([1, 2], 1), "stages must be a non-empty list of modules"),
    (lambda a: a.plan.search(a.plan.ModelShape(7e9, 32, 4096, 32, 2048), 8.0, 64), "gpus"),
]


@pytest.mark.parametrize("call, words", API_LIMITS_AND_TYPES)
def test_the_api_refuses_with_one_line_naming_the_argument_at_once(call, words):
    import time

    from course_utils.errors import CourseInputError

    api = _api()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.process_time()
    with pytest.raises(CourseInputError) as info:
        call(api)
    assert time.process_time() - start < 1.0
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024 < 100  # MB
    message = str(info.value)
    assert "\n" not in message and words in message, message


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _sparse(size: int):
    def make(path: Path) -> None:
        with path.open("wb") as f:  # a file that big, without writing it
            f.truncate(size)

    return make


def _link(target: str):
    return lambda path: path.symlink_to(target)


# (what to make at PATH, the command, exit code, words of its output): nothing that is not a
# regular file of a reasonable size is read, and nothing of what it holds is printed; a run
# whose only notebook could not be graded says so in its row and exits 1
SLOW = pytest.mark.slow  # a row of the batch: the grader starts (about 5 s)
GRADE = ["grade", "{path}.ipynb", *NO_SANDBOX]  # no notebook runs: no sandbox needed
NOT_FILES = [
    pytest.param(_fifo, GRADE, 1, "a FIFO", marks=SLOW),
    pytest.param(_link("/dev/zero"), GRADE, 1, "a symbolic link", marks=SLOW),
    pytest.param(_link("/etc/passwd"), GRADE, 1, "a symbolic link", marks=SLOW),
    pytest.param(_sparse(30 * 10**6), GRADE, 1, "over the limit of 25 MB", marks=SLOW),
    (_fifo, ["grade", "{nb}", "--roster", "{path}.csv"], 2, "--roster"),
    (_link("/dev/zero"), ["grade", "{nb}", "--roster", "{path}.csv"], 2, "not a regular file"),
    (_sparse(6 * 10**6), ["grade", "{nb}", "--roster", "{path}.csv"], 2, "over the limit of 5 MB"),
]


@pytest.mark.parametrize("make, args, code, words", NOT_FILES)
def test_inputs_that_are_not_files_are_never_read(make, args, code, words, tmp_path):
    name = "alice_03"
    suffix = ".csv" if "--roster" in args else ".ipynb"
    make(tmp_path / f"{name}{suffix}")
    filled = [a.format(path=name, nb=NB) for a in args]
    result = run_course(filled, tmp_path, timeout=60)
    assert "TIMED OUT" not in result["err"]  # a FIFO is never opened
    assert "Traceback" not in result["err"] + result["out"]
    assert result["code"] == code, result["err"]
    said = result["out"] + result["err"]
    assert words in said, said
    assert "root:" not in said
    assert result["mb"] < MB_REFUSAL, f"{result['mb']:.0f} MB"
    if code == 2:
        assert len(result["err"].strip().splitlines()) == 1 and result["cpu"] < 1.0


def test_help_states_the_limits_the_commands_enforce():
    import contextlib
    import io

    from course_utils import validation
    from course_utils.cli import main
    from course_utils.commands import context_parallel, data_parallel, run, tensor_parallel

    def shown(*argv: str) -> str:
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            assert main([*argv, "--help"]) == 0
        return " ".join(text.getvalue().split())  # argparse wraps lines anywhere

    assert f"{run.MAX_SAMPLE_LAYERS['gpt']:,} for gpt" in shown("run")
    assert f"at most {validation.MAX_PIPELINE_DEVICES} devices" in shown("run")
    assert f"(1-{data_parallel.MAX_STEPS})" in shown("data-parallel")
    assert f"at most {data_parallel.MAX_WORKERS} workers" in shown("data-parallel")
    assert f"<= {tensor_parallel.MAX_TOKEN_DIMS:,}" in shown("tensor-parallel")
    text = shown("context-parallel")
    assert f"up to {context_parallel.MAX_SEQ} with one head" in text and "200 MB" not in text
    assert f"1-{validation.MAX_GRADE_JOBS}" in shown("grade")
    assert f"default {validation.MAX_ACTIONS:,}" in shown("schedule")
    assert f"default {validation.MAX_GANTT_ACTIONS:,}" in shown("gantt")
    # and they are enforced: one past each is refused (tests/test_limits.py runs each limit)
    assert context_parallel.MAX_SEQ**2 <= context_parallel.MAX_SCORES
    assert (context_parallel.MAX_SEQ + 1) ** 2 > context_parallel.MAX_SCORES


@pytest.mark.slow
def test_grade_grades_with_a_home_it_cannot_write(tmp_path):
    # HOME=/proc: the kernel without a sandbox keeps its IPython folder in its scratch folder
    result = run_course(["grade", NB, "--no-sandbox"], tmp_path, env={"HOME": "/proc"}, timeout=300)
    assert result["code"] == 0 and "Traceback" not in result["err"], result["err"][-1000:]
    assert "score: 6/6" in result["out"], result["out"][-1000:]
