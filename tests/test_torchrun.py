"""The torchrun entry point (`course_utils.distributed.train`), launched for real.

Every "node" is a real `torchrun` agent on 127.0.0.1; two agents meeting at one c10d
rendezvous form a 2-node job. Starting one costs seconds (each agent and each process
imports torch), so each launch checks all it can: equality with one process, the report,
the checkpoints, the timeline, and that nothing is left running. The fast tests at the top
check the launch plan and the model parts without starting anything.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import torch

from course_utils.distributed import checkpoint
from course_utils.distributed.cluster import free_port
from course_utils.distributed.job import Place, make_plan, place_from_env
from course_utils.distributed.launch import Job, _failure, launch, start_agent, torchrun_command
from course_utils.distributed.parallelize import model_part, stage_layers
from course_utils.distributed.scratch import scratch_folder
from course_utils.distributed.setup import Setup, build_model, make_batch
from course_utils.distributed.train import parser
from course_utils.errors import CourseInputError
from course_utils.pipeline import make_schedule
from course_utils.pipeline.export import to_pytorch_csv

# torch.distributed, torchrun, DCP, FSDP2 and pipelining change between PyTorch versions.
pytestmark = pytest.mark.torch_api

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-5


def ours() -> list[psutil.Process]:
    """torchrun agents and train processes below this test process, still running."""
    alive = []
    for child in psutil.Process().children(recursive=True):
        cmd = command_of(child)
        if "/torchrun " in cmd or "-m course_utils.distributed.train" in cmd:
            alive.append(child)
    return alive


def command_of(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # gone, or a zombie
        return ""


def plan_for(argv: list[str], world: int, local_world: int):
    args = parser().parse_args(argv)
    return make_plan(args, Place(0, 0, world, local_world, 0))


# --------------------------------------------------------------------------- no processes


@pytest.mark.parametrize(
    "argv, world, local, words",
    [
        (
            ["--parallel", "pipeline", "--schedule", "interleaved"],
            4,
            2,
            "world size 4 does not fit",
        ),
        (["--parallel", "pipeline"], 1, 1, "at least 2 processes"),
        (["--parallel", "fsdp+pipeline"], 2, 2, "--nnodes >= 2"),
        (["--parallel", "ddp", "--batch", "6"], 4, 2, "--batch 6 must be a multiple of 4"),
        (["--parallel", "fsdp+pipeline", "--batch", "4"], 4, 2, "2 data-parallel share(s) x 4"),
        (["--parallel", "ddp", "--schedule", "1f1b"], 2, 1, "--schedule goes with"),
        (["--schedule", "1f1b", "--csv", "x.csv"], 2, 1, "not both"),
        (["--schedule", "interleaved", "--microbatches", "3"], 2, 1, "multiple of devices"),
        (["--schedule", "zigzag"], 2, 1, "--schedule must be one of"),
        (["--steps", "4", "--fail-at-step", "5"], 2, 1, "--fail-at-step must be"),
        (["--report", "out.txt"], 2, 1, "--report must end in .json"),
        (["--csv", "/no/such.csv"], 2, 1, "--csv /no/such.csv"),
    ],
)
def test_bad_launch_plans_are_one_line(argv, world, local, words):
    with pytest.raises(CourseInputError) as info:
        plan_for(argv, world, local)
    message = str(info.value)
    assert words in message and "\n" not in message


def test_a_csv_for_another_world_size_is_refused(tmp_path):
    path = to_pytorch_csv(make_schedule("zb-h1", 3, 4), tmp_path / "mine.csv")
    with pytest.raises(CourseInputError, match="has 3 rows .* 2 pipeline ranks"):
        plan_for(["--csv", str(path)], 2, 1)
    plan = plan_for(["--csv", str(path)], 3, 1)  # the world size it was exported for
    assert plan.pipeline is not None and plan.pipeline.kind == "csv"
    assert plan.pipeline.placement == {0: 0, 1: 1, 2: 2} and plan.parallel == "pipeline"


BOX = """[rank1]: Traceback (most recent call last):
[rank1]:   File "train.py", line 9, in <module>
[rank1]: RuntimeError: Connection reset by peer
E1126 16:20:01 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1)
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
course_utils.distributed.train FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-26_16:20:01
  rank      : 1 (local_rank: 0)
  exitcode  : 1 (pid: 4242)
  error_file: <N/A>
