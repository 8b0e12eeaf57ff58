"""Tests for course_utils.grading.grader: preparing a submission so it cannot be gamed, reading
nbval's report, the CLI's bad-input handling, and real grading runs on a sample notebook."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import nbformat
import pytest
from conftest import run_module

from course_utils.errors import CourseInputError
from course_utils.grading import grader as grading
from course_utils.grading import make_exercises

FIXTURES = Path(__file__).parent / "fixtures" / "solutions"
SOLUTION = nbformat.read(FIXTURES / "99_sample.ipynb", as_version=4)
CHECK_IDS = ["check-99-1", "check-99-2", "check-99-3"]


@pytest.fixture(scope="module")
def exercise(tmp_path_factory) -> nbformat.NotebookNode:
    """The generated (unanswered) exercise version of the sample solution."""
    folder = tmp_path_factory.mktemp("exercises")
    make_exercises.write_exercises(FIXTURES, folder)
    return nbformat.read(folder / "99_sample.ipynb", as_version=4)


def cell(nb, cell_id):
    return next(c for c in nb.cells if c.id == cell_id)


@pytest.fixture
def cli(run_cli):
    """`python -m course_utils grade ARGS...` in this process: (returncode, stdout, stderr).
    The grader still runs each notebook with nbval in a child process of its own."""
    return lambda *args: run_cli("grade", *args)


# -- prepare: no kernel needed ------------------------------------------------------------------


def test_prepare_restores_edited_and_deleted_checks_and_strips_markers(exercise, tmp_path):
    sub = copy.deepcopy(exercise)
    sub.cells.remove(cell(sub, "check-99-1"))  # deleted
    cell(sub, "check-99-2").source = "# NBVAL_SKIP\npass"  # edited and skipped
    cell(sub, "check-99-3").metadata.tags = ["check", "nbval-skip", "raises-exception"]
    cell(sub, "answer-99-3").source = "#NBVAL_RAISES_EXCEPTION\n" + cell(sub, "answer-99-3").source
    cell(sub, "answer-99-2").metadata.tags = ["answer", "skip-execution"]

    nb, checks = grading.prepare(sub, SOLUTION, tmp_path)

    ids = [c.id for c in nb.cells]
    # The deleted check is back right after its answer cell.
    assert ids.index("check-99-1") == ids.index("answer-99-1") + 1
    for check_id in CHECK_IDS:
        restored = cell(nb, check_id)
        assert restored.source == cell(SOLUTION, check_id).source
        assert restored.metadata.tags == ["check"]
    assert "NBVAL" not in "".join(c.source for c in nb.cells)
    assert cell(nb, "answer-99-2").metadata.tags == ["answer"]
    # nbval numbers code cells from 0, and the grader's own chdir cell comes first.
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].source == f"import os\nos.chdir({str(tmp_path)!r})"
    assert sorted(checks.values()) == CHECK_IDS
    assert all(code[i].id == check_id for i, check_id in checks.items())
    nbformat.validate(nb)


def test_prepare_pairs_checks_by_tag_when_ids_are_lost(exercise, tmp_path):
    sub = copy.deepcopy(exercise)
    for i, c in enumerate(sub.cells):
        c.id = f"renamed-{i}"
    nb, checks = grading.prepare(sub, SOLUTION, tmp_path)
    assert [c.id for c in nb.cells if "check" in c.metadata.get("tags", [])] == CHECK_IDS
    assert len(nb.cells) == len(sub.cells) + 1  # only the chdir cell was added
    assert sorted(checks.values()) == CHECK_IDS


def test_prepare_reimports_the_lessons_check_module(exercise, tmp_path):
    solution = copy.deepcopy(SOLUTION)
    solution.cells[1].source = "from course_utils.checks import l03 as check"
    nb, _ = grading.prepare(exercise, solution, tmp_path)
    source = cell(nb, "check-99-1").source
    assert source.startswith("import importlib as _importlib, course_utils.checks.l03 as check\n")
    assert "_importlib.reload(_importlib.import_module('course_utils.checks'))\n" in source
    assert "check = _importlib.reload(check)\n" in source
    assert source.endswith("check.exercise_1(bubble_fraction)")


def test_failure_message_is_the_checks_message_or_the_errors_last_line():
    report = "Notebook cell execution failed\nInput:\ncheck.exercise_1(x)\n\nTraceback:\n\n"
    assert grading.failure_message(report + "❌ Not quite.\nHint: count.\n") == (
        "Not quite.\nHint: count."
    )
    assert grading.failure_message(report + "✋ Exercise 3.1 is not answered yet: x") == (
        "Exercise 3.1 is not answered yet: x"
    )
    ansi = "#x1B[31m----#x1B[39m\n#x1B[31mNameError#x1B[39m: name 'x' is not defined\n"
    assert grading.failure_message(report + ansi) == "NameError: name 'x' is not defined"


def test_match_solution_by_check_ids_then_by_name(exercise, tmp_path):
    assert grading.match_solution(exercise, tmp_path / "whatever.ipynb", FIXTURES).name == (
        "99_sample.ipynb"
    )
    anonymous = copy.deepcopy(exercise)
    for i, c in enumerate(anonymous.cells):
        c.id = f"x{i}"
    assert grading.match_solution(anonymous, tmp_path / "99_sample.ipynb", FIXTURES)
    with pytest.raises(CourseInputError, match="no solution matches"):
        grading.match_solution(anonymous, tmp_path / "other.ipynb", FIXTURES)


def test_student_names(tmp_path):
    solution = FIXTURES / "99_sample.ipynb"
    assert grading.student_name(tmp_path / "alice.ipynb", None, solution) == "alice"
    assert grading.student_name(tmp_path / "bob" / "99_sample.ipynb", None, solution) == "bob"
    assert grading.student_name(tmp_path / "x.ipynb", "carol", solution) == "carol"


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.ipynb"], "submission 'missing.ipynb' does not exist"),
        (["notes.txt"], "is not a notebook (.ipynb)"),
        (["broken.ipynb"], "is not a readable notebook"),
        (["empty"], "has no .ipynb files"),
        (["stranger.ipynb"], "no solution matches"),
        (["stranger.ipynb", "--timeout", "0"], "--timeout and --cell-timeout must be positive"),
        (["stranger.ipynb", "--solutions", "nowhere"], "--solutions 'nowhere' is not a folder"),
        (["--json"], "the following arguments are required: submissions"),
        (["stranger.ipynb", "--csv", "no/such/dir/g.csv"], "--csv 'no/such/dir/g.csv'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)  # the relative paths below are in tmp_path
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "broken.ipynb").write_text("{not json")
    (tmp_path / "empty").mkdir()
    nbformat.write(nbformat.v4.new_notebook(), tmp_path / "stranger.ipynb")
    if "--solutions" not in args:
        args = [*args, "--solutions", FIXTURES]
    result = cli(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


# -- real grading runs (one nbval run per notebook) ---------------------------------------------


def answered(exercise, **answers) -> nbformat.NotebookNode:
    """The exercise with some answer cells filled in (source per answer cell id)."""
    nb = copy.deepcopy(exercise)
    for cell_id, source in answers.items():
        cell(nb, cell_id.replace("_", "-")).source = source
    return nb


@pytest.mark.slow
def test_grading_a_folder_of_students(cli, exercise, tmp_path):
    solved = copy.deepcopy(SOLUTION)
    partial = answered(
        exercise,
        # The kernel must work in the student's folder: dave reads an answer from a file.
        answer_99_1="bubble_fraction = float(open('answer.txt').read())",
        answer_99_2="def bubble(p, m):\n    return (p - 1) / m",  # wrong formula
        answer_99_3='idle = "DEVICE 0 "',  # a valid choice, but wrong
    )
    # Cheating without answering: delete one check, skip the others every way nbval allows.
    cheat = answered(exercise, answer_99_1="bubble_fraction = 0.5  # NBVAL_SKIP")
    cheat.cells.remove(cell(cheat, "check-99-1"))
    cell(cheat, "check-99-2").source = "# NBVAL_SKIP\n" + cell(cheat, "check-99-2").source
    cell(cheat, "check-99-3").metadata.tags = ["check", "nbval-skip"]
    cheat.cells.insert(0, nbformat.v4.new_code_cell("# NBVAL_RAISES_EXCEPTION\nraise SystemExit"))
    students = {"alice": solved, "bob": exercise, "carol": cheat, "dave": partial}
    for name, nb in students.items():
        (tmp_path / "class" / name).mkdir(parents=True)
        nbformat.write(nb, tmp_path / "class" / name / "99_sample.ipynb")
    (tmp_path / "class" / "dave" / "answer.txt").write_text("0.2727272727")

    result = cli(
        tmp_path / "class", "--json", "--csv", tmp_path / "grades.csv", "--solutions", FIXTURES
    )
    assert result.returncode == 0, result.stderr
    report = {Path(r["notebook"]).parent.name: r for r in json.loads(result.stdout)}
    assert {name: report[name]["score"] for name in students} == {
        "alice": 3,
        "bob": 0,
        "carol": 0,
        "dave": 1,
    }
    assert all(r["total"] == 3 for r in report.values())
    assert [e["id"] for e in report["alice"]["exercises"]] == CHECK_IDS
    assert all(e["passed"] and e["message"] == "" for e in report["alice"]["exercises"])

    bob = report["bob"]["exercises"]
    assert all("is not answered yet" in e["message"] for e in bob)
    assert "still raises NotImplementedError" in bob[1]["message"]
    dave = {e["id"]: e for e in report["dave"]["exercises"]}
    assert dave["check-99-1"]["passed"]
    assert dave["check-99-2"]["message"].startswith("bubble(")
    assert "is not right. Hint: try p=1." in dave["check-99-2"]["message"]
    assert dave["check-99-3"]["message"] == (
        "Look again at which device waits longest before its first step."
    )
    assert "Traceback" not in result.stdout

    with open(tmp_path / "grades.csv", newline="") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    assert set(rows) == set(students)
    assert rows["dave"]["score"] == "1" and rows["dave"]["total"] == "3"
    assert [rows["dave"][i] for i in CHECK_IDS] == ["1", "0", "0"]
    assert [rows["alice"][i] for i in CHECK_IDS] == ["1", "1", "1"]


@pytest.mark.slow
def test_table_output_for_one_file(exercise, tmp_path):
    # The grade command's smoke test: `python -m course_utils grade` in a real process.
    path = tmp_path / "frank.ipynb"
    nbformat.write(answered(exercise, answer_99_3='idle = "device 3"'), path)
    result = run_module("grade", path, "--solutions", FIXTURES, timeout=600)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{path} (student frank, solution ")
    assert lines[1].split()[:2] == ["check-99-1", "FAILED"]
    assert "not answered yet" in lines[1]
    assert lines[3].split() == ["check-99-3", "passed"]
    assert lines[4] == "  score: 1/3 (33%)"


@pytest.mark.slow
def test_a_hanging_answer_times_out_and_fails_its_check(cli, exercise, tmp_path):
    nb = answered(exercise, answer_99_2="def bubble(p, m):\n    while True:\n        pass")
    path = tmp_path / "99_sample.ipynb"
    nbformat.write(nb, path)
    result = cli(path, "--json", "--cell-timeout", "3", "--solutions", FIXTURES)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["score"] == 0
    assert not report["exercises"][1]["passed"]
    assert "Timeout" in report["exercises"][1]["message"]
    # nbval skips the cells after a timeout; they count as failed, with the reason.
    assert report["exercises"][2]["message"] == "did not run (an earlier cell timed out)"
