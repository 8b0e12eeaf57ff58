"""Micro-batches held over time: how many micro-batches' activations each device keeps.

A forward pass leaves activations behind until the backward pass that frees them (B, or W
when the backward is split). `held_over_time` turns a timeline into that step curve per
device and `held_chart` draws every device's curve on one time axis.
"""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from course_utils.actions import KINDS
from course_utils.charts.plot import add_legend, figure_and_axes
from course_utils.timeline import Timeline


def held_over_time(timeline: Timeline, device: int) -> tuple[list[float], list[int]]:
    """Step curve of micro-batches held by `device`: +1 when a forward starts, -1 when the
    backward that frees it (B, or W when split) ends; changes at one moment are merged.
    What each kind keeps or frees is `KINDS[kind].holds`."""
    change: dict[float, int] = {}
    for e in timeline.device_events(device):
        holds = KINDS[e.action.kind].holds
        if holds:  # kept from the start of the action, freed at its end
            t = e.start if holds > 0 else e.end
            change[t] = change.get(t, 0) + holds
    times, held = [0.0], [0]
    for t in sorted(change):
        times.append(t)
        held.append(held[-1] + change[t])
    return times, held


def held_chart(
    timeline: Timeline,
    title: str = "",
    ax: Axes | None = None,
    figsize: tuple[float, float] = (8, 3),
) -> Figure:
    """One step curve per device: the micro-batches it holds at each moment of the step."""
    fig, ax = figure_and_axes(ax, figsize)
    for d in range(timeline.num_devices):
        ax.step(*held_over_time(timeline, d), where="post", label=f"device {d}")
    ax.set(title=title, xlabel="time (units)", ylabel="micro-batches held")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    add_legend(ax, "outside")
    return fig
