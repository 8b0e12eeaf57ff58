"""Feedback for each student: one HTML page per graded notebook, to hand back.

    write_feedback(results, Path("feedback"), roots=[Path("submissions")])
    # feedback/Alice Smith_12345_assignsubmission_file_/03_bubble_tradeoff.html

A page lists every exercise of the notebook with its title, passed or not, and the message
the learner's own check cell gives for that answer: the same kind hint, never the expected
answer (the checks are written that way, and the page adds nothing of the grader's). Then
what else the grader noticed (a name cell edited, locked cells changed, a cell that ran too
long), and the score. Everything that came from the notebook or the checks is escaped, its control
characters shown (`neutral.visible`). The pages mirror the submissions' folders, so each lands
beside the student's name, always inside the feedback folder: every part of a page's path is
a safe file name (`neutral.file_name`), and a name the notebook chose (its name cell) is never
a path.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from course_utils.grading.grader import GradeResult
from course_utils.grading.neutral import file_name, visible

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 52rem; margin: 2rem auto; padding: 0 1rem;
       color: #222; line-height: 1.45; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; vertical-align: top; padding: .45rem .6rem;
         border-bottom: 1px solid #ddd; }
td.result { white-space: nowrap; font-weight: 600; }
tr.passed td.result { color: #1a7f37; }
tr.failed td.result { color: #b35900; }
td.message { white-space: pre-wrap; }
.score { font-size: 1.2rem; }
"""
HEADING = re.compile(r"^#+\s*Exercise\s+(\d+\.\d+)\s*(.*)$", re.M)


def titles(solutions: Path, lesson: int) -> dict[str, str]:
    """{"3.1": "(Predict): the bubble of a pipeline", ...} from the solution's headings."""
    import nbformat

    from course_utils.grading.grader import solution_for

    nb = nbformat.read(solution_for(lesson, solutions), as_version=4)
    found: dict[str, str] = {}
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for number, title in HEADING.findall(cell.source):
                found.setdefault(number, title.strip())
    return found


def page(result: GradeResult, exercise_titles: dict[str, str]) -> str:
    """The feedback page of one graded notebook."""

    def e(text: object) -> str:
        return html.escape(visible(text, newlines=True))

    who = result.name or result.student
    lesson = f"Lesson {result.lesson:02d}" if result.lesson else "Exercises"
    out = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(lesson)}: feedback for {e(who)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{e(lesson)}: feedback for {e(who)}</h1>",
        f"<p>Notebook: <code>{e(Path(result.notebook).name)}</code>",
    ]
    if result.variant not in ("", "default"):
        out.append(f" · graded on the numbers of <code>{e(result.variant)}</code>")
    out.append("</p>")
    if result.problem:
        out.append(f"<p><strong>Not graded:</strong> {e(result.problem)}</p>")
    if result.exercises:
        out += ["<table>", "<tr><th>Exercise</th><th>Result</th><th>Feedback</th></tr>"]
        for ex in result.exercises:
            kind = "passed" if ex.passed else "failed"
            title = exercise_titles.get(ex.id, "")
            mark = "✅ passed" if ex.passed else "❌ not yet"
            if not ex.passed and "not answered" in ex.message:
                mark = "✋ not answered"
            out.append(
                f'<tr class="{kind}"><td>{e(ex.id)} {e(title)}</td>'
                f'<td class="result">{mark}</td><td class="message">{e(ex.message)}</td></tr>'
            )
        out.append("</table>")
    remarks = list(result.notes)
    remarks += [f"locked cell {t['cell']}: {t['status']}" for t in result.tampering]
    if remarks:
        out.append("<h2>Also noticed</h2><ul>")
        out += [f"<li>{e(r)}</li>" for r in remarks]
        out.append("</ul>")
    if result.total:
        percent = 100 * result.score / result.total
        out.append(
            f'<p class="score">Score: {result.score} of {result.total} exercises '
            f"({percent:.0f}%)</p>"
        )
    out.append("</body></html>\n")
    return "\n".join(out)


def place(result: GradeResult, roots: list[Path]) -> Path:
    """Where a notebook's page goes inside the feedback folder (a relative path of safe
    names): its path under the folder it was found in, else `<student>/<notebook>`, with
    `.html`."""
    notebook = Path(result.notebook)
    parts: tuple[str, ...] = (result.student, notebook.name)
    for root in roots:
        try:
            parts = notebook.relative_to(root).parts
            break
        except ValueError:
            continue
    names = [file_name(p) for p in parts]
    names[-1] = file_name(Path(names[-1]).stem) + ".html"
    return Path(*names)


def write_feedback(
    results: list[GradeResult], folder: Path, roots: list[Path], solutions: Path
) -> list[Path]:
    """One page per notebook that was found (not for "missing" rows); the paths written."""
    known: dict[int, dict[str, str]] = {}
    written: list[Path] = []
    for result in results:
        if not result.notebook:
            continue
        if result.lesson and result.lesson not in known:
            try:
                known[result.lesson] = titles(solutions, result.lesson)
            except Exception:  # no solution for it: the page just lacks the titles
                known[result.lesson] = {}
        path = folder / place(result, [r for r in roots if r.is_dir()])
        while path in written:  # two names made safe alike
            path = path.with_name(f"{path.stem}-{len(written)}.html")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page(result, known.get(result.lesson or 0, {})), encoding="utf-8")
        written.append(path)
    return written
