"""`python -m course_utils grade SUBMISSION.ipynb ...`: grade exercise notebooks (see
`course_utils.grading.grader` and INSTRUCTORS.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from course_utils.errors import CourseInputError
from course_utils.grading.grader import (
    find_submissions,
    grade_notebook,
    match_solution,
    table,
    write_csv,
)
from course_utils.grading.notebook_tools import SOLUTIONS, read_notebook

HELP = "grade exercise notebooks with nbval"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "submissions", nargs="+", type=Path, help="submitted .ipynb files or folders of them"
    )
    parser.add_argument("--csv", type=Path, help="write one row per student notebook here")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument(
        "--solutions", type=Path, default=SOLUTIONS, help="folder of solved notebooks"
    )
    parser.add_argument(
        "--timeout", type=float, default=600, help="seconds per notebook (default 600)"
    )
    parser.add_argument(
        "--cell-timeout", type=float, default=120, help="seconds per cell (default 120)"
    )


def run(args: argparse.Namespace) -> int:
    if args.timeout <= 0 or args.cell_timeout <= 0:
        raise CourseInputError("--timeout and --cell-timeout must be positive numbers of seconds")
    if not args.solutions.is_dir():
        raise CourseInputError(f"--solutions {str(args.solutions)!r} is not a folder")
    if args.csv and not args.csv.parent.is_dir():
        raise CourseInputError(f"--csv {str(args.csv)!r}: folder {str(args.csv.parent)!r} missing")
    submissions = find_submissions(args.submissions)
    for path, _ in submissions:  # fail fast on bad input before running anything
        match_solution(read_notebook(path), path, args.solutions)
    results = []
    for path, student in submissions:
        result = grade_notebook(path, student, args.solutions, args.timeout, args.cell_timeout)
        results.append(result)
        if not args.json:
            print(table(result), flush=True)
    if args.json:
        payload = [r.to_dict() for r in results]
        # One notebook named on the command line: an object; a folder or several: a list.
        single = len(payload) == 1 and not args.submissions[0].is_dir()
        print(json.dumps(payload[0] if single else payload, indent=2))
    if args.csv:
        write_csv(results, args.csv)
        if not args.json:
            print(f"wrote {args.csv} ({len(results)} rows)")
    return 0