============================================================
"""


@pytest.mark.parametrize(
    "logs, says",
    [
        (["", BOX], "exit codes [-9, 1]; rank 1, exitcode 1): RuntimeError: Connection reset"),
        (["", BOX.replace("[rank1]: RuntimeError: Connection reset by peer\n", "")],
         "rank 1, exitcode 1): no error printed (COURSE_DEBUG=1 keeps the agents' logs)"),
        (["oops\n=====\n", "=====\n"], "exit codes [-9, 1]): oops"),
        (["", ""], "): no output"),
    ],
)  # fmt: skip
def test_a_rank_that_dies_unreported_is_named_with_its_exit_code_and_exception(logs, says):
    # CI once printed only "the torchrun job failed (exit codes [-9, 1]): =====": the box's rule.
    error = _failure(Job([], [-9, 1], logs, 1.0, 0.0))
    assert says in str(error) and "\n" not in str(error) and "====" not in str(error)


def test_a_rank_that_crashes_below_python_is_named_with_its_signal_and_where(tmp_path):
    # CI once printed "rank 1, exitcode -6): no error printed": a rank aborted (SIGABRT) and
    # said nothing Python could see. launch() sets PYTHONFAULTHANDLER for the ranks; this is
    # what a real abort then prints.
    script = tmp_path / "train.py"
    script.write_text("import os\n\ndef step():\n    os.abort()\n\nstep()\n")
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    crash = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert crash.returncode == -6
    said = failure_saying(crash.stderr, exitcode=-6)
    assert (
        "rank 1, exitcode -6 (SIGABRT)): Fatal Python error: Aborted, in step (train.py:4)" in said
    )
    cpp = "terminate called after throwing an instance of 'gloo::IoException'\n  what():  closed\n"
    said = failure_saying(cpp, exitcode=-6)
    assert (
        "): terminate called after throwing an instance of 'gloo::IoException'; what():  closed"
        in said
    )


def failure_saying(output: str, exitcode: int) -> str:
    """_failure's line for a job whose rank 1 printed `output` and ended with `exitcode`."""
    box = BOX.replace("[rank1]: RuntimeError: Connection reset by peer\n", output)
    return str(
        _failure(
            Job(
                [], [-9, 1], ["", box.replace("exitcode  : 1", f"exitcode  : {exitcode}")], 1.0, 0.0
            )
        )
    )


def test_plans_lay_out_the_mesh_as_lesson_12_recommends():
    two_d = plan_for(["--parallel", "fsdp+pipeline"], 4, 2)  # 2 nodes x 2 processes
    assert two_d.mesh_names == ("pp", "dp") and two_d.mesh_shape == (2, 2) and two_d.shares == 2
    looped = plan_for(["--schedule", "interleaved"], 2, 1)
    assert looped.pipeline is not None and looped.pipeline.stages == 4
    assert looped.pipeline.placement == {0: 0, 1: 1, 2: 0, 3: 1}
    # A course schedule PyTorch has no class for goes through the CSV runtime.
    course = plan_for(["--schedule", "zb-h1"], 2, 1)
    assert course.pipeline is not None and course.pipeline.kind == "csv"
    assert course.pipeline.course is not None and course.pipeline.csv is None


def test_a_model_part_keeps_the_whole_models_names_and_computes_its_stage():
    setup = Setup("gpt", 4, 0)
    whole = build_model(setup)
    x, _ = make_batch(setup, 0)
    h = x
    names: set[str] = set()
    for first, last in stage_layers(setup, 3):
        part = model_part(setup, first, last)
        names |= {n for n, _ in part.named_parameters()}
        h = part(h)  # the parts one after the other compute the whole model
    assert names == {n for n, _ in whole.named_parameters()}
    assert torch.allclose(h, whole(x), atol=1e-6)


def test_only_complete_checkpoints_count(tmp_path):
    for step, complete in [(2, True), (4, True), (6, False)]:
        (tmp_path / f"step-{step}").mkdir()
        if complete:
            (tmp_path / f"step-{step}" / ".metadata").write_bytes(b"")
    (tmp_path / "step-x").mkdir()
    assert checkpoint.complete_steps(tmp_path) == [2, 4]
    assert checkpoint.latest_step(tmp_path) == 4
    assert checkpoint.latest_step(tmp_path, at_most=3) == 2
    assert checkpoint.latest_step(tmp_path / "none") is None


