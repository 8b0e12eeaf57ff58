"""Generate exercises/ from solutions/: the solved notebooks are the one source of truth.

    python -m course_utils.grading.make_exercises          # (re)write exercises/*.ipynb
    python -m course_utils.grading.make_exercises --check  # exit 1 and list stale files

Each `### BEGIN SOLUTION` ... `### END SOLUTION` block (nbgrader's markers) becomes
`# YOUR CODE HERE` + `raise NotImplementedError()` at the block's indentation (in markdown
cells: "YOUR ANSWER HERE"); outputs and execution counts are cleared; cell ids and tags stay,
so the grader can match check cells. The output is byte-for-byte deterministic and already
`ruff format`-clean, which is what lets `--check` (and a test) catch a stale exercises/.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

import nbformat

from course_utils.errors import CourseInputError
from course_utils.grading.notebook_tools import (
    EXERCISES,
    SOLUTIONS,
    notebook_text,
    read_notebook,
    ruff_format_notebook,
    ruff_problems,
    strip_solutions,
)

# Notebook metadata that only describes one run (widget state), not the exercise.
RUN_METADATA = ("widgets",)


def exercise_notebook(solution: nbformat.NotebookNode, name: str = "notebook") -> str:
    """The exercise version of a solution notebook, as file text."""
    nb = copy.deepcopy(solution)
    for key in RUN_METADATA:
        nb.metadata.pop(key, None)
    for index, cell in enumerate(nb.cells):
        where = f"{name}, cell {index} (id {cell.get('id', '?')})"
        if cell.cell_type in ("code", "markdown"):
            cell.source = strip_solutions(cell.source, cell.cell_type, where)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
            cell.metadata.pop("execution", None)  # nbclient's timings
    return ruff_format_notebook(notebook_text(nb), f"exercises/{name}")


# In the notebook's JSON text the quotes are escaped (\"default\"); in a cell's source not.
STUDENT_LINE = re.compile(r'for_student\((\\?)"default\1"\)')
STUDENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")


def for_student(text: str, student: str) -> str:
    """An exercise notebook's text with `student`'s numbers (their name is the seed)."""
    if not STUDENT_NAME.fullmatch(student) or student == "default":
        raise CourseInputError(
            f"student must be a name of letters, digits and _.@- (up to 64), got {student!r}"
        )
    return STUDENT_LINE.sub(lambda m: f'for_student({m[1]}"{student}{m[1]}")', text)


def write_for_students(students: list[str], out: Path, solutions: Path = SOLUTIONS) -> list[Path]:
    """out/<student>/<lesson>.ipynb for every student and lesson: their own numbers."""
    notebooks = {
        p.name: exercise_notebook(read_notebook(p), p.name)
        for p in sorted(solutions.glob("*.ipynb"))
    }
    written = []
    for student in students:
        texts = {name: for_student(text, student) for name, text in notebooks.items()}
        folder = out / student
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            (folder / name).write_text(text, encoding="utf-8")
            written.append(folder / name)
    return written


def plan(
    solutions: Path = SOLUTIONS, exercises: Path = EXERCISES
) -> tuple[dict[Path, str], list[Path]]:
    """What exercises/ should contain ({path: text}) and the files there with no solution."""
    wanted = {
        exercises / path.name: exercise_notebook(read_notebook(path), path.name)
        for path in sorted(solutions.glob("*.ipynb"))
    }
    orphans = [p for p in sorted(exercises.glob("*.ipynb")) if p not in wanted]
    return wanted, orphans


def stale_files(solutions: Path = SOLUTIONS, exercises: Path = EXERCISES) -> list[str]:
    """Problems with exercises/ as one line each; empty when it is up to date."""
    wanted, orphans = plan(solutions, exercises)
    problems = []
    for path, text in wanted.items():
        if not path.exists():
            problems.append(f"{path}: missing (generate it from {solutions / path.name})")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path}: out of date with {solutions / path.name}")
    problems += [f"{p}: has no solution notebook in {solutions} (delete it)" for p in orphans]
    return problems


def write_exercises(solutions: Path = SOLUTIONS, exercises: Path = EXERCISES) -> list[Path]:
    """Write every exercise notebook that changed; returns the files written."""
    wanted, orphans = plan(solutions, exercises)
    exercises.mkdir(parents=True, exist_ok=True)
    written = []
    for path, text in wanted.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
            # Cutting solutions out can leave e.g. an import only the solution used.
            for problem in ruff_problems(text, f"exercises/{path.name}"):
                print(f"warning: ruff: {problem} (fix it in {solutions / path.name})")
    for path in orphans:
        print(f"warning: {path} has no solution notebook in {solutions} (delete it)")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_utils.grading.make_exercises", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--check", action="store_true", help="only report stale files (exit 1 if any)"
    )
    parser.add_argument(
        "--solutions", type=Path, default=SOLUTIONS, help="solved notebooks (input)"
    )
    parser.add_argument(
        "--exercises", type=Path, default=EXERCISES, help="exercise notebooks (output)"
    )
    parser.add_argument(
        "--students",
        nargs="+",
        default=None,
        metavar="NAME",
        help="write OUT/NAME/*.ipynb for each student, with their own numbers",
    )
    parser.add_argument("--out", type=Path, default=None, help="folder for --students")
    args = parser.parse_args(argv)
    try:
        if not args.solutions.is_dir():
            raise CourseInputError(f"--solutions {str(args.solutions)!r} is not a folder")
        if args.students is not None:
            if args.out is None:
                raise CourseInputError("--students needs --out FOLDER for the notebooks")
            written = write_for_students(args.students, args.out, args.solutions)
            print(f"wrote {len(written)} notebooks for {len(args.students)} students in {args.out}")
            return 0
        if args.check:
            problems = stale_files(args.solutions, args.exercises)
            for line in problems:
                print(line)
            if problems:
                print("exercises/ is out of date: run `make exercises`", file=sys.stderr)
                return 1
            print(
                f"exercises/ is up to date ({len(list(args.solutions.glob('*.ipynb')))} notebooks)"
            )
            return 0
        written = write_exercises(args.solutions, args.exercises)
    except CourseInputError as exc:
        print(f"make_exercises: error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    print(f"exercises/ is up to date ({len(written)} written)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
