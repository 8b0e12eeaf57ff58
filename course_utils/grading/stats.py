"""Class statistics: per exercise, the share of students who passed, how many left it
unanswered, how many wrong answers were partly right (earned part of the points), and the
commonest hint among the wrong answers.

    stats = class_statistics(results)
    print(stats_table(stats))
    write_stats(stats, Path("stats.png"))   # the bar chart, and stats.csv beside it

Students, not files: each student counts once per lesson, with the notebook the gradebook
takes (`keep.counted`: not a duplicate left out, not a file off the roster, not a "missing"
row), and only if it was graded. "Not answered yet" is counted apart from the wrong answers,
so the hint shown is the commonest mistake. Hints are grouped with their numbers masked,
since every student has their own numbers: "gpipe_bubble(5, 17) gives (p-1)/m" and
"gpipe_bubble(3, 9) gives (p-1)/m" are the same mistake. The example shown is the first
student's wording.

A hint may hold anything a student's code raised (TeX, escape sequences, odd characters): it
is drawn as plain text (no mathtext), shown `visible` in the terminal and written through
`neutral.cell` into the CSV, and if the chart still cannot be drawn with the hints it is
drawn without them, saying so: no answer text can stop the report.
"""

from __future__ import annotations

import csv
import re
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from course_utils.grading.grader import GradeResult, unanswered
from course_utils.grading.keep import counted
from course_utils.grading.neutral import cell, visible

NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
LABEL = re.compile(r"^Exercise \d+\.\d+(?: is)?:?\s*")  # the table's row says which exercise


@dataclass
class ExerciseStats:
    id: str
    graded: int  # students whose notebook was graded
    passed: int
    hint: str  # the commonest message among the wrong answers ("" if none was wrong)
    hint_count: int
    unanswered: int = 0  # students who left it unanswered ("not answered yet")
    partly: int = 0  # of the wrong answers, those that earned part of the points

    @property
    def share(self) -> float:
        return self.passed / self.graded if self.graded else 0.0

    @property
    def wrong(self) -> int:
        return self.graded - self.passed - self.unanswered


def _order(exercise_id: str) -> tuple[int, ...]:
    return tuple(map(int, exercise_id.split(".")))


def class_statistics(results: list[GradeResult]) -> list[ExerciseStats]:
    graded: Counter[str] = Counter()
    passed: Counter[str] = Counter()
    blank: Counter[str] = Counter()
    partly: Counter[str] = Counter()
    hints: dict[str, Counter[str]] = {}
    example: dict[tuple[str, str], str] = {}
    for r in results:
        if r.problem or not counted(r):
            continue
        for e in r.exercises:
            graded[e.id] += 1
            if e.passed:
                passed[e.id] += 1
                continue
            if unanswered(e):
                blank[e.id] += 1
                continue
            partly[e.id] += e.partly
            first = LABEL.sub("", (e.message.strip().splitlines() or [""])[0])
            shape = NUMBER.sub("#", first)
            hints.setdefault(e.id, Counter())[shape] += 1
            example.setdefault((e.id, shape), first)
    stats = []
    for k in sorted(graded, key=_order):
        common = hints.get(k, Counter()).most_common(1)
        shape, count = common[0] if common else ("", 0)
        stats.append(
            ExerciseStats(
                k, graded[k], passed[k], example.get((k, shape), ""), count, blank[k], partly[k]
            )
        )
    return stats


def stats_table(stats: list[ExerciseStats], width: int = 64) -> str:
    lines = [
        f"{'exercise':<9} {'passed':>13} {'not answered':>12}  "
        "commonest hint among the wrong answers (how many got it)"
    ]
    for s in stats:
        hint = textwrap.shorten(visible(s.hint), width) + f" ({s.hint_count})" if s.hint else "-"
        share = f"{s.passed}/{s.graded} {100 * s.share:3.0f}%"
        lines.append(f"{visible(s.id):<9} {share:>13} {s.unanswered:>12}  {hint}")
    return "\n".join(lines)


def write_stats(
    stats: list[ExerciseStats], path: Path, skipped: list[str] | None = None
) -> tuple[Path, Path]:
    """The bar chart at `path` (PNG) and the table as CSV beside it (same name, .csv). If
    the chart cannot be drawn with its hints it is drawn without them, and a line saying so
    goes to `skipped`."""
    try:
        _draw(stats, path, hints=True)
    except Exception as exc:  # a hint no font or parser takes: the shares still count
        _draw(stats, path, hints=False)
        if skipped is not None:
            skipped.append(f"the chart shows no hints: one could not be drawn ({exc!r:.200})")
    table = path.with_suffix(".csv")
    with table.open("w", newline="", encoding="utf-8", errors="backslashreplace") as f:
        writer = csv.writer(f)
        writer.writerow(["exercise", "graded", "passed", "percent passed", "not answered",
                         "commonest hint", "students given it", "partly right"])  # fmt: skip
        for s in stats:
            writer.writerow([cell(c) for c in (s.id, s.graded, s.passed, round(100 * s.share, 1),
                             s.unanswered, s.hint, s.hint_count, s.partly)])  # fmt: skip
    return path, table


def _draw(stats: list[ExerciseStats], path: Path, hints: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course_utils.charts.style import DPI, FIGURE_WIDTH, use_course_style

    use_course_style()
    height = 1.2 + 0.42 * max(1, len(stats))
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH * 1.4, height), dpi=DPI)
    rows = list(range(len(stats)))[::-1]
    start = [0.0] * len(stats)
    for what, color, count in (
        ("passed", "#2ca02c", lambda s: s.passed),
        ("answered wrong", "#ff7f0e", lambda s: s.wrong),
        ("not answered", "#bbbbbb", lambda s: s.unanswered),
    ):
        width = [100 * count(s) / s.graded if s.graded else 0.0 for s in stats]
        ax.barh(rows, width, left=start, color=color, height=0.6, label=what)
        start = [a + b for a, b in zip(start, width, strict=True)]
    ax.set_yticks(rows, [s.id for s in stats])
    ax.set_xlim(0, 100)
    ax.set_ylim(-0.6, len(stats) + 0.4)  # room above the bars for the legend
    ax.set_xlabel("students (%)")
    ax.legend(loc="upper left", ncols=3, fontsize=8, frameon=False)
    ax.set_title("Class statistics: each exercise, and the commonest hint among wrong answers")
    for y, s in zip(rows, stats, strict=True):
        ax.text(1, y, f"{s.passed}/{s.graded}", va="center", fontsize=8, color="white"
                if s.share > 0.12 else "black")  # fmt: skip
        if s.hint and hints:  # plain text: a `$` in a student's message is not TeX
            hint = textwrap.shorten(visible(s.hint), 90) + f"  ({s.hint_count}×)"
            ax.text(102, y, hint, va="center", fontsize=8, clip_on=False, parse_math=False)
    fig.subplots_adjust(left=0.06, right=0.5, top=1 - 0.5 / height, bottom=0.6 / height)
    try:
        fig.savefig(path)
    finally:
        plt.close(fig)
