"""Every documented limit is a run that succeeds on a laptop, and nothing outlives `grade`.

Each command is run at the corner of its limits (the sizes its --help promises, together) in
a child process and must finish with exit code 0 under 1.5 GB (`validation.MEMORY_BUDGET`;
Binder gives 2 GB), measured as the child's peak resident memory; `grade -j 3`, `distributed`
and the torchrun entry point as the proportional set size of their whole process tree
(workers and kernels; ranks). Then `grade -j 2` is
killed mid-batch (SIGTERM, SIGKILL, Ctrl-C): 5 s later none of its workers or kernels is
left, nor any file in its temporary folder, and Ctrl-C ends it within 2 s with one line
(in a sandbox: `needs_bwrap`). Where no sandbox can be made the limits run `grade
--no-sandbox`.

All slow (a few minutes in all: real training steps at their largest). The runs at the limits
(marked `limits`, 5 to 7 minutes of CPU) are `make test-limits`, which CI runs last, alone;
`make test` runs the rest.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from conftest import NEEDS_BWRAP, SOCKETS_IN_TMP
from gradingkit import NO_SANDBOX
from measured import ROOT, run_course, tree_peak_mb

from course_utils import validation
from course_utils.pipeline.schedules import count_actions
from course_utils.validation import MAX_ACTIONS, MAX_GANTT_ACTIONS, MEMORY_BUDGET

pytestmark = pytest.mark.slow
BUDGET_MB = MEMORY_BUDGET / 1e6
SOLUTIONS = ROOT / "solutions"

# (command at its limits, what it is the limit of)
AT_THE_LIMITS = [
    (["schedule", "zb-h1", "--devices", "400", "--microbatches", "416", "--json"],
     f"{MAX_ACTIONS:,} actions (3 per stage and micro-batch), as JSON"),
    (["gantt", "zb-h1", "-p", "40", "-m", "166", "-o", "chart.png"],
     f"{MAX_GANTT_ACTIONS:,} bars"),
    (["run", "interleaved", "--devices", "8", "--chunks", "4", "--microbatches", "64"],
     "gpt: 8 devices, 32 stages, 64 micro-batches, the largest batch (128 x 32 layers)"),
    (["run", "breadth-first", "--devices", "8", "--chunks", "4", "--microbatches", "64",
      "--batch-size", "2048", "--model", "mlp"], "mlp: 32 layers x 2048 samples"),
    (["data-parallel", "--workers", "16", "--batch", "65536", "--steps", "20"],
     "16 workers, 65,536 samples, 20 steps"),
    (["tensor-parallel", "--workers", "8", "--d-model", "1024", "--tokens", "1024"],
     "8 workers, the widest MLP"),
    (["tensor-parallel", "--workers", "8", "--d-model", "256", "--tokens", "4096"],
     "8 workers, the most tokens"),
    (["fsdp", "--workers", "8", "--steps", "20", "--microbatches", "8", "--prefetch", "8"],
     "8 workers, 20 steps, 8 micro-batches, prefetch 8"),
    (["context-parallel", "--workers", "1", "--heads", "16", "--seq", "362", "--dim", "128"],
     "16 heads x 362^2 scores of 128 dims on one worker"),
    (["context-parallel", "--workers", "8", "--heads", "16", "--seq", "352", "--dim", "128",
      "--zigzag", "--causal"], "8 workers, zig-zag and causal"),
    (["context-parallel", "--workers", "8", "--heads", "1", "--seq", "1440", "--dim", "128"],
     "the longest sequence"),
    (["moe", "--workers", "8", "--experts", "64", "--tokens", "4096", "--top-k", "2",
      "--capacity-factor", "64", "--skew", "10"], "8 workers, 64 experts, 4096 tokens"),
    (["plan", "search", "--params", "70B", "--layers", "80", "--hidden", "8192", "--heads", "64",
      "--seq", "2048", "--global-batch", "512", "--gpus", "65536"], "65,536 GPUs"),
    (["plan", "search", "--params", "824B", "--layers", "1024", "--hidden", "8192", "--heads",
      "1024", "--seq", "1048576", "--global-batch", "512", "--gpus", "65536"],
     "65,536 GPUs, 1024 layers and heads, a million tokens"),
    (["plan", "memory", "--params", "70B", "--layers", "1024", "--hidden", "2048", "--heads", "16",
      "--seq", "2048", "--pp", "1024", "--microbatches", "65", "--schedule", "zb-h1"],
     "1024 stages x 65 micro-batches simulated"),
]  # fmt: skip


@pytest.mark.limits
@pytest.mark.parametrize("args, what", AT_THE_LIMITS, ids=[w for _, w in AT_THE_LIMITS])
def test_every_documented_limit_runs_under_the_budget(args, what, tmp_path):
    result = run_course(args, tmp_path, timeout=600)
    assert result["code"] == 0, result["err"][-2000:]
    assert result["mb"] < BUDGET_MB, f"{what}: {result['mb']:.0f} MB"
    if args[0] in ("schedule", "gantt"):  # what --max-actions is raised on: never predicted low
        use = "gantt" if args[0] == "gantt" else "json"
        actions = count_actions(args[1], int(args[3]), int(args[5]))
        predicted = validation.BASE_BYTES[use] + validation.ACTION_BYTES[use] * actions
        assert result["mb"] * 1e6 <= predicted, (result["mb"], predicted / 1e6)
    print(f"{' '.join(args)}: {result['mb']:.0f} MB, {result['cpu']:.1f} s of CPU")


# (command at its limits, what it is the limit of): torch.distributed processes, measured as
# their whole tree (every rank, the parent and its one-process reference)
PROCESSES = validation.MAX_PROCESSES
GPT_BATCH = validation.MAX_PROCESS_BATCH["gpt"]  # the MLP's 4,096 take less (1.15 GB)
STEPS = validation.MAX_COMPARED_STEPS
DISTRIBUTED_AT_THE_LIMITS = [
    (["distributed", "--workers", PROCESSES, "--batch", GPT_BATCH, "--model", "gpt", "--steps",
      STEPS], f"DDP: {PROCESSES} processes, the GPT's batch of {GPT_BATCH}, {STEPS} steps"),
    (["distributed", "--fsdp", "--workers", PROCESSES, "--batch", GPT_BATCH, "--model", "gpt"],
     "FSDP2: the GPT's batch"),
    (["distributed", "--parallel", "pipeline", "--workers", PROCESSES, "--microbatches", "64",
      "--batch", GPT_BATCH, "--model", "gpt"], "pipeline: 64 micro-batches"),
    (["distributed", "--ring-attention", "--workers", PROCESSES], "ring attention"),
    (["--standalone", f"--nproc-per-node={PROCESSES}", "-m", "course_utils.distributed.train",
      "--parallel", "fsdp", "--batch", GPT_BATCH, "--steps", "3",
      "--checkpoint-dir", "ckpt", "--report", "r.json"],
     "torchrun: train with FSDP2 and checkpoints"),
]  # fmt: skip


# lesson 13's launcher at its limits: every "node" an agent of torchrun on this machine
LAUNCH = (
    "from course_utils.distributed.launch import MAX_NODES, MAX_PROCS_PER_NODE, launch\n"
    "job = launch(nodes=MAX_NODES, procs_per_node=MAX_PROCS_PER_NODE, parallel='fsdp+pipeline',"
    f" batch={GPT_BATCH}, microbatches={GPT_BATCH // 2}, steps=2, checkpoint_dir='ckpt')\n"
    "assert job.report['max_param_diff'] < 1e-5, job.report['max_param_diff']\n"
)
DISTRIBUTED_AT_THE_LIMITS.append(
    (["-c", LAUNCH], "launch(): 2 nodes of 2 processes, FSDP2 x pipeline, the GPT's batch")
)


@pytest.mark.limits
@pytest.mark.parametrize("args, what", DISTRIBUTED_AT_THE_LIMITS,
                         ids=[w for _, w in DISTRIBUTED_AT_THE_LIMITS])  # fmt: skip
def test_distributed_at_its_limits_stays_under_the_budget(args, what, tmp_path):
    # the train entry point as torchrun starts it, or lesson 13's launcher, or a command
    module = {"--standalone": "torch.distributed.run", "-c": None}.get(args[0], "course_utils")
    args = [*args, "--timeout", "600"] if module == "course_utils" else args
    # TMPDIR: torchrun's own log folder (it leaves one in the temporary directory)
    code, peak = tree_peak_mb(args, tmp_path, 900, {"TMPDIR": str(tmp_path)}, module)
    assert code == 0, what
    assert peak < BUDGET_MB, f"{what}: {peak:.0f} MB"
    print(f"{' '.join(map(str, args))}: {peak:.0f} MB for the process tree")


def _heavy_handful(folder: Path, count: int) -> None:
    """`count` solved notebooks of the lessons whose exercises hold the most in memory."""
    folder.mkdir()
    for lesson in sorted(SOLUTIONS.glob("*.ipynb"))[-count:]:
        shutil.copy(lesson, folder / f"s{lesson.name[:2]}_{lesson.name}")


@pytest.mark.limits
def test_grade_at_its_most_jobs_stays_under_the_budget(tmp_path):
    from course_utils.validation import MAX_GRADE_JOBS

    _heavy_handful(tmp_path / "class", MAX_GRADE_JOBS)
    command = ["grade", tmp_path / "class", "-j", MAX_GRADE_JOBS, *NO_SANDBOX]
    code, peak = tree_peak_mb(command, tmp_path)
    assert code == 0
    assert peak < BUDGET_MB, f"grade -j {MAX_GRADE_JOBS}: {peak:.0f} MB"
    print(f"grade -j {MAX_GRADE_JOBS}: {peak:.0f} MB for the process tree")


# -- nothing outlives grade --------------------------------------------------------------------


def _slow_class(folder: Path) -> None:
    """Two notebooks whose first cells sleep: the batch is always mid-notebook when hit."""
    folder.mkdir()
    for who in ("ann", "ben"):
        nb = nbformat.read(ROOT / "exercises" / "03_bubble_tradeoff.ipynb", as_version=4)
        nb.cells.insert(1, nbformat.v4.new_code_cell("import time\ntime.sleep(300)"))
        nbformat.write(nb, folder / f"{who}_03.ipynb")


def _kernels_running(pid: int, count: int, timeout: float = 120) -> list:
    """The descendants of `pid` once `count` kernels run among them."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            tree = psutil.Process(pid).children(recursive=True)
            kernels = [p for p in tree if "ipykernel_launcher" in " ".join(p.cmdline())]
        except psutil.Error:
            tree, kernels = [], []
        if len(kernels) >= count:
            time.sleep(1)  # let them get into the first cell
            return psutil.Process(pid).children(recursive=True)
        time.sleep(0.2)
    raise AssertionError("the kernels never started")


