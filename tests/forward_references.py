"""The terms a lesson uses before the course has taught them: its forward references.

    python tests/forward_references.py        (from the checkout's root)

Prints, per lesson, each term of TERMS that a markdown cell names before the cell that
teaches it (TAUGHT: a lesson and a cell id), and in how many cells. A lesson may point ahead
to a term once ("an all-reduce, lesson 06's primer draws it"); a second cell that leans on it
means the learner meets it unexplained. tests/test_forward_references.py holds every lesson to
at most one cell per term. Exits 1 when some lesson has more.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TERMS = {
    "all-reduce": r"(?i)\ball-?reduces?\b",
    "reduce-scatter": r"(?i)\breduce-?scatters?\b",
    "all-gather": r"(?i)\ball-?gathers?\b",
    "all-to-all": r"(?i)\ball-to-alls?\b",
    "ZeRO": r"\bZeRO\b",
    "FSDP": r"\bFSDP",
    "mixed precision": r"(?i)\bmixed[- ]precision\b",
    "recomputation": r"(?i)\brecomput",
}
PRIMER = ("06", "l06-md-primer")  # the four collectives, a picture each
TAUGHT = {
    "all-reduce": PRIMER,
    "reduce-scatter": PRIMER,
    "all-gather": PRIMER,
    "all-to-all": PRIMER,
    "ZeRO": ("08", "l08-md-01"),
    "FSDP": ("08", "l08-md-01"),
    "mixed precision": ("01", "l01-md-03"),  # the primer on a parameter's bytes
    "recomputation": ("07", "l07-md-28"),
}
AT_MOST = 1


def lessons() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def markdown(path: Path) -> list[tuple[str, str]]:
    cells = json.loads(path.read_text())["cells"]
    return [(c.get("id", "?"), "".join(c["source"])) for c in cells if c["cell_type"] == "markdown"]


def forward_references() -> dict[str, dict[str, list[str]]]:
    """{lesson number: {term: [ids of the cells naming it before it is taught]}}."""
    found: dict[str, dict[str, list[str]]] = {}
    for path in lessons():
        number, cells = path.name[:2], markdown(path)
        ids = [cid for cid, _ in cells]
        for term, pattern in TERMS.items():
            lesson, cell = TAUGHT[term]
            if number > lesson:
                continue
            end = ids.index(cell) if number == lesson else len(cells)
            hits = [cid for cid, text in cells[:end] if re.search(pattern, text)]
            if hits:
                found.setdefault(number, {})[term] = hits
    return found


def main() -> int:
    found = forward_references()
    over = 0
    for number in (p.name[:2] for p in lessons()):
        terms = found.get(number, {})
        said = "; ".join(f"{t}: {len(c)} ({', '.join(c)})" for t, c in terms.items()) or "none"
        print(f"lesson {number}: {said}")
        over += sum(len(c) > AT_MOST for c in terms.values())
    print(f"{over} term(s) referenced ahead more than {AT_MOST} time(s) in one lesson")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
