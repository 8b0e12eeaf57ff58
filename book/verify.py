"""Checks of a built book: every internal link and image resolves, and no solution's text is
anywhere in it.

Sphinx's `linkcheck` builder checks external links only, and `-n -W` (which `build` uses)
catches a broken cross-reference in a page's source but not a broken link in a notebook's
raw HTML output or a missing image file. So `broken_links` reads the built HTML itself: each
href and src that is not an external URL must name a file of the book, and its #fragment an
id on that page.
"""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat

from course_utils.grading.notebook_tools import BEGIN, END, tags

EXTERNAL = re.compile(r"^([a-z][a-z0-9+.-]*:|//)", re.I)  # http:, mailto:, data:, //host
TEXT_FILES = {".html", ".js", ".txt", ".json", ".ipynb", ".md", ".css", ".xml"}


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        for key in ("id", "name") if tag != "meta" else ():
            if found.get(key):
                self.ids.add(str(found[key]))
        for key in ("href", "src"):
            if found.get(key) and tag not in ("meta",):
                self.links.append(str(found[key]))


def _parse(path: Path) -> _Page:
    parser = _Page()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return parser


def broken_links(root: Path) -> list[str]:
    """'page: link (why)' for each internal link or image of the HTML under `root` that
    names no file of the book, or an id its page does not have."""
    root = root.resolve()
    pages = {p: _parse(p) for p in sorted(root.rglob("*.html"))}
    broken = []
    for page, parsed in pages.items():
        for link in parsed.links:
            if EXTERNAL.match(link) or link == "#":
                continue
            parts = urlsplit(link)
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if target.is_dir():
                target = target / "index.html"
            where = f"{page.relative_to(root)}: {link}"
            if not target.is_file() or not target.is_relative_to(root):
                broken.append(f"{where} (no such file in the book)")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{where} (no id {parts.fragment!r} on that page)")
    return broken


def words(text: str) -> str:
    """Text reduced to its words and numbers, one space apart and around: how a solution's
    line is found again whatever markup, highlighting or escaping surrounds it."""
    return " " + " ".join(re.findall(r"[A-Za-z0-9_]+", text)) + " "


def html_words(raw: str) -> str:
    """An HTML page's (or script's) text without its tags and escapes, as `words`."""
    return words(html.unescape(re.sub(r"<[^>]+>", " ", raw)))


def book_text(root: Path) -> str:
    """Every text file of the built book (pages, search index, sources), as `words`."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in TEXT_FILES)
    return "".join(html_words(p.read_text(encoding="utf-8", errors="replace")) for p in files)


def solution_blocks(solutions: list[Path]) -> dict[str, list[str]]:
    """{'solutions/02_x.ipynb, answer-02-1': [lines of each BEGIN/END SOLUTION block]}."""
    blocks: dict[str, list[str]] = {}
    for path in solutions:
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            if "answer" not in tags(cell):
                continue
            inside, lines = False, []
            for line in cell.source.splitlines():
                marker = line.strip()
                if marker in (BEGIN, END):
                    inside = marker == BEGIN
                elif inside:
                    lines.append(line)
            blocks[f"{path.parent.name}/{path.name}, {cell.get('id') or f'cell {i}'}"] = lines
    return blocks


def needles(block: list[str], shown: str) -> list[str]:
    """What of a solution block must not be in the book: each line of three words or more
    and 12 characters or more (shorter ones, such as `if s == 0`, stand in the course's own
    code that lessons show) that the lessons and blank exercises (`shown`, as `words`) do not
    hold themselves, and the whole block unless they hold it."""
    found = [
        w
        for line in block
        if len((w := words(line)).split()) >= 3 and len(w) >= 12 and w not in shown
    ]
    whole = words("\n".join(block))
    return found + ([whole] if whole.strip() and whole not in shown else [])


def solution_leaks(root: Path, solutions: list[Path], shown_notebooks: list[Path]) -> list[str]:
    """'where: text' for each solution line or block found in the book under `root`."""
    shown = words(
        "\n".join(
            cell.source for p in shown_notebooks for cell in nbformat.read(p, as_version=4).cells
        )
    )
    text = book_text(root)
    return [
        f"{where}: {needle.strip()!r}"
        for where, block in solution_blocks(solutions).items()
        for needle in needles(block, shown)
        if needle in text
    ]
