"""`lines_chart`: the course's line chart of measured, predicted and reference curves.

A lesson's measured curves (bubble against m, throughput against workers, ...) share one
look, so a lesson cell says *what* to draw and this module *how* (the way `d2l.plot` serves
the d2l book):

    fig = lines_chart(ms, {"formula": f, "measured on this machine": b},
                      reference={"reference": (ref_ms, ref_b)},
                      title=..., xlabel=..., ylabel=...)

A series whose label starts with "formula" or "ideal" is a dashed line, one starting with
"predicted" or "simulated" dashed with squares, anything else measured (solid with dots);
reference series are grey and dotted.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from course_utils.charts.style import use_course_style
from course_utils.errors import CourseInputError

PALETTE = ["#4c72b0", "#dd8452", "#55a467", "#c44e52", "#8172b3", "#937860"]


def _style(label: str, colour: str) -> dict:
    word = label.split(" ")[0].lower().rstrip(":,")
    if word in ("formula", "ideal"):
        return {"linestyle": "--", "color": "crimson" if word == "formula" else colour}
    if word in ("predicted", "simulated"):
        return {"linestyle": "--", "marker": "s", "color": colour}
    return {"linestyle": "-", "marker": "o", "color": colour}


def lines_chart(
    xs: Sequence[float],
    series: dict[str, Sequence[float]],
    reference: dict[str, tuple[Sequence[float], Sequence[float]]] | None = None,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    xscale: str = "log2",
    figsize: tuple[float, float] = (8, 3.8),
) -> Figure:
    """One figure: each series against `xs`, each reference (xs, ys) in grey, a legend."""
    if not series or any(len(ys) != len(xs) for ys in series.values()):
        raise CourseInputError("series must map labels to lists as long as xs")
    if xscale not in ("log2", "linear"):
        raise CourseInputError(f"xscale must be log2 or linear, got {xscale!r}")
    use_course_style()
    fig, ax = plt.subplots(figsize=figsize)
    for k, (label, ys) in enumerate(series.items()):
        ax.plot(xs, ys, label=label, **_style(label, PALETTE[k % len(PALETTE)]))
    for label, (ref_xs, ref_ys) in (reference or {}).items():
        ax.plot(ref_xs, ref_ys, "s:", color="#8c8c8c", label=label)
    if xscale == "log2":
        ax.set_xscale("log", base=2)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.legend()
    return fig


def grouped_bars(
    categories: Sequence[str],
    panels: dict[str, dict[str, Sequence[float]]],
    title: str = "",
    ylabel: str = "",
) -> Figure:
    """Side-by-side panels (e.g. "This machine", "Reference"), each with one group of bars
    per category and one bar per series: `panels[panel][series][k]` is category k's value."""
    if not panels or any(
        len(values) != len(categories) for series in panels.values() for values in series.values()
    ):
        raise CourseInputError("panels must map series to one value per category")
    use_course_style()
    fig, axes = plt.subplots(
        1, len(panels), figsize=(6 * len(panels), 3.6), sharey=True, squeeze=False
    )
    for ax, (where, series) in zip(axes[0], panels.items(), strict=True):
        width = 0.8 / len(series)
        for k, (label, values) in enumerate(series.items()):
            offsets = [i - 0.4 + width * (k + 0.5) for i in range(len(categories))]
            ax.bar(offsets, values, width, color=PALETTE[k % len(PALETTE)], label=label)
        ax.set_xticks(range(len(categories)), list(categories))
        ax.set_title(where)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
