"""Feedback for each student: one HTML page per graded notebook, to hand back.

    write_feedback(results, Path("feedback"), roots=[Path("submissions")])
    # feedback/Alice Smith_12345_assignsubmission_file/03_bubble_tradeoff.html

A page lists every exercise of the notebook with its title, passed, partly right or not, the
points it earned of those it is worth, and the message the learner's own check cell gives
for that answer: the same kind hint, never the expected answer (the checks are written that
way, and the page adds nothing of the grader's). Then what else the grader noticed, in plain
words (a locked cell changed is named by what it is, "the check cell of Exercise 3.2", never
by its id; a name cell set to someone else; a late or second notebook), the score in points,
and the instructor's review where there is one (its points and note, and the final score).
Messages and titles are rendered as the notebook renders them (`code`, **bold**, *emphasis*),
after escaping. A notebook graded on other numbers than it printed (its name cell names
someone else) shows, for each exercise, what its own check cell said on the numbers it
printed (`ExerciseResult.as_printed`): a student is never shown numbers her notebook did not
print.

Everything that came from the notebook or the checks is escaped (element text only: no
attribute holds any), its control characters
shown (`neutral.visible`). The pages mirror the submissions' folders, so each lands beside
the student's name, always inside the feedback folder: every part of a page's path is a safe
file name (`neutral.file_name`), and a name the notebook chose (its name cell) is never a
path. Zipped, the folder is what Moodle's "Upload multiple feedback files in a ZIP" and
Canvas's "Re-Upload Submissions" read back (INSTRUCTORS.md).
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from course_utils.grading import keep
from course_utils.grading.grader import GradeResult, unanswered
from course_utils.grading.neutral import file_name, visible

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 52rem; margin: 2rem auto; padding: 0 1rem;
       color: #222; line-height: 1.45; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; vertical-align: top; padding: .45rem .6rem;
         border-bottom: 1px solid #ddd; }
td.result, td.points { white-space: nowrap; font-weight: 600; }
tr.passed td.result { color: #1a7f37; }
tr.partly td.result { color: #8a6d00; }
tr.failed td.result { color: #b35900; }
td.message { white-space: pre-wrap; }
code { background: #f3f3f3; padding: 0 .2em; border-radius: 3px; }
.score { font-size: 1.2rem; }
"""
HEADING = re.compile(r"^#+\s*Exercise\s+(\d+\.\d+)\s*(.*)$", re.M)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
STRONG = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
EMPHASIS = re.compile(r"(?<![\w*])\*(?=[^\s*])([^*]+?)(?<=[^\s*])\*(?![\w*])")
# The grader's notes about the name cell are the instructor's: the flags say it plainly.
NAME_CELL_NOTES = ("worked on the course's default", "its name cell", "graded on the numbers of")
PLAIN = {  # the grader's words for the instructor -> the student's
    "the kernel died (the notebook crashed or exited)": (
        "your notebook stopped running part way (it crashed or exited), so the exercises "
        "after that point could not be checked"
    ),
}


def inline_markdown(text: object) -> str:
    """`text` as safe HTML, its inline markdown rendered as a notebook would: `code`,
    **bold**, *emphasis*. Escaped first (control characters shown): nothing of it is HTML."""
    parts = []
    last = 0
    raw = visible(text, newlines=True)
    for found in CODE_SPAN.finditer(raw):
        parts.append(_emphasis(html.escape(raw[last : found.start()], quote=False)))
        parts.append(f"<code>{html.escape(found.group(2).strip(), quote=False)}</code>")
        last = found.end()
    parts.append(_emphasis(html.escape(raw[last:], quote=False)))
    return "".join(parts)


def _emphasis(escaped: str) -> str:
    escaped = STRONG.sub(r"<strong>\1</strong>", escaped)
    return EMPHASIS.sub(r"<em>\1</em>", escaped)


def solution_of_lesson(solutions: Path, lesson: int):
    import nbformat

    from course_utils.grading.grader import solution_for

    return nbformat.read(solution_for(lesson, solutions), as_version=4)


def titles(solution) -> dict[str, str]:
    """{"3.1": "(Predict): the bubble of a pipeline", ...} from the solution's headings."""
    found: dict[str, str] = {}
    for cell in solution.cells:
        if cell.cell_type == "markdown":
            for number, title in HEADING.findall(cell.source):
                found.setdefault(number, title.strip())
    return found


def locked_cells(solution, lesson: int) -> dict[str, str]:
    """{cell id: what the cell is, in plain words} for the solution's locked cells."""
    from course_utils.grading.notebook_tools import is_check_cell
    from course_utils.grading.sandbox import exercise_of_cells

    words = {}
    for cell, k in zip(solution.cells, exercise_of_cells(solution, lesson), strict=True):
        where = f"Exercise {lesson}.{k}" if k is not None else None
        if is_check_cell(cell):
            what = f"the check cell of {where}" if where else "a check cell"
        elif "for_student(" in cell.source:
            what = "the first code cell (the one with your name)"
        elif "check.given(" in cell.source and where:
            what = f"the cell that shows the numbers of {where}"
        elif where:
            what = f"a cell of {where} that was not yours to change"
        else:
            what = "a cell at the top of the notebook that was not yours to change"
        words[str(cell.get("id"))] = what
    return words


