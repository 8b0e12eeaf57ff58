"""Every exercise notebook's checks can fail and can pass.

For each `solutions/NN_*.ipynb` (whatever exists when the tests run):

- exercises/ is generated from solutions/ and up to date (`make exercises`);
- the notebook follows the conventions: "### Exercise N.K (Predict|Build|Diagnose)" heading,
  an answer cell (tag "answer") with a solution block, a check cell (tag "check", id
  `check-NN-K`) making one call `check.exercise_K(...)`;
- run unanswered (exercises/), EVERY check cell fails with "not answered yet" and no stack
  trace; run solved (solutions/), every cell runs without error (what nbval checked when
  `make notebooks` ran solutions/ too) and every check cell passes and says so;
- the grader gives the unanswered notebook 0 and the solution full marks, also when it is
  written out for another student's numbers, and a submission that patches or skips its
  checks no marks (tests/test_grading.py attacks the grader further).

Each notebook is executed once per session (tests/notebook_runs.py), as in Restart & Run
All, pinned to one core; a solution must run within 2 minutes and 1.5 GB there.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import nbformat
import pytest
from gradingkit import NO_SANDBOX, SANDBOX
from notebook_runs import READS_THE_RUNS, run

from course_utils.grading import make_exercises
from course_utils.grading.notebook_tools import BEGIN, check_cells, is_check_cell

ROOT = Path(__file__).resolve().parents[1]
SOLVED = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
NAMES = [pytest.param(p.name, id=p.stem) for p in SOLVED] or [
    pytest.param(None, marks=pytest.mark.skip(reason="no solutions/NN_*.ipynb notebooks yet"))
]
CALL = re.compile(r"\w+\.exercise_(\d+)\(.*\)")


def executed(path: Path) -> nbformat.NotebookNode:
    """`path` as it ran top to bottom in a fresh kernel on one core (errors allowed): the
    session's one run of it (tests/notebook_runs.py)."""
    if not path.exists():
        pytest.fail(f"{path.relative_to(ROOT)} is missing: run `make exercises`")
    return run(path).notebook


def errors(cell) -> list:
    return [o for o in cell.get("outputs", []) if o.output_type == "error"]


def test_exercises_folder_is_up_to_date():
    stale = make_exercises.stale_files()
    assert not stale, "run `make exercises`:\n" + "\n".join(stale)


@pytest.mark.parametrize("name", NAMES)
def test_notebook_follows_the_exercise_conventions(name):
    nb = nbformat.read(ROOT / "solutions" / name, as_version=4)
    lesson = int(name[:2])
    imports = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    # The checks are reached through one object, made for the student in the setup cell
    # (the grader and `make_exercises --students` rewrite the name; see for_student).
    assert f"from course_utils.checks import l{lesson:02d}\n" in imports + "\n", name
    assert f'check = l{lesson:02d}.for_student("default")' in imports, name

    checks = check_cells(nb)
    assert 4 <= len(checks) <= 9, f"{name}: {len(checks)} exercises (the course uses 4-9)"
    previous, kinds = -1, set()
    for k, check in enumerate(checks, start=1):
        where = f"{name}, check cell {check.get('id')!r}"
        assert check.id == f"check-{lesson:02d}-{k}", f"{where}: ids go check-NN-1, -2, ..."
        assert "check" in check.metadata.get("tags", []), f"{where}: needs the tag 'check'"
        calls = [ln for ln in check.source.splitlines() if ln.strip() and not ln.startswith("#")]
        assert len(calls) == 1 and CALL.fullmatch(calls[0].strip()), f"{where}: one check call"
        assert int(CALL.fullmatch(calls[0].strip()).group(1)) == k, f"{where}: calls exercise_{k}"

        here = nb.cells.index(check)
        between = nb.cells[previous + 1 : here]
        answers = [c for c in between if "answer" in c.metadata.get("tags", [])]
        assert answers, f"{where}: no answer cell (tag 'answer') before it"
        solved = [any(line.strip() == BEGIN for line in c.source.splitlines()) for c in answers]
        assert all(solved), f"{where}: answer lacks {BEGIN!r}"
        heading = re.compile(rf"^#+ Exercise {lesson}\.{k} \((Predict|Build|Diagnose)\)", re.M)
        found = [heading.search(c.source) for c in between if c.cell_type == "markdown"]
        found = [m.group(1) for m in found if m]
        assert found, (
            f"{where}: no '### Exercise {lesson}.{k} (Predict|Build|Diagnose): ...' heading"
        )
        kinds.add(found[0])
        previous = here
    # No check cells hidden elsewhere, e.g. with the id but not the tag.
    assert sum(is_check_cell(c) for c in nb.cells) == len(checks)
    assert kinds == {"Predict", "Build", "Diagnose"}, f"{name}: exercise kinds {sorted(kinds)}"


