"""Several answers of one exercise, each judged on its own: every wrong one named at once.

    fields = Fields()
    with fields.judging():
        judge(makespan, want, "makespan", hints)
    with fields.judging():
        judge(speedup, naive / want, "speedup", hints)
    fields.verdict()  # fails once, naming each wrong answer with its own hint

A learner who got three answers wrong hears about all three in one run of the check, not
one per run; an unanswered one is still "not answered yet" (read before any judging).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from course_utils.checks.feedback import CheckFailed, NotAnswered, fail


class Fields:
    """The failures of an exercise's answers, gathered one answer at a time."""

    def __init__(self) -> None:
        self.failures: list[CheckFailed] = []

    @contextmanager
    def judging(self) -> Iterator[None]:
        """Judge one answer inside: its failure is kept, and the next answer judged."""
        try:
            yield
        except NotAnswered:
            raise
        except CheckFailed as exc:
            self.failures.append(exc)

    def verdict(self) -> None:
        """Fail with every kept failure (one: its message alone), or return."""
        if len(self.failures) == 1:
            raise self.failures[0]
        if self.failures:
            said = "\n".join(f"- {f.message}" for f in self.failures)
            fail(f"{len(self.failures)} answers are not right yet:\n{said}")
