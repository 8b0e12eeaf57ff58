"""Each learner's own numbers: `Variant`, `pick`, `numbers` and a lesson's `for_student`.

Every learner gets the same questions with different numbers, drawn from their name, so a
neighbour's answers fail; the default student gets the course's own numbers, those the
solutions are written for. A check module declares an exercise's numbers with `numbers` and
`pick` (`given_K`), and binds itself to a learner with `lesson_checks` (`for_student`).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_STUDENT = "default"


class Variant:
    """One learner's version of a lesson's exercises: the numbers drawn from their seed.

    Every learner gets the same questions with different numbers (p, m, sizes, bandwidths),
    so copying a neighbour's answers fails. The default student gets the course's own
    numbers, the ones the solutions are written for. `cases_seed` fixes the inputs Build
    exercises are tried on (the grader draws its own, which a learner cannot know); without
    it they are drawn from the student's name: the same on every run of their notebook.
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
        """The random source for a Build exercise's inputs (see `cases_seed`): the grader's
        secret draw, or in the learner's notebook one fixed by their name, so every run of
        the notebook tries the same cases."""
        if self.cases_seed is None:
            return random.Random(f"{self.student}/{key}")
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
