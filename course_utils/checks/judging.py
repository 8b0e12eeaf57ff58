"""Judging a number: right to 3 significant figures, or the mistake it reveals.

`same_to_3_figures` and `close` are the course's rule for every number a learner types;
`matches` applies it inside lists and tuples. `judge` compares an answer with the right one
and, when it differs, fails with the first mistake it recognises: a unit slip (a percentage
for a fraction, GB for GiB), one of the question's own slips, the hint for a known wrong
answer, an answer rounded too far, or the `OTHERWISE` hint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from course_utils.checks.feedback import fail


def close(value: float, expected: float, rel: float = 1e-3, abs: float = 1e-9) -> bool:
    """True when `value` is `expected` to 3 significant figures (the course's rule for every
    number a learner types), or within `rel` (relative) or `abs` (absolute) of it: a check
    may widen the tolerance, never narrow it below 3 figures."""
    return same_to_3_figures(value, expected) or math.isclose(
        value, expected, rel_tol=rel, abs_tol=abs
    )


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
