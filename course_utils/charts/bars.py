"""`bar_chart`: the course's bar chart, side by side or stacked, in one call.

    fig = bar_chart(["device 0", "device 1"], {"GPipe": [8, 8], "1F1B": [2, 1]},
                    lines={"p = 2": 2}, ylabel="micro-batches held")

One bar per category and series: several series stand side by side, or on top of each
other with `stacked=True` (the parts of a memory budget); `horizontal=True` lists the
categories from top to bottom. `lines` draws labelled lines across the bars at the given
values (a budget, a limit), `bar_labels` writes on the bars, `totals` above each stack.
`grouped_bars` puts several such charts side by side (this machine, the reference).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from course_utils.charts.plot import PALETTE, add_legend, figure_and_axes, reference_lines
from course_utils.charts.style import use_course_style
from course_utils.errors import CourseInputError


def _colours(series: int, categories: int, colors: Sequence[str] | None) -> list:
    """One colour per series, or per bar when a single series is given one per category."""
    if colors is None:  # the course's palette, or matplotlib's longer cycle for many series
        cycle = (
            PALETTE if series <= len(PALETTE) else plt.rcParams["axes.prop_cycle"].by_key()["color"]
        )
        return [cycle[k % len(cycle)] for k in range(series)]
    if series == 1 and len(colors) == categories:
        return [list(colors)]
    if len(colors) != series:
        raise CourseInputError(
            f"colors must give one colour per series ({series}) or, for one series, one per "
            f"category ({categories}); got {len(colors)}"
        )
    return list(colors)


def bar_chart(
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    stacked: bool = False,
    horizontal: bool = False,
    lines: Mapping[str, float] | None = None,
    colors: Sequence[str] | None = None,
    bar_labels: str | Mapping[str, Sequence[str]] | None = None,
    totals: str | None = None,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    limit: tuple[float, float] | None = None,
    rotation: float = 0,
    legend: str = "best",
    ax: Axes | None = None,
    figsize: tuple[float, float] = (8, 3.8),
) -> Figure:
    """Bars of `series[label][k]` for category k, a line per `lines` value, a legend.

    `bar_labels` is a format for every bar ("{:.2f} GiB") or each series' own texts;
    `totals` a format for the top of each stack; `limit` the value axis' range.
    """
    if not series or any(len(values) != len(categories) for values in series.values()):
        raise CourseInputError("series must map labels to one value per category")
    fig, ax = figure_and_axes(ax, figsize)
    colours = _colours(len(series), len(categories), colors)
    draw = ax.barh if horizontal else ax.bar
    positions = np.arange(len(categories), dtype=float)
    base = np.zeros(len(categories))
    width = 0.8 if stacked else 0.8 / len(series)
    bars = None
    for k, (label, values) in enumerate(series.items()):
        where = positions if stacked else positions - 0.4 + width * (k + 0.5)
        offset: dict[str, Any] = {"left" if horizontal else "bottom": base} if stacked else {}
        bars = draw(
            where, values, width, color=colours[k], edgecolor="white", label=label, **offset
        )
        if isinstance(bar_labels, str):
            inside = dict(label_type="center", color="white") if stacked else {"padding": 3}
            ax.bar_label(bars, fmt=bar_labels, fontsize=8, **inside)
        elif bar_labels is not None and label in bar_labels:
            ax.bar_label(bars, labels=list(bar_labels[label]), fontsize=8, padding=3)
        if stacked:
            base = base + np.asarray(values, dtype=float)
    if totals is not None and bars is not None:
        ax.bar_label(bars, labels=[totals.format(t) for t in base], padding=3)
    set_ticks = ax.set_yticks if horizontal else ax.set_xticks
    set_ticks(positions, list(categories), rotation=rotation)
    if horizontal:
        ax.invert_yaxis()  # the first category on top, as it is read
    reference_lines(ax, lines, vertical=horizontal)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if limit is not None:
        (ax.set_xlim if horizontal else ax.set_ylim)(*limit)
    elif bar_labels is not None or totals is not None:
        low, high = ax.get_xlim() if horizontal else ax.get_ylim()
        (ax.set_xlim if horizontal else ax.set_ylim)(low, high + 0.12 * (high - low))
    add_legend(ax, legend)
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
        bar_chart(categories, series, title=where, ax=ax)
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
