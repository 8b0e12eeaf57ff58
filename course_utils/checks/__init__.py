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

This package never imports torch; a lesson's check module imports it lazily if needed.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import random
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, NoReturn

__all__ = [
    "DEFAULT",
    "OTHERWISE",
    "RIGHT",
    "CheckFailed",
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
]

# What a learner sees in front of a message (the grader also uses these to find the message).
FAILED_MARK = "❌"
NOT_ANSWERED_MARK = "✋"
PASSED_MARK = "✅"


class CheckFailed(AssertionError):
    """A wrong answer. In a notebook it shows as one kind message and no stack trace.

    It is an AssertionError so that plain Python and pytest treat it as a failed check.
    """

    mark = FAILED_MARK

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


_LABEL: ContextVar[str | None] = ContextVar("exercise_label", default=None)  # see `exercise`


def exercise_label() -> str:
    """'Exercise 3.2' inside the check `exercise_2` of `course_utils.checks.l03` (as `exercise`
    declares it), 'This exercise' elsewhere."""
    return _LABEL.get() or "This exercise"


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


def _describe(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{text} (a {type(value).__name__})"


def as_number(value: Any, what: str) -> float:
    """`value` as a finite float. Accepts int, float, Fraction, numpy scalars and one-element
    arrays/tensors; a string, bool, NaN or infinity gets a message instead."""
    require(value, what)
    if isinstance(value, bool):
        fail(f"`{what}` should be a number, not {value!r}.")
    if isinstance(value, str):
        fail(
            f"`{what}` should be a number, but it is the text {value!r}. "
            "Write the number (or a formula) without quotes."
        )
    # numpy scalars, 0-d or one-element arrays and torch tensors all have .item();
    # asking for it avoids importing either library here.
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, int | float):
        size = getattr(value, "size", 1)
        size = size() if callable(size) else size  # torch: .size() is a method
        count = math.prod(size) if isinstance(size, tuple) else size
        if count != 1:
            fail(f"`{what}` should be one number, but it holds {count} values.")
        value = value.item()
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        fail(f"`{what}` should be a number, but it is {_describe(value)}.")
    if math.isnan(number):
        fail(f"`{what}` is NaN (not a number). Look for a 0/0 or an undefined step in the formula.")
    if math.isinf(number):
        fail(f"`{what}` is infinite. Look for a division by zero in your formula.")
    return number


def as_int(value: Any, what: str) -> int:
    """`value` as an int (3.0 is fine, 2.5 is not)."""
    number = as_number(value, what)
    if not number.is_integer():
        fail(f"`{what}` should be a whole number, but it is {number:g}.")
    return int(number)


def as_choice(value: Any, choices: Iterable[Any], what: str) -> Any:
    """`value` as one of `choices` (text is compared ignoring case and outer spaces);
    returns the matching choice as spelled in `choices`."""
    require(value, what)
    options = list(choices)
    listed = ", ".join(repr(c) for c in options)
    if isinstance(value, str):
        wanted = value.strip().casefold()
        for option in options:
            if isinstance(option, str) and option.strip().casefold() == wanted:
                return option
    else:
        for option in options:
            if not isinstance(option, str) and value == option and type(value) is not bool:
                return option
    fail(f"`{what}` should be one of {listed}, but it is {_describe(value)}.")


def as_sequence(
    value: Any,
    what: str,
    length: int | None = None,
    item: Callable[[Any, str], Any] | None = None,
) -> list[Any]:
    """`value` as a list (from a list, tuple, range, array...; not from a string or a dict).

    `length` demands exactly that many items; `item(x, name)` converts each item, e.g.
    `as_sequence(order, "order", item=as_int)`, so item errors name `order[2]`.
    """
    require(value, what)
    if isinstance(value, str | bytes | dict) or not isinstance(value, Iterable):
        fail(f"`{what}` should be a list, but it is {_describe(value)}.")
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays / tensors
        items = value.tolist()
        items = items if isinstance(items, list) else [items]
    else:
        items = list(value)
    if length is not None and len(items) != length:
        fail(f"`{what}` should have {length} items, but it has {len(items)}.")
    if item is not None:
        items = [item(x, f"{what}[{i}]") for i, x in enumerate(items)]
    return items


