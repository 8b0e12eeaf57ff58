"""A learner can find their way through every lesson: the sections are numbered in order,
each markdown cell opens at most one section, the recap is the last section (with the
exercises after it), the opening and the recap send the learner on to the next lesson and
not past it, each lesson's stated time covers its reading at 150 words a minute, and the
course's measuring tools are explained in the appendix (lesson 14), not in every lesson.

Lesson 13 passes as it is; it is being rewritten on another branch (dist44), which these
checks then hold to the same rules.
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import ROOT

LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
APPENDIX = "14"  # how the course measures: reached from the lessons, not from lesson 13
WORDS_PER_MINUTE = 150
HEADING = re.compile(r"^(#{1,6})\s+(.*)$", re.M)
NOTEBOOK = re.compile(r"\b(\d\d)_[a-z0-9_]+\.ipynb")


def markdown(path) -> list[tuple[str, str]]:
    """(cell id, source) of every markdown cell of a notebook."""
    cells = json.loads(path.read_text())["cells"]
    return [(c.get("id", "?"), "".join(c["source"])) for c in cells if c["cell_type"] == "markdown"]


def headings(path) -> list[tuple[str, int, str]]:
    """(cell id, level, title) of every heading, outside code fences."""
    found = []
    for cid, text in markdown(path):
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        found += [(cid, len(m.group(1)), m.group(2).strip()) for m in HEADING.finditer(text)]
    return found


def recap_and_opening(path) -> tuple[str, str]:
    cells = markdown(path)
    recap = next((text for _, text in cells if re.search(r"^## Recap", text, re.M)), "")
    return cells[0][1], recap


def number(path) -> int:
    return int(path.name[:2])


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_sections_are_numbered_one_two_three_in_order(lesson):
    numbers = [
        int(m.group(1))
        for _, level, title in headings(lesson)
        if level == 2
        for m in [re.match(r"(\d+)\.", title)]
        if m
    ]
    assert numbers == list(range(1, len(numbers) + 1)), f"{lesson.name}: sections {numbers}"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_each_markdown_cell_opens_at_most_one_section(lesson):
    seen: dict[str, int] = {}
    for cid, _, _ in headings(lesson):
        seen[cid] = seen.get(cid, 0) + 1
    assert [cid for cid, n in seen.items() if n > 1] == [], f"{lesson.name}: split these cells"


@pytest.mark.parametrize("lesson", [p for p in LESSONS if p.name[:2] != "00"], ids=lambda p: p.stem)
def test_the_recap_is_the_last_section_and_the_exercises_follow_it(lesson):
    titles = [title for _, level, title in headings(lesson) if level <= 2]
    assert titles[-1] == "Recap", f"{lesson.name}: the last section is {titles[-1]!r}"
    text = "\n".join(t for _, t in markdown(lesson))
    practise = text.find("Now practise")
    assert practise == -1 or practise > text.find("## Recap"), (
        f"{lesson.name}: practise before recap"
    )


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_the_opening_and_the_recap_send_the_learner_to_the_next_lesson(lesson):
    n = number(lesson)
    opening, recap = recap_and_opening(lesson)
    last = max(number(p) for p in LESSONS if p.name[:2] != APPENDIX)
    for where, text in (("opening", opening), ("recap", recap)):
        ahead = sorted({int(k) for k in NOTEBOOK.findall(text) if int(k) > n} - {int(APPENDIX)})
        assert ahead in ([], [n + 1]), f"{lesson.name}: its {where} sends the learner to {ahead}"
    if n == 0:
        assert "01_" in opening + "\n".join(t for _, t in markdown(lesson))
    elif n < last and lesson.name[:2] != APPENDIX:
        assert f"({n + 1:02d}_" in recap, (
            f"{lesson.name}: the recap has no link to lesson {n + 1:02d}"
        )


@pytest.mark.parametrize("lesson", [p for p in LESSONS if p.name[:2] != "00"], ids=lambda p: p.stem)
def test_the_stated_time_covers_the_reading(lesson):
    words = sum(len(t.split()) for _, t in markdown(lesson))
    opening = markdown(lesson)[0][1]
    stated = re.search(r"\*\*Time:\*\*\s*about (\d+) minutes(?: \((\d+) to read)?", opening)
    assert stated, f"{lesson.name}: no '**Time:** about N minutes' in its opening"
    reading = int(stated.group(2) or stated.group(1))
    run_minutes = 2 if lesson.name[:2] == "13" else 1  # test_lessons.py's budgets, on one core
    needed = words / WORDS_PER_MINUTE + run_minutes
    assert reading >= needed, f"{lesson.name}: {reading} min to read and run, {needed:.0f} needed"


# The words about the course's own measuring tools, as ../shared/tooling_words.py counts them:
# a paragraph naming one of these counts whole. They belong in the appendix (lesson 14).
TOOLING = re.compile(
    r"virtual[- ]clock|wall[- ]clock|reference (twin|recording)|capacity probe|cores? (free|"
    r"available)|free cores|take turns|taking turns|CPU time|busy loop|best of \d|spread of",
    re.I,
)
TOOLING_SHARE = 0.05


@pytest.mark.parametrize(
    "lesson", [p for p in LESSONS if p.name[:2] != APPENDIX], ids=lambda p: p.stem
)
def test_the_measuring_tools_are_explained_in_the_appendix_not_in_the_lesson(lesson):
    paragraphs = [p for _, text in markdown(lesson) for p in re.split(r"\n\s*\n", text)]
    words = sum(len(p.split()) for p in paragraphs)
    tooling = sum(len(p.split()) for p in paragraphs if TOOLING.search(p))
    assert tooling <= TOOLING_SHARE * words, (
        f"{lesson.name}: {tooling} of {words} words are about the measuring tools; move them to "
        "notebooks/14_appendix_measuring.ipynb and link it"
    )
