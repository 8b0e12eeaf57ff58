"""Issue 51, a fourth round of bad input: each class of case a table, run in a real child as in
tests/test_bad_input.py (exit 2, one line naming the flag as typed, no traceback, nothing on
stdout, under a second of CPU and 500 MB, nothing left behind), then the planner's API, which
refuses what it cannot compute with one `CourseInputError` line.

Placeholders: {tmp} the test's working folder; {csv:NAME} a CSV file holding CSVS[NAME];
{roster:NAME} a roster holding ROSTERS[NAME]; {file} a plain file; {fifo} a FIFO; {folder}
a folder named out.json; {nb} a solved notebook.
"""

from __future__ import annotations

import math
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from measured import measure, run_course

ROOT = Path(__file__).resolve().parents[1]
NB = str(ROOT / "solutions" / "03_bubble_tradeoff.ipynb")
MB_REFUSAL = 500
SEARCH = ["plan", "search", "--params", "70B", "--layers", "80", "--hidden", "8192", "--heads",
          "64", "--seq", "2048", "--global-batch", "512", "--gpus", "64"]  # fmt: skip
TRAIN = "course_utils.distributed.train"
# What torchrun tells a rank (one process, no torchrun): the checks that need no torch
RANK0 = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}


def _interleaved_8_stages() -> str:
    from course_utils.pipeline import make_schedule

    return "\n".join(
        ",".join(map(str, d)) for d in make_schedule("interleaved", 2, 2, 4).devices
    )  # fmt: skip


def _mb(count: int) -> str:
    """A 1F1B-like CSV on 2 ranks using `count` micro-batches."""
    first = ",".join([f"0F{i}" for i in range(count)] + [f"0B{i}" for i in range(count)])
    second = ",".join(f"1F{i},1B{i}" for i in range(count))
    return f"{first}\n{second}\n"


CSVS = {
    "latin-1": b"0F0,0B0\n1F0,1B0\xe9\xff\n",
    "200 kB cell": "0F0," + "x" * 200_000 + "\n1F0,1B0\n",
    "twice": "0F0,0F0,0B0\n1F0,1B0\n",
    "mb 999999999": "0F0,0B0,0F999999999\n1F0,1B0\n",
    "stage 5 of 2": "0F0,0B0,5F0\n1F0,1B0\n",
    "no backward": "0F0\n1F0\n",
    "65 micro-batches": _mb(65),
    "deadlock": "0F0,0B0\n1B0,1F0\n",
    "empty": "",
    "not actions": "0F0,xyz\n1F0,1B0\n",
    "3 micro-batches": _mb(3),
    "8 stages": None,  # made from the course's interleaved schedule (the GPT has 6 layers)
}

ROSTERS = {
    # 4.8 MB, under the 5 MB limit: 170,000 rows, the last lms_id given twice (quadratic once)
    "170k, lms_id twice": lambda: (
        "id,name,lms_id\n"
        + "".join(f"s{i},Student {i},{i}\n" for i in range(170_000))
        + "dup,Dup Name,5\n"
    ),
    "1,001 students": lambda: "id,name\n" + "".join(f"s{i},S {i}\n" for i in range(1001)),
}


@pytest.fixture
def where(tmp_path):
    """Fill the placeholders: (a function filling a command's words, the working folder)."""
    work = tmp_path / "work"
    work.mkdir()
    files = tmp_path / "files"
    files.mkdir()
    (files / "plain").write_text("x")
    (files / "out.json").mkdir()
    os.mkfifo(files / "fifo")

    def fill(word: str) -> str:
        if word.startswith("{csv:"):
            key = word[5:-1]
            path = files / f"{len(list(files.iterdir()))}.csv"
            text = CSVS[key] if key != "8 stages" else _interleaved_8_stages()
            path.write_bytes(text if isinstance(text, bytes) else str(text).encode())
            return str(path)
        if word.startswith("{roster:"):
            path = files / f"roster{len(list(files.iterdir()))}.csv"
            path.write_text(ROSTERS[word[8:-1]]())
            return str(path)
        if word == "{huge}":  # a 2-row CSV of 1.5 million actions, as big (13 MB, sparse)
            path = files / "huge.csv"
            with path.open("wb") as f:
                f.truncate(13_300_000)
            return str(path)
        values = {"tmp": str(work), "file": str(files / "plain"), "fifo": str(files / "fifo"),
                  "folder": str(files / "out.json"), "nb": NB}  # fmt: skip
        return word.format(**values) if "{" in word else word

    return (lambda words: [fill(w) for w in words]), work


