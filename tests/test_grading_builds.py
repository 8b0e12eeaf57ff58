"""Grading the per-rank Builds of lessons 08 to 10 in the sandbox: the verdict is the grader's.

The learner's kernel runs each program on its device threads, watched, and sends back what
the run did (shards, outputs, the bytes of every collective, the buffers held); the grader
judges it against what it computes itself on one device. A wrong program gets its hint
there too, and a kernel that claims a pass earns nothing.
"""

from __future__ import annotations

import copy
from pathlib import Path

import buildprograms as programs
import nbformat
import pytest

from course_utils.grading.batch import grade_all

pytestmark = [pytest.mark.slow, pytest.mark.needs_bwrap]  # graded in the sandbox, by its stand-in

ROOT = Path(__file__).resolve().parents[1]
NAMES = {
    8: "08_sharded_data_parallelism.ipynb",
    9: "09_sequence_context_parallelism.ipynb",
    10: "10_mixture_of_experts.ipynb",
}
CLAIMS_PASSED = """
import course_utils.checks.wire as _wire
_wire.call_outcome = lambda *a, **k: {"result": _wire.encode({"passed": True, "score": 1})}
"""


def answered(folder: str, lesson: int, k: int, code: str):
    nb = nbformat.read(ROOT / folder / NAMES[lesson], as_version=4)
    nb = copy.deepcopy(nb)
    cell = next(c for c in nb.cells if c.get("id") == f"answer-{lesson:02d}-{k}")
    cell.source = code
    return nb


def test_the_grader_judges_each_build_from_the_run_it_is_sent(tmp_path):
    subs = {
        "fsdp-keeps": (8, answered("exercises", 8, 6, programs.source(programs.keeps_gathered))),
        "ring-averaged": (9, answered("exercises", 9, 2, programs.source(programs.averaged))),
        "moe-claims": (
            10,
            answered("exercises", 10, 8, programs.source(programs.wrong_rank) + CLAIMS_PASSED),
        ),
        "moe-solved": (10, nbformat.read(ROOT / "solutions" / NAMES[10], as_version=4)),
    }
    for student, (lesson, nb) in subs.items():
        (tmp_path / student).mkdir()
        nbformat.write(nb, tmp_path / student / NAMES[lesson])
    results = {r.student: r for r in grade_all([tmp_path], jobs=2)}
    verdicts = {s: {e.id: e for e in r.exercises} for s, r in results.items()}
    assert not verdicts["fsdp-keeps"]["8.6"].passed
    assert "layer 0's gathered parameters" in verdicts["fsdp-keeps"]["8.6"].message
    assert not verdicts["ring-averaged"]["9.2"].passed
    assert "same share of the softmax" in verdicts["ring-averaged"]["9.2"].message
    claimed = verdicts["moe-claims"]["10.8"]
    assert not claimed.passed and "did not come back as the record of a run" in claimed.message
    assert all(e.passed for e in results["moe-solved"].exercises), results["moe-solved"]