def _alive(processes: list) -> list:
    import psutil

    left = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.NoSuchProcess:
            pass
    return left


def _default_ctrl_c() -> None:
    # A shell starts background jobs with SIGINT ignored, and a child keeps that: the grader
    # under test must get the Ctrl-C a terminal would send it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@SOCKETS_IN_TMP  # it watches /tmp/cg-*; test_sandbox's hostile class makes such folders
# bwrap's --die-with-parent and PID namespace end each kernel with its worker: without them a
# run beside other tests (grade --no-sandbox) left /tmp/cg-* folders behind for minutes.
@NEEDS_BWRAP
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_nothing_outlives_grade_j2(sig, tmp_path):
    _slow_class(tmp_path / "class")
    private = tmp_path / "tmp"  # its TMPDIR: what it leaves there would be left behind
    private.mkdir()
    sockets = set(Path("/tmp").glob("cg-*"))  # where sockets go when TMPDIR's path is long
    proc = subprocess.Popen(
        [sys.executable, "-m", "course_utils", "grade", str(tmp_path / "class"), "-j", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(private)},
        preexec_fn=_default_ctrl_c,
    )
    try:
        children = _kernels_running(proc.pid, 2)
        assert len(children) >= 4  # 2 workers and 2 kernels at least (bwrap in between)
        start = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - start
        time.sleep(max(0.0, 5 - took))
        left = _alive(children)
        assert left == [], [" ".join(p.cmdline())[:100] for p in left]
        assert list(private.iterdir()) == []  # connection files and sockets removed too
        assert set(Path("/tmp").glob("cg-*")) <= sockets
        if sig == signal.SIGINT:  # Ctrl-C: stops within 2 s, one line, no traceback
            assert took < 2.0, f"{took:.1f} s"
            assert proc.returncode == 130
            assert err.strip().splitlines() == ["python -m course_utils grade: interrupted"]
        elif sig == signal.SIGTERM:
            assert proc.returncode == 143 and "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in _alive(children if "children" in locals() else []):
            p.kill()
