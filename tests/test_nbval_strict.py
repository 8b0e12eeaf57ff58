"""Strict nbval on the solutions (issue 45): every solution, executed once and saved, passes
`pytest --nbval` (outputs compared) on the saved copy twice in a row, and its blank handout,
executed and saved, fails.

What makes a solved notebook print the same thing on every run: a Build exercise's check
draws its cases from the student's name in a notebook (`Variant.cases`; the grader draws its
own secret ones), and a cell that prints measured figures (a program's timings against its
target: `programs.scorecard`) carries nbval's tag `nbval-ignore-output`, so that nbval still
runs it and fails it if it raises, but does not compare what it printed; so does a
`%%writefile` cell (lesson 13's worker files), which says "Writing" once, then "Overwriting".

The executed copies are the session's notebook runs (tests/notebook_runs.py), so each
solution costs two more runs here. `make test` checks lesson 02's (a Build's cases and a
scorecard); the others are marked `nbval_strict`: `make test-nbval` runs them all (CI does).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from notebook_runs import READS_THE_RUNS, runs

ROOT = Path(__file__).resolve().parents[1]
SOLVED = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
IN_MAKE_TEST = "02_microbatching_gpipe.ipynb"
STRICT = pytest.mark.nbval_strict
NAMES = [
    pytest.param(p.name, id=p.stem, marks=[] if p.name == IN_MAKE_TEST else [STRICT])
    for p in SOLVED
]
TIMEOUT_S = 600


def nbval(notebook: Path, *options: str) -> subprocess.CompletedProcess:
    """`pytest --nbval` (strict: outputs compared) on `notebook`, in its folder, as an
    instructor would run it on a copy of the course."""
    command = [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env", "-q",
               "-p", "no:cacheprovider", "-p", "no:xdist", *options, notebook.name]  # fmt: skip
    return subprocess.run(
        command, cwd=notebook.parent, capture_output=True, text=True, timeout=TIMEOUT_S
    )


@pytest.mark.slow
@READS_THE_RUNS
@pytest.mark.parametrize("name", NAMES)
def test_a_solution_saved_once_passes_strict_nbval_twice_and_its_blank_handout_fails(
    name, tmp_path
):
    solution, exercise = ROOT / "solutions" / name, ROOT / "exercises" / name
    done = runs([solution, exercise])
    assert done[solution].error is None, done[solution].error
    saved = tmp_path / "solved" / name
    saved.parent.mkdir()
    nbformat.write(done[solution].notebook, saved)
    before = saved.read_bytes()
    for attempt in (1, 2):
        result = nbval(saved)
        assert result.returncode == 0, f"run {attempt}:\n{result.stdout[-4000:]}"
        assert re.search(r"\d+ passed", result.stdout) and "failed" not in result.stdout
    assert saved.read_bytes() == before  # nbval compares with the saved copy, never writes it
    blank = tmp_path / "blank" / name
    blank.parent.mkdir()
    nbformat.write(done[exercise].notebook, blank)
    result = nbval(blank)  # its answer cells raise NotImplementedError, its checks say why
    assert result.returncode == 1, result.stdout[-4000:]
    assert "NotImplementedError" in result.stdout and "is not answered yet" in result.stdout


def test_cells_that_print_measured_figures_skip_the_output_comparison_and_no_check_does():
    """The tag excuses a cell's printed figures from nbval's comparison, nothing else: every
    cell that prints a program's timings has it, and no check cell; an answer cell only where
    it is a `%%writefile` (it says "Writing" the first time, "Overwriting" after)."""
    tagged = {}
    for path in SOLVED:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            tags = cell.metadata.get("tags", [])
            writes = cell.source.startswith("%%writefile")
            if writes:
                assert "nbval-ignore-output" in tags, f"{path.name}: {cell.source[:40]}"
            if "nbval-ignore-output" in tags:
                tagged.setdefault(path.name, []).append(cell.source)
                assert cell.cell_type == "code" and "check" not in tags
                assert "answer" not in tags or writes
            elif cell.cell_type == "code":
                assert "scorecard(" not in cell.source, f"{path.name}: a timing cell untagged"
    assert set(tagged) >= {IN_MAKE_TEST, "04_1f1b_zero_bubble.ipynb"}
