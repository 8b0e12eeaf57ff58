"""Every lesson run top to bottom, once, pinned to one core: it passes, within its budget,
and every headline it prints agrees with the simulator.

The runs are tests/notebook_runs.py's (every notebook of the course once per session,
two at a time, each pinned to its own core: the Binder case). A lesson must run without
error (what nbval checks; `make notebooks` still runs nbval for instructors), in under a
minute on one core (lesson 13, which starts real processes: two) and 1 GB, and every
headline it prints (`course_utils.measure.headline`:
a ratio measured on the virtual clock beside the simulator's prediction from the same
run's costs) must be within 10% of its prediction; lessons 02 to 12 must print at least one.
The same lessons beside a CPU hog: tests/test_constrained.py (`make test-constrained`).
"""

from __future__ import annotations

import pytest
from notebook_runs import LESSONS, READS_THE_RUNS, run

BUDGET_S, BUDGET_MB = 60, 1024
# Lesson 13 starts real processes (gloo ranks, two torchrun agents and their restart):
# Binder's two minutes are its budget.
BUDGET_S_PROCESSES = {"13": 120}
TOLERANCE = 0.10
MEASURED = {f"{n:02d}" for n in range(2, 13)}  # lessons with a measured headline

pytestmark = [pytest.mark.slow, READS_THE_RUNS]


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_lesson_runs_clean_within_its_budget_on_one_core(lesson):
    result = run(lesson)
    assert result.error is None, result.error
    budget = BUDGET_S_PROCESSES.get(lesson.name[:2], BUDGET_S)
    assert result.seconds < budget, f"{result.seconds:.0f} s on one core (budget {budget} s)"
    assert result.peak_mb < BUDGET_MB, f"{result.peak_mb:.0f} MB"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_every_headline_agrees_with_its_prediction(lesson):
    result = run(lesson)
    if lesson.name[:2] in MEASURED:
        assert result.headlines, f"{lesson.name} printed no headline"
    for h in result.headlines:
        gap = h["measured"] / h["predicted"] - 1
        assert abs(gap) <= TOLERANCE, (
            f"{h['section']}: {h['what']} vs {h['baseline']} measured {h['measured']:.3f}x, "
            f"predicted {h['predicted']:.3f}x ({gap:+.0%})"
        )
        # the sentence the lesson printed for it says what the numbers say
        assert f"{h['what'][:1].upper()}{h['what'][1:]}" in result.stdout, h["what"]
