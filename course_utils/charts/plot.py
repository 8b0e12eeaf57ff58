"""`plot`: the course's line chart, so a lesson cell says *what* to draw and not *how*.

The way `d2l.plot` serves the d2l book: curves by label, each an (xs, ys) pair,

    fig = plot({"formula 1/p": (grid, 1 / grid), "this machine": (ps, measured)},
               hlines={"one 80 GB GPU": 80}, title=..., xlabel=..., ylabel=...)

A curve's label decides its look unless `fmts` says otherwise: a label starting with
"formula" or "ideal" is a dashed line (crimson for a formula), "predicted" or "simulated"
dashed with squares, "reference" grey and dotted with squares, anything else measured
(solid with dots). A format is a matplotlib format string ("o-", "C1--", "kx") or a dict
of line properties ({"color": "C0", "alpha": 0.35}). `ax` draws into one panel of a larger
figure. `hlines` and `vlines` draw labelled lines across the axes (a budget, a node's
edge). `lines_chart(xs, series, reference)` is the same for curves that share their xs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from course_utils.charts.style import use_course_style
from course_utils.errors import CourseInputError

PALETTE = ["#4c72b0", "#dd8452", "#55a467", "#c44e52", "#8172b3", "#937860"]
REFERENCE_GREY = "#8c8c8c"
# Labelled horizontal or vertical lines (budgets, limits, "even"), in order of appearance.
LINE_STYLES = [("--", "#444444"), (":", REFERENCE_GREY), ("-.", "#444444")]
SCALES = ("linear", "log", "log2")
LEGENDS = ("best", "outside", "none")

Curve = tuple[Sequence[float], Sequence[float]]
Format = str | Mapping[str, Any]


def _style(label: str, colour: str) -> dict:
    word = label.split(" ")[0].lower().rstrip(":,")
    if word in ("formula", "ideal"):
        return {"linestyle": "--", "color": "crimson" if word == "formula" else colour}
    if word in ("predicted", "simulated"):
        return {"linestyle": "--", "marker": "s", "color": colour}
    if word == "reference":
        return {"linestyle": ":", "marker": "s", "color": REFERENCE_GREY}
    return {"linestyle": "-", "marker": "o", "color": colour}


def set_scale(ax: Axes, axis: str, scale: str) -> None:
    """Set an axis to "linear", "log" (base 10) or "log2"."""
    if scale not in SCALES:
        raise CourseInputError(f"{axis}scale must be one of {', '.join(SCALES)}, got {scale!r}")
    setter = ax.set_xscale if axis == "x" else ax.set_yscale
    if scale == "log2":
        setter("log", base=2)
    else:
        setter(scale)


def add_legend(ax: Axes, where: str = "best", **kwargs) -> None:
    """A legend "best" placed, "outside" (right of the axes, covering no data) or "none"."""
    if where not in LEGENDS:
        raise CourseInputError(f"legend must be one of {', '.join(LEGENDS)}, got {where!r}")
    if where == "outside":
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), **kwargs)
    elif where == "best":
        ax.legend(**kwargs)


def figure_and_axes(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    """The course's style, and `ax` with its figure, or a new figure of one panel."""
    use_course_style()
    if ax is not None:
        return cast(Figure, ax.figure), ax
    fig, new = plt.subplots(figsize=figsize)
    return fig, new


def reference_lines(ax: Axes, lines: Mapping[str, float] | None, vertical: bool = False) -> None:
    """Labelled lines across the axes at the given values (horizontal unless `vertical`)."""
    for k, (label, value) in enumerate((lines or {}).items()):
        linestyle, colour = LINE_STYLES[k % len(LINE_STYLES)]
        draw = ax.axvline if vertical else ax.axhline
        draw(value, linestyle=linestyle, color=colour, linewidth=1.2, label=label)


def plot(
    curves: Mapping[str, Curve],
    *,
    fmts: Mapping[str, Format] | None = None,
    hlines: Mapping[str, float] | None = None,
    vlines: Mapping[str, float] | None = None,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    xscale: str = "linear",
    yscale: str = "linear",
    xlim: tuple[float, float] | None = None,
    ylim: tuple[float, float] | None = None,
    xticks: Sequence[float] | None = None,
    legend: str = "best",
    ax: Axes | None = None,
    figsize: tuple[float, float] = (8, 3.8),
) -> Figure:
    """Each curve (xs, ys) by its label, labelled lines at `hlines`/`vlines`, a legend."""
    if not curves:
        raise CourseInputError("curves must map at least one label to (xs, ys)")
    for label, curve in curves.items():
        if len(curve) != 2 or len(curve[0]) != len(curve[1]):
            raise CourseInputError(f"curve {label!r} must be (xs, ys) of equal lengths")
    fig, ax = figure_and_axes(ax, figsize)
    k = 0  # the next palette colour: formulas and references keep their own
    for label, (xs, ys) in curves.items():
        fmt = (fmts or {}).get(label)
        if isinstance(fmt, str):
            ax.plot(xs, ys, fmt, label=label)
            continue
        style = _style(label, PALETTE[k % len(PALETTE)]) | dict(fmt or {})
        k += style["color"] == PALETTE[k % len(PALETTE)]
        ax.plot(xs, ys, label=label, **style)
    reference_lines(ax, hlines)
    for label, x in (vlines or {}).items():  # boundaries (a node's edge): thin and solid
        ax.axvline(x, color="black", linewidth=0.8, label=label)
    set_scale(ax, "x", xscale)
    set_scale(ax, "y", yscale)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if xlim is not None:
        ax.set_xlim(*xlim)
    if ylim is not None:
        ax.set_ylim(*ylim)
    if xticks is not None:
        ax.set_xticks(list(xticks))
    add_legend(ax, legend)
    return fig


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
    """One figure: each series against the shared `xs`, each reference (xs, ys) in grey."""
    if not series or any(len(ys) != len(xs) for ys in series.values()):
        raise CourseInputError("series must map labels to lists as long as xs")
    if xscale not in ("log2", "linear"):
        raise CourseInputError(f"xscale must be log2 or linear, got {xscale!r}")
    curves = {label: (xs, ys) for label, ys in series.items()}
    grey = {"linestyle": ":", "marker": "s", "color": REFERENCE_GREY}
    greys = {label: grey for label in reference or {}}
    return plot(
        curves | dict(reference or {}),
        fmts=greys,
        title=title,
        xlabel=xlabel,
        ylabel=ylabel,
        xscale=xscale,
        figsize=figsize,
    )
