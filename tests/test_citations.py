"""Citations agree everywhere: the year beside the authors is the arXiv year.

A paper is cited as "Author et al. YEAR, arXiv YYMM.NNNNN" (a venue and its own year may
follow, as in "Rajbhandari et al. 2019, arXiv 1910.02054; SC 2020"), in lessons, exercises,
solutions, docs and the package alike, so a learner meets one year per paper.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARXIV = re.compile(r"arXiv[:\s]*(\d\d)(\d\d)\.\d{4,5}")
AUTHOR_YEAR = re.compile(r"([A-Z][a-z]+(?:-[A-Z][a-z]+)?) et al\.,?\s+((?:19|20)\d\d)\b")


def texts() -> list[tuple[str, str]]:
    found = []
    paths = [*ROOT.glob("*.md"), *ROOT.glob("docs/**/*.md"), *ROOT.glob("course_utils/**/*.py")]
    for path in sorted(paths):
        found.append((str(path.relative_to(ROOT)), path.read_text()))
    for folder in ("notebooks", "solutions", "exercises"):
        for path in sorted((ROOT / folder).glob("*.ipynb")):
            cells = json.loads(path.read_text())["cells"]
            text = "\n".join("".join(c["source"]) for c in cells)
            found.append((str(path.relative_to(ROOT)), text))
    return found


def citations() -> list[tuple[str, str, str, str]]:
    """(file, author, year written, arXiv year) for every 'Author et al. YEAR, ... arXiv id'."""
    found = []
    for name, text in texts():
        for m in ARXIV.finditer(text):
            start = max(text.rfind("(", 0, m.start()), m.start() - 90)
            authors = list(AUTHOR_YEAR.finditer(text, start, m.start()))
            if authors:
                who = authors[-1]
                found.append((name, who.group(1), who.group(2), "20" + m.group(1)))
    return found


def test_the_year_beside_an_arxiv_id_is_its_year():
    found = citations()
    assert len(found) > 50  # the scan sees the course's citations
    wrong = [c for c in found if c[2] != c[3]]
    assert not wrong, f"(file, author, written, arXiv year): {wrong}"


def test_an_author_cited_without_an_id_gets_one_of_their_papers_years():
    years = defaultdict(set)
    for _, author, _, arxiv_year in citations():
        years[author].add(arxiv_year)
    wrong = []
    for name, text in texts():
        for m in AUTHOR_YEAR.finditer(text):
            author, year = m.group(1), m.group(2)
            if author in years and year not in years[author]:
                wrong.append((name, m.group(0), sorted(years[author])))
    assert not wrong, wrong


def test_dualpipev_is_credited_to_sea_ai_labs_cut_in_half_wherever_deepseek_is_cited():
    # arXiv 2412.19437 (the DeepSeek-V3 report) describes DualPipe; the V variant is Sea AI
    # Lab's "cut-in-half" of it, as DeepSeek's DualPipe README says.
    found, wrong = 0, []
    for name, text in texts():
        for m in re.finditer(r"2412\.19437", text):
            near = text[max(0, m.start() - 300) : m.end() + 300]
            if "DualPipeV" in near or "dualpipe-v" in near or "dualpipe_v" in near:
                found += 1
                if "Sea AI Lab" not in near and "cut-in-half" not in near:
                    wrong.append((name, text[max(0, m.start() - 120) : m.end()]))
    assert found >= 5  # the scan sees the lesson, the package and the docs
    assert not wrong, wrong
