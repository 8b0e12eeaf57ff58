"""The exercise-check framework: kind, specific feedback for answers in exercise notebooks.

An exercise notebook has, per exercise, an answer cell (tag "answer") and a check cell
(tag "check", id "check-NN-K") that makes ONE call, e.g. `check.exercise_1(bubble_fraction)`,
where `check = lNN.for_student(name)` binds the lesson's check module `course_utils.checks.lNN`
to the learner's numbers. A check module declares, per exercise, its given numbers, the shape
of each answer, the right answer and the hints keyed to the mistake they name:

    for_student = checks.lesson_checks(__name__)
    given_1 = numbers(p=pick("1p", 4, [3, 5, 6]), m=pick("1m", 12, [6, 8, 16]))

    @exercise(given_1, bubble_fraction="number")
    def exercise_1(g, bubble_fraction) -> str:
        hints = {
            "That is relative to the busy time; the question asks ...": (g.p - 1) / g.m,
            "Not yet. Count busy slots and idle slots ...": OTHERWISE,
        }
        judge(bubble_fraction, (g.p - 1) / (g.m + g.p - 1), "bubble_fraction", hints)
        return "Right: ..."

`exercise` reads the answers (None -> NotAnswered, NaN -> a message; a Diagnose exercise's
choices judged from their table of hints), `judge` names the mistake, and the returned message
is printed with its tick. A Build exercise tries the learner's function on its `cases_K` with
`each_call`. The grader calls the same `exercise_K`, `given_K` and `cases_K` in its own
process (`course_utils.grading`).

Numbers: every number a learner types passes when it is right to 3 significant figures
(`judge`, `matches`, `close`; inside lists and tuples too), and the mistakes a check
recognises are matched the same way. Counts, indices and the results of a learner's Build
function are compared exactly (within float rounding).

Rules for feedback: say what is wrong and give a hint, never the answer itself. A learner
must never see a stack trace from inside a checker: `CheckFailed` renders in IPython as
just its message (via `_render_traceback_`), and the helpers turn wrong types, NaN and a
learner function's own exceptions into `CheckFailed` messages. Under nbval a failed check
is a failed cell, which is how `python -m course_utils grade` scores a notebook.

The framework, a module per idea (everything is imported from here: `from course_utils.checks
import judge, exercise`):

- `feedback`   what a learner sees: `CheckFailed`, `NotAnswered`, `passed`, `fail`, `require`
- `reading`    reading an answer by its type: `as_number`, `as_sequence`, `check_function`, ...
- `fields`     several answers judged each on its own, every wrong one named: `Fields`
- `judging`    numbers to 3 figures and the mistakes they reveal: `judge`, `matches`, `close`
- `variants`   each learner's numbers: `Variant`, `pick`, `numbers`, `lesson_checks`
- `declaring`  the `exercise` decorator, the answers' shapes and `each_call`
- `layouts`    training-run layouts as answers, judged with the planner (lesson 12)
- `wire`       answers as data, between a learner's kernel and the grader
- `lNN`        lesson NN's checks

This package never imports torch; a lesson's check module imports it lazily if needed.
"""

from __future__ import annotations

from course_utils.checks.declaring import (
    LETTERS,
    SHAPES,
    Shape,
    choice,
    each_call,
    exercise,
    sequence,
)
from course_utils.checks.feedback import (
    FAILED_MARK,
    NOT_ANSWERED_MARK,
    PASSED_MARK,
    CheckFailed,
    NotAnswered,
    exercise_label,
    expect_choice,
    fail,
    passed,
    require,
)
from course_utils.checks.fields import Fields
from course_utils.checks.judging import (
    GB,
    GIB,
    OTHERWISE,
    RIGHT,
    UNIT_SLIPS,
    AnyOf,
    any_of,
    close,
    judge,
    matches,
    same_to_3_figures,
)
from course_utils.checks.reading import (
    as_action,
    as_choice,
    as_dict,
    as_int,
    as_number,
    as_placement,
    as_sequence,
    as_tensor,
    check_function,
)
from course_utils.checks.variants import (
    DEFAULT,
    DEFAULT_STUDENT,
    Given,
    LessonChecks,
    Pick,
    Variant,
    lesson_checks,
    numbers,
    pick,
)

__all__ = [
    # what check modules and notebooks use
    "DEFAULT",
    "OTHERWISE",
    "RIGHT",
    "CheckFailed",
    "Fields",
    "Given",
    "LessonChecks",
    "NotAnswered",
    "Variant",
    "any_of",
    "as_action",
    "as_choice",
    "as_dict",
    "as_int",
    "as_number",
    "as_placement",
    "as_sequence",
    "as_tensor",
    "check_function",
    "choice",
    "close",
    "each_call",
    "exercise",
    "exercise_label",
    "expect_choice",
    "fail",
    "judge",
    "lesson_checks",
    "matches",
    "numbers",
    "passed",
    "pick",
    "require",
    "same_to_3_figures",
    "sequence",
    # the framework's constants and types, for the grader and for new checks
    "FAILED_MARK",
    "GB",
    "GIB",
    "LETTERS",
    "NOT_ANSWERED_MARK",
    "PASSED_MARK",
    "SHAPES",
    "UNIT_SLIPS",
    "AnyOf",
    "DEFAULT_STUDENT",
    "Pick",
    "Shape",
]
