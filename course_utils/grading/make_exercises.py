"""Generate exercises/ from solutions/: the solved notebooks are the one source of truth.

    python -m course_utils.grading.make_exercises          # (re)write exercises/*.ipynb
    python -m course_utils.grading.make_exercises --check  # exit 1 and list stale files
    python -m course_utils.grading.make_exercises --students ana "José Núñez" --out handout/
    python -m course_utils.grading.make_exercises --roster roster.csv --out handout/

Each `### BEGIN SOLUTION` ... `### END SOLUTION` block (nbgrader's markers) becomes
`# YOUR CODE HERE` + `raise NotImplementedError()` at the block's indentation (in markdown
cells: "YOUR ANSWER HERE"); outputs and execution counts are cleared; cell ids and tags stay,
so the grader can match check cells. Locked cells (check cells, cells tagged "locked") get
JupyterLab's `editable: false` and `deletable: false`, answer cells `deletable: false`, as
nbgrader does; the grader still compares their text. The name cell (`lNN.for_student(...)`)
stays editable, as its text asks a learner on their own to put their name there: the
grader compares it without the name and reads the name with `grader.name_in_notebook`.
The output is byte-for-byte deterministic and already `ruff format`-clean, which is what
lets `--check` (and a test) catch a stale exercises/.

`--students`/`--roster` write OUT/<id>/*.ipynb for each student, on their own numbers (the
id is the seed); every name is checked (`roster.check_name`) before anything is written.
`--lesson NN` hands out one lesson, laid out for an LMS: with students, OUT/<id>/NN_*.ipynb
and OUT/NN_*.zip holding the same folders (one file to upload to a Moodle Folder or Canvas's
Files and unzip there: each student opens their own folder); without, OUT/NN_*.ipynb, the
one notebook to attach to the assignment.
"""

from __future__ import annotations

import copy
import re
import shutil
import sys
from pathlib import Path

import nbformat

from course_utils import validation
from course_utils.errors import CourseInputError
from course_utils.grading.notebook_tools import (
    EXERCISES,
    SOLUTIONS,
    is_check_cell,
    notebook_text,
    read_notebook,
    ruff_format_notebook,
    ruff_problems,
    strip_solutions,
    tags,
)
from course_utils.grading.roster import check_name, check_names, read_roster

# Notebook metadata that only describes one run (widget state), not the exercise.
RUN_METADATA = ("widgets",)
# Students' handouts written at once: about 0.2 MB each (every lesson), 200 MB for a full
# class; more is a mistake (a roster of a whole university) or a job for several runs.
MAX_STUDENTS = 1000


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
        lock(cell)
    return ruff_format_notebook(notebook_text(nb), f"exercises/{name}")


def lock(cell: nbformat.NotebookNode) -> None:
    """JupyterLab's locks, as nbgrader sets them: a check or locked cell can be neither
    edited nor deleted, an answer cell not deleted. The name cell can be edited (a learner
    on their own writes their name there), not deleted."""
    if cell.cell_type == "code" and ANY_STUDENT.search(cell.source):
        cell.metadata.pop("editable", None)
        cell.metadata["deletable"] = False
    elif is_check_cell(cell) or "locked" in tags(cell):
        cell.metadata["editable"] = False
        cell.metadata["deletable"] = False
    elif "answer" in tags(cell):
        cell.metadata["deletable"] = False


# In the notebook's JSON text the quotes are escaped (\"default\"); in a cell's source not.
STUDENT_LINE = re.compile(r'for_student\((\\?)"default\1"\)')
ANY_STUDENT = re.compile(r'for_student\("[^"\n]*"\)')  # in a cell's source, any name


def for_student(text: str, student: str) -> str:
    """An exercise notebook's text with `student`'s numbers (their name is the seed). The
    name may be in any script; `check_name` says what it may not hold (no quotes or
    backslashes, so it goes into the Python string and the JSON text as it is)."""
    student = check_name(student)
    return STUDENT_LINE.sub(lambda m: f'for_student({m[1]}"{student}{m[1]}")', text)


def lesson_notebooks(solutions: Path, lesson: int | None = None) -> list[Path]:
    """The solution notebooks to hand out: every lesson's, or `lesson`'s alone."""
    if lesson is None:
        return sorted(solutions.glob("*.ipynb"))
    from course_utils.grading import missing_solution, solution_of

    validation.integer(lesson, "--lesson", 1, 99)
    found = solution_of(lesson, solutions)
    if found is None:
        raise CourseInputError(f"--lesson {lesson}: {missing_solution(lesson, solutions)}")
    return [found]


