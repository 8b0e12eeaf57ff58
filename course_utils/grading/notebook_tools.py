"""Small shared helpers for the exercise machinery: reading and writing notebooks the same
way every time, finding answer and check cells, and cutting out solution blocks.

Conventions (see INSTRUCTORS.md): an exercise has an answer cell tagged "answer" whose
solution sits between `### BEGIN SOLUTION` and `### END SOLUTION` lines (nbgrader's syntax),
and a check cell tagged "check" with the id `check-NN-K` (lesson NN, exercise K).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

from course_utils.errors import CourseInputError
from course_utils.grading import EXERCISES, REPO, SOLUTIONS  # noqa: E402 (re-exported)

__all__ = ["EXERCISES", "REPO", "SOLUTIONS"]

CHECK_ID = re.compile(r"check-(\d+)-(\d+)")
BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
CODE_STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
ANSWER_STUB = "YOUR ANSWER HERE"
KERNEL_STARTUP_SECONDS = 180


def notebook_client(nb: nbformat.NotebookNode, **kwargs):
    """An nbclient NotebookClient that runs `nb` without imitating a front end's widgets.

    By default nbclient answers an ipywidgets Output widget's messages itself, on the
    socket where it waits for the cell's reply; sometimes it then misses that reply and the
    cell "runs" until its timeout (nbclient issue #312; we measured 15 stalls in 60 runs of
    a cell with `widgets.interact` on a busy core). Graders and test runners do not need
    live widgets, so none are imitated: their output stays in the cell's outputs.

    A kernel gets `KERNEL_STARTUP_SECONDS` to answer its first message, not nbclient's 60 s:
    on a fresh machine busy with other kernels the first start (cold caches) took longer.
    """
    from nbclient import NotebookClient

    kwargs.setdefault("startup_timeout", KERNEL_STARTUP_SECONDS)
    client = NotebookClient(nb, **kwargs)
    client.widget_registry = {}
    return client


def read_notebook(path: str | Path) -> nbformat.NotebookNode:
    """Read a notebook (as nbformat v4), or raise CourseInputError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise CourseInputError(f"notebook {str(path)!r} does not exist (give an .ipynb file)")
    try:
        return nbformat.read(path, as_version=4)
    except Exception as exc:  # nbformat raises several unrelated types for bad files
        raise CourseInputError(f"{str(path)!r} is not a readable notebook ({exc})") from None


def notebook_text(nb: nbformat.NotebookNode) -> str:
    """The exact file text nbformat.write produces (sorted keys, indent 1, final newline)."""
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def tags(cell: nbformat.NotebookNode) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def is_check_cell(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and (
        "check" in tags(cell) or bool(CHECK_ID.fullmatch(cell.get("id", "")))
    )


def check_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in nb.cells if is_check_cell(cell)]


def strip_solutions(source: str, cell_type: str, where: str = "cell") -> str:
    """Replace each BEGIN/END SOLUTION block: code by an indented NotImplementedError stub,
    markdown by "YOUR ANSWER HERE". Raises CourseInputError on unbalanced markers."""
    out: list[str] = []
    inside = False
    for line in source.split("\n"):
        marker = line.strip()
        if marker == BEGIN:
            if inside:
                raise CourseInputError(f"{where}: nested {BEGIN!r} (close the first block)")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            stub = CODE_STUB if cell_type == "code" else (ANSWER_STUB,)
            out += [indent + s for s in stub]
        elif marker == END:
            if not inside:
                raise CourseInputError(f"{where}: {END!r} without a {BEGIN!r} before it")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise CourseInputError(f"{where}: {BEGIN!r} without a matching {END!r}")
    return "\n".join(out)


def _ruff() -> str | None:
    ruff = Path(sys.executable).with_name("ruff")
    return str(ruff) if ruff.exists() else shutil.which("ruff")


def ruff_problems(text: str, filename: str) -> list[str]:
    """`ruff check` findings for a notebook's text (empty if clean or ruff is missing)."""
    command = _ruff()
    if command is None:
        return []
    result = subprocess.run(
        [command, "check", "--quiet", "--output-format=concise", "--stdin-filename", filename, "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    return [line for line in result.stdout.splitlines() if line.strip()]


def ruff_format_notebook(text: str, filename: str) -> str:
    """Format a notebook's code cells with the project's ruff settings (as `make lint` will
    check them); returns `text` unchanged if ruff is not installed."""
    command = _ruff()
    if command is None:
        return text
    result = subprocess.run(
        [command, "format", "--quiet", "--stdin-filename", filename, "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    if result.returncode != 0:
        raise CourseInputError(f"{filename}: ruff format failed: {result.stderr.strip()}")
    return result.stdout
