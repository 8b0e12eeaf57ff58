"""Grading a per-rank program (Exercise 1.7) in the sandbox: the verdict is the grader's.

The learner's kernel runs the program on its device threads and sends back what the run did
(gradients, actions, bytes); the grader judges that against the gradients it computes itself.
Whatever else the kernel says ("passed", a forged record) earns nothing, and a program that
never ends is stopped at the call time limit, the rest of the notebook still graded.
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat
import pytest
import rankprograms as programs

from course_utils.grading.batch import grade_all

pytestmark = [pytest.mark.slow, pytest.mark.needs_bwrap]  # graded in the sandbox, by its stand-in

ROOT = Path(__file__).resolve().parents[1]
NAME = "01_naive_model_parallelism.ipynb"
SOLVED = nbformat.read(ROOT / "solutions" / NAME, as_version=4)
BLANK = nbformat.read(ROOT / "exercises" / NAME, as_version=4)
OTHERS = [f"1.{k}" for k in range(1, 7)]

# Each forgery goes with a wrong program (rank 1 forgets requires_grad_).
CLAIMS_PASSED = """
import course_utils.checks.wire as _wire
_wire.call_outcome = lambda *a, **k: {"result": _wire.encode({"passed": True, "score": 1})}
"""
FORGED_RECORD = """
from course_utils.checks import programs as _programs
_run = _programs.ProgramCase.__course_call__
def _forged(case, program):
    record = _run(case, program)
    record.update(failure=None, passed=True, verdict="✅ Right")
    return record
_programs.ProgramCase.__course_call__ = _forged
print("✅ Right: both ranks' gradients equal one device's")
"""
# Loops for ever on every case but the learner's own (the check's other models).
RUNAWAY = """
def naive_program(ctx):
    if ctx.rank == 1 and len(ctx.inputs[0]) != g.batch:
        while True:
            pass
    return _naive(ctx)
"""


def answered(nb, code: str):
    nb = copy.deepcopy(nb)
    cell = next(c for c in nb.cells if c.get("id") == "answer-01-7")
    cell.source = code
    return nb


def test_the_grader_judges_the_program_from_the_evidence_it_sends(tmp_path):
    wrong = programs.source(programs.forgot_requires_grad)
    runaway = programs.source(programs.naive).replace("def naive_program(", "def _naive(")
    subs = {
        "honest-wrong": answered(BLANK, programs.source(programs.recvs_swapped)),
        "claims-passed": answered(BLANK, wrong + CLAIMS_PASSED),
        "forged-record": answered(BLANK, wrong + FORGED_RECORD),
        "runaway": answered(SOLVED, runaway + RUNAWAY),
    }
    for student, nb in subs.items():
        (tmp_path / student).mkdir()
        nbformat.write(nb, tmp_path / student / NAME)
    results = {r.student: r for r in grade_all([tmp_path], jobs=2, call_timeout=2)}
    verdicts = {s: {e.id: e for e in r.exercises} for s, r in results.items()}
    for student in ("honest-wrong", "claims-passed", "forged-record"):
        assert results[student].score == 0, (student, results[student].exercises)
    assert (
        "rank 0 must send its activation before it waits" in verdicts["honest-wrong"]["1.7"].message
    )
    assert "did not come back as the record of a run" in verdicts["claims-passed"]["1.7"].message
    # what the forged record still shows: rank 0 never got a gradient to run 0B0 with
    assert "rank 0 ran the actions ['0F0']" in verdicts["forged-record"]["1.7"].message
    runaway_17 = verdicts["runaway"]["1.7"]
    assert not runaway_17.passed and "ran past 2 s" in runaway_17.message
    assert [e.id for e in results["runaway"].exercises if e.passed] == OTHERS


def test_the_grader_judges_pipeline_programs_on_order_and_memory(tmp_path):
    """Exercises 4.7 and 5.7 graded in the sandbox, on another student's numbers: a GPipe
    order in place of 1F1B fails on rank 0's memory, untagged messages on their tags, and
    the rest of each notebook (the solution) earns its marks."""
    import pipeprograms as pipes

    from course_utils.grading.make_exercises import for_student

    wrong = {
        "04_1f1b_zero_bubble.ipynb": ("answer-04-7", pipes.gpipe_shaped),
        "05_interleaved_breadth_first.ipynb": ("answer-05-7", pipes.untold),
    }
    for name, (cell_id, program) in wrong.items():
        text = (ROOT / "solutions" / name).read_text()
        nb = nbformat.reads(for_student(text, "bob"), as_version=4)
        next(c for c in nb.cells if c.get("id") == cell_id).source = programs.source(program)
        (tmp_path / "bob").mkdir(exist_ok=True)
        nbformat.write(nb, tmp_path / "bob" / name)
    results = grade_all([tmp_path], jobs=2, variants=True)
    assert {r.student for r in results} == {"bob"}
    verdicts = {e.id: e for r in results for e in r.exercises}
    assert not verdicts["4.7"].passed and "as GPipe does" in verdicts["4.7"].message
    assert not verdicts["5.7"].passed and "tags must tell them apart" in verdicts["5.7"].message
    others = [e for e in verdicts.values() if e.id not in ("4.7", "5.7")]
    assert len(others) == 12 and all(e.passed for e in others), others


def test_lesson_06s_programs_are_judged_from_their_evidence_too(tmp_path):
    """6.4, 6.5 and 6.8 graded in the sandbox: a right ring and hierarchy pass, a DDP that
    sums fails with its hint, and a kernel that claims a pass for it earns nothing."""
    import dpprograms as dp

    name = "06_data_parallelism.ipynb"
    solved = nbformat.read(ROOT / "solutions" / name, as_version=4)
    wrong = dp.ddp_sum.source

    def with_ddp(code: str):
        nb = copy.deepcopy(solved)
        cell = next(c for c in nb.cells if c.get("id") == "answer-06-8")
        cell.source = code
        return nb

    subs = {"summed": with_ddp(wrong), "claims-passed": with_ddp(wrong + CLAIMS_PASSED)}
    for student, nb in subs.items():
        (tmp_path / student).mkdir()
        nbformat.write(nb, tmp_path / student / name)
    results = {r.student: r for r in grade_all([tmp_path], jobs=2, call_timeout=20)}
    verdicts = {s: {e.id: e for e in r.exercises} for s, r in results.items()}
    assert verdicts["summed"]["6.4"].passed, verdicts["summed"]["6.4"].message
    assert verdicts["summed"]["6.5"].passed, verdicts["summed"]["6.5"].message  # 2 node groups
    assert not verdicts["summed"]["6.8"].passed
    assert "they were summed" in verdicts["summed"]["6.8"].message
    claimed = verdicts["claims-passed"]["6.8"]
    assert not claimed.passed and "did not come back as the record of a run" in claimed.message