def test_outside_torchrun_the_module_says_how_to_start_it():
    with pytest.raises(CourseInputError, match="start this module with torchrun") as info:
        place_from_env({"RANK": "0"})
    assert "\n" not in str(info.value)
    place = place_from_env(
        {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
         "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "3"}
    )  # fmt: skip
    assert (place.node, place.nodes, place.restarts_left) == (1, 2, 2)


# --------------------------------------------------------------------------- real launches


def check_report(job, parallel: str, world: int, nodes: int, steps: int) -> dict:
    report = job.report
    assert report["parallel"] == parallel and report["world_size"] == world
    assert report["nodes"] == nodes and report["steps_done"] == steps
    assert report["max_param_diff"] <= TOL
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == list(range(world))
    assert [r["node"] for r in ranks] == [r // (world // nodes) for r in range(world)]
    assert len({r["pid"] for r in ranks}) == world  # real, separate processes
    for r in ranks:  # one machine, one clock: the estimate is off by at most half a round trip
        assert abs(r["clock_estimate_s"]) <= r["clock_rtt_s"] / 2 + 1e-6
        assert r["same_clock_as_rank_0"] and r["clock_offset_s"] == 0  # and is not applied
    assert ours() == []
    return report


def events(job, rank: int) -> list[str]:
    return [str(e.action) for e in job.timeline.device_events(rank)]


@pytest.mark.slow
def test_ddp_on_two_nodes_equals_one_process_and_checkpoints(tmp_path):
    job = launch(parallel="ddp", steps=4, checkpoint_dir=tmp_path / "ckpt")
    report = check_report(job, "ddp", 2, 2, 4)
    assert report["resumed_from"] is None and report["backend"] == "gloo"
    assert len(report["step_times_s"]) == 4 and min(report["step_times_s"]) > 0
    assert report["losses"][-1] < report["losses"][0]
    assert [c["step"] for c in report["checkpoints"]] == [2, 4]
    assert checkpoint.complete_steps(tmp_path / "ckpt") == [2, 4]
    for rank in range(2):
        actions = events(job, rank)
        assert [a for a in actions if "REDUCE" not in a] == [
            f"0{kind}{step}" for step in range(1, 5) for kind in "FB"
        ]
        assert sum("REDUCE_GRAD" in a for a in actions) >= 4  # DDP's bucketed all-reduces
    # The lesson's launch (2 agents + 2 processes) fits a laptop with the CPU build the course
    # installs; a CUDA build (make test-compat's older torch) loads about 400 MB more per process.
    budget = 1536 if torch.version.cuda is None else 4096
    assert 0 < job.peak_memory_mb < budget, (job.peak_memory_mb, torch.__version__)


@pytest.mark.slow
def test_fsdp_on_two_nodes_equals_one_process(tmp_path):
    job = launch(parallel="fsdp", steps=4, checkpoint_dir=tmp_path / "ckpt")
    check_report(job, "fsdp", 2, 2, 4)


@pytest.mark.slow
def test_pipeline_1f1b_across_two_nodes_runs_the_schedule(tmp_path):
    job = launch(parallel="pipeline", schedule="1f1b", steps=2)
    report = check_report(job, "pipeline", 2, 2, 2)
    assert report["schedule"] == "1f1b" and report["mesh"] == {"pp": 2}
    want = make_schedule("1f1b", 2, 4).as_strings()
    for rank in range(2):
        assert events(job, rank) == want[rank] * 2  # the course's 1F1B order, every step
    # Measured on rank 0's clock: stage 1 cannot start before stage 0 sent its activations.
    first = {str(e.action): e for e in sorted(job.timeline.events, key=lambda e: -e.start)}
    assert first["1F0"].start >= first["0F0"].end


@pytest.mark.slow
def test_the_learners_exported_csv_runs_across_two_nodes(tmp_path):
    zb = make_schedule("zb-h1", 2, 4)
    path = to_pytorch_csv(zb, tmp_path / "my_schedule.csv")
    job = launch(parallel="pipeline", csv=path, steps=2)
    report = check_report(job, "pipeline", 2, 2, 2)
    assert report["schedule"] == "my_schedule.csv (CSV)"
    for rank in range(2):
        assert events(job, rank) == zb.as_strings()[rank] * 2  # I and W as written


def full(path: Path) -> dict[str, torch.Tensor]:
    return checkpoint.load_full(path)


@pytest.mark.slow
def test_fsdp_pipeline_2d_mesh_a_crash_and_a_smaller_world(tmp_path):
    # 2 nodes x 2 processes: pipeline across the nodes, FSDP inside each.
    clean = launch(
        parallel="fsdp+pipeline", procs_per_node=2, steps=6, checkpoint_dir=tmp_path / "clean"
    )
    report = check_report(clean, "fsdp+pipeline", 4, 2, 6)
    assert report["mesh"] == {"pp": 2, "dp": 2}
    # The same run, its last rank killed at step 3: torchrun restarts everyone, once.
    crashed = launch(
        parallel="fsdp+pipeline",
        procs_per_node=2,
        steps=6,
        checkpoint_dir=tmp_path / "crashed",
        fail_at_step=3,
        max_restarts=1,
    )
    report = check_report(crashed, "fsdp+pipeline", 4, 2, 6)
    assert report["resumed_from"] == 2 and report["first_step"] == 3
    assert report["restart_count"] == 1 and len(report["step_times_s"]) == 4
    story = "\n".join(crashed.story())  # what lesson 13 prints of the agents' logs
    assert "node 1: course_utils.distributed.train: rank 3 (node 1): --fail-at-step 3" in story
    assert "Worker group FAILED" in story and "restart_count=1" in story
    assert (tmp_path / "crashed" / "failed-at-step-3").exists()
    a, b = full(tmp_path / "clean" / "step-6"), full(tmp_path / "crashed" / "step-6")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit for bit
    # The 4-process checkpoint resumed by one process with DDP: DCP reshards by name.
    shutil.copytree(tmp_path / "clean", tmp_path / "smaller")
    alone = launch(
        parallel="ddp", nodes=1, procs_per_node=1, steps=5, checkpoint_dir=tmp_path / "smaller"
    )
    report = check_report(alone, "ddp", 1, 1, 5)
    assert report["resumed_from"] == 4


@pytest.mark.slow
def test_a_bad_launch_stops_every_rank_with_one_line(tmp_path):
    path = to_pytorch_csv(make_schedule("1f1b", 3, 4), tmp_path / "three.csv")
    start = time.monotonic()
    with pytest.raises(CourseInputError) as info:
        launch(parallel="pipeline", csv=path, steps=2)
    assert time.monotonic() - start < 90  # bounded: every rank checked and stopped at once
    message = str(info.value)
    assert "\n" not in message and "has 3 rows" in message and "world size 2" in message
    job = info.value.job  # every agent ended on its own: no rank was left waiting
    assert job.stopped == [] and all(code != 0 for code in job.returncodes)
    assert sum(message in log for log in job.logs) == 2  # one line on each node's output
    assert ours() == []


@pytest.mark.slow
def test_a_node_that_never_comes_ends_the_rendezvous(tmp_path):
    # Only node 0 of a 2-node job: the rendezvous gives up after join_timeout (--rdzv-conf).
    logs = str(tmp_path / "logs")  # torchrun's own log folder, or it leaves one in /tmp
    command = torchrun_command(0, 2, 1, free_port(), "lonely", [], join_timeout=3, log_dir=logs)
    start = time.monotonic()
    agent = start_agent(command, tmp_path / "node0.log", dict(os.environ))
    try:
        code = agent.wait(timeout=90)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert code != 0 and time.monotonic() - start < 90
    assert "RendezvousTimeoutError" in (tmp_path / "node0.log").read_text()
    assert ours() == []


PARENT = """
import sys
from course_utils.distributed.launch import launch
launch(parallel="ddp", steps=1000, checkpoint_every=1000)
"""


@pytest.mark.slow
def test_killing_the_launcher_leaves_no_agent_or_rank_behind(tmp_path, monkeypatch):
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # where its scratch folder goes
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 120
        family: list[psutil.Process] = []
        while time.monotonic() < deadline:  # wait for 2 agents and their 2 train processes
            family = psutil.Process(parent.pid).children(recursive=True)
            commands = [command_of(p) for p in family]
            agents = [c for c in commands if "/torchrun " in c]
            trains = [c for c in commands if "-m course_utils.distributed.train" in c]
            trains = [c for c in trains if c not in agents]
            if len(agents) == 2 and len(trains) == 2:
                break
            time.sleep(0.5)
        assert len(family) >= 4, family
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 15
        alive = family
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"still running after the launcher died: {alive}"
    finally:
        if parent.poll() is None:
            parent.kill()
    # killed outright, it could not remove its folder: the next launch does
    (left,) = tmp_path.glob(f"course-job-{parent.pid}-*")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = scratch_folder("job")
    assert not left.exists() and mine.is_dir()
    mine.rmdir()


@pytest.mark.parametrize(
    "kwargs", [{"nodes": 0}, {"procs_per_node": 9}, {"max_restarts": -1}, {"timeout": 0}]
)
def test_launch_checks_its_own_arguments_before_starting_anything(kwargs):
    with pytest.raises(CourseInputError):
        launch(**kwargs)
    assert ours() == []