def write_for_students(
    students: list[str], out: Path, solutions: Path = SOLUTIONS, lesson: int | None = None
) -> list[Path]:
    """out/<student>/<lesson>.ipynb for every student and lesson (or `lesson` only): their
    own numbers. Every name is checked, and the room on the disk, before anything is written."""
    if len(students) > MAX_STUDENTS:
        raise CourseInputError(
            f"{len(students):,} students: at most {MAX_STUDENTS:,} handouts are written at once "
            "(split the class)"
        )
    students = check_names(students)
    notebooks = {
        p.name: exercise_notebook(read_notebook(p), p.name)
        for p in lesson_notebooks(solutions, lesson)
    }
    needed = len(students) * sum(len(text.encode()) + 64 for text in notebooks.values())
    existing = next(p for p in (out, *out.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if needed > free // 2:
        raise CourseInputError(
            f"--out {str(out)!r}: the handouts need about {needed / 1e6:,.0f} MB, and only "
            f"{free / 1e6:,.0f} MB are free there (at most half of it is used)"
        )
    written = []
    for student in students:
        texts = {name: for_student(text, student) for name, text in notebooks.items()}
        folder = out / student
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            (folder / name).write_text(text, encoding="utf-8")
            written.append(folder / name)
    return written


def zip_handout(written: list[Path], out: Path) -> Path:
    """OUT/<lesson>.zip holding each student's `<id>/<lesson>.ipynb` (one lesson's handouts
    as one upload), written whole or not at all."""
    import os
    import zipfile

    name = written[0].name
    archive = out / (Path(name).stem + ".zip")
    partial = archive.with_name(archive.name + ".partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
        for path in written:
            z.write(path, f"{path.parent.name}/{path.name}")
    os.replace(partial, archive)
    return archive


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
    from course_utils.cli import OneLineParser

    parser = OneLineParser(
        prog="python -m course_utils.grading.make_exercises",
        description=f"{__doc__.splitlines()[0]} Limits: a --roster of "
        f"{validation.MAX_ROSTER_BYTES // validation.MB} MB (as grade's), {MAX_STUDENTS:,} "
        "students at once.",
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
    parser.add_argument(
        "--roster",
        type=Path,
        default=None,
        help="a roster CSV (id,name[,lms_id][,login]): write OUT/<id>/*.ipynb for each student",
    )
    parser.add_argument(
        "--lesson",
        type=int,
        default=None,
        metavar="NN",
        help="hand out one lesson, laid out for upload (needs --out; with --students or "
        "--roster also OUT/NN_*.zip, one folder per student)",
    )
    parser.add_argument("--out", type=Path, default=None, help="folder for the handouts")
    args = parser.parse_args(argv)
    try:
        if not args.solutions.is_dir():
            raise CourseInputError(f"--solutions {str(args.solutions)!r} is not a folder")
        if args.out is not None:  # a folder that takes files, before anything is read
            validation.output_folder(args.out, "--out")
        if args.students is not None or args.roster is not None:
            if args.students is not None and args.roster is not None:
                raise CourseInputError("give --students or --roster, not both")
            if args.out is None:
                raise CourseInputError("--students and --roster need --out FOLDER")
            ids = (
                [s.id for s in read_roster(args.roster)]
                if args.roster is not None
                else args.students
            )
            written = write_for_students(ids, args.out, args.solutions, args.lesson)
            print(f"wrote {len(written)} notebooks for {len(ids)} students in {args.out}")
            if args.lesson is not None:
                archive = zip_handout(written, args.out)
                print(f"wrote {archive}: one folder per student, to upload and unzip (a Moodle "
                      "Folder, Canvas Files)")  # fmt: skip
            return 0
        if args.lesson is not None:
            if args.out is None or args.check:
                raise CourseInputError("--lesson hands out one lesson: give --out FOLDER")
            (path,) = lesson_notebooks(args.solutions, args.lesson)
            args.out.mkdir(parents=True, exist_ok=True)
            target = args.out / path.name
            target.write_text(exercise_notebook(read_notebook(path), path.name), encoding="utf-8")
            print(f"wrote {target}: attach it to the lesson's assignment")
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
        validation.output_folder(args.exercises, "--exercises")
        written = write_exercises(args.solutions, args.exercises)
    except CourseInputError as exc:
        print(f"make_exercises: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the disk filled, a folder vanished: one line, not a traceback
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"make_exercises: error: cannot write: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    print(f"exercises/ is up to date ({len(written)} written)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
