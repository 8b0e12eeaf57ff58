"""Verdicts, decided in the grader's own process from a submission's answers as data.

For each exercise the grader calls the lesson's own check, `exercise_K(*answers, variant=...)`,
exactly as the notebook does, but here, where the learner's code never ran: the answers
are decoded values (`course_utils.checks.wire`), and a function answer is a `Replay` of what
it returned in the learner's kernel on the inputs `cases_K` drew. An exercise passes only
when its check returns and prints its ✅ line: an error, a missing answer, or any surprise
is a fail with the reason.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from types import ModuleType

from course_utils.checks import PASSED_MARK, CheckFailed, NotAnswered, Variant
from course_utils.checks.wire import Replay, decode
from course_utils.grading.sandbox import Exercise


@dataclass
class Verdict:
    exercise: int
    passed: bool
    message: str


def cases_for(module: ModuleType, k: int, variant: Variant) -> dict[str, list[tuple]]:
    """The inputs exercise K's check calls a function answer on ({} when it takes no function)."""
    cases = getattr(module, f"cases_{k}", None)
    return cases(variant) if cases else {}


def judge(
    module: ModuleType, exercise: Exercise, found: dict, variant: Variant, problems: list[str]
) -> Verdict:
    """The verdict on one exercise from what the capture found in the learner's kernel."""
    k = exercise.k
    label = f"Exercise {module.__name__.rsplit('.l', 1)[-1].lstrip('0')}.{k}"
    values: dict[str, object] = {}
    cases = cases_for(module, k, variant)
    for expression in exercise.expressions:
        got = found.get(expression)
        if got is None or "missing" in got:
            why = "; ".join(problems) or f"`{expression}` is not defined in the notebook"
            return Verdict(k, False, f"{label} is not answered: {why}")
        if "error" in got:
            return Verdict(k, False, f"{label}: `{expression}` could not be read: {got['error']}")
        if "calls" in got:
            values[expression] = Replay(expression, cases[expression], got["calls"])
        elif "function" in got:
            return Verdict(k, False, f"{label}: `{expression}` is a function, a value was expected")
        else:
            values[expression] = decode(got["value"])
    args = [values[e] for e in exercise.args]
    kwargs = {name: values[e] for name, e in exercise.kwargs.items()}
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            getattr(module, f"exercise_{k}")(*args, **kwargs, variant=variant)
    except NotAnswered as exc:
        return Verdict(k, False, _with_problems(exc.message, problems))
    except CheckFailed as exc:
        return Verdict(k, False, _with_problems(exc.message, problems))
    except Exception as exc:  # an answer the check could not handle: never a pass
        return Verdict(
            k,
            False,
            f"{label}: the check could not judge this answer ({type(exc).__name__}: {exc})",
        )
    printed = out.getvalue().strip()
    if not printed.startswith(PASSED_MARK):
        return Verdict(k, False, f"{label}: the check gave no verdict")
    return Verdict(k, True, printed.removeprefix(PASSED_MARK).strip())


def _with_problems(message: str, problems: list[str]) -> str:
    return message if not problems else f"{message} ({'; '.join(problems)})"
