"""Declaring a check: the `exercise` decorator, the answers' shapes and `each_call`.

`exercise(given_K, name="number", ...)` turns a lesson's judging function into its check
`exercise_K`: it reads each answer by its shape (`SHAPES`, a tuple of options, or a Diagnose
exercise's table of hints, each table judged on its own and the rest of the check beside them,
every wrong answer named at once: `Fields`), hands the judging function the learner's
numbers and prints the message a right answer earns. A Build exercise tries the learner's
function on its cases with `each_call`.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from course_utils.checks import scoring
from course_utils.checks.feedback import (
    EXERCISE_LABEL,
    CheckFailed,
    NotAnswered,
    fail,
    passed,
    require,
)
from course_utils.checks.fields import Fields
from course_utils.checks.judging import OTHERWISE, RIGHT
from course_utils.checks.reading import (
    as_choice,
    as_int,
    as_number,
    as_sequence,
    check_function,
    format_call,
)
from course_utils.checks.variants import DEFAULT, Given, Variant


def each_call(
    fn: Callable[..., Any], cases: Iterable[tuple], huge: Iterable[tuple] = (), why: str = ""
) -> Iterator[tuple[Any, str, Any]]:
    """A Build exercise's trials: for each case, (its arguments, the call as the learner would
    write it, what `fn` returned). `fn` is the learner's function as `check_function` wraps it;
    it gets a copy of the arguments, so a function that changes its inputs cannot change the
    case the check then compares with. A case among `huge` (too big to build or simulate)
    that fails gets `why` after the error: how to answer it without building it. Judged in
    parts (`scoring`), it tries only the case being judged, and each case once."""
    huge = list(huge)
    for index, case in scoring.tried(cases):
        shown = format_call(fn.__name__, case, {})
        try:
            result = scoring.outcome(index, fn.__name__, case, functools.partial(_call, fn, case))
        except NotAnswered:
            raise
        except CheckFailed as exc:
            if case not in huge:
                raise
            fail(f"{exc.lines()[0].rstrip('.')}. {why}")
        yield case, shown, result


def _call(fn: Callable[..., Any], case: tuple) -> Any:
    return fn(*copy.deepcopy(case))


Shape = Callable[[Any, str], Any]  # reads an answer: (value, its name) -> value, or fails


def choice(*options: Any) -> Shape:
    """The shape of an answer that is one of `options` (`as_choice`)."""
    return lambda value, what: as_choice(value, options, what)


def sequence(item: Shape | None = None, length: int | None = None) -> Shape:
    """The shape of a list answer (`as_sequence`), each item read by `item`."""
    return lambda value, what: as_sequence(value, what, length=length, item=item)


LETTERS = ("a", "b", "c", "d")
# The shapes a lesson names in `exercise(...)`; a tuple of options, a diagnosis's table or a
# Shape also works.
SHAPES: dict[str, Shape] = {
    "answer": require,
    "number": as_number,
    "whole number": as_int,
    "numbers": sequence(item=as_number),
    "whole numbers": sequence(item=as_int),
    "list": sequence(),
    "letter": choice(*LETTERS),
    "function": check_function,
}


def _diagnosed(table: dict[Any, Any]) -> Shape:
    """A multiple-choice answer read and judged by its table (see `exercise`)."""
    right = next(choice for choice, hint in table.items() if hint is RIGHT)
    choices = list(LETTERS) if OTHERWISE in table else sorted(table, key=str)

    def judged(value: Any, what: str) -> Any:
        got = as_choice(value, choices, what)
        if got != right:
            fail(f"`{what}` = {got!r} is not it. {table.get(got, table.get(OTHERWISE))}")
        return got

    return judged


def exercise(
    given: Callable[..., Any] | None = None,
    *,
    points: float = 1,
    partial: bool = False,
    lesson: int | None = None,
    **shapes: str | tuple | dict | Shape,
) -> Callable[..., Any]:
    """Declare a lesson's check `exercise_K` from its judging function.

    The function's parameters are the answers, in the order the check cell passes them, and
    optionally `g` (the learner's numbers, from `given`) and `variant`. Each answer is read
    with its shape: a name in `SHAPES`, a tuple of the options, a function (value, name) ->
    value, or a diagnosis's table (by default it must only be answered). A table maps the
    right choice to RIGHT and each wrong one to its hint (or holds one hint under OTHERWISE
    for any other letter): every table is judged, and the rest of the check with the choices
    set right, each wrong answer named at once (`Fields`), e.g. "`fix` = 'c' is not it. <hint>":

    @exercise(problem={"b": RIGHT, "a": "...", ...}, fix={"a": RIGHT, ...}, best="number")

    Then the function judges the rest, failing with a hint, and returns the message a right
    answer earns. The check is called `exercise_K(*answers, variant=...)`; its `points` and
    `partial` say what it is worth (`partial`: a wrong answer earns the share of its parts
    that hold, each case of a Build, each table of a Diagnose and the rest: `scoring`).
    `lesson`: its lesson's number, for a check written outside the lesson's module `lNN`
    (which imports it, and counts it as its own).
    """
    if not (isinstance(points, int | float) and not isinstance(points, bool) and points > 0):
        raise ValueError(f"points must be a number > 0, got {points!r}")

    def declare(judging: Callable[..., str]) -> Callable[..., None]:
        names = list(inspect.signature(judging).parameters)
        answers = [name for name in names if name not in ("g", "variant")]
        number = lesson or int(judging.__module__.rsplit(".l", 1)[-1])
        label = f"Exercise {number}.{int(judging.__name__.removeprefix('exercise_'))}"
        readers: dict[str, Shape] = {}
        for name in answers:
            spec = shapes.get(name, "answer")
            if isinstance(spec, dict):
                readers[name] = _diagnosed(spec)
            elif isinstance(spec, str):
                readers[name] = SHAPES[spec]
            else:
                readers[name] = choice(*spec) if isinstance(spec, tuple) else spec

        tables = {n: spec for n, spec in shapes.items() if isinstance(spec, dict)}
        right = {
            n: next(c for c, hint in spec.items() if hint is RIGHT) for n, spec in tables.items()
        }

        def judged(values: tuple, variant: Variant, chosen: dict[str, Any]) -> str:
            """The message of a right answer, or a failure naming every wrong answer: each
            table judged on its own, then the rest with the choices set right; `chosen`: table
            answers taken as read (the rest of a Diagnose judged alone, in parts)."""
            at = dict(zip(answers, values, strict=True))
            read = {
                n: chosen[n] if n in chosen else readers[n](at[n], n) for n in at if n not in tables
            }
            for n in tables:
                require(at[n], n)  # an unanswered choice before any judging
            fields = Fields()
            for n in tables:
                read[n] = chosen.get(n, right[n])
                if n not in chosen:
                    with fields.judging():
                        readers[n](at[n], n)
            if given and "g" in names:
                read["g"] = Given(given(variant))
            if "variant" in names:
                read["variant"] = variant
            if not tables:
                return judging(**read)
            if len(tables) == len(answers):  # a Diagnose of choices alone
                fields.verdict()
                return judging(**read)
            message = ""
            with fields.judging():  # the rest, its own answers one by one if it keeps Fields
                message = judging(**read)
            fields.verdict()
            return message

        def in_parts(values: tuple, variant: Variant) -> str:
            at = dict(zip(answers, values, strict=True))
            rest = None
            if len(tables) < len(answers):
                rest = functools.partial(judged, values, variant, right)
            return scoring.in_parts(
                whole=functools.partial(judged, values, variant, {}),
                tables=[functools.partial(readers[n], at[n], n) for n in tables],
                rest=rest,
                points=points,
                cases=not tables,
            )

        @functools.wraps(judging)
        def check(*values: Any, variant: Variant = DEFAULT) -> None:
            if len(values) != len(answers):
                raise TypeError(f"{judging.__name__} takes {len(answers)} answers")
            token = EXERCISE_LABEL.set(label)
            try:
                if partial:
                    message = in_parts(values, variant)
                else:
                    message = judged(values, variant, {})
            finally:
                EXERCISE_LABEL.reset(token)
            passed(message)

        check.points = points  # type: ignore[attr-defined]
        check.partial = partial  # type: ignore[attr-defined]
        if lesson:  # the lesson's module imports it: it is one of that lesson's checks
            check.__module__ = f"{__package__}.l{lesson:02d}"

        check.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in answers]
            + [inspect.Parameter("variant", inspect.Parameter.KEYWORD_ONLY, default=DEFAULT)]
        )
        return check

    return declare
