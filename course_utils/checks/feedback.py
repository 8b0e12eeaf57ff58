"""What a learner sees from a check: one kind message, never a stack trace.

`CheckFailed` is a wrong answer (an AssertionError, so plain Python and pytest count it as a
failed check) and `NotAnswered` an answer still missing; in IPython each renders as its
mark and message only. `passed` prints a right answer's line, `fail` raises with a hint that
never gives the answer, `require` turns a placeholder (None, `...`) into NotAnswered, and
`exercise_label` names the exercise being checked ("Exercise 3.2").
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, NoReturn

# What a learner sees in front of a message (the grader also uses these to find the message).
FAILED_MARK = "❌"
NOT_ANSWERED_MARK = "✋"
PASSED_MARK = "✅"


class CheckFailed(AssertionError):
    """A wrong answer. In a notebook it shows as one kind message and no stack trace.

    It is an AssertionError so that plain Python and pytest treat it as a failed check.
    """

    mark = FAILED_MARK
    # The share of the exercise's parts that hold, and (right, parts): set by the check of an
    # exercise with partial credit once it has judged each part (`scoring`), else nothing.
    share: float = 0.0
    parts: tuple[int, int] | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def _render_traceback_(self) -> list[str]:
        # IPython calls this instead of formatting the traceback: the learner needs the
        # feedback, not the checker's internals.
        return [f"{self.mark} {line}" if i == 0 else line for i, line in enumerate(self.lines())]

    def lines(self) -> list[str]:
        return self.message.splitlines() or [""]


class NotAnswered(CheckFailed):
    """The exercise has no answer yet (None, `...`, or a function still raising
    NotImplementedError). Message: "Exercise N.K is not answered yet: ..."."""

    mark = NOT_ANSWERED_MARK

    def __init__(self, detail: str, exercise: str | None = None) -> None:
        label = exercise or exercise_label()
        super().__init__(f"{label} is not answered yet: {detail}")
        self.detail = detail


# The exercise a check is judging (set by `exercise`, read by `exercise_label`).
EXERCISE_LABEL: ContextVar[str | None] = ContextVar("exercise_label", default=None)


def exercise_label() -> str:
    """'Exercise 3.2' inside the check `exercise_2` of `course_utils.checks.l03` (as `exercise`
    declares it), 'This exercise' elsewhere."""
    return EXERCISE_LABEL.get() or "This exercise"


def passed(message: str) -> None:
    """Print the success line of a check, e.g. passed("Right: 3 of 11 slots are idle.")."""
    print(f"{PASSED_MARK} {message}")


def fail(message: str) -> NoReturn:
    """Raise CheckFailed(message): a wrong answer, with a hint that does not give it away."""
    raise CheckFailed(message)


def expect_choice(got: Any, right: Any, hints: dict[Any, str], message: str) -> None:
    """Fail unless `got == right`, explaining the wrong option chosen.

    `hints` holds one explanation per wrong option; `message` may use {got!r} and {hint}.
    """
    if got != right:
        fail(message.format(got=got, hint=hints.get(got, "")))


def _is_unanswered(value: Any) -> bool:
    return value is None or value is NotImplemented or value is Ellipsis


def require(value: Any, what: str) -> Any:
    """Return `value`, or raise NotAnswered if it is a placeholder (None, ..., NotImplemented)."""
    if _is_unanswered(value):
        raise NotAnswered(
            f"`{what}` is still {value!r}. Set it in the answer cell above, "
            "run that cell, then this one."
        )
    return value
