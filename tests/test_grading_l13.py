"""Grading lesson 13's worker files in the sandbox: real processes, the verdict the grader's.

The learner's kernel runs each worker file on two processes inside its sandbox (gloo on the
sandbox's own loopback, no host name needed) and sends back what the processes did; the
grader judges that. A worker that deadlocks fails with who waits for whom, one that never
ends is stopped at the call's time limit, one that crashes is named; the rest of the notebook
is still graded, and no process of any of them outlives the grade.
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat
import pytest
import workerfiles as files

from course_utils.grading.batch import grade_all

pytestmark = [pytest.mark.slow, pytest.mark.needs_bwrap]  # graded in the sandbox, by its stand-in

ROOT = Path(__file__).resolve().parents[1]
NAME = "13_beyond_one_machine.ipynb"
SOLVED = nbformat.read(ROOT / "solutions" / NAME, as_version=4)
BLANK = nbformat.read(ROOT / "exercises" / NAME, as_version=4)
OTHERS = ["13.1", "13.4", "13.5"]
# Rank 1 dies at once, as if killed: no error of its own to report.
CRASHES = files.edit(
    files.DDP, ("    world = dist.get_world_size()\n",
                "    world = dist.get_world_size()\n    if dist.get_rank() == 1:\n"
                "        import os, signal\n        os.kill(os.getpid(), signal.SIGKILL)\n"),
)  # fmt: skip
# Forges the evidence of a right run: the sums it claims are not the inputs' the grader drew.
FORGED = """
from course_utils.checks import processes as _p
def _forged(case, worker):
    return {"world": 2, "returned": [x * 0 for x in case.inputs()], "arguments": [[], []],
            "calls": [[{"op": "isend"}, {"op": "recv"}]] * 2, "failure": None, "passed": True}
_p.WorkerRingCase.__course_call__ = _forged
"""


def answered(nb, ring: str | None = None, ddp: str | None = None, extra: str = ""):
    """`nb` with these worker files as its answers, and without the cells that try them out
    (the learner's own: a run less each, the check's runs are what is graded)."""
    nb = copy.deepcopy(nb)
    nb.cells = [c for c in nb.cells if c.get("id") not in ("s13-code-05", "s13-code-07")]
    for cell in nb.cells:
        if cell.get("id") == "answer-13-2" and ring is not None:
            cell.source = files.cell(ring, "ring_worker.py")
        if cell.get("id") == "answer-13-3" and ddp is not None:
            cell.source = files.cell(ddp, "ddp_worker.py")
        if cell.get("id") == "answer-13-1" and extra:
            cell.source += "\n" + extra
    return nb


def test_the_grader_runs_the_workers_in_the_sandbox_and_judges_what_they_did(tmp_path):
    subs = {
        "deadlock-sum": answered(SOLVED, files.both_send_first, files.no_division),
        "hang-crash": answered(SOLVED, files.hangs, CRASHES),
        "forged": answered(SOLVED, files.forgot_own, extra=FORGED),
        "unanswered": BLANK,
    }
    for student, nb in subs.items():
        (tmp_path / student).mkdir()
        nbformat.write(nb, tmp_path / student / NAME)
    results = {r.student: r for r in grade_all([tmp_path], jobs=2, call_timeout=30)}
    verdicts = {s: {e.id: e for e in r.exercises} for s, r in results.items()}
    for student, r in results.items():
        assert r.problem is None, (student, r.problem)

    said = verdicts["deadlock-sum"]
    assert "deadlock: rank 0 waits in send to rank 1" in said["13.2"].message
    assert "Divide by the world size" in said["13.3"].message
    assert [e for e in verdicts["deadlock-sum"] if said[e].passed] == OTHERS

    said = verdicts["hang-crash"]
    assert not said["13.2"].passed and "ran past" in said["13.2"].message, said["13.2"].message
    assert "rank 1 exited with signal SIGKILL" in said["13.3"].message, said["13.3"].message
    assert [e for e in said if said[e].passed] == OTHERS

    said = verdicts["forged"]  # "passed": a kernel's claim; its sums are not the grader's
    assert "not the sum of every rank's" in said["13.2"].message, said["13.2"].message
    assert [e for e in said if said[e].passed] == ["13.1", "13.3", "13.4", "13.5"]
    assert results["unanswered"].score == 0
    assert "not answered" in verdicts["unanswered"]["13.2"].message
    assert not files.ranks_left()
