"""For instructors: exercise notebooks generated from the solutions, and grading.

- `notebook_tools`  reading notebooks, answer and check cells, solution blocks
- `make_exercises`  exercises/ from solutions/ (`python -m course_utils.grading.make_exercises`)
- `grader`          grade submissions (`python -m course_utils grade`, see INSTRUCTORS.md)

The learner-facing checks themselves live in `course_utils.checks`. Importing this package
is cheap (the commands check their arguments before importing nbformat, which is slow).
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = REPO / "solutions"
EXERCISES = REPO / "exercises"
