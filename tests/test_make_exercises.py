"""Tests for course_utils.grading.make_exercises: solution blocks become stubs, the output is
deterministic and lint-clean, and --check catches every kind of stale exercises/ folder."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib.machinery import PathFinder
from pathlib import Path

import nbformat
import pytest

from course_utils.errors import CourseInputError
from course_utils.grading import make_exercises
from course_utils.grading.notebook_tools import REPO, strip_solutions

FIXTURES = Path(__file__).parent / "fixtures" / "solutions"
RUFF = Path(sys.executable).with_name("ruff")


def test_code_block_becomes_an_indented_stub():
    source = (
        "def bubble(p, m):\n"
        '    """Doc."""\n'
        "    ### BEGIN SOLUTION\n"
        "    x = p - 1\n"
        "    return x / (m + x)\n"
        "    ### END SOLUTION\n"
        "\n"
        "y = None\n"
        "### BEGIN SOLUTION\n"
        "y = 3\n"
        "### END SOLUTION"
    )
    assert strip_solutions(source, "code") == (
        "def bubble(p, m):\n"
        '    """Doc."""\n'
        "    # YOUR CODE HERE\n"
        "    raise NotImplementedError()\n"
        "\n"
        "y = None\n"
        "# YOUR CODE HERE\n"
        "raise NotImplementedError()"
    )


def test_markdown_block_becomes_your_answer_here():
    source = "Why?\n\n### BEGIN SOLUTION\nBecause.\nReally.\n### END SOLUTION\nEnd."
    assert strip_solutions(source, "markdown") == "Why?\n\nYOUR ANSWER HERE\nEnd."


def test_source_without_markers_is_unchanged():
    assert strip_solutions("x = 1\n# BEGIN SOLUTION is only a comment here", "code") == (
        "x = 1\n# BEGIN SOLUTION is only a comment here"
    )


@pytest.mark.parametrize(
    "source, problem",
    [
        ("### BEGIN SOLUTION\nx = 1", "without a matching"),
        ("x = 1\n### END SOLUTION", "without a '### BEGIN SOLUTION' before it"),
        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "nested"),
    ],
)
def test_unbalanced_markers_are_a_clear_error(source, problem):
    with pytest.raises(CourseInputError, match=problem):
        strip_solutions(source, "code", where="03_x.ipynb, cell 4")


@pytest.fixture()
def folders(tmp_path):
    solutions, exercises = tmp_path / "solutions", tmp_path / "exercises"
    solutions.mkdir()
    solution = nbformat.read(FIXTURES / "99_sample.ipynb", as_version=4)
    # A solution saved after a run: outputs, counts and widget state must not leak through.
    for cell in solution.cells:
        if cell.cell_type == "code":
            cell.execution_count = 7
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="✅ Right\n")]
    solution.metadata["widgets"] = {"state": {}}
    nbformat.write(solution, solutions / "99_sample.ipynb")
    return solutions, exercises


def test_generated_notebook_has_stubs_no_solutions_and_no_outputs(folders):
    solutions, exercises = folders
    assert make_exercises.write_exercises(solutions, exercises) == [exercises / "99_sample.ipynb"]
    text = (exercises / "99_sample.ipynb").read_text(encoding="utf-8")
    assert "BEGIN SOLUTION" not in text and "bubble_fraction = 3 / 11" not in text
    exercise = nbformat.read(exercises / "99_sample.ipynb", as_version=4)
    solution = nbformat.read(solutions / "99_sample.ipynb", as_version=4)
    nbformat.validate(exercise)
    assert "widgets" not in exercise.metadata
    assert [c.id for c in exercise.cells] == [c.id for c in solution.cells]
    assert [c.metadata.get("tags") for c in exercise.cells] == [
        c.metadata.get("tags") for c in solution.cells
    ]
    for cell in exercise.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    answers = [c.source for c in exercise.cells if "answer" in c.metadata.get("tags", [])]
    assert len(answers) == 3
    assert all("# YOUR CODE HERE\n" in a and "raise NotImplementedError()" in a for a in answers)
    assert answers[0].startswith("bubble_fraction = None")  # the placeholder line stays
    assert "    # YOUR CODE HERE\n    raise NotImplementedError()" in answers[1]  # indented
    assert "YOUR ANSWER HERE" in exercise.cells[-1].source


def test_output_is_deterministic_and_lint_clean(folders):
    solutions, exercises = folders
    make_exercises.write_exercises(solutions, exercises)
    path = exercises / "99_sample.ipynb"
    first = path.read_text(encoding="utf-8")
    assert first == nbformat.writes(nbformat.read(path, as_version=4)) + "\n"  # nbformat layout
    assert make_exercises.write_exercises(solutions, exercises) == []  # nothing to rewrite
    assert path.read_text(encoding="utf-8") == first
    if RUFF.exists():
        for command in (["format", "--check"], ["check"]):
            result = subprocess.run(
                [str(RUFF), *command, str(path)], cwd=REPO, capture_output=True, text=True
            )
            assert result.returncode == 0, result.stdout + result.stderr


def test_check_reports_missing_stale_and_orphan_files(folders):
    solutions, exercises = folders
    name = "99_sample.ipynb"
    assert make_exercises.stale_files(solutions, exercises) == [
        f"{exercises / name}: missing (generate it from {solutions / name})"
    ]
    make_exercises.write_exercises(solutions, exercises)
    assert make_exercises.stale_files(solutions, exercises) == []

    # Editing the solution makes the exercise stale.
    solution = nbformat.read(solutions / "99_sample.ipynb", as_version=4)
    solution.cells[0].source += "\n\nA new sentence."
    nbformat.write(solution, solutions / "99_sample.ipynb")
    assert [p.split(":")[1] for p in make_exercises.stale_files(solutions, exercises)] == [
        " out of date with " + str(solutions / "99_sample.ipynb")
    ]
    make_exercises.write_exercises(solutions, exercises)

    # An exercise without a solution is reported, not silently kept.
    shutil.copy(exercises / "99_sample.ipynb", exercises / "98_gone.ipynb")
    (problem,) = make_exercises.stale_files(solutions, exercises)
    assert problem.startswith(f"{exercises / '98_gone.ipynb'}: has no solution notebook")


@pytest.mark.slow
def test_command_line_check_exit_codes(folders):
    solutions, exercises = folders

    def cli(*extra):
        return subprocess.run(
            [sys.executable, "-m", "course_utils.grading.make_exercises", *extra]
            + ["--solutions", str(solutions), "--exercises", str(exercises)],
            capture_output=True,
            text=True,
        )

    stale = cli("--check")
    assert stale.returncode == 1 and "99_sample.ipynb: missing" in stale.stdout
    assert "run `make exercises`" in stale.stderr
    assert cli().returncode == 0
    fresh = cli("--check")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr

    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "course_utils.grading.make_exercises",
            "--solutions",
            str(solutions.parent / "missing"),  # not /nonexistent: a tool can create that
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--solutions" in bad.stderr


@pytest.mark.slow
def test_unbalanced_solution_is_a_one_line_error(folders):
    solutions, exercises = folders
    nb = nbformat.read(solutions / "99_sample.ipynb", as_version=4)
    nb.cells[3].source = "x = None\n### BEGIN SOLUTION\nx = 1"
    nbformat.write(nb, solutions / "99_sample.ipynb")
    result = subprocess.run(
        [sys.executable, "-m", "course_utils.grading.make_exercises"]
        + ["--solutions", str(solutions), "--exercises", str(exercises)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "99_sample.ipynb, cell 3 (id answer-99-1)" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(not RUFF.exists(), reason="ruff is not installed next to this Python")
def test_lint_problems_left_by_cutting_a_solution_are_reported(folders, capsys):
    solutions, exercises = folders
    nb = nbformat.read(solutions / "99_sample.ipynb", as_version=4)
    nb.cells[3].source = (
        "import math\n\nbubble_fraction = None\n"
        "### BEGIN SOLUTION\nbubble_fraction = math.sqrt(9) / 11\n### END SOLUTION"
    )
    nbformat.write(nb, solutions / "99_sample.ipynb")
    make_exercises.write_exercises(solutions, exercises)
    out = capsys.readouterr().out
    assert "warning: ruff: exercises/99_sample.ipynb:cell 4" in out and "F401" in out


def test_for_student_rewrites_the_name_in_a_notebook_file(tmp_path):
    # In the .ipynb file the call's quotes are escaped inside a JSON string.
    solved = REPO / "solutions" / "03_bubble_tradeoff.ipynb"
    mine = make_exercises.for_student(solved.read_text(), "s7")
    nb = nbformat.reads(mine, as_version=4)
    calls = [line for c in nb.cells for line in c.source.splitlines() if "for_student(" in line]
    assert calls and all('for_student("s7")' in line for line in calls)
    assert 'for_student("default")' not in mine.replace('\\"', '"')
    # and in plain source text
    assert make_exercises.for_student('c = l03.for_student("default")', "bob") == (
        'c = l03.for_student("bob")'
    )
    written = make_exercises.write_for_students(["ann"], tmp_path)
    lesson_03 = [p for p in written if p.name == solved.name]
    assert lesson_03 and 'for_student(\\"ann\\")' in lesson_03[0].read_text()


@pytest.mark.slow
def test_notebook_client_leaves_output_widgets_to_the_kernel():
    # nbclient's imitation of an Output widget can miss a cell's reply (nbclient #312): our
    # runners do not imitate it, so what the widget captures stays in the cell's outputs.
    from course_utils.grading.notebook_tools import notebook_client

    source = (
        "import ipywidgets as widgets\n"
        "box = widgets.Output()\n"
        "display(box)\n"
        "with box:\n"
        "    print('inside the widget')"
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    notebook_client(nb, timeout=60, kernel_name="python3").execute()
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.output_type == "stream")
    assert "inside the widget" in text


@pytest.mark.skipif(  # on sys.path, whatever this process has put in sys.modules
    PathFinder.find_spec("rfc3987_syntax") is None, reason="rfc3987-syntax not installed"
)
def test_a_grading_process_reads_notebooks_without_jsonschemas_slow_formats():
    """Every grading worker reads notebooks. Plain `import nbformat` makes jsonschema compile
    rfc3987-syntax's Lark grammars (about 2 s per process); after course_utils.grading it
    does not, and notebooks still read and validate."""
    lesson = REPO / "notebooks" / "00_welcome.ipynb"
    read = f"nb = nbformat.read({str(lesson)!r}, as_version=4); nbformat.validate(nb)"
    shows_lark = "; import sys; print('lark' in sys.modules)"
    for first, lark in [("import nbformat", "True"), ("import course_utils.grading", "False")]:
        code = f"{first}; import nbformat; {read}{shows_lark}"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == lark, (first, out.stdout)


def test_the_tests_read_notebooks_without_jsonschemas_slow_formats():
    """pyproject.toml's `-p course_utils.grading` loads that package before nbval's plugin,
    which imports nbformat, so no pytest process of the course compiles the grammars."""
    assert "nbformat" in sys.modules and "lark" not in sys.modules


def test_one_lessons_handouts_are_laid_out_for_upload(tmp_path, capsys):
    import zipfile

    out = tmp_path / "handout"
    code = make_exercises.main(["--lesson", "3", "--students", "ana", "王小明", "--out", str(out)])
    assert code == 0
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.ipynb")) == [
        "ana/03_bubble_tradeoff.ipynb", "王小明/03_bubble_tradeoff.ipynb"
    ]  # fmt: skip
    with zipfile.ZipFile(out / "03_bubble_tradeoff.zip") as z:
        assert sorted(z.namelist()) == [
            "ana/03_bubble_tradeoff.ipynb",
            "王小明/03_bubble_tradeoff.ipynb",
        ]
        nb = nbformat.reads(z.read("王小明/03_bubble_tradeoff.ipynb").decode(), as_version=4)
    assert any('for_student("王小明")' in c.source for c in nb.cells)
    # without students: the one notebook to attach to the assignment
    assert make_exercises.main(["--lesson", "3", "--out", str(tmp_path / "one")]) == 0
    assert [p.name for p in (tmp_path / "one").iterdir()] == ["03_bubble_tradeoff.ipynb"]
    capsys.readouterr()
    for argv, words in [
        (["--lesson", "14", "--out", str(tmp_path / "x")], "--lesson 14: lesson 14 has no"),
        (["--lesson", "3"], "--lesson hands out one lesson: give --out FOLDER"),
    ]:
        assert make_exercises.main(argv) == 2
        assert words in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_the_name_cell_can_be_edited_and_the_grader_still_knows_the_student():
    """Issue 50: every exercise notebook asks a learner on their own to write their name in
    the first code cell; that cell can be edited (not deleted), every other locked cell
    stays locked, and the grader reads the name and reports no tampering for it."""
    from course_utils.grading.grader import name_in_notebook, tampering

    for path in sorted((REPO / "exercises").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        named = [c for c in nb.cells if make_exercises.ANY_STUDENT.search(c.source)]
        assert len(named) == 1, path.name
        cell = named[0]
        assert cell.metadata.get("editable", True) and cell.metadata["deletable"] is False
        intro = nb.cells[0].source
        assert 'replace `"default"` there with your name' in " ".join(intro.split()), path.name
        for other in nb.cells:
            if other is not cell and "locked" in other.metadata.get("tags", []):
                assert other.metadata["editable"] is False, (path.name, other.id)
        solution = nbformat.read(REPO / "solutions" / path.name, as_version=4)
        for text in (path.read_text(encoding="utf-8"), make_exercises.for_student(
            path.read_text(encoding="utf-8"), "s7")):  # fmt: skip
            mine = nbformat.reads(text, as_version=4)
            for c in mine.cells:
                c.source = make_exercises.ANY_STUDENT.sub('for_student("Ana María")', c.source)
            assert name_in_notebook(mine) == "Ana María", path.name
            assert tampering(mine, solution, "Ana María") == [], path.name
