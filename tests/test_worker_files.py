"""A worker file on real processes (`distributed.workers`): what each rank returned and called,
a deadlock named within seconds, an error with its line, a hang stopped, nothing left behind.

Every run starts two fresh Pythons (a few seconds each, importing torch): those tests are
`slow`; the bad-input ones and the files caught before any process starts are not.
"""

from __future__ import annotations

import time

import psutil
import pytest
import torch
import workerfiles as files

from course_utils.checks import wire
from course_utils.distributed.workers import Worker, run_worker
from course_utils.errors import CourseInputError, WorkerError


def gone(pids: list[int]) -> bool:
    """No process of these ids is left (a zombie is gone too: it only waits to be reaped)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


@pytest.mark.slow
def test_the_ring_returns_every_ranks_sum_and_reports_its_calls(capsys):
    xs = [torch.tensor([1.0, 2.0]), torch.tensor([10.0, 20.0])]
    run = files.ring().run(rank_args=[(x,) for x in xs])
    assert all(torch.equal(t, torch.tensor([11.0, 22.0])) for t in run.returned)
    assert [[c["op"] for c in calls] for calls in run.calls] == [
        ["init_process_group", "isend", "recv"]
    ] * 2
    assert [c["peer"] for c in run.calls[0][1:]] == [1, 1]
    assert run.calls[0][1]["bytes"] == 8  # two float32 numbers
    assert run.failure is None and gone(run.pids)


@pytest.mark.slow
def test_a_model_comes_back_trained_as_its_parameters_and_prints_come_back_per_rank(capsys):
    text = files.DDP.replace(
        "    dist.destroy_process_group()\n", "    print('done', dist.get_rank())\n"
    )
    from course_utils.checks.processes import WorkerDDPCase
    from course_utils.checks.worker_runs import trained

    case = WorkerDDPCase(2, 4, 8, 2, seed=3)
    run = files.ddp(text).run(rank_args=case.shards())  # it never left the group: done for it
    printed = capsys.readouterr().out
    assert "[rank 0] done 0" in printed and "[rank 1] done 1" in printed
    assert "[Gloo]" not in printed  # torch's own greeting is not the learner's output
    want = trained(case)
    for args in run.arguments:
        assert args[0].keys() == want.keys()
        assert all(torch.allclose(args[0][k], want[k], atol=1e-6) for k in want)


@pytest.mark.slow
def test_a_deadlock_is_named_within_seconds_with_who_waits_for_whom():
    start = time.monotonic()
    run = files.ring(files.both_send_first).run(torch.ones(3), raise_failure=False, echo=False)
    failure = run.failure
    assert failure["kind"] == "deadlock"
    for rank, peer in ((0, 1), (1, 0)):
        assert f"rank {rank} waits in send to rank {peer}, at " in failure["message"]
    assert "line 12 (`dist.send(passing, dst=right)`)" in failure["message"]
    assert time.monotonic() - start < 60  # ~3 s past the start-up, not the 60 s limit
    assert gone(run.pids)
    with pytest.raises(WorkerError, match="deadlock: rank 0 waits in send"):
        files.ring(files.both_send_first).run(torch.ones(3), echo=False)


@pytest.mark.slow
def test_a_rank_that_raises_is_named_with_its_line_and_a_finished_peer_is_not_waited_for():
    run = files.ddp(files.raises).run(*_one_shard(), raise_failure=False, echo=False)
    assert run.failure["kind"] == "raised"
    assert "raised ValueError: step too big, at " in run.failure["message"]
    assert "line 17" in run.failure["message"]
    assert gone(run.pids)
    # A rank that returns while the other waits for it: nobody is left to send.
    early = files.RING.replace(
        "    rank, world", "    if dist.get_rank() == 0:\n        return x\n    rank, world"
    )
    run = files.ring(early).run(torch.ones(2), raise_failure=False, echo=False)
    assert run.failure["kind"] == "deadlock"
    assert "rank 0 has finished; rank 1 waits in recv from rank 0" in run.failure["message"]


def _one_shard():
    from course_utils.checks.processes import WorkerDDPCase

    return WorkerDDPCase(2, 4, 8, 1, seed=1).shards()[0]


@pytest.mark.slow
def test_a_rank_that_never_ends_is_stopped_at_the_timeout_and_says_where_it_was():
    run = files.ring(files.hangs).run(torch.ones(2), timeout=25, raise_failure=False, echo=False)
    failure = run.failure
    assert failure["kind"] == "timeout" and "ran past 25 s" in failure["message"]
    assert "rank 1 was running" in failure["message"]
    assert "rank 0 was waiting in" in failure["message"]
    assert gone(run.pids) and not files.ranks_left(run.pids)


@pytest.mark.slow
def test_the_graders_call_limit_stops_the_ranks_and_leaves_none(monkeypatch):
    """Graded, the kernel calls a case under `wire.call_outcome`'s time limit: past it the
    launcher's `finally` kills every rank (here a worker that spins on both ranks)."""
    from course_utils.checks.processes import WorkerRingCase

    spin = files.RING.replace(
        "    dist.init_process_group", "    while True:\n        pass\n    dist.init_process_group"
    )
    monkeypatch.setattr(WorkerRingCase, "least_call_seconds", 0.0)  # the limit as given
    outcome = wire.call_outcome(files.ring(spin), (WorkerRingCase(2, 3, 1),), limit_s=8)
    assert "timeout" in outcome and outcome["seconds"] < 20
    assert not files.ranks_left()