def _refused(result: dict, words: str, cpu: float = 1.0) -> None:
    err = result["err"]
    assert "Traceback" not in err + result["out"], err[-800:]
    assert result["code"] == 2, (result["code"], err[-800:])
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-2000:]
    assert words in lines[0], lines[0]
    assert result["out"] == ""
    assert result["cpu"] < cpu, f"{result['cpu']:.2f} s of CPU to say no"
    assert result["mb"] < MB_REFUSAL, f"{result['mb']:.0f} MB to say no"
    assert "TIMED OUT" not in err


def _module(module: str, args: list[str], cwd: Path, env: dict | None = None) -> dict:
    return measure([sys.executable, "-m", module, *args], cwd, env=env, timeout=60)


# -- tracebacks: `distributed --csv F`, checked before any process starts ------------------------

# (args, words of the one line)
CSV_FILES = [
    # the issue's
    (["distributed", "--csv", "{csv:latin-1}"], "is not UTF-8 text"),
    (["distributed", "--csv", "{csv:200 kB cell}"], "is not a CSV file: field larger"),
    (["distributed", "--csv", "{csv:twice}"], "0F0 appears twice"),
    (["distributed", "--csv", "{csv:mb 999999999}"], "1,000,000,000 micro-batches"),
    (["distributed", "--csv", "{csv:stage 5 of 2}"], "is missing"),
    (["distributed", "--csv", "{csv:no backward}"], "0B0 is missing"),
    (["distributed", "--csv", "{huge}"], "over the limit of 1 MB: not read"),
    (["distributed", "--csv", "{csv:65 micro-batches}"], "65 micro-batches"),
    # more of our own
    (["distributed", "--csv", "{csv:deadlock}"], "--csv"),
    (["distributed", "--csv", "{csv:empty}"], "holds no compute actions"),
    (["distributed", "--csv", "{csv:not actions}"], "xyz"),
    (["distributed", "--csv", "{csv:8 stages}"], "the model has 6 layers"),
    (["distributed", "--csv", "{csv:3 micro-batches}", "--batch", "7"],
     "--batch must be a multiple of the CSV's micro-batches (3)"),
    (["distributed", "--csv", "{fifo}"], "not a regular file"),
    (["distributed", "--csv", "{folder}"], "is a folder"),
    (["distributed", "--csv", "{tmp}/missing.csv"], "does not exist"),
    (["distributed", "--parallel", "pipeline", "--workers", "4", "--schedule", "interleaved"],
     "8 stages, but the gpt model has 6 layers"),
    (["distributed", "--parallel", "pipeline", "--microbatches", "4", "--batch", "6"],
     "--batch must be a multiple of --microbatches (4)"),
]  # fmt: skip


@pytest.mark.parametrize("args, words", CSV_FILES, ids=[w[:40] for _, w in CSV_FILES])
def test_a_bad_csv_is_one_line_before_any_process(args, words, where):
    fill, work = where
    _refused(run_course(fill(args), work, env={"TMPDIR": str(work)}), words)
    assert list(work.iterdir()) == []  # no temporary CSV left


# -- numbers: finite, and in a range that keeps every derived figure finite -------------------

