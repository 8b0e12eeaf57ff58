"""`python -m course_utils grade SUBMISSION.ipynb|FOLDER ...`: grade exercise notebooks.

Each notebook runs apart, in its own kernel and scratch folder; its answers are judged in
the grader's process (see `course_utils.grading` and INSTRUCTORS.md). A table per notebook,
or `--json` (always a list), and `--csv` (one row per notebook).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from course_utils.errors import CourseInputError

HELP = "grade exercise notebooks (run apart, judged outside the learner's kernel)"
MAX_JOBS = 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from course_utils.grading import SOLUTIONS

    parser.add_argument(
        "submissions", nargs="+", type=Path, help="submitted .ipynb files or folders of them"
    )
    parser.add_argument("--csv", type=Path, help="write one row per notebook here")
    parser.add_argument("--json", action="store_true", help="print the results as a JSON list")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS, help="folder of solutions")
    parser.add_argument("--lesson", type=int, default=None, help="grade as this lesson (1-99)")
    parser.add_argument(
        "--variants",
        action="store_true",
        help="each learner's own numbers: their student name is the seed (see make_exercises)",
    )
    parser.add_argument(
        "-j", "--jobs", type=int, default=1, help=f"notebooks graded at once (1-{MAX_JOBS})"
    )
    parser.add_argument(
        "--timeout", type=float, default=600, help="seconds per notebook (default 600)"
    )
    parser.add_argument(
        "--cell-timeout", type=float, default=120, help="seconds per cell (default 120)"
    )
    parser.add_argument(
        "--call-timeout",
        type=float,
        default=20,
        help="seconds per call of a learner's function (default 20)",
    )


def _seconds(value: float, flag: str) -> float:
    if not math.isfinite(value) or value <= 0 or value > 86400:
        raise CourseInputError(f"{flag} must be a number of seconds from 0 to 86400, got {value!r}")
    return value


def run(args: argparse.Namespace) -> int:
    for flag in ("--timeout", "--cell-timeout", "--call-timeout"):
        _seconds(getattr(args, flag.lstrip("-").replace("-", "_")), flag)
    if not 1 <= args.jobs <= MAX_JOBS:
        raise CourseInputError(f"--jobs must be an integer from 1 to {MAX_JOBS}, got {args.jobs}")
    if args.lesson is not None and not 1 <= args.lesson <= 99:
        raise CourseInputError(f"--lesson must be a lesson number from 1 to 99, got {args.lesson}")
    if not args.solutions.is_dir():
        from course_utils.grading import SOLUTIONS

        if args.solutions == SOLUTIONS:  # the default: course_utils is an installed package
            raise CourseInputError(
                "--solutions DIR is needed: the solved notebooks are not part of the installed "
                "course_utils package; give the solutions/ folder of a course checkout"
            )
        raise CourseInputError(f"--solutions {str(args.solutions)!r} is not a folder")
    if args.csv is not None:
        if args.csv.is_dir():
            raise CourseInputError(f"--csv {str(args.csv)!r} is a folder: give a file name")
        if not args.csv.parent.is_dir():
            raise CourseInputError(
                f"--csv {str(args.csv)!r}: folder {str(args.csv.parent)!r} is missing"
            )

    for path in args.submissions:  # bad paths: one line, before anything slow is imported
        if not path.exists():
            raise CourseInputError(f"submission {str(path)!r} does not exist")
        if path.is_file() and path.suffix != ".ipynb":
            raise CourseInputError(f"submission {str(path)!r} is not a notebook (.ipynb)")

    from course_utils.grading.batch import find_submissions, grade_all, write_csv
    from course_utils.grading.grader import table

    find_submissions(args.submissions)  # an empty folder: one line too

    def show(result) -> None:
        if not args.json:
            print(table(result), flush=True)

    results = grade_all(
        args.submissions,
        jobs=args.jobs,
        variants=args.variants,
        lesson=args.lesson,
        solutions=args.solutions,
        cell_timeout=args.cell_timeout,
        total_timeout=args.timeout,
        call_timeout=args.call_timeout,
        on_result=show,
    )
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2, allow_nan=False))
    if args.csv:
        write_csv(results, args.csv)
        print(
            f"wrote {args.csv} ({len(results)} rows)", file=sys.stderr if args.json else sys.stdout
        )
    return 0
