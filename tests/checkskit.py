"""What the check tests share: the students they try, and calling a check with an answer."""

from __future__ import annotations

from course_utils.checks import DEFAULT, Variant

# Students whose numbers the per-student tests try (a test file may name its own STUDENTS).
STUDENTS = ["s1", "s7", "alice", "bob", "zoe", "carol", "dave"]


def run(check, k: int, answers, variant: Variant = DEFAULT) -> None:
    """Call exercise k's check with `answers`, the last of which may be the Variant to use."""
    if answers and isinstance(answers[-1], Variant):
        *answers, variant = answers
    getattr(check, f"exercise_{k}")(*answers, variant=variant)