NUMBERS = [
    # the issue's: subnormal bandwidths, FLOP rates and huge counts (inf in JSON, "inf ms")
    (["data-parallel", "--inter-node-gbs", "1e-320", "--gpus-per-node", "1", "--json"],
     "--inter-node-gbs"),
    (["tensor-parallel", "--intra-node-gbs", "1e-320", "--json"], "--intra-node-gbs"),
    (["plan", "memory", "--params", "1e308", "--json"], "--params"),
    ([*SEARCH, "--peak-tflops", "1e-320", "--json"], "--peak-tflops"),
    (["run", "1f1b", "--intra-node-gbs", "1e-320"], "--intra-node-gbs"),
    (["moe", "--inter-node-gbs", "1e-320"], "--inter-node-gbs"),
    (["fsdp", "--intra-node-gbs", "1e-320"], "--intra-node-gbs"),
    (["context-parallel", "--inter-node-gbs", "1e-320"], "--inter-node-gbs"),
    (["plan", "memory", "--params", "7B", "--gpu-memory-gib", "1"], "--gpu-memory-gib 1 leaves"),
    (["distributed", "--timeout", "0.0004"], "--timeout"),
    # more of our own
    ([*SEARCH, "--efficiency", "1e-320"], "--efficiency"),
    ([*SEARCH, "--peak-tflops", "1e300"], "--peak-tflops"),
    (["plan", "memory", "--params", "7B", "--gpu-memory-gib", "5e-324"], "--gpu-memory-gib"),
    (["plan", "memory", "--params", "7B", "--gpu-memory-gib", "8", "--reserve-gib", "8"],
     "--reserve-gib"),
    (["plan", "memory", "--params", "7B", "--latency-us", "1e300"], "--latency-us"),
    (["plan", "memory", "--params", "2e15"], "--params"),
    (["plan", "memory", "--params", "7B", "--inter", "1e-9"], "--inter"),
    (["data-parallel", "--gpus-per-node", "100000"], "--gpus-per-node"),
    (["run", "1f1b", "--latency-us", "inf"], "--latency-us"),
    (["distributed", "--timeout", "1e300"], "--timeout"),
    (["distributed", "--batch", "1025", "--model", "gpt"], "--batch must be an integer from 1"),
    (["distributed", "--workers", "5"], "--workers must be an integer from 1 to 4"),
    (["distributed", "--batch", "7"], "--batch must be a multiple of --workers (2)"),
    (["grade", "{nb}", "--cell-timeout", "2.5"], "--cell-timeout must be a whole number"),
    (["grade", "{nb}", "--cell-timeout", "0.5"], "--cell-timeout"),
]  # fmt: skip


@pytest.mark.parametrize("args, words", NUMBERS, ids=[" ".join(a[:2]) + w for a, w in NUMBERS])
def test_numbers_out_of_range_are_one_line(args, words, where):
    fill, work = where
    _refused(run_course(fill(args), work), words)


# -- the torchrun entry point: its flags and torchrun's variables, before torch ---------------

# (environment, args, words)
TRAIN_INPUTS = [
    # the issue's
    ({"COURSE_AGENT_PID": "abc"}, [], "COURSE_AGENT_PID must be an integer"),
    ({**RANK0, "RANK": "x"}, [], "RANK must be an integer >= 0"),
    ({**RANK0, "TORCHELASTIC_RESTART_COUNT": "one"}, [], "TORCHELASTIC_RESTART_COUNT"),
    (RANK0, ["--timeout", "inf"], "--timeout"),
    (RANK0, ["--timeout", "nan"], "--timeout"),
    (RANK0, ["--timeout", "1e300"], "--timeout"),
    (RANK0, ["--timeout", "-5"], "--timeout"),
    (RANK0, ["--seed", str(2**70)], "--seed"),
    (RANK0, ["--lr", "inf"], "--lr"),
    ({}, ["--parallel", "tp"], "--parallel"),
    # more of our own
    ({**RANK0, "LOCAL_RANK": "-1"}, [], "LOCAL_RANK"),
    ({**RANK0, "WORLD_SIZE": "0"}, [], "WORLD_SIZE"),
    ({**RANK0, "RANK": "3"}, [], "do not make a launch"),
    ({**RANK0, "TORCHELASTIC_MAX_RESTARTS": "2.5"}, [], "TORCHELASTIC_MAX_RESTARTS"),
    (RANK0, ["--lr", "1e9"], "--lr"),
    (RANK0, ["--batch", "2048"], "--batch must be an integer from 1 to"),
    (RANK0, ["--model", "mlp", "--batch", "5000"], "--batch"),
    (RANK0, ["--steps", "0"], "--steps"),
    (RANK0, ["--microbatches", "65"], "--microbatches"),
    (RANK0, ["--checkpoint-every", "0"], "--checkpoint-every"),
    (RANK0, ["--steps", "3", "--fail-at-step", "4"], "--fail-at-step"),
    (RANK0, ["--report", "out.txt"], "--report must end in .json"),
    ({}, ["--steps", "ten"], "--steps"),
]  # fmt: skip


@pytest.mark.parametrize("env, args, words", TRAIN_INPUTS, ids=[w for _, _, w in TRAIN_INPUTS])
def test_the_torchrun_entry_point_refuses_before_importing_torch(env, args, words, tmp_path):
    result = _module(TRAIN, args, tmp_path, env)
    _refused(result, words)  # under a second of CPU: torch (2 s) was never imported


