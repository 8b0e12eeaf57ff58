"""Grade one exercise notebook: run it apart, judge its answers here, report what was changed.

    result = grade_notebook(notebook_bytes, "alice/03_bubble_tradeoff.ipynb", student="alice")

1. Which lesson: the check module it imports and its "Exercise N.K" headings say (`lesson=`
   pins it; a notebook of another lesson then scores what it answers of this one: nothing).
2. Which numbers: with `variant=` the learner's own (their seed, e.g. their name), else the
   course's default ones. The inputs for Build exercises are drawn here, fresh, and never
   leave the grader except as the arguments the learner's function is called with.
3. Run it apart (`course_utils.grading.sandbox`): its own kernel in a sandbox of its own
   (`isolation`), which shows it the course's package without the checks (`stand_in`), its
   own scratch folder, nothing of the submission's folder on `sys.path`; answers come back
   as data.
4. Judge here (`course_utils.grading.judge`): the lesson's check functions, in this process.
5. Report tampering: every locked cell of the solution (check cells, cells tagged "locked")
   is compared with the submission's; changed and missing ones are listed. A name cell
   (`lNN.for_student("...")`) that does not name the student graded is said so in `flags`:
   "default numbers" (it says "default") or "name cell edited" (another name).

Score = the points earned / the points of the solution's exercises: each exercise is worth
what its check declares (1 unless it says more); a right answer earns them all, a partly right
one, where its check gives partial credit, the share of its parts that hold (`judge`). An
instructor's review (the CSV's `review` column, read back by `journal`) adds to or takes from
the score (`GradeResult.final`). The batch runner (`batch.py`) grades many notebooks, each
in its own worker process.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import importlib
import json
import re
import secrets
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from course_utils.checks import DEFAULT_STUDENT, Variant
from course_utils.checks.scoring import earned
from course_utils.checks.wire import encode
from course_utils.errors import CourseInputError
from course_utils.grading import stand_in
from course_utils.grading.judge import cases_for, judge, worth
from course_utils.grading.make_exercises import ANY_STUDENT
from course_utils.grading.neutral import visible
from course_utils.grading.notebook_tools import SOLUTIONS, is_check_cell, tags
from course_utils.grading.roster import possessive
from course_utils.grading.sandbox import Exercise, KernelStartError, check_calls, run_submission

IMPORT = re.compile(r"course_utils\.checks import l(\d+)")
HEADING = re.compile(r"^#+\s*Exercise\s+(\d+)\.\d+", re.M)


@dataclass
class ExerciseResult:
    id: str  # "3.2"
    passed: bool
    message: str
    # Graded on other numbers than the notebook printed (its name cell names someone else):
    # {"passed", "message"} its own check cell would have shown (None where the same).
    as_printed: dict | None = None
    points: float = 1  # what the exercise is worth (its check's `points`)
    earned: float | None = None  # all its points if passed, else a partly right answer's share

    def __post_init__(self) -> None:
        self.points = tidy(max(float(self.points), 0.0))
        earned = self.points if self.passed else (self.earned or 0.0)
        self.earned = tidy(min(max(float(earned), 0.0), self.points))

    @property
    def partly(self) -> bool:
        """Not right, but some of its points earned (a check with partial credit)."""
        return not self.passed and bool(self.earned)


def tidy(points: float) -> float:
    """Points as every report writes them: a whole number as an int, else to 2 decimals."""
    points = round(float(points), 2)
    return int(points) if points.is_integer() else points


NOT_ANSWERED = re.compile(r"^Exercise \d+\.\d+ is not answered")


def unanswered(exercise: ExerciseResult) -> bool:
    """Whether the exercise was left unanswered (its message says so), not answered wrong."""
    return not exercise.passed and bool(NOT_ANSWERED.match(exercise.message))


@dataclass
class GradeResult:
    notebook: str
    student: str
    lesson: int | None = None
    variant: str = DEFAULT_STUDENT
    exercises: list[ExerciseResult] = field(default_factory=list)
    tampering: list[dict] = field(default_factory=list)  # [{"cell", "status"}]
    problem: str | None = None  # why the notebook could not be graded at all
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    flags: list[str] = field(default_factory=list)  # "default numbers", "missing", ...
    name: str = ""  # the student's name on the roster
    sha256: str = ""  # of the notebook's bytes
    key: dict = field(default_factory=dict)  # its resume key (`resume.ResumeKey`), as graded
    regraded: list[str] = field(default_factory=list)  # why graded again (a rerun's reasons)
    # The instructor's manual review, read back from the CSV's `review` and `review note`
    # columns (`journal.reviews`): points added to the score (taken, if negative), and why.
    review: float | None = None
    review_note: str = ""

    @property
    def total(self) -> float:
        """The points the notebook's exercises are worth."""
        return tidy(sum(e.points for e in self.exercises))

    @property
    def score(self) -> float:
        """The points the grader gave (before any review)."""
        return tidy(sum(e.earned or 0.0 for e in self.exercises))

    def final(self, possible: float | None = None) -> float:
        """The score with the review added, kept within 0 and the points `possible` (the
        lesson's; by default the notebook's total)."""
        top = self.total if possible is None else possible
        return tidy(min(max(self.score + (self.review or 0.0), 0.0), max(top, 0.0)))

    def to_dict(self) -> dict:
        missing = "missing" in self.flags  # no notebook: no score, no total
        return {
            "notebook": self.notebook,
            "student": self.student,
            "lesson": self.lesson,
            "variant": self.variant,
            "score": None if missing else self.score,
            "total": None if missing else self.total,
            "exercises": [asdict(e) for e in self.exercises],
            "tampering": self.tampering,
            "problem": self.problem,
            "notes": self.notes,
            "seconds": round(self.seconds, 2),
            "flags": self.flags,
            "name": self.name,
            "sha256": self.sha256,
            "key": self.key,
            "regraded": self.regraded,
            "review": self.review,
            "review_note": self.review_note,
            "final": None if missing else self.final(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> GradeResult:
        """The result `to_dict` wrote (a worker's report, a journal's line)."""
        return cls(
            notebook=data["notebook"],
            student=data["student"],
            lesson=data.get("lesson"),
            variant=data.get("variant", DEFAULT_STUDENT),
            exercises=[ExerciseResult(**e) for e in data.get("exercises", [])],
            tampering=data.get("tampering", []),
            problem=data.get("problem"),
            notes=data.get("notes", []),
            seconds=data.get("seconds", 0.0),
            flags=data.get("flags", []),
            name=data.get("name", ""),
            sha256=data.get("sha256", ""),
            key=data.get("key") or {},
            regraded=list(data.get("regraded") or []),
            review=data.get("review"),
            review_note=data.get("review_note") or "",
        )


def read_submission(data: bytes, name: str) -> nbformat.NotebookNode:
    try:
        return nbformat.reads(data.decode("utf-8"), as_version=4)
    except Exception as exc:  # truncated JSON, not a notebook, bad encoding ...
        # nbformat quotes the file's text when it is not JSON: say where, not what.
        if isinstance(exc, json.JSONDecodeError):
            first = f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        elif type(exc).__name__ == "NotJSONError":
            first = "not JSON"
        else:
            first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise CourseInputError(f"{name} is not a readable notebook ({first})") from None


def detect_lesson(nb: nbformat.NotebookNode) -> int | None:
    """The lesson a notebook is for, from the check module it imports and its headings."""
    text = "\n".join(c.source for c in nb.cells)
    votes = Counter(int(n) for n in IMPORT.findall(text))
    votes.update(int(n) for n in HEADING.findall(text))
    return votes.most_common(1)[0][0] if votes else None


def solution_for(lesson: int, solutions: Path = SOLUTIONS) -> Path:
    from course_utils.grading import missing_solution, solution_of

    found = solution_of(lesson, solutions)
    if found is None:
        raise CourseInputError(missing_solution(lesson, solutions) or "no solution")
    return found


def exercises_of(solution: nbformat.NotebookNode) -> list[Exercise]:
    """Each exercise's answer expressions, read from the solution's check calls."""
    found: dict[int, Exercise] = {}
    for cell in solution.cells:
        if is_check_cell(cell):
            for k, (args, kwargs) in check_calls(cell.source).items():
                found[k] = Exercise(k, args, kwargs)
    return [found[k] for k in sorted(found)]


def source_fingerprint(source: str) -> str:
    """A hash of a cell's source that ignores trailing spaces and blank lines around it."""
    lines = [line.rstrip() for line in source.strip().splitlines()]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def tampering(
    submission: nbformat.NotebookNode,
    solution: nbformat.NotebookNode,
    variant: str = DEFAULT_STUDENT,
) -> list[dict]:
    """Locked cells of the solution (check cells and cells tagged "locked") that the
    submission changed or removed, matched by cell id, else by content. The name in the
    setup cell is not compared (a notebook written for a student names them there; one that
    names someone else is flagged by `_name_cell`, not reported twice)."""

    def fingerprint(source: str) -> str:
        return source_fingerprint(ANY_STUDENT.sub(f'for_student("{DEFAULT_STUDENT}")', source))

    theirs = {c.get("id"): c for c in submission.cells}
    contents = {fingerprint(c.source) for c in submission.cells}
    report = []
    for cell in solution.cells:
        if not (is_check_cell(cell) or "locked" in tags(cell)):
            continue
        mine = fingerprint(cell.source)
        if cell.get("id") in theirs:
            if fingerprint(theirs[cell.get("id")].source) != mine:
                report.append({"cell": cell.get("id"), "status": "changed"})
        elif mine not in contents:
            report.append({"cell": cell.get("id"), "status": "removed"})
    return report


def name_in_notebook(nb: nbformat.NotebookNode) -> str | None:
    """The student its setup cell names (`check = l03.for_student("alice")`), if any."""
    for cell in nb.cells:
        if cell.cell_type != "code" or "for_student" not in cell.source:
            continue
        lines = cell.source.splitlines()
        code = "\n".join(ln for ln in lines if not ln.lstrip().startswith(("%", "!")))
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute | ast.Name)
                and getattr(node.func, "attr", getattr(node.func, "id", "")) == "for_student"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                return node.args[0].value
    return None


def naming(nb: nbformat.NotebookNode, student: str) -> nbformat.NotebookNode:
    """`nb` with its name cell naming `student` (a copy, if it named someone else). Without a
    sandbox the kernel draws its numbers from the real checks, for the student its name cell
    names; in one, the stand-in hands it the numbers of the student graded, whatever the cell
    says. The notebook run without a sandbox names that student, so both grade alike."""
    named = name_in_notebook(nb)
    if named is None or named == student:
        return nb
    call = re.compile(r"""for_student\((["'])""" + re.escape(named) + r"\1\)")
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = call.sub(lambda m: f"for_student({student!r})", cell.source)
    return nb


def _name_cell(result: GradeResult, named: str | None) -> None:
    """Say in the result when the setup cell does not name the student graded."""
    if result.variant == DEFAULT_STUDENT:
        if named not in (None, DEFAULT_STUDENT):
            result.notes.append(
                f"its name cell says {named!r}: graded on the course's default numbers "
                f"(grade with --variants or --student {named!r} for that student's own)"
            )
        return
    own = possessive(result.variant)
    if named == DEFAULT_STUDENT:
        result.flags.append("default numbers")
        result.notes.append(
            f'worked on the course\'s default numbers: its name cell says "default", '
            f"not {result.variant!r}; graded on {own} numbers"
        )
    elif named is not None and named != result.variant:
        result.flags.append("name cell edited")
        result.notes.append(
            f"its name cell was edited: it says {named!r}, not {result.variant!r}; "
            f"graded on {own} numbers"
        )


def _as_printed(
    result: GradeResult, module, exercises: list[Exercise], run, named: str | None
) -> None:
    """Where the notebook printed other numbers than it was graded on (its name cell names
    someone else, or "default"), what its own check cells said on those numbers, for the
    feedback page: a student is never shown numbers her notebook did not print. Build
    exercises are left as they are: their messages show the grader's own calls."""
    if named is None or named == result.variant:
        return
    try:
        printed = Variant(named, cases_seed=secrets.token_hex(8))
    except ValueError:  # a name cell no check could have run with
        return
    for ex, row in zip(exercises, result.exercises, strict=True):
        if ex.cases:
            continue
        verdict = judge(module, ex, run.answers.get(ex.k, {}), printed, run.problems.get(ex.k, []))
        row.as_printed = {"passed": verdict.passed, "message": verdict.message}


def grade_notebook(
    data: bytes,
    name: str,
    student: str = DEFAULT_STUDENT,
    variant: str | None = None,
    lesson: int | None = None,
    solutions: Path = SOLUTIONS,
    folder_files: dict[str, bytes] | None = None,
    cell_timeout: float = 120.0,
    total_timeout: float = 600.0,
    call_timeout: float = 20.0,
    sandbox: bool = True,
    trust_name_cell: bool = False,
    limits=None,
    ipc_root: Path | None = None,
    cgroup: Path | None = None,
) -> GradeResult:
    """Grade one submitted notebook given as bytes (see the module docstring).

    `sandbox=False` runs the learner's kernel without a sandbox (`grade --no-sandbox`).
    `trust_name_cell` (a single handout graded without a name): with no `variant`, grade on
    the numbers of the student its setup cell names, and flag the name as not verified.
    `limits`, `ipc_root` and `cgroup` are the sandbox's (`sandbox.run_submission`)."""
    result = GradeResult(notebook=name, student=student, variant=variant or DEFAULT_STUDENT)
    result.sha256 = hashlib.sha256(data).hexdigest()
    try:
        submission = read_submission(data, name)
    except CourseInputError as exc:
        result.problem = str(exc)
        return result
    named = name_in_notebook(submission)
    if trust_name_cell and variant is None and named not in (None, DEFAULT_STUDENT):
        result.variant = result.student = str(named)
        result.flags.append("name not verified")
        result.notes.append(
            f"graded on the numbers of {named!r}, the name in its first cell, which was not "
            f"verified (grade it with --student NAME to be sure)"
        )
    else:
        _name_cell(result, named)
    detected = detect_lesson(submission)
    result.lesson = lesson or detected
    if result.lesson is None:
        result.problem = f"{name}: no exercises of any lesson found (no check import or heading)"
        return result
    if lesson and detected and detected != lesson:
        result.notes.append(
            f"this notebook looks like lesson {detected:02d}'s; graded as {lesson:02d}"
        )
    solution = nbformat.read(solution_for(result.lesson, solutions), as_version=4)
    module = importlib.import_module(f"course_utils.checks.l{result.lesson:02d}")
    learner = Variant(result.variant, cases_seed=secrets.token_hex(8))
    exercises = exercises_of(solution)
    for ex in exercises:
        ex.cases = {
            e: [encode(tuple(c)) for c in cs] for e, cs in cases_for(module, ex.k, learner).items()
        }
    result.tampering = tampering(submission, solution, result.variant)
    checks_cells = frozenset(c.source.strip() for c in solution.cells if is_check_cell(c))
    with tempfile.TemporaryDirectory(prefix="course-checks-") as tmp:
        checks = None
        if sandbox:
            checks = stand_in.write(Path(tmp) / "checks", solution, module, learner)
        try:
            run = run_submission(
                submission if sandbox else naming(submission, result.variant),
                folder_files or {},
                result.lesson,
                exercises,
                cell_timeout,
                total_timeout,
                call_timeout,
                skip=checks_cells,
                stand_in=checks,
                limits=limits,
                ipc_root=ipc_root,
                cgroup=cgroup,
            )
        except KernelStartError as exc:
            result.problem = str(exc)
            return result
    result.notes += run.notes
    result.seconds = run.seconds
    for ex in exercises:
        verdict = judge(module, ex, run.answers.get(ex.k, {}), learner, run.problems.get(ex.k, []))
        points = worth(module, ex.k)[0]
        result.exercises.append(
            ExerciseResult(
                f"{result.lesson}.{ex.k}",
                verdict.passed,
                verdict.message,
                points=points,
                earned=earned(points, verdict.share),
            )
        )
    _as_printed(result, module, exercises, run, named)
    return result


def table(result: GradeResult) -> str:
    """The result for the terminal: every text that came from the submission is `visible`
    (an escape sequence in it is shown, not obeyed), one line each."""
    v = visible
    head = f"{v(result.notebook)} (student {v(result.student)}"
    head += f", lesson {result.lesson:02d}" if result.lesson else ""
    head += f", variant {v(result.variant)})" if result.variant != DEFAULT_STUDENT else ")"
    lines = [head]
    if result.problem:
        lines.append(f"  not graded: {v(result.problem)}")
    width = max((len(e.id) for e in result.exercises), default=0)
    for e in result.exercises:
        message = e.message.splitlines()[0] if e.message and not e.passed else ""
        verdict = "passed" if e.passed else "partly" if e.partly else "FAILED"
        if e.points != 1 or e.partly:
            verdict += f" {e.earned}/{e.points}"
        lines.append(f"  {v(e.id):<{width}}  {verdict}  {v(message)}".rstrip())
    for t in result.tampering:
        lines.append(f"  locked cell {v(t['cell'])}: {v(t['status'])}")
    lines += [f"  note: {v(n)}" for n in result.notes]
    if result.total:
        lines.append(
            f"  score: {result.score}/{result.total} ({100 * result.score / result.total:.0f}%)"
        )
    if result.review is not None:
        said = f": {v(result.review_note)}" if result.review_note else ""
        lines.append(f"  review: {result.review:+g}{said}; final {result.final()}/{result.total}")
    return "\n".join(lines)