def remarks(result: GradeResult, cells: dict[str, str]) -> list[str]:
    """What else was noticed, in plain words for the student."""
    said = []
    flags = set(result.flags)
    if "default numbers" in flags:
        said.append(
            "Your notebook's first cell was set to \"default\", so it showed the course's "
            "example numbers instead of your own. Your answers were checked on your own "
            "numbers; each message above is what your notebook's own check said on the "
            "numbers it showed."
        )
    elif "name cell edited" in flags:
        said.append(
            "Your notebook's first cell names someone else, so it showed other numbers than "
            "your own. Your answers were checked on your own numbers; each message above is "
            "what your notebook's own check said on the numbers it showed."
        )
    if keep.LATE in flags:
        said.append("This notebook was handed in after the deadline.")
    if keep.DUPLICATE in flags:
        which = "this is the one that counts" if keep.counted(result) else "another one counts"
        said.append(f"You handed in more than one notebook for this lesson: {which}.")
    elif keep.NOT_KEPT in flags and keep.LATE in flags:
        said.append("Work handed in late does not count towards the grade in this course.")
    for t in result.tampering:
        what = cells.get(str(t["cell"]), "a cell that was not yours to change")
        done = "deleted" if t["status"] == "removed" else "changed"
        said.append(
            f"{what[0].upper()}{what[1:]} was {done}. Your grade does not depend on it: "
            "your answers were checked by the grader, not by that cell."
        )
    for note in result.notes:
        if not note.startswith((keep.PLACE_NOTE, *NAME_CELL_NOTES)):
            note = PLAIN.get(note, note)
            said.append(note[0].upper() + note[1:] + ("" if note.endswith(".") else "."))
    return said


def page(
    result: GradeResult, exercise_titles: dict[str, str], cells: dict[str, str] | None = None
) -> str:
    """The feedback page of one graded notebook (`cells`: `locked_cells` of its solution)."""

    def e(text: object) -> str:
        return html.escape(visible(text, newlines=True), quote=False)

    md = inline_markdown
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
        out.append(" · checked on your own numbers")
    out.append("</p>")
    if result.problem:
        out.append(f"<p><strong>Not graded:</strong> {md(result.problem)}</p>")
    if result.exercises:
        out += [
            "<table>",
            "<tr><th>Exercise</th><th>Result</th><th>Points</th><th>Feedback</th></tr>",
        ]
        for ex in result.exercises:
            kind = "passed" if ex.passed else "partly" if ex.partly else "failed"
            title = exercise_titles.get(ex.id, "")
            mark = {"passed": "✅ passed", "partly": "◐ partly right"}.get(kind, "❌ not yet")
            if unanswered(ex):
                mark = "✋ not answered"
            message = ex.message
            if ex.as_printed is not None:
                message = ex.as_printed["message"]
                if ex.as_printed["passed"] and not ex.passed:
                    message = (
                        "Right for the numbers your notebook showed, but those are not your "
                        f"numbers, so it does not count. ({message})"
                    )
            out.append(
                f'<tr class="{kind}"><td>{e(ex.id)} {md(title)}</td>'
                f'<td class="result">{mark}</td><td class="points">{ex.earned} of {ex.points}'
                f'</td><td class="message">{md(message)}</td></tr>'
            )
        out.append("</table>")
    noticed = remarks(result, cells or {})
    if noticed:
        out.append("<h2>Also noticed</h2><ul>")
        out += [f"<li>{md(r)}</li>" for r in noticed]
        out.append("</ul>")
    if result.total:
        percent = 100 * result.score / result.total
        out.append(
            f'<p class="score">Score: {result.score} of {result.total} points ({percent:.0f}%)</p>'
        )
    if result.review is not None or result.review_note:
        out.append(_review(result))
    out.append("</body></html>\n")
    return "\n".join(out)


def _review(result: GradeResult) -> str:
    """The instructor's review: its points, its note, and the score it makes."""
    said = "<h2>Your instructor's review</h2><p>"
    if result.review is not None:
        points = f"{result.review:+g} point{'' if abs(result.review) == 1 else 's'}"
        said += f"{points}{': ' if result.review_note else '.'}"
    if result.review_note:
        said += inline_markdown(result.review_note)
    said += "</p>"
    if result.review is not None and result.total:
        final = result.final()
        said += (
            f'<p class="score">Final score: {final} of {result.total} points '
            f"({100 * final / result.total:.0f}%)</p>"
        )
    return said


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
    known: dict[int, tuple[dict[str, str], dict[str, str]]] = {}
    written: list[Path] = []
    for result in results:
        if not result.notebook:
            continue
        if result.lesson and result.lesson not in known:
            try:
                solution = solution_of_lesson(solutions, result.lesson)
                known[result.lesson] = (titles(solution), locked_cells(solution, result.lesson))
            except Exception:  # no solution for it: the page just lacks the titles
                known[result.lesson] = ({}, {})
        path = folder / place(result, [r for r in roots if r.is_dir()])
        while path in written:  # two names made safe alike
            path = path.with_name(f"{path.stem}-{len(written)}.html")
        path.parent.mkdir(parents=True, exist_ok=True)
        exercise_titles, cells = known.get(result.lesson or 0, ({}, {}))
        path.write_text(page(result, exercise_titles, cells), encoding="utf-8")
        written.append(path)
    return written