TORCHRUN = "course_utils.distributed.torchrun"
UNDER_TORCHRUN = ["--standalone", "--nproc-per-node=2", "-m", TRAIN]
# (args after `-m course_utils.distributed.train`, words): under plain torchrun each ended in
# its 45-line ChildFailedError report
TORCHRUN_INPUTS = [
    (["--lr", "inf"], "--lr"),
    (["--parallel", "tp"], "--parallel"),
    (["--timeout", "nan"], "--timeout"),
    (["--seed", str(2**70)], "--seed"),
    (["--steps", "3", "--fail-at-step", "4"], "--fail-at-step"),
]


@pytest.mark.parametrize("args, words", TORCHRUN_INPUTS, ids=[w for _, w in TORCHRUN_INPUTS])
def test_the_courses_torchrun_refuses_the_training_flags_before_any_process(args, words, tmp_path):
    _refused(_module(TORCHRUN, [*UNDER_TORCHRUN, *args], tmp_path), words)


@pytest.mark.slow
def test_a_refusal_of_the_ranks_under_the_courses_torchrun_is_their_one_line(tmp_path):
    # what only the ranks can see (a checkpoint folder of another program's): they refuse
    # together, the first of the node says why, and torchrun's report is not added
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "run.json").write_text("{not json")
    out = subprocess.run(
        [sys.executable, "-m", TORCHRUN, *UNDER_TORCHRUN, "--checkpoint-dir", "junk"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        # torch's own log folder (torchelastic_*) in tmp_path, not left in /tmp
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
             "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        f"{TRAIN}: error: --checkpoint-dir junk: its run.json is not a record the course wrote: "
        "use an empty folder"
    ], out.stderr[-2000:]


def test_the_entry_point_imports_torch_only_to_train():
    code = f"""
import os, sys
os.environ.update({RANK0!r})
from course_utils.distributed import train
assert train.main(["--lr", "inf"]) == 2
os.environ["RANK"] = "x"
assert train.main([]) == 2
try:
    train.main(["--parallel", "tp"])
except SystemExit as exc:
    assert exc.code == 2
assert "torch" not in sys.modules, "torch was imported"
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]


# -- where output goes: make_exercises --out, grade's folders and files ------------------------

MAKE = "course_utils.grading.make_exercises"
# (module or None for course_utils, args, words)
OUTPUTS = [
    # the issue's
    (MAKE, ["--students", "ann", "--out", "{file}/sub"], "is a file, not a folder"),
    (MAKE, ["--students", "ann", "--out", "/proc/handout"], "takes no new files"),
    (MAKE, ["--students", "ann", "--out", "/dev/null/x"], "'/dev/null' is a file"),
    (MAKE, ["--bogus"], "unrecognized arguments: --bogus"),
    (None, ["gantt", "1f1b", "-p", "2", "-m", "2", "-o", ".png"], "an ending without a name"),
    (None, ["grade", "{nb}", "--solutions", "{tmp}/missing"], "--solutions"),
    # (the issue said 13, which has exercises now; 14, the appendix, has none)
    (None, ["grade", "{nb}", "--lesson", "14"], "--lesson 14: lesson 14 has no exercises"),
    # more of our own
    (MAKE, ["--students", "ann", "--out", "{file}"], "is a file, not a folder"),
    (MAKE, ["--students", "ann", "--out", "{fifo}/x"], "is a file, not a folder"),
    (MAKE, ["--exercises", "/proc/exercises"], "--exercises"),
    (MAKE, ["--students", "ann"], "need --out"),
    (MAKE, ["--out", "{tmp}/h", "--students", "a/b"], "'a/b'"),
    (None, ["grade", "{nb}", "--solutions", "{tmp}", "--no-sandbox"],
     "has no notebook of lesson 03"),
    (None, ["grade", "{nb}", "--lesson", "99"], "--lesson 99"),
    (None, ["grade", "{nb}", "--feedback", "/dev/null/pages"], "--feedback"),
    (None, ["grade", "{nb}", "--feedback", "{file}/pages"], "--feedback"),
    (None, ["gantt", "1f1b", "-p", "2", "-m", "2", "-o", "{tmp}/.PNG"], "-o"),
    (None, ["run", "1f1b", "--gantt", ".svg"], "--gantt"),
]  # fmt: skip


@pytest.mark.parametrize("module, args, words", OUTPUTS, ids=[w for _, _, w in OUTPUTS])
def test_outputs_that_cannot_be_written_are_one_line(module, args, words, where):
    fill, work = where
    filled = fill(args)
    result = _module(module, filled, work) if module else run_course(filled, work)
    _refused(result, words)
    assert list(work.iterdir()) == []


# -- rosters: read in linear time, under grade's size limit everywhere ------------------------

# (module or None, args, words, CPU seconds allowed: reading 170,000 rows takes about half a
# second; when each row counted the roster's lms_ids again it took 60 s)
ROSTER_CASES = [
    (None, ["grade", "{nb}", "--roster", "{roster:170k, lms_id twice}"],
     "lms_id '5' is given twice", 4.0),
    (MAKE, ["--roster", "{roster:170k, lms_id twice}", "--out", "{tmp}/h"], "given twice", 4.0),
    (MAKE, ["--roster", "{huge}", "--out", "{tmp}/h"], "over the limit of 5 MB", 1.0),
    (MAKE, ["--roster", "{roster:1,001 students}", "--out", "{tmp}/h"],
     "at most 1,000 handouts", 1.0),
    (MAKE, ["--roster", "{fifo}", "--out", "{tmp}/h"], "not a regular file", 1.0),
    (MAKE, ["--students", *(f"s{i}" for i in range(1001)), "--out", "{tmp}/h"], "1,001 students",
     1.0),
]  # fmt: skip


@pytest.mark.parametrize("module, args, words, cpu", ROSTER_CASES, ids=[c[2] for c in ROSTER_CASES])
def test_rosters_are_read_in_linear_time_within_the_size_limit(module, args, words, cpu, where):
    fill, work = where
    filled = fill(args)
    result = _module(module, filled, work) if module else run_course(filled, work)
    _refused(result, words, cpu)
    assert list(work.iterdir()) == []


# -- silent wrong results and leaks ------------------------------------------------------------


def test_the_layers_the_checks_count_are_the_models():
    from course_utils.distributed.job import MODEL_LAYERS
    from course_utils.distributed.setup import Setup, build_model

    assert {m: len(build_model(Setup(m)).layers()) for m in MODEL_LAYERS} == MODEL_LAYERS


def test_nan_is_never_reported_as_equality():
    import numpy as np

    from course_utils.distributed.setup import largest, max_abs_diff

    assert math.isnan(largest([0.0, math.nan, 1.0])) and math.isnan(largest([math.nan]))
    assert largest([0.5, 2.0]) == 2.0 and largest([]) == 0.0
    assert max([0.0, math.nan]) == 0.0  # what Python's max said: "equal"
    nan = {"w": np.array([1.0, np.nan])}
    assert math.isnan(max_abs_diff(nan, {"w": np.array([1.0, 2.0])}))


def test_a_bad_course_schedule_for_processes_is_refused_before_any_file_or_process(
    tmp_path, monkeypatch
):
    import tempfile

    from course_utils.distributed import run_pipeline
    from course_utils.errors import CourseInputError
    from course_utils.pipeline import Action, Schedule
    from course_utils.pipeline.export import from_pytorch_csv

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = tmp_path / "m65.csv"
    path.write_text(CSVS["65 micro-batches"])
    dupe = (("0F0", "0F0", "0B0"), ("1F0", "1B0"))
    for schedule, words in [
        (from_pytorch_csv(path), "65 micro-batches"),
        (Schedule("dupe", 2, 1, tuple(tuple(map(Action.parse, d)) for d in dupe)), "twice"),
    ]:
        with pytest.raises(CourseInputError, match=words):
            run_pipeline(schedule, 2, batch=4, model="mlp")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m65.csv"]


def _rank_alone(tmp_path: Path) -> dict:
    """Environment of a one-process job without torchrun (a free port of its own)."""
    from conftest import free_port

    return {**os.environ, **RANK0, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
            "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}  # fmt: skip


@pytest.mark.slow
def test_a_diverging_training_fails_instead_of_reporting_equality(tmp_path):
    # --lr 10 is allowed (a real, if poor, choice): the parameters become NaN, which the
    # report once called "largest parameter difference 0.0e+00"
    out = subprocess.run(
        [sys.executable, "-m", TRAIN, "--lr", "10", "--steps", "6", "--report", "r.json"],
        capture_output=True, text=True, cwd=tmp_path, env=_rank_alone(tmp_path), timeout=300,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "diverged" in lines[0] and "--lr 10" in lines[0], out.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow
def test_ctrl_c_while_training_and_checkpointing_is_one_line(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [sys.executable, "-m", TRAIN, "--steps", "1000", "--checkpoint-every", "1",
         "--checkpoint-dir", str(ckpt), "--model", "mlp"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env=_rank_alone(tmp_path), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(list(ckpt.glob("step-*"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # checkpoints every step: the signal lands in or near a save
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines() == [f"{TRAIN}: interrupted"], err[-2000:]


@pytest.mark.slow
def test_a_report_that_names_a_folder_or_a_junk_run_record_stops_before_training(tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "run.json").write_text("{not json")
    (tmp_path / "out.json").mkdir()
    for args, words in [
        (["--report", "out.json"], "is a folder"),
        (["--checkpoint-dir", "junk"], "run.json is not a record the course wrote"),
    ]:
        start = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
        out = subprocess.run(
            [sys.executable, "-m", TRAIN, "--steps", "1000", *args], capture_output=True,
            text=True, cwd=tmp_path, env=_rank_alone(tmp_path), timeout=300,
        )  # fmt: skip
        assert out.returncode == 2, out.stderr[-2000:]
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and f"{TRAIN}: error: " in lines[0] and words in lines[0], lines
        # refused before training 1,000 steps (which takes far longer than the start-up)
        assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - start < 30


@pytest.mark.slow
def test_fsdp2_on_processes_prints_its_report_and_no_warning(tmp_path):
    # each rank printed FSDP2's "returned a view tensor" UserWarning at every forward (8 lines)
    args = ["distributed", "--fsdp", "--workers", "2", "--batch", "4", "--model", "gpt",
            "--steps", "1", "--timeout", "300"]  # fmt: skip
    result = run_course(args, tmp_path, timeout=300)
    assert result["code"] == 0, result["err"][-2000:]
    assert result["err"] == "" and "FSDP2 (fully_shard) on 2 processes" in result["out"]


# -- the planner's API -------------------------------------------------------------------------


def _plan():
    import types

    import numpy as np

    from course_utils import plan
    from course_utils.parallel import sequence_parallel
    from course_utils.parallel.context_parallel import costs as cp_costs
    from course_utils.parallel.fsdp import costs as fsdp_costs
    from course_utils.pipeline import make_schedule, simulate
    from course_utils.threads import ring

    shape = plan.ModelShape(7_000_000_000, 32, 4096, 32, 2048)
    return types.SimpleNamespace(plan=plan, M=shape, np=np, make_schedule=make_schedule,
                                 simulate=simulate, ring=ring, sp=sequence_parallel,
                                 cp_costs=cp_costs, fsdp_costs=fsdp_costs)  # fmt: skip


# (call, words of the one line): AttributeError, TypeError, ZeroDivisionError, OverflowError,
# MemoryError, hangs and silent results once
API_CALLS = [
    # the issue's
    (lambda a: a.plan.memory(a.M, config=5), "config must be a Config"),
    (lambda a: a.plan.search("70B", 64, 512), "model must be a ModelShape"),
    (lambda a: a.plan.min_gpus(a.M, 512, hardware=5), "hardware must be a Hardware"),
    (lambda a: a.plan.step_time(a.M, a.plan.Config(), hardware="H100"), "hardware"),
    (lambda a: a.plan.evaluate(7e9, a.plan.Config()), "model must be a ModelShape"),
    (lambda a: a.plan.parse_count(None), "params must be a positive number"),
    (lambda a: a.plan.ring_attention_bytes(2048, 0, 32, 128), "cp must be an integer"),
    (lambda a: a.plan.gpu_counts(1, 0, 64), "gpus_per_node"),
    (lambda a: a.plan.context_degrees(a.M, 10**30), "gpus must be an integer from 1 to 65,536"),
    (lambda a: a.plan.gpu_counts(1, 8, 10**30), "limit"),
    (lambda a: a.plan.min_gpus(a.M, 512, limit=10**30), "limit"),
    (lambda a: a.plan.search(a.M, 64, 512, cp_kind="Ring"), "cp_kind must be one of ring"),
    (lambda a: a.plan.min_gpus(a.M, 512, limit=-5), "limit"),
    (lambda a: a.simulate(a.make_schedule("1f1b", 2, 2), 0), "costs must be a CostModel"),
    (lambda a: a.plan.model_state_bytes(-5), "params must be a finite number >= 0"),
    (lambda a: a.plan.utilisation(a.M, a.plan.Config(), seconds=-1), "seconds"),
    (lambda a: a.plan.Hardware(gpu_memory_gib=1), "leaves nothing usable"),
    (lambda a: a.plan.memory(1e308), "model must be a ModelShape or a parameter count"),
    # more of our own
    (lambda a: a.plan.memory(a.M, a.plan.Config(tp=10**30)), "tp must be an integer"),
    (lambda a: a.plan.memory(a.M, a.plan.Config(sequence_parallel="yes")), "sequence_parallel"),
    (lambda a: a.plan.memory(a.M, a.plan.Config(zero=True)), "zero must be 0, 1, 2 or 3"),
    (lambda a: a.plan.memory(a.M, precision=["bf16"]), "precision must be one of"),
    (lambda a: a.plan.ModelShape(7e9, 10**30, 4096, 32), "layers must be an integer"),
    (lambda a: a.plan.ModelShape(1e300, 32, 4096, 32), "params"),
    (lambda a: a.plan.Hardware(intra_node_gbs=1e-320), "intra_node_gbs"),
    (lambda a: a.plan.Hardware(efficiency=5e-324), "efficiency"),
    (lambda a: a.plan.hardware(speed=2), "a change must be one of"),
    (lambda a: a.plan.replace_config(a.plan.Config(), tpp=2), "a change must be one of"),
    (lambda a: a.plan.ulysses_attention_bytes(2048, 2, 32, 0), "head_dim"),
    (lambda a: a.plan.activation_terms(2048, 1, 4096, 32, tp=0), "tp"),
    (lambda a: a.plan.activation_bytes_per_layer(2048, 1, 4096, 32, moe_factor=math.inf),
     "moe_factor"),
    (lambda a: a.plan.training_flops(a.M, -1.0), "tokens"),
    (lambda a: a.plan.training_flops(a.M, 1e6, cp=0), "cp"),
    (lambda a: a.plan.pipeline_bubble("1f1b", 10**30, 4), "pp"),
    (lambda a: a.plan.inflight_microbatches("zigzag", 4, 4), "schedule must be one of"),
    (lambda a: a.plan.traffic(None, a.plan.Config()), "model must be a ModelShape"),
    (lambda a: a.plan.buffers(a.M, "tp=2"), "config must be a Config"),
    (lambda a: a.plan.states_lower_bound(a.M, hardware=None), "hardware"),
    (lambda a: a.plan.search(a.M, 64, 10**30), "global_batch"),
    (lambda a: a.plan.search(a.M, 64, 512, dp_overlap="no"), "dp_overlap must be a bool"),
    (lambda a: a.plan.min_gpus(a.M, 512, budget_s=math.nan), "budget_s"),
    (lambda a: a.plan.params_disagree(7e9, "7B"), "shape must be a ModelShape"),
    (lambda a: a.plan.format_bytes(-1), "nbytes"),
    (lambda a: a.plan.format_memory({"parameters": 1.0}), "must have a 'total'"),
    (lambda a: a.plan.format_time({"total": math.nan}), "parts['total']"),
    (lambda a: a.plan.search_to_dict([]), "result must be search()'s result"),
    # the byte counts the planner restates, where the threads compute them
    (lambda a: a.ring.ring_bytes_per_rank(100, 0), "world_size must be an integer"),
    (lambda a: a.ring.chunk_bounds(10, 10**30), "parts must be an integer"),
    (lambda a: a.ring.ring_plan(5, 4), "rank must be an integer from 0 to 3"),
    (lambda a: a.ring.naive_bytes_per_rank(None, 4), "numel"),
    (lambda a: a.sp.sp_comm_bytes(64, 1, 32, 0), "workers"),
    (lambda a: a.sp.korthikanti_mlp_block_bytes(64, 1, 32, 128, tp=0), "tp"),
    (lambda a: a.sp.layernorm_statistics_bytes("64", 1), "seq"),
    (lambda a: a.sp.dropout_mask((2, 2), 1.5, 0), "p must be a finite number"),
    (lambda a: a.fsdp_costs.precision_for(None), "element_size"),
    (lambda a: a.cp_costs.simulate_ring(2, step_costs=[]), "step_costs must be a dict"),
]  # fmt: skip


@pytest.mark.parametrize("call, words", API_CALLS)
def test_the_api_refuses_what_it_cannot_compute_at_once(call, words):
    from course_utils.errors import CourseInputError

    api = _plan()
    start = time.process_time()
    with pytest.raises(CourseInputError) as info:
        call(api)
    assert time.process_time() - start < 1.0
    message = str(info.value)
    assert "\n" not in message and words in message, message


def test_the_planner_takes_numbers_of_any_kind_and_bounds_what_it_counts():
    api = _plan()
    plan = api.plan
    assert plan.parse_count(api.np.int64(4)) == 4 and plan.parse_count(api.np.float32(7e9)) > 0
    assert plan.gpu_counts(1, 8, 4) == [1, 2, 4]  # no count above the limit
    assert plan.context_degrees(api.M, 65_536) == [1, 2]  # 2048 tokens: 1024 a GPU at least
    assert plan.search_to_dict({"feasible": [], "rejected": []}) == {"feasible": [],
                                                                     "rejected": []}  # fmt: skip


# Every public function of the planner, each argument replaced in turn by a value it cannot
# use: a CourseInputError, or a result whose numbers are all finite and >= 0, within a second.
BAD_VALUES = [None, "x", -5, 0, 10**30, math.nan, math.inf, -math.inf, 1e-320, 1e308, [], 2.5,
              True, -1e-9, {}]  # fmt: skip
NOT_SWEPT = {"draw_cluster", "draw_layout", "draw_plan", "layout_explorer", "planner_widget",
             "estimate_from_sliders", "describe", "describe_layout", "layout",
             "ring_allreduce_time"}  # fmt: skip


def _good_arguments(api) -> dict:
    """Quick, valid values by argument name (a small search: 8 GPUs)."""
    plan = api.plan
    return dict(model=plan.ModelShape(1_300_000_000, 24, 2048, 16, 2048), config=plan.Config(),
                precision="bf16-mixed", hardware=plan.Hardware(), gpus=8, global_batch=16,
                params=7e9, zero=0, dp=1, tp=1, pp=1, seq=2048, microbatch_size=1, hidden=4096,
                heads=32, sequence_parallel=False, recompute="none", bytes_per_value=2, cp=1,
                ffn_hidden=None, moe_factor=1.0, head_dim=128, batch=1, schedule="1f1b",
                microbatches=4, chunks=1, tokens=1e6, seconds=1.0, start=1, gpus_per_node=8,
                limit=16, budget_s=2.0, dp_overlap=False, first_fit=False, cp_kind="ring",
                text="7B", what="params", name="A100-80GB", nbytes=1e9, limit_gib=80.0,
                mem={"total": 1.0}, parts={"total": 1.0}, shape=plan.MODEL_PRESETS["6.7B"],
                result={"feasible": [], "rejected": []})  # fmt: skip


def _numbers(value) -> list:
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list | tuple):
        return [n for v in value for n in _numbers(v)]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return [n for v in vars(value).values() for n in _numbers(v)] if hasattr(
            value, "__dataclass_fields__") else []  # fmt: skip
    return [value]


def test_every_planner_function_refuses_or_answers_finite_numbers():
    import inspect

    from course_utils.errors import CourseInputError

    api = _plan()
    good = _good_arguments(api)
    failures, calls = [], 0
    for name in api.plan.__all__:
        fn = getattr(api.plan, name)
        if name in NOT_SWEPT or name.isupper() or isinstance(fn, type) or not callable(fn):
            continue
        parameters = inspect.signature(fn).parameters
        base = {
            p: good[p] if p in good else v.default
            for p, v in parameters.items()
            if v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL)
        }
        for p in base:
            for bad in BAD_VALUES:
                calls += 1
                start = time.process_time()
                try:
                    out = fn(**{**base, p: bad})
                except CourseInputError as exc:
                    if "\n" in str(exc):
                        failures.append(f"{name}({p}={bad!r}): two lines")
                    continue
                except Exception as exc:  # noqa: BLE001 - what the sweep is looking for
                    failures.append(f"{name}({p}={bad!r}): {type(exc).__name__}: {exc}"[:150])
                    continue
                finally:
                    took = time.process_time() - start
                    if took > 1.0:
                        failures.append(f"{name}({p}={bad!r}): {took:.1f} s")
                wrong = [n for n in _numbers(out) if not math.isfinite(n) or n < 0]
                if wrong:
                    failures.append(f"{name}({p}={bad!r}) -> {wrong[:3]}")
    assert calls > 1000
    assert failures == [], "\n".join(failures[:40])
