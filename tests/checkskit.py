"""What the check tests share: the students they try, calling a check with an answer, and a
busy core to run it beside."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence

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


@contextlib.contextmanager
def beside_a_busy_loop() -> Iterator[None]:
    """Inside: this thread (and the threads it starts) on one core, shared with a process that
    loops for ever on it (a learner's machine busy with something else)."""
    mine = os.sched_getaffinity(0)
    core = min(mine)
    busy = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"],
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)
        busy.kill()
        busy.wait()


def fails_with_its_own_hint(exercise: Callable, wrong: Callable, mistakes: dict) -> None:
    """`exercise(wrong)` fails with the words `mistakes[wrong]` of its hint, and with none of
    the other mistakes' words: each of the commonest mistakes has a hint of its own."""
    from course_utils.checks import CheckFailed

    try:
        exercise(wrong)
    except CheckFailed as exc:
        said = str(exc)
    else:
        raise AssertionError(f"{wrong.__name__} passed")
    assert mistakes[wrong] in said, (mistakes[wrong], said)
    assert not any(w in said for m, w in mistakes.items() if m is not wrong), said
