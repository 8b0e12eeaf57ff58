"""What the check tests share: the students they try, and calling a check with an answer."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from course_utils.checks import DEFAULT, Variant

# Students whose numbers the per-student tests try (a test file may name its own STUDENTS).
STUDENTS = ["s1", "s7", "alice", "bob", "zoe", "carol", "dave"]


class Later(Sequence):
    """Answers computed when a test first reads them, not while pytest collects: for answers
    that take seconds to compute (a planner search), which every pytest worker would
    otherwise pay at its start, whether or not it runs the tests that need them."""

    def __init__(self, make: Callable[[], Sequence]) -> None:
        self._make = make

    @functools.cached_property
    def _answers(self) -> tuple:
        return tuple(self._make())

    def __getitem__(self, i):
        return self._answers[i]

    def __len__(self) -> int:
        return len(self._answers)


def run(check, k: int, answers, variant: Variant = DEFAULT) -> None:
    """Call exercise k's check with `answers`, the last of which may be the Variant to use."""
    if answers and isinstance(answers[-1], Variant):
        *answers, variant = answers
    getattr(check, f"exercise_{k}")(*answers, variant=variant)