def test_a_case_that_starts_processes_gets_at_least_its_own_time():
    from course_utils.checks.processes import WorkerRingCase

    seen = {}

    class Case(WorkerRingCase):
        def __course_call__(self, worker):
            time.sleep(0.3)  # past the 0.1 s the grader gave: its floor of 1 s holds
            seen["ran"] = True
            return {}

    Case.least_call_seconds = 1.0
    outcome = wire.call_outcome(lambda: None, (Case(2, 3, 1),), limit_s=0.1)
    assert seen and "result" in outcome, outcome


def test_bad_input_is_one_line(tmp_path):
    path = tmp_path / "w.py"
    path.write_text("def main():\n    return 1\n")
    for call, match in [
        (lambda: run_worker(path, "main", world=0), "world must be an integer from 1 to 4"),
        (lambda: run_worker(path, "main", world=True), "world must be an integer"),
        (lambda: run_worker(path, "no such"), "function must be the name"),
        (lambda: run_worker(path, "main", timeout=0), "timeout must be a number"),
        (lambda: run_worker(path, "main", rank_args=[()]), "a tuple per rank"),
        (lambda: Worker(path, "main", world=9), "world must be"),
    ]:
        with pytest.raises(CourseInputError, match=match):
            call()


def test_what_is_wrong_with_the_file_is_found_before_any_process_starts(tmp_path):
    stub = tmp_path / "stub.py"
    stub.write_text(
        'def ring_sum(x):\n    """Doc."""\n    # YOUR CODE HERE\n    raise NotImplementedError()\n'
    )
    with pytest.raises(NotImplementedError):
        run_worker(stub, "ring_sum")
    broken = tmp_path / "broken.py"
    broken.write_text("def ring_sum(x):\n    return (\n")
    run = run_worker(broken, "ring_sum", raise_failure=False, echo=False)
    assert (
        run.failure["kind"] == "raised"
        and "broken.py line 2: SyntaxError" in run.failure["message"]
    )
    run = run_worker(tmp_path / "nowhere.py", "ring_sum", raise_failure=False, echo=False)
    assert run.failure["kind"] == "missing" and "%%writefile" in run.failure["message"]
    other = tmp_path / "other.py"
    other.write_text("def something_else():\n    pass\n")
    with pytest.raises(WorkerError, match="other.py has no `ring_sum`"):
        run_worker(other, "ring_sum", echo=False)
    assert run.seconds < 5 and not run.pids


def test_lesson_13_writes_its_own_torch_distributed_worker_and_launches_it():
    import re

    import nbformat
    from conftest import ROOT

    lesson = nbformat.read(ROOT / "notebooks" / "13_beyond_one_machine.ipynb", as_version=4)
    code = [c.source for c in lesson.cells if c.cell_type == "code"]
    call = re.compile(r"\bdist\.(init_process_group|all_reduce|isend|recv|all_gather)\(")
    calling = [s for s in code if call.search(s)]
    assert len(calling) >= 3 and all(s.startswith("%%writefile") for s in calling)
    assert "init_device_mesh(" in "\n".join(calling)
    assert any('run_worker("lesson13_worker.py", "main"' in s for s in code)


def test_the_gpu_script_finds_the_lessons_worker_file_and_what_it_forces():
    """benchmarks/gpu_lesson13.py runs the lesson's own file on NCCL (on a GPU machine only):
    it must find the cells that write it, and the lines it changes to force NCCL."""
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("gpu13", ROOT / "benchmarks/gpu_lesson13.py")
    assert spec is not None and spec.loader is not None
    gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu)
    text = gpu.worker_text()
    compile(text, "lesson13_worker.py", "exec")
    assert all(old in text for old, _ in gpu.FORCED)
    assert 'BACKEND, DEVICE = ("nccl", f"cuda:{LOCAL_RANK}") if ON_GPU else ("gloo", "cpu")' in text
    assert "def main():" in text and "def hello():" in text and "def mesh():" in text