# Every lesson has an exercise notebook but the welcome (00) and the appendix (14).
WITHOUT_EXERCISES = {"00", "14"}  # the index, the appendix


def test_every_lesson_has_exercises():
    lessons = {p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    wanted = {name for name in lessons if name[:2] not in WITHOUT_EXERCISES}
    assert {p.name for p in SOLVED} == wanted


def implementation_exercises() -> dict[int, list[int]]:
    """Each lesson's implementation exercises: the Builds whose learner code the check runs on
    the course's devices or, in lesson 13, on real processes. Their cases say how to run it
    (`__course_call__`: `programs.ProgramCase`, `rank_cases`, `processes`)."""
    import importlib

    found: dict[int, list[int]] = {}
    for path in sorted((ROOT / "course_utils" / "checks").glob("l[0-9][0-9].py")):
        module = importlib.import_module(f"course_utils.checks.{path.stem}")
        for k in sorted(int(n[6:]) for n in dir(module) if re.fullmatch(r"cases_\d+", n)):
            cases = getattr(module, f"cases_{k}")()
            trials = [c for calls in cases.values() for args in calls for c in args]
            if any(callable(getattr(c, "__course_call__", None)) for c in trials):
                found.setdefault(int(path.stem[1:]), []).append(k)
    return found


# Implementation exercises today: 29 of 94, at least one in every lesson 01-13 (issue 44 asked
# for 30% and one in every lesson). They must never go down.
IMPLEMENTATION_LESSONS = set(range(1, 14))
IMPLEMENTATION_AT_LEAST = 29


def test_implementation_exercises_never_go_down():
    found = implementation_exercises()
    assert found.get(13) == [2, 3]  # the worker files, run on two processes
    assert set(found) >= IMPLEMENTATION_LESSONS, sorted(found)
    assert sum(map(len, found.values())) >= IMPLEMENTATION_AT_LEAST, found


def test_implementation_exercises_are_30_percent_with_one_in_every_lesson():
    found = implementation_exercises()
    total = 0
    for path in SOLVED:
        nb = nbformat.read(path, as_version=4)
        total += sum(bool(CALL.search(c.source)) for c in nb.cells if is_check_cell(c))
    assert set(found) == set(range(1, 14)), sorted(found)
    assert sum(map(len, found.values())) >= 0.3 * total, (found, total)


def test_for_student_puts_the_name_in_the_setup_line_of_the_file_and_of_a_cell():
    from course_utils.errors import CourseInputError
    from course_utils.grading.make_exercises import for_student

    cell = 'check = l03.for_student("default")  # your instructor may give you your own name'
    assert for_student(cell, "ana") == cell.replace('"default"', '"ana"')
    file_text = nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)]))
    mine = nbformat.reads(for_student(file_text, "ana"), as_version=4)
    assert mine.cells[0].source == cell.replace('"default"', '"ana"')
    with pytest.raises(CourseInputError, match="student"):
        for_student(cell, "../etc")