def as_dict(value: Any, what: str, keys: Sequence[str]) -> dict:
    """`value` as a dict that holds every one of `keys`."""
    require(value, what)
    listed = ", ".join(repr(k) for k in keys)
    if not isinstance(value, dict):
        fail(f"`{what}` should be a dict with the keys {listed}, but it is {_describe(value)}.")
    missing = [k for k in keys if k not in value]
    if missing:
        fail(f"`{what}` has no key {missing[0]!r}: give it all of {listed}.")
    return value


def close(value: float, expected: float, rel: float = 1e-3, abs: float = 1e-9) -> bool:
    """True when `value` is `expected` to 3 significant figures (the course's rule for every
    number a learner types), or within `rel` (relative) or `abs` (absolute) of it: a check
    may widen the tolerance, never narrow it below 3 figures."""
    return same_to_3_figures(value, expected) or math.isclose(
        value, expected, rel_tol=rel, abs_tol=abs
    )


def _short(value: Any) -> str:
    """A call argument as a learner should read it: tensors and arrays by their shape."""
    shape = getattr(value, "shape", None)
    if shape == () and hasattr(value, "item"):  # numpy / torch scalar: show the number
        return repr(value.item())
    if shape is not None and hasattr(value, "dtype") and getattr(value, "ndim", 0) > 0:
        kind = "tensor" if type(value).__module__.startswith("torch") else "array"
        return f"{kind}(shape={tuple(shape)})"
    if isinstance(value, list | tuple) and value and all(hasattr(v, "shape") for v in value):
        inner = ", ".join(_short(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    return repr(value)


def _format_call(what: str, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    parts = [_short(a) for a in args] + [f"{k}={_short(v)}" for k, v in kwargs.items()]
    call = f"{what}({', '.join(parts)})"
    return call if len(call) <= 120 else call[:117] + "..."


def check_function(fn: Any, what: str) -> Callable[..., Any]:
    """Check that `fn` is a function and return a safe caller for it.

    The caller runs `fn(*args, **kwargs)`; if the learner's code raises, the error becomes a
    CheckFailed naming the call that broke (or NotAnswered if the body is still the
    `raise NotImplementedError()` stub), so the learner never sees the checker's internals.
    """
    require(fn, what)
    if not callable(fn):
        fail(f"`{what}` should be a function (define it with `def`), but it is {_describe(fn)}.")

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except NotImplementedError:
            raise NotAnswered(
                f"`{what}` still raises NotImplementedError. Replace the "
                "`raise NotImplementedError()` line with your code and run that cell again."
            ) from None
        except CheckFailed:
            raise
        except Exception as exc:  # the learner's bug: report it, not our stack
            raise CheckFailed(
                f"{_format_call(what, args, kwargs)} raised {type(exc).__name__}: {exc}\n"
                "Try that call yourself in a new cell to see where it goes wrong."
            ) from None

    call.__name__ = what
    return call


def each_call(
    fn: Callable[..., Any], cases: Iterable[tuple], huge: Iterable[tuple] = (), why: str = ""
) -> Iterator[tuple[Any, str, Any]]:
    """A Build exercise's trials: for each case, (its arguments, the call as the learner would
    write it, what `fn` returned). `fn` is the learner's function as `check_function` wraps it;
    it gets a copy of the arguments, so a function that changes its inputs cannot change the
    case the check then compares with. A case among `huge` (too big to build or simulate)
    that fails gets `why` after the error: how to answer it without building it."""
    huge = list(huge)
    for case in cases:
        shown = _format_call(fn.__name__, case, {})
        try:
            result = fn(*copy.deepcopy(case))
        except NotAnswered:
            raise
        except CheckFailed as exc:
            if case not in huge:
                raise
            fail(f"{exc.lines()[0].rstrip('.')}. {why}")
        yield case, shown, result


def as_action(value: Any, what: str) -> Any:
    """`value` as a pipeline action (`course_utils.actions.Action`), read from text like '1F0'."""
    from course_utils.actions import Action
    from course_utils.errors import CourseInputError

    require(value, what)
    try:
        return Action.parse(value)
    except CourseInputError:
        fail(
            f"`{what}` is {_describe(value)}, which is not an action. Write it as text like "
            "'1F0' (stage 1, forward, micro-batch 0) or '0B1'."
        )


def as_placement(value: Any, what: str, devices: int, stages: int) -> list[list[int]]:
    """`value` as the stages each of `devices` holds: every stage 0..stages-1 dealt out once,
    each device's in increasing order."""
    rows = as_sequence(value, what)
    if len(rows) != devices:
        fail(
            f"`{what}` has {len(rows)} entries; it needs one per device ({devices}), each the "
            "list of the stages that device holds."
        )
    got = [as_sequence(row, f"{what}[{d}]", item=as_int) for d, row in enumerate(rows)]
    if sorted(s for row in got for s in row) != list(range(stages)):
        fail(
            f"`{what}` = {got} does not hand out each of the {stages} stages 0..{stages - 1} "
            "exactly once."
        )
    if any(row != sorted(row) for row in got):
        fail(f"`{what}` = {got}: list each device's stages in increasing order.")
    return got


def as_tensor(value: Any, what: str, shape: Sequence[int] | None = None) -> Any:
    """`value` as a float32 torch tensor (of `shape`, if given); torch is imported only here."""
    import torch

    require(value, what)
    try:
        tensor = torch.as_tensor(value, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        fail(f"`{what}` should be a tensor, but it is {_describe(value)}.")
    if shape is not None and tuple(tensor.shape) != tuple(shape):
        fail(f"`{what}` has shape {tuple(tensor.shape)}; it should be {tuple(shape)}.")
    return tensor


# --------------------------------------------------------------------------- numbers and units


def _half_unit_of_3rd_figure(expected: float) -> float:
    return 0.5 * 10 ** (math.floor(math.log10(abs(expected))) - 2)


def same_to_3_figures(value: float, expected: float) -> bool:
    """True when `value` equals `expected` to 3 significant figures (or better).

    0.133 and 0.1333 pass for 2/15; 0.13 does not (that is 2 figures). An exact answer,
    e.g. the fraction 2/15 itself, always passes.
    """
    if expected == 0:
        return abs(value) <= 1e-12
    return abs(value - expected) <= _half_unit_of_3rd_figure(expected) * (1 + 1e-9)


def _rounded_to_fewer_figures(value: float, expected: float) -> bool:
    """`value` is `expected` rounded to 1 or 2 significant figures, either way at a half:
    0.63 and 0.62 both count for 0.625 (Python's round() alone would only allow 0.62)."""
    if expected == 0 or value == 0:
        return False
    for figures in (1, 2):
        scale = 10 ** (math.floor(math.log10(abs(expected))) - figures + 1)
        steps = value / scale
        on_grid = math.isclose(steps, round(steps), rel_tol=1e-9, abs_tol=1e-9)
        if on_grid and abs(value - expected) <= 0.5 * scale * (1 + 1e-9):
            return True
    return False


GIB, GB = 2**30, 1e9
# (factor: value / expected, what the slip is) for the units a question may ask for.
UNIT_SLIPS: dict[str, list[tuple[float, str]]] = {
    "fraction": [(100, "a percentage; give a fraction between 0 and 1 (25% is 0.25)")],
    "percent": [(0.01, "a fraction; give a percentage (0.25 is 25%)")],
    "s": [(1e3, "milliseconds; give seconds"), (1e-3, "thousands of seconds; give seconds")],
    "ms": [(1e-3, "seconds; give milliseconds"), (1e3, "microseconds; give milliseconds")],
    "bytes": [
        (1 / GB, "GB; give bytes"),
        (1 / GIB, "GiB; give bytes"),
        (1e-6, "MB; give bytes"),
        (8, "bits; give bytes"),
    ],
    "GB": [(GB, "bytes; give GB (1 GB = 10^9 bytes)"), (GB / GIB, "GiB; give GB (10^9 bytes)")],
    "GiB": [
        (GIB, "bytes; give GiB (1 GiB = 2^30 bytes)"),
        (GIB / GB, "GB; give GiB (2^30 bytes, not 10^9)"),
    ],
    "GB/s": [(8, "gigabits per second; give gigabytes per second")],
}


def _fail_on_slip(
    number: float, expected: float, what: str, unit: str | None, slips: Sequence[tuple[float, str]]
) -> None:
    """Fail with the unit slip `number` matches, or the question's own slip."""
    for factor, slip in UNIT_SLIPS.get(unit or "", []):
        if expected and same_to_3_figures(number, expected * factor):
            fail(f"`{what}` = {number:g} looks like {slip}.")
    for factor, slip in slips:
        if expected and same_to_3_figures(number, expected * factor):
            fail(f"`{what}` = {number:g} {slip}")


def _fail_if_too_rounded(number: float, expected: float, what: str, unit: str | None) -> None:
    unit_name = f" {unit}" if unit and unit not in ("fraction", "percent") else ""
    if _rounded_to_fewer_figures(number, expected):
        fail(f"`{what}` = {number:g}{unit_name} is close: give 3 significant figures.")


# --------------------------------------------------------------------------- variants

DEFAULT_STUDENT = "default"


class Variant:
    """One learner's version of a lesson's exercises: the numbers drawn from their seed.

    Every learner gets the same questions with different numbers (p, m, sizes, bandwidths),
    so copying a neighbour's answers fails. The default student gets the course's own
    numbers, the ones the solutions are written for. `cases_seed` fixes the inputs Build
    exercises are tried on (the grader draws its own, which a learner cannot know); without
    it they are fresh random inputs on every call.
    """

    def __init__(self, student: str = DEFAULT_STUDENT, cases_seed: int | str | None = None):
        if not isinstance(student, str) or not student.strip():
            raise ValueError(f"student must be a non-empty name, got {student!r}")
        self.student = student.strip()
        self.cases_seed = cases_seed

    @property
    def is_default(self) -> bool:
        return self.student == DEFAULT_STUDENT

    def pick(self, key: str, default: Any, options: Sequence[Any]) -> Any:
        """The course's `default` for the default student, else one of `options` drawn from
        the student's seed (the same student always gets the same one)."""
        if self.is_default:
            return default
        return random.Random(f"{self.student}/{key}").choice(list(options))

    def seeded(self, key: str) -> random.Random | None:
        """A random source fixed by the student's name, or None for the default student (whose
        numbers the lesson writes out)."""
        seed = self.pick(key, None, range(1, 10**6))
        return None if seed is None else random.Random(seed)

    def cases(self, key: str) -> random.Random:
        """The random source for a Build exercise's inputs (see `cases_seed`)."""
        if self.cases_seed is None:
            return random.Random()
        return random.Random(f"{self.cases_seed}/{key}")

    def __repr__(self) -> str:
        return f"Variant({self.student!r})"


DEFAULT = Variant()


class Given(dict):
    """An exercise's numbers: `g["p"]` or `g.p`, shown as "p = 4, m = 12"."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __repr__(self) -> str:
        return ", ".join(
            f"{k} = {v:g}" if isinstance(v, float) else f"{k} = {v}" for k, v in self.items()
        )


class LessonChecks:
    """A lesson's check module bound to one learner's variant.

    check = l03.for_student("alice")   # in the exercise notebook's first code cell
    g = check.given(1)                 # prints and returns this learner's numbers
    check.exercise_1(answer)           # judged with those numbers
    """

    def __init__(self, module: Any, student: str = DEFAULT_STUDENT) -> None:
        self.module = module
        self.variant = Variant(student)

    def given(self, k: int) -> Given:
        numbers = Given(getattr(self.module, f"given_{k}")(self.variant))
        lesson = self.module.__name__.rsplit(".l", 1)[-1].lstrip("0")
        print(f"Exercise {lesson}.{k}, your numbers: {numbers!r}")
        return numbers

    def __getattr__(self, name: str) -> Any:
        if not name.startswith(("exercise_", "given_", "cases_")):
            raise AttributeError(name)
        fn = getattr(self.module, name)
        if name.startswith("exercise_"):
            return lambda *answers: fn(*answers, variant=self.variant)
        return lambda: fn(self.variant)


# --------------------------------------------------------------------------- declaring exercises


def lesson_checks(module_name: str) -> Callable[[str], LessonChecks]:
    """A check module's `for_student`: `for_student = lesson_checks(__name__)`."""

    def for_this_lesson(student: str = DEFAULT_STUDENT) -> LessonChecks:
        """This lesson's checks with `student`'s numbers (the notebook's first code cell)."""
        return LessonChecks(sys.modules[module_name], student)

    return for_this_lesson


@dataclass(frozen=True)
class Pick:
    """A number drawn per student (`Variant.pick`): the course's `default`, or one of `options`;
    with `names`, each is a tuple of the numbers of those names."""

    key: str
    default: Any
    options: Sequence[Any]
    names: tuple[str, ...] = ()


def pick(key: str, default: Any, options: Sequence[Any], *names: str) -> Pick:
    return Pick(key, default, options, names)


def numbers(*together: Pick, **declared: Any) -> Callable[..., Given]:
    """An exercise's `given_K`, declared: each name's constant, its `pick(...)`, or a function of
    the numbers before it; picks of numbers drawn together come first, with their names:

    given_1 = numbers(pick("1", (2, 4), [(3, 6), (4, 8)], "p", "m"), F=1.0, B=lambda g: 2 * g.F)
    """

    def given(variant: Variant = DEFAULT) -> Given:
        g = Given()
        for x in together:
            g.update(zip(x.names, variant.pick(x.key, x.default, x.options), strict=True))
        for name, x in declared.items():
            if isinstance(x, Pick):
                g[name] = variant.pick(x.key, x.default, x.options)
            else:
                g[name] = x(g) if callable(x) else x
        return g

    return given


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


OTHERWISE: Any = _Marker("OTHERWISE")  # in `judge`'s hints: the hint for any other wrong answer
RIGHT: Any = _Marker("RIGHT")  # in a diagnosis's table (see `exercise`): the right choice


@dataclass(frozen=True)
class AnyOf:
    """In `judge`'s hints: a mistake that gives any of these answers."""

    answers: tuple[Any, ...]


def any_of(*answers: Any) -> AnyOf:
    return AnyOf(answers)


def matches(got: Any, want: Any, rel: float = 0.0) -> bool:
    """The course's rule for comparing a learner's answer: a float is right to 3 significant
    figures (or within `rel`, where a check widens it), a whole number exactly, a list item by
    item; `want` may also be `any_of(...)`, a test (a function of the answer) or None (no
    answer matches)."""
    if want is None:
        return False
    if isinstance(want, AnyOf):
        return any(matches(got, w, rel) for w in want.answers)
    if callable(want):
        return bool(want(got))
    if isinstance(got, list | tuple):
        return (
            isinstance(want, list | tuple)
            and len(got) == len(want)
            and all(matches(g, w, rel) for g, w in zip(got, want, strict=True))
        )
    if isinstance(got, float) and isinstance(want, int | float) and not isinstance(want, bool):
        return close(got, want, rel=rel) if rel else same_to_3_figures(got, want)
    return bool(got == want)


def judge(
    value: Any,
    want: Any,
    what: str,
    hints: dict[str, Any] | str,
    *,
    unit: str | None = None,
    slips: Sequence[tuple[float, str]] = (),
    rel: float = 0.0,
    rounding: bool = True,
    upside_down: str = "",
) -> bool:
    """True when `value` (an answer read by its shape) is `want` (see `matches`). Otherwise
    fail with, in this order: a unit slip (a percentage for a fraction, GB for GiB, ...) or
    one of the question's `slips`, each (factor, what the learner did) written to follow
    "`what` = 5.2e+09", e.g. (2, "counts both directions; give the bytes one way."): one
    sentence a teacher would say, naming every mistake that gives that factor; the first
    hint whose mistake `value` matches (`hints` maps each hint to the wrong answer it names:
    an answer, `any_of(...)`, a test of the answer, None where it does not apply, or True or
    False where the check has already told whether it was made); a fraction outside
    0..1; the right number rounded too far (unless `rounding` is False: where the answers
    are small whole numbers or halves, a coarse one is as likely another mistake); the hint
    marked `OTHERWISE` (`hints` may be just that one). Without it, it returns False, for the
    check to go on. A ratio says which way up it goes in `upside_down`, for the answer that
    turns it over."""
    if matches(value, want, rel):
        return True
    if isinstance(hints, str):
        hints = {hints: OTHERWISE}
    number = isinstance(value, float) and isinstance(want, int | float)
    if number:
        _fail_on_slip(value, want, what, unit, slips)
        if upside_down and want and matches(value, 1 / want, rel):
            fail(f"`{what}` is upside down: {upside_down}.")
    fallback = None
    for hint, wrong in hints.items():
        if wrong is OTHERWISE:
            fallback = hint
        elif wrong is True or (wrong is not False and matches(value, wrong, rel)):
            fail(hint)
    if number and unit == "fraction" and not 0 <= value <= 1:
        fail(f"`{what}` is a fraction of the step: a number between 0 and 1, not {value:g}.")
    if number and rounding:
        _fail_if_too_rounded(value, want, what, unit)
    if fallback is not None:
        fail(fallback)
    return False


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


def _diagnosed(table: dict[Any, Any], before: list[str]) -> Shape:
    """A multiple-choice answer judged as it is read, from its table (see `exercise`)."""
    right = next(choice for choice, hint in table.items() if hint is RIGHT)
    choices = list(LETTERS) if OTHERWISE in table else sorted(table, key=str)

    def judged(value: Any, what: str) -> Any:
        got = as_choice(value, choices, what)
        if got != right:
            named = " and ".join(f"`{name}`" for name in before)
            said = f"{named} {'is' if len(before) == 1 else 'are'} right. " if before else ""
            fail(f"{said}`{what}` = {got!r} is not it. {table.get(got, table.get(OTHERWISE))}")
        return got

    return judged


def exercise(
    given: Callable[..., Any] | None = None, **shapes: str | tuple | dict | Shape
) -> Callable[..., Any]:
    """Declare a lesson's check `exercise_K` from its judging function.

    The function's parameters are the answers, in the order the check cell passes them, and
    optionally `g` (the learner's numbers, from `given`) and `variant`. Each answer is read
    with its shape: a name in `SHAPES`, a tuple of the options, a function (value, name) ->
    value, or a diagnosis's table (by default it must only be answered). A table maps the
    right choice to RIGHT and each wrong one to its hint (or holds one hint under OTHERWISE
    for any other letter): the answer is judged as it is read, failing with
    "`fix` = 'c' is not it. <hint>", after "`problem` is right. " where tables came before:

    @exercise(problem={"b": RIGHT, "a": "...", ...}, fix={"a": RIGHT, ...}, best="number")

    Then the function judges the rest, failing with a hint, and returns the message a right
    answer earns. The check is called `exercise_K(*answers, variant=...)`.
    """

    def declare(judging: Callable[..., str]) -> Callable[..., None]:
        names = list(inspect.signature(judging).parameters)
        answers = [name for name in names if name not in ("g", "variant")]
        lesson = int(judging.__module__.rsplit(".l", 1)[-1])
        label = f"Exercise {lesson}.{int(judging.__name__.removeprefix('exercise_'))}"
        readers: dict[str, Shape] = {}
        for name in answers:
            spec = shapes.get(name, "answer")
            if isinstance(spec, dict):
                before = [n for n in readers if isinstance(shapes.get(n), dict)]
                readers[name] = _diagnosed(spec, before)
            elif isinstance(spec, str):
                readers[name] = SHAPES[spec]
            else:
                readers[name] = choice(*spec) if isinstance(spec, tuple) else spec

        @functools.wraps(judging)
        def check(*values: Any, variant: Variant = DEFAULT) -> None:
            if len(values) != len(answers):
                raise TypeError(f"{judging.__name__} takes {len(answers)} answers")
            token = _LABEL.set(label)
            try:
                read = {n: readers[n](x, n) for n, x in zip(answers, values, strict=True)}
                if given and "g" in names:
                    read["g"] = Given(given(variant))
                if "variant" in names:
                    read["variant"] = variant
                message = judging(**read)
            finally:
                _LABEL.reset(token)
            passed(message)

        check.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in answers]
            + [inspect.Parameter("variant", inspect.Parameter.KEYWORD_ONLY, default=DEFAULT)]
        )
        return check

    return declare
