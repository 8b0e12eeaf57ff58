"""Lessons read like d2l: short code cells, the plotting in `course_utils.charts`.

No code cell of a lesson is longer than 30 lines, and most are under 15: a longer cell does
several things (measure, chart, conclude), and each is its own cell, with a sentence of
markdown between them where that helps the reader.
"""

from __future__ import annotations

import json

import pytest
from conftest import ROOT

LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
LONGEST = 30  # lines of a lesson's code cell, at most
SHORT = 15  # most code cells have fewer lines than this


def code_cells(path) -> list[tuple[str, int]]:
    """(cell id, number of lines) of every code cell of a notebook."""
    cells = json.loads(path.read_text())["cells"]
    return [
        (cell.get("id", "?"), len("".join(cell["source"]).splitlines()))
        for cell in cells
        if cell["cell_type"] == "code"
    ]


def test_the_lessons_are_found():
    assert len(LESSONS) >= 14 and LESSONS[0].name.startswith("00_")


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_no_code_cell_of_a_lesson_is_longer_than_30_lines(lesson):
    too_long = [f"{cid} ({n} lines)" for cid, n in code_cells(lesson) if n > LONGEST]
    assert too_long == [], (
        f"{lesson.name}: split these cells at their ideas (measure, chart, conclude), or move "
        f"plotting into course_utils.charts: {', '.join(too_long)}"
    )


def test_most_code_cells_of_the_lessons_are_under_15_lines():
    lengths = [n for lesson in LESSONS for _, n in code_cells(lesson)]
    short = sum(n < SHORT for n in lengths)
    assert short > len(lengths) / 2, (
        f"only {short} of {len(lengths)} code cells under {SHORT} lines"
    )