def test_a_notebook_written_for_a_student_is_not_tampered_and_a_renamed_one_only_flagged():
    from course_utils.grading.grader import tampering
    from course_utils.grading.make_exercises import for_student

    solution = nbformat.read(ROOT / "solutions" / "03_bubble_tradeoff.ipynb", as_version=4)
    mine = nbformat.reads(for_student(nbformat.writes(solution), "ana"), as_version=4)
    assert tampering(mine, solution, "ana") == []
    # ana sets her notebook back to the course's numbers: the name cell's flag says so
    # ("default numbers", grader._name_cell), not a second report of a changed cell...
    assert tampering(solution, solution, "ana") == []
    # ...but anything else added to her setup cell is a change
    setup = next(c for c in mine.cells if "for_student(" in c.source)
    setup.source += "\ncheck.exercise_1 = print"
    assert [t["status"] for t in tampering(mine, solution, "ana")] == ["changed"]


@pytest.mark.slow
@READS_THE_RUNS
@pytest.mark.parametrize("name", NAMES)
def test_every_check_fails_when_unanswered(name):
    nb = executed(ROOT / "exercises" / name)
    for check in check_cells(nb):
        found = errors(check)
        assert len(found) == 1, f"{name} {check.id}: the unanswered check did not fail"
        (error,) = found
        assert error.ename == "NotAnswered", (
            f"{name} {check.id}: unanswered should raise NotAnswered, got "
            f"{error.ename}: {error.evalue}"
        )
        assert "is not answered yet" in error.evalue
        # The learner sees one kind message, no stack trace from inside the checker.
        assert error.traceback[0].startswith("✋") and "File " not in "\n".join(error.traceback)


@pytest.mark.slow
@READS_THE_RUNS
@pytest.mark.parametrize("name", NAMES)
def test_every_check_passes_with_the_solution(name):
    nb = executed(ROOT / "solutions" / name)
    for check in check_cells(nb):
        found = errors(check)
        assert not found, f"{name} {check.id}: {found[0].ename}: {found[0].evalue}"
        text = "".join(o.get("text", "") for o in check.outputs if o.output_type == "stream")
        assert "✅" in text, f"{name} {check.id}: a passing check should say so (passed(...))"


# Ways a cell can be excused from running clean: nbval's comment markers and skip tags.
NBVAL_MARKER = re.compile(r"\s*#\s*NBVAL_\w+")
SKIP_TAGS = {"skip-execution", "raises-exception", "skip"}


@pytest.mark.slow
@READS_THE_RUNS
@pytest.mark.parametrize("name", NAMES)
def test_every_solution_cell_runs_without_error(name):
    # The solutions' run top to bottom: `make notebooks` (nbval) runs the lessons only, so
    # this is where a solution cell that raises is caught, check cell or not.
    path = ROOT / "solutions" / name
    raw = nbformat.read(path, as_version=4)
    for index, cell in enumerate(raw.cells):  # nothing may excuse a cell from running clean
        marked = [ln for ln in cell.source.splitlines() if NBVAL_MARKER.match(ln)]
        # (nbval-ignore-output, on cells that print measured figures, only spares their
        # output nbval's comparison: tests/test_nbval_strict.py)
        tags = [t for t in cell.metadata.get("tags", []) if t != "nbval-ignore-output"]
        marked += [t for t in tags if t.startswith("nbval-")]
        marked += sorted(SKIP_TAGS & set(cell.metadata.get("tags", [])))
        assert not marked, f"{name} cell {index}: solutions carry no nbval/skip markers: {marked}"
    nb = executed(path)
    took = run(path)
    assert took.seconds < 120, f"{name}: {took.seconds:.0f} s on one core (budget 2 minutes)"
    assert took.peak_mb < 1536, f"{name}: {took.peak_mb:.0f} MB (budget 1.5 GB)"
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()]
    not_run = [i for i, c in code if c.execution_count is None]
    assert code and not not_run, f"{name}: cells {not_run} did not run"
    for index, cell in code:
        found = errors(cell)
        assert not found, (
            f"{name} cell {index} ({cell.get('id')}): {found[0].ename}: {found[0].evalue}"
        )


