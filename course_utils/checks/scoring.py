"""Points and partial credit: what an exercise is worth, and the share of its parts an answer
gets right.

Every exercise is worth 1 point unless its check declares more, `exercise(..., points=3)`. A
check declared with `partial=True` gives a wrong answer the share of its parts that hold:

- a Build exercise's parts are its trials, each case `each_call` tries: the check is run once
  per case with that case alone (the learner's function on it, everything else as it is);
- a Diagnose exercise's parts are its tables (each choice judged by its own table) and, where
  it asks for more than choices, the rest of the check, judged with the choices set right;
- an exercise whose answers are judged each on its own (`Fields`, every wrong one named at
  once) has a part per answer judged (a table, or an answer of the rest's own `Fields`).

The share is worked out wherever the check runs: in the notebook, for the learner's feedback,
and in the grader, for the grade, from the answers as data (each case judged there, on the
evidence the learner's kernel sent back). It travels on the `CheckFailed` the check raises
(`share`, `parts`), set here after the parts were judged, never taken from an exception the
learner's code raised; the message gains a last line, "Partly right: 2 of 3 cases (2 of 3
points)." A right answer earns every point, a wrong one with no part right none, and a wrong
one whose parts all hold alone (a check that compares its cases with one another) all but
one part's share.

Each case's outcome is remembered from the first run of the check (`Trials.memo`), so a
learner's function runs once per case in the notebook, however many parts are judged.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from course_utils.checks.feedback import CheckFailed

MAX_PARTS = 1000  # a check that tries more cases than this is judged on its first ones


@dataclass
class Trials:
    """The cases one check of a partial exercise has tried, while it is judged in parts."""

    only: int | None = None  # judge this case alone (by its place among all tried); None: all
    seen: int = 0  # cases offered in this run of the check
    memo: dict[int, tuple[str, str, Any]] = field(default_factory=dict)  # case -> outcome
    fields: tuple[int, int] | None = None  # (right, judged) of the last `Fields` verdict


TRIALS: ContextVar[Trials | None] = ContextVar("trials", default=None)


def tried(cases) -> Iterator[tuple[int | None, tuple]]:
    """(its place, case) for each case `each_call` should try now: every case, or only the
    one being judged alone."""
    state = TRIALS.get()
    for case in cases:
        if state is None:
            yield None, case
            continue
        index = state.seen
        state.seen += 1
        if state.only is None or state.only == index:
            yield index, case


def outcome(index: int | None, name: str, case: tuple, call: Callable[[], Any]) -> Any:
    """`call()` (the learner's function on `case`), or what it gave the first time this check
    tried that case."""
    state = TRIALS.get()
    if state is None or index is None:
        return call()
    key = f"{name}{case!r}"
    if index in state.memo and state.memo[index][1] == key:
        kind, _, value = state.memo[index]
        if kind == "raised":
            raise value
        return copy.deepcopy(value)
    try:
        value = call()
    except CheckFailed as exc:
        state.memo[index] = ("raised", key, exc)
        raise
    try:
        state.memo[index] = ("returned", key, copy.deepcopy(value))
    except Exception:  # noqa: BLE001 - a result that cannot be copied is asked for again
        pass
    return value


def parts_judged(right: int, total: int) -> None:
    """A `Fields` verdict: `right` of the `total` answers it judged hold (the last verdict of
    a check is its outermost: the parts of a check judged in fields)."""
    state = TRIALS.get()
    if state is not None:
        state.fields = (right, total)


def earned(points: float, share: float) -> float:
    """The points a share of an exercise's parts earns, to 2 decimals (as every report shows)."""
    return round(points * share, 2)


def _holds(run: Callable[[], Any]) -> bool:
    try:
        run()
    except Exception:  # noqa: BLE001 - a part that fails in any way is not right
        return False
    return True


def _trials(rest: Callable[[], Any], state: Trials) -> tuple[int, int]:
    """(parts, parts right) of the rest of a check: one per case it tries, each judged alone;
    a check that tries no case is one part."""
    total, right, index = state.seen, 0, 0
    while index < MAX_PARTS:
        state.only, state.seen = index, 0
        ok = _holds(rest)
        total = max(total, state.seen)
        if total == 0:
            return 1, int(ok)
        right += ok
        index += 1
        if index >= total:
            break
    return min(total, MAX_PARTS), right


def in_parts(
    whole: Callable[[], str],
    tables: list[Callable[[], Any]],
    rest: Callable[[], Any] | None,
    points: float,
    cases: bool,
) -> str:
    """The message of `whole()` (the check, every answer at once) if it passes; else raise
    its failure with the share of parts right: each of `tables` (a Diagnose choice read by its
    own table) and each case `rest()` tries (the other answers judged with the choices set
    right), or `rest` as one part. `cases` words the parts as cases (a Build exercise)."""
    state = Trials()
    token = TRIALS.set(state)
    try:
        try:
            return whole()
        except CheckFailed as exc:
            first = exc
        if state.fields is not None and state.seen == 0:  # judged in fields, no case tried
            (right, total), cases = state.fields, False
        else:
            right = sum(_holds(table) for table in tables)
            total = len(tables)
            if rest is not None:
                parts, held = _trials(rest, state)
                total, right = total + parts, right + held
    finally:
        TRIALS.reset(token)
    # Parts that each hold while the whole fails (a check that compares its cases with one
    # another) do not make a right answer: a failed check never earns every point.
    right = min(right, max(total - 1, 0))
    first.parts = (right, total)
    first.share = right / total if total else 0.0
    if 0 < right < total:
        what, got = "cases" if cases else "parts", earned(points, first.share)
        first.message += (
            f"\nPartly right: {right} of {total} {what} ({got:g} of {points:g} "
            f"point{'' if points == 1 else 's'})."
        )
        first.args = (first.message,)
    raise first
