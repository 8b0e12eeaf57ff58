"""Verdicts, decided in the grader's own process from a submission's answers as data.

For each exercise the grader calls the lesson's own check, `exercise_K(*answers, variant=...)`,
exactly as the notebook does, but here, where the learner's code never ran: the answers
are decoded values (`course_utils.checks.wire`), and a function answer is a `Replay` of what
it returned in the learner's kernel on the inputs `cases_K` drew. An exercise passes only
when its check returns and prints its ✅ line: an error, a missing answer, or any surprise
is a fail with the reason. A check declared with partial credit (`checks.scoring`) judges
each of its parts here too, each case on the evidence the kernel sent, and the share of
parts right rides on the failure it raises (`CheckFailed.share`): that share, read only from
such a check and only from what it raised here, is the verdict's `share` (1 for a pass).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from types import ModuleType

from course_utils.checks import PASSED_MARK, CheckFailed, Variant
from course_utils.checks.wire import Replay, decode
from course_utils.grading.sandbox import Exercise


@dataclass
class Verdict:
    exercise: int
    passed: bool
    message: str
    share: float = 0.0  # of the exercise's points earned: 1 for a pass, a part's for a fail


def worth(module: ModuleType, k: int) -> tuple[float, bool]:
    """(points, partial): what exercise K of `module` is worth, as its check declares."""
    check = getattr(module, f"exercise_{k}", None)
    return float(getattr(check, "points", 1)), bool(getattr(check, "partial", False))


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
    except CheckFailed as exc:  # NotAnswered too: a part may be answered, and right
        share = min(max(float(exc.share), 0.0), 1.0) if worth(module, k)[1] else 0.0
        return Verdict(k, False, _with_problems(exc.message, problems), share)
    except Exception as exc:  # an answer the check could not handle: never a pass
        return Verdict(
            k,
            False,
            f"{label}: the check could not judge this answer ({type(exc).__name__}: {exc})",
        )
    printed = out.getvalue().strip()
    if not printed.startswith(PASSED_MARK):
        return Verdict(k, False, f"{label}: the check gave no verdict")
    return Verdict(k, True, printed.removeprefix(PASSED_MARK).strip(), 1.0)


def _with_problems(message: str, problems: list[str]) -> str:
    return message if not problems else f"{message} ({'; '.join(problems)})"