@pytest.mark.slow
@pytest.mark.skipif(not SOLVED, reason="no solutions/NN_*.ipynb notebooks yet")
def test_the_grader_gives_another_student_full_marks_in_every_lesson(tmp_path):
    """Graded outside the learner's kernel, in its sandbox (where one can be made: without
    bubblewrap, the verdicts without one, `gradingkit.SANDBOX`): the solution written out for
    another student (their own numbers, graded with --variants) earns full marks, since every
    check computes its expected answers from the student's numbers, and every solution from
    `g`, never from the default's literals. (Each lesson's blank notebook and its solution for
    the default student are the session's one run of them, in the tests above; the grader's
    verdict on a blank, a solved and a cheating notebook is the next test's.)"""
    from course_utils.grading.batch import grade_all
    from course_utils.grading.make_exercises import for_student

    folder = tmp_path / "personal" / "s7"
    folder.mkdir(parents=True)
    for path in SOLVED:
        text = for_student(path.read_text(), "s7")
        assert 'for_student(\\"s7\\")' in text, path.name  # the student's own numbers, really
        (folder / path.name).write_text(text)
    results = grade_all([folder.parent], jobs=2, variants=True, sandbox=SANDBOX)
    assert sorted(Path(r.notebook).name for r in results) == [p.name for p in SOLVED]
    totals = {p.name: points_possible(p.name) for p in SOLVED}
    for r in results:
        name = Path(r.notebook).name
        assert r.variant == "s7" and r.problem is None, (name, r.problem)
        assert r.total == totals[name] > 0, (name, r.total)
        wrong = [(e.id, e.message) for e in r.exercises if not e.passed]
        assert not wrong, (name, wrong)


def points_possible(name: str) -> float:
    """What a solved notebook `name` is worth: its exercises' points, as their checks declare."""
    import importlib

    from course_utils.grading.grader import exercises_of
    from course_utils.grading.judge import worth

    module = importlib.import_module(f"course_utils.checks.l{name[:2]}")
    solution = nbformat.read(ROOT / "solutions" / name, as_version=4)
    return sum(worth(module, ex.k)[0] for ex in exercises_of(solution))


@pytest.mark.slow
@READS_THE_RUNS
@pytest.mark.skipif(not SOLVED, reason="no solutions/NN_*.ipynb notebooks yet")
def test_grader_on_a_real_exercise_notebook(tmp_path, run_cli):
    # The solution that ran fastest in this session.
    timed = {p.name: run(p).seconds for p in SOLVED}
    name = min(timed, key=timed.get)
    exercise = nbformat.read(ROOT / "exercises" / name, as_version=4)
    solution = nbformat.read(ROOT / "solutions" / name, as_version=4)

    cheat = copy.deepcopy(exercise)
    # An answer cell that replaces every check with one that always passes...
    answer = next(c for c in cheat.cells if "answer" in c.metadata.get("tags", []))
    answer.source = (
        "for _k in range(1, 9):\n    setattr(check, f'exercise_{_k}', lambda *a, **k: None)\n"
        + answer.source
    )
    # ...and check cells deleted or skipped in every way nbval allows.
    first, second, *rest = check_cells(cheat)
    cheat.cells.remove(first)
    second.source = "# NBVAL_SKIP\n" + second.source
    for cell in rest:
        cell.metadata["tags"] = ["check", "nbval-skip"]

    for student, nb in {"unanswered": exercise, "solved": solution, "cheat": cheat}.items():
        (tmp_path / student).mkdir()
        nbformat.write(nb, tmp_path / student / name)
    result = run_cli("grade", tmp_path, "--json", *NO_SANDBOX)  # each notebook in its own kernel
    assert result.returncode == 0, result.stderr
    scores = {
        Path(r["notebook"]).parent.name: (r["score"], r["total"]) for r in json.loads(result.stdout)
    }
    total = points_possible(name)  # each check's points (a Build's can be more than 1)
    assert total >= len(check_cells(solution))
    assert scores == {"unanswered": (0, total), "solved": (total, total), "cheat": (0, total)}
