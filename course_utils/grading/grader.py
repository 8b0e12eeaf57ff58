"""Grade exercise notebooks with nbval: `python -m course_utils grade SUBMISSION.ipynb ...`.

A submission is a learner's copy of an `exercises/NN_slug.ipynb`. Grading it:

1. match it to its solution notebook in solutions/ (by its check cells' ids `check-NN-K`,
   failing that by file name);
2. prepare a copy a learner cannot game: every check cell is put back from the solution
   (edited ones replaced, deleted ones re-inserted after the answer they check), each
   check cell re-imports the lesson's check module first, and every nbval marker
   (`# NBVAL_SKIP`, `# NBVAL_RAISES_EXCEPTION`, tags `nbval-skip`, `raises-exception`, ...)
   is stripped from every cell;
3. run the copy top to bottom with `pytest --nbval-lax --nbval-current-env` in a subprocess
   (the kernel works in the submission's folder, so its relative paths still work), with a
   per-cell and a per-notebook timeout;
4. read the per-cell results from pytest's JUnit XML: a check cell that ran without error
   is a passed exercise; a failed one reports the check's own message.

Score = passed / total check cells of the solution. Output: a table, `--json`, or `--csv`
(one row per student notebook; a folder argument grades every notebook inside it).
"""

from __future__ import annotations

import copy
import csv
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from course_utils.checks import FAILED_MARK, NOT_ANSWERED_MARK
from course_utils.errors import CourseInputError
from course_utils.grading.notebook_tools import (
    CHECK_ID,
    SOLUTIONS,
    check_cells,
    is_check_cell,
    read_notebook,
    tags,
)

# nbval's switches (comment markers and the tags derived from them) plus Jupyter's own
# skip tags: any of them could make a failing check count as passed or not run at all.
NBVAL_MARKER = re.compile(r"^\s*#+\s*(NBVAL_[A-Z_]+|PYTEST_VALIDATE_[A-Z_]+)\s*$")
SKIP_TAGS = {"raises-exception", "skip-execution", "skip", "remove-cell"}
CHECK_IMPORT = re.compile(r"^from course_utils\.checks import (l\d+) as (\w+)\s*$", re.M)
ANSI = re.compile(r"(?:\x1b|#x1B)\[[0-9;]*m")


@dataclass
class ExerciseResult:
    id: str
    passed: bool
    message: str


@dataclass
class GradeResult:
    notebook: str
    student: str
    solution: str
    exercises: list[ExerciseResult] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.exercises)

    @property
    def score(self) -> int:
        return sum(e.passed for e in self.exercises)

    def to_dict(self) -> dict:
        return {
            "notebook": self.notebook,
            "score": self.score,
            "total": self.total,
            "exercises": [asdict(e) for e in self.exercises],
        }


# -- finding submissions and their solutions ---------------------------------------------------


