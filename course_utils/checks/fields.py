"""Several answers of one exercise, each judged on its own: every wrong one named at once.

    fields = Fields()
    with fields.judging():
        judge(makespan, want, "makespan", hints)
    fields.judge(speedup, naive / want, "speedup", hints)  # the same, in one line
    fields.verdict()  # fails once, naming each wrong answer with its own hint

A learner who got three answers wrong hears about all three in one run of the check, not
one per run; an unanswered one is still "not answered yet" (read before any judging).

Each `judging()` block is one part of the exercise. A judging function called inside a block
(`exercise` judges a Diagnose's tables this way, then the rest of the check in one block)
may keep its own `Fields`: its answers count as parts one by one and its failures join the
outer list, so the learner reads one flat list. The last verdict tells `scoring` how many
parts held, for an exercise with partial credit (`exercise(..., partial=True)`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from course_utils.checks import scoring
from course_utils.checks.feedback import CheckFailed, NotAnswered
from course_utils.checks.judging import judge
from course_utils.checks.reading import as_choice

# The Fields judged inside the current `judging()` block, newest last (a judging function's).
_INNER: ContextVar[list[Fields] | None] = ContextVar("inner_fields", default=None)


class Fields:
    """The failures of an exercise's answers, gathered one answer at a time."""

    def __init__(self) -> None:
        self.failures: list[CheckFailed] = []
        self.judged = 0  # parts judged: a block each, or the parts of a Fields inside it
        self.raised: CheckFailed | None = None

    @contextmanager
    def judging(self) -> Iterator[None]:
        """Judge one answer inside: its failure is kept, and the next answer judged."""
        inner: list[Fields] = []
        token = _INNER.set(inner)
        try:
            yield
        except NotAnswered:
            raise
        except CheckFailed as exc:
            if inner and exc is inner[-1].raised:  # the inner verdict: its failures, flat
                self.failures.extend(inner[-1].failures)
            else:
                self.failures.append(exc)
        finally:
            _INNER.reset(token)
            self.judged += inner[-1].judged if inner else 1

    def judge(self, value: Any, want: Any, what: str, *args: Any, **kwargs: Any) -> None:
        """`judge(value, want, what, ...)` (checks.judging) as one answer of these fields;
        with `choices=(...)`, `value` is first read as one of them (`as_choice`), so an
        answer none of them names is one wrong answer among the others, not the only one."""
        choices = kwargs.pop("choices", None)
        with self.judging():
            if choices is not None:
                value = as_choice(value, choices, what)
            judge(value, want, what, *args, **kwargs)

    def verdict(self) -> None:
        """Fail with every kept failure (one: its message alone), or return."""
        outer = _INNER.get()
        if outer is not None:
            outer.append(self)
        scoring.parts_judged(self.judged - len(self.failures), self.judged)
        if len(self.failures) == 1:
            self.raised = self.failures[0]
        elif self.failures:
            said = "\n".join(f"- {f.message}" for f in self.failures)
            self.raised = CheckFailed(f"{len(self.failures)} answers are not right yet:\n{said}")
        if self.raised is not None:
            raise self.raised