def find_submissions(paths: list[Path]) -> list[tuple[Path, str | None]]:
    """(notebook, student) pairs; in a folder of per-student folders the student is the
    sub-folder's name, otherwise it is decided later from the file (see `student_name`)."""
    found: list[tuple[Path, str | None]] = []
    for path in paths:
        if path.is_dir():
            notebooks = sorted(
                p
                for p in path.rglob("*.ipynb")
                if not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
            if not notebooks:
                raise CourseInputError(f"submission folder {str(path)!r} has no .ipynb files")
            for nb in notebooks:
                parts = nb.relative_to(path).parts
                found.append((nb, parts[0] if len(parts) > 1 else None))
        elif path.suffix != ".ipynb":
            raise CourseInputError(f"submission {str(path)!r} is not a notebook (.ipynb)")
        elif not path.exists():
            raise CourseInputError(f"submission {str(path)!r} does not exist")
        else:
            found.append((path, None))
    return found


def check_ids(nb: nbformat.NotebookNode) -> list[str]:
    return [cell.id for cell in check_cells(nb) if CHECK_ID.fullmatch(cell.get("id", ""))]


def match_solution(submission: nbformat.NotebookNode, path: Path, solutions: Path) -> Path:
    """The solution notebook sharing most check ids with `submission`, else the same name."""
    candidates = sorted(solutions.glob("*.ipynb"))
    if not candidates:
        raise CourseInputError(f"--solutions {str(solutions)!r} has no solution notebooks")
    ids = {cell.get("id") for cell in submission.cells}
    overlap = {c: len(ids & set(check_ids(read_notebook(c)))) for c in candidates}
    best = max(candidates, key=lambda c: overlap[c])
    if overlap[best]:
        return best
    for candidate in candidates:
        if candidate.name == path.name:
            return candidate
    raise CourseInputError(
        f"no solution matches {str(path)!r}: none of its cell ids is a check id of "
        f"{solutions}/*.ipynb and no solution has its file name"
    )


def student_name(path: Path, student: str | None, solution: Path) -> str:
    """The folder name for `alice/03_x.ipynb`, the file stem for `alice.ipynb`."""
    if student:
        return student
    return path.parent.resolve().name if path.stem == solution.stem else path.stem


# -- preparing a notebook that cannot be gamed -------------------------------------------------


def strip_nbval_markers(cell: nbformat.NotebookNode) -> None:
    lines = cell.source.split("\n")
    cell.source = "\n".join(line for line in lines if not NBVAL_MARKER.match(line))
    if "tags" in cell.get("metadata", {}):
        cell.metadata.tags = [
            t for t in cell.metadata.tags if not t.startswith("nbval-") and t not in SKIP_TAGS
        ]


def restored_check(cell: nbformat.NotebookNode, reimport: str) -> nbformat.NotebookNode:
    """A fresh copy of the solution's check cell; it first reloads the check framework and
    the lesson's check module, so an answer cell that replaced or patched them (or `check`)
    cannot fake a pass."""
    new = copy.deepcopy(cell)
    new.source = reimport + new.source if reimport else new.source
    new.outputs, new.execution_count = [], None
    return new


def prepare(
    submission: nbformat.NotebookNode, solution: nbformat.NotebookNode, workdir: Path
) -> tuple[nbformat.NotebookNode, dict[int, str]]:
    """The notebook to run, and {code cell index (as nbval counts): check id}."""
    nb = copy.deepcopy(submission)
    nb.nbformat, nb.nbformat_minor = 4, max(5, nb.get("nbformat_minor", 5))
    for cell in nb.cells:
        cell.setdefault("id", nbformat.v4.new_code_cell().id)  # old notebooks have no ids
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        strip_nbval_markers(cell)

    imports = CHECK_IMPORT.findall("\n".join(c.source for c in solution.cells))
    reimport = "".join(
        f"import importlib as _importlib, course_utils.checks.{module} as {alias}\n"
        f"_importlib.reload(_importlib.import_module('course_utils.checks'))\n"
        f"{alias} = _importlib.reload({alias})\n"
        for module, alias in dict(imports).items()
    )
    wanted = [c for c in solution.cells if is_check_cell(c)]
    wanted_ids = {c.id for c in wanted}

    # 1. check cells with the solution's id: replace them.
    position = {cell.id: i for i, cell in enumerate(nb.cells)}
    missing = []
    for check in wanted:
        if check.id in position:
            nb.cells[position[check.id]] = restored_check(check, reimport)
        else:
            missing.append(check)
    # 2. cells still tagged "check" but with other ids (old notebooks, pasted copies):
    # pair them with the missing checks in order; any extra ones are just ordinary cells.
    strays = [c for c in nb.cells if is_check_cell(c) and c.id not in wanted_ids]
    for cell in strays:
        cell.metadata["tags"] = [t for t in tags(cell) if t != "check"]
    for stray, check in zip(strays, list(missing), strict=False):
        index = next(i for i, c in enumerate(nb.cells) if c is stray)
        nb.cells[index] = restored_check(check, reimport)
        missing.remove(check)
    # 3. deleted check cells: put back after the nearest solution cell before them that
    # the submission still has (normally the answer cell), else at the same relative place.
    for check in missing:
        at = solution.cells.index(check)
        ids = [c.id for c in nb.cells]
        before = [c.id for c in solution.cells[:at] if c.id in ids]
        index = ids.index(before[-1]) + 1 if before else round(at / len(solution.cells) * len(ids))
        nb.cells.insert(index, restored_check(check, reimport))

    # The kernel starts where nbval puts the copy (a temp folder); work where the learner did.
    setup = nbformat.v4.new_code_cell(f"import os\nos.chdir({str(workdir)!r})")
    nb.cells.insert(0, setup)
    code = [c for c in nb.cells if c.cell_type == "code"]
    return nb, {i: c.id for i, c in enumerate(code) if c.id in wanted_ids}


# -- running it with nbval ---------------------------------------------------------------------


def failure_message(text: str) -> str:
    """The check's own message from nbval's failure report, else the error's last line."""
    header, _, rest = text.partition("\nInput:\n")
    timeout = re.search(r"Cell \d+: (Timeout .*)", header)
    if timeout:  # nbval interrupted a cell that ran too long
        return timeout.group(1).strip()
    traceback = ANSI.sub("", rest.partition("\nTraceback:\n")[2]).strip()
    lines = [line.rstrip() for line in traceback.splitlines() if line.strip()]
    if not lines:
        return ANSI.sub("", text).strip().splitlines()[-1] if text.strip() else "failed"
    if lines[0].startswith((FAILED_MARK, NOT_ANSWERED_MARK)):
        lines[0] = lines[0].removeprefix(FAILED_MARK).removeprefix(NOT_ANSWERED_MARK).strip()
        return "\n".join(lines)
    return lines[-1]  # e.g. "NameError: name 'bubble' is not defined"


def run_nbval(
    nb: nbformat.NotebookNode, name: str, timeout: float, cell_timeout: float
) -> tuple[dict[int, tuple[bool, str]], str | None]:
    """Run a prepared notebook; ({code cell index: (passed, message)}, problem or None)."""
    with tempfile.TemporaryDirectory(prefix="course-grade-") as tmp:
        path, report = Path(tmp) / name, Path(tmp) / "report.xml"
        nbformat.write(nb, path)
        command = [
            sys.executable,
            "-m",
            "pytest",
            "--nbval-lax",
            "--nbval-current-env",
            f"--nbval-cell-timeout={cell_timeout:g}",
            "-p",
            "no:cacheprovider",
            "--color=no",
            "-q",
            f"--rootdir={tmp}",
            f"--junitxml={report}",
            str(path),
        ]
        problem = None
        try:
            subprocess.run(command, cwd=tmp, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            problem = f"the notebook did not finish within {timeout:g} s"
        if not report.exists():
            return {}, problem or "nbval produced no report"
        results: dict[int, tuple[bool, str]] = {}
        for case in ET.parse(report).iter("testcase"):
            number = re.fullmatch(r"Cell (\d+)", case.get("name", ""))
            if not number:
                continue
            bad = case.find("failure")
            bad = bad if bad is not None else case.find("error")
            if bad is not None:
                results[int(number.group(1))] = (False, failure_message(bad.text or ""))
            elif (skipped := case.find("skipped")) is not None:
                why = f"{skipped.get('message', '')} {skipped.text or ''}"
                reason = "an earlier cell timed out" if "timed out" in why else ""
                results[int(number.group(1))] = (False, f"did not run ({reason or 'skipped'})")
            else:
                results[int(number.group(1))] = (True, "")
        return results, problem


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it is inside it (shorter tables)."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def grade_notebook(
    path: Path,
    student: str | None = None,
    solutions: Path = SOLUTIONS,
    timeout: float = 600,
    cell_timeout: float = 120,
) -> GradeResult:
    """Grade one submission (see the module docstring for the steps)."""
    submission = read_notebook(path)
    solution_path = match_solution(submission, path, solutions)
    solution = read_notebook(solution_path)
    nb, checks = prepare(submission, solution, path.parent.resolve())
    results, problem = run_nbval(nb, path.name, timeout, cell_timeout)
    by_id = {check_id: results.get(index) for index, check_id in checks.items()}
    result = GradeResult(
        notebook=str(path),
        student=student_name(path, student, solution_path),
        solution=_shown(solution_path),
    )
    for cell in check_cells(solution):
        outcome = by_id.get(cell.id)
        if outcome is None:
            outcome = (False, f"did not run ({problem or 'no result from nbval'})")
        result.exercises.append(ExerciseResult(cell.id, *outcome))
    return result


# -- reporting ----------------------------------------------------------------------------------


def table(result: GradeResult) -> str:
    width = max((len(e.id) for e in result.exercises), default=0)
    lines = [f"{result.notebook} (student {result.student}, solution {result.solution})"]
    for e in result.exercises:
        message = e.message.splitlines()[0] if e.message else ""
        lines.append(f"  {e.id:<{width}}  {'passed' if e.passed else 'FAILED'}  {message}".rstrip())
    percent = 100 * result.score / result.total if result.total else 0.0
    lines.append(f"  score: {result.score}/{result.total} ({percent:.0f}%)")
    return "\n".join(lines)


def write_csv(results: list[GradeResult], path: Path) -> None:
    """One row per student notebook; one 1/0 column per exercise id (blank if not in it)."""
    ids = sorted({e.id for r in results for e in r.exercises})
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "notebook", "score", "total", *ids])
        for r in results:
            marks = {e.id: int(e.passed) for e in r.exercises}
            writer.writerow(
                [r.student, r.notebook, r.score, r.total, *(marks.get(i, "") for i in ids)]
            )
