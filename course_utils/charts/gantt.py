"""Gantt charts of timelines: who computed what, when, and where the bubbles are.

`draw(timeline)` gives one row per device (device 0 at the top). The fill colour says
which micro-batch, the shade and hatch say which kind of work:

    forward (F)        plain micro-batch colour
    backward (B)       darker, diagonal hatch
    input-grad (I)     darker, the other diagonal      (zero-bubble split of B)
    weight-grad (W)    lighter, dotted                 (zero-bubble split of B)
    communication      thin dark bar on a lane under the device's row
    bubble             grey cross-hatch wherever the device computes nothing

Simulated timelines (cost units) and measured ones (seconds, drawn in ms) look alike,
so `draw([simulated, measured])` or `compare(simulated, measured)` stacks them on one
time axis. Bars are drawn as one collection per kind of work, not one artist per bar,
so a 16-device, 64-micro-batch chart still renders in a few tens of milliseconds.

The `python -m course_utils gantt` command draws a schedule with it. This module never
imports torch.
"""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from course_utils.charts import style
from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import label as schedule_label
from course_utils.timeline import Event, Timeline

CATEGORIES = style.CATEGORIES

# Layout, in inches: fixed margins instead of tight_layout, which is slow and jumpy.
LEFT, RIGHT = 0.85, 0.25
TITLE_H = 0.42  # above each chart
XAXIS_H = 0.55  # tick labels and axis label under the last chart
LEGEND_H = 0.38  # one legend row at the bottom
TOP_PAD = 0.08
NOTE_H = 0.17  # a line of the clock's note, above the charts
MAX_PLOT_H = 4.8  # per chart: p=16 gets 0.3 inch per device row
ROW_H = 0.55
MIN_PLOT_H = 0.9

LABEL_FONTSIZE = 7.5
MAX_LABELS = 400  # beyond this many labels the chart is too dense to read them anyway
MIN_HATCH_PX = 8  # narrower bars are drawn without hatching


# ----------------------------------------------------------------------------- helpers


def _category(event: Event) -> str:
    return style.category(event.action.kind)


def _stats(timeline: Timeline) -> tuple[float, float, list[float]]:
    """(start, makespan, busy per device), each in one pass over the events."""
    return timeline.start, timeline.makespan, timeline.busy_per_device()


def bubble_fraction(timeline: Timeline) -> float:
    """Idle compute time over devices x makespan (the same as `timeline.bubble_fraction`)."""
    return timeline.bubble_fraction


def _shape(timeline: Timeline) -> tuple[int, int, int]:
    """(devices, micro-batches, chunks) of a timeline; micro-batches counted from the events
    when the timeline does not say (a measured data-parallel step, say)."""
    m = timeline.microbatches
    if m is None:
        m = len({e.action.microbatch for e in timeline.events if e.action.microbatch is not None})
    return timeline.num_devices, m, timeline.chunks


def _time_unit(timeline: Timeline) -> tuple[float, str]:
    """(scale, unit name): measured seconds are shown in milliseconds."""
    if timeline.unit == "s":
        return 1000.0, "ms"
    return 1.0, timeline.unit or "units"


def _number(x: float) -> str:
    """33.0, 237.0, 4.27, 0.0123: one decimal for big numbers, 3 significant digits else."""
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3g}"


def title_for(timeline: Timeline, prefix: str | None = None, colour: str = "micro-batch") -> str:
    """E.g. '1F1B, p=4, m=8 — makespan 33.0 units, bubble 27.3%'.

    m counts micro-batches, and idle time is called the bubble, only when colour means
    micro-batch: a timeline whose colour is a step or an expert gets p alone (its name
    says the rest) and its idle share is called "idle".
    """
    if prefix is None:
        name = timeline.name or "timeline"
        prefix = schedule_label(name)
        if "p=" not in prefix:
            p, m, v = _shape(timeline)
            prefix += f", p={p}"
            if colour == "micro-batch":
                prefix += f", m={m}" + (f", v={v}" if v > 1 else "")
        if timeline.source == "measured" and "measured" not in prefix.lower():
            prefix += " (measured)"
    scale, unit = _time_unit(timeline)
    _, makespan, _ = _stats(timeline)
    # A pipeline's idle time is its bubble; elsewhere (data or expert parallelism) the
    # devices idle mostly while they wait for a collective, so the title says "idle".
    idle = "bubble" if colour == "micro-batch" else "idle"
    clock = timeline.meta.get("clock") if timeline.source == "measured" else None
    return (
        f"{prefix} — makespan {_number(makespan * scale)} {unit}, "
        f"{idle} {100 * bubble_fraction(timeline):.1f}%" + (f" [{clock} clock]" if clock else "")
    )


def clock_note(timelines: list[Timeline]) -> str | None:
    """What the measured timelines' clocks measure and model, for a line under the chart."""
    notes = []
    for t in timelines:
        clock = t.meta.get("clock") if t.source == "measured" else None
        if clock == "virtual":
            links = t.meta.get("links", "emulated links")
            note = f"virtual clock: measured compute (CPU time), {links}"
        elif clock == "wall":
            note = "wall clock: real timestamps on this machine's cores"
        else:
            continue
        if note not in notes:
            notes.append(note)
    return "; ".join(notes) or None


def _idle_segments(intervals: list[tuple[float, float]], end: float) -> list[tuple[float, float]]:
    """Gaps in [0, end] not covered by `intervals` (the device's compute)."""
    gaps, cursor = [], 0.0
    eps = 1e-9 * max(end, 1e-12)
    for a, b in sorted(intervals):
        if a > cursor + eps:
            gaps.append((cursor, a))
        cursor = max(cursor, b)
    if end > cursor + eps:
        gaps.append((cursor, end))
    return gaps


def _split_by(
    a: float, b: float, covers: list[tuple[float, float]]
) -> list[tuple[str, float, float]]:
    """Cut the idle stretch [a, b] into ("wait", ...) where `covers` overlap it, else "bubble".

    Gaps of rounding size (a collective that starts 1e-14 after the compute ends) are not
    bubbles: they would put an "idle" patch in the legend that no bar shows.
    """
    eps = 1e-9 * max(abs(b), 1e-12)
    pieces, cursor = [], a
    for c0, c1 in sorted(covers):
        lo, hi = max(c0, cursor), min(c1, b)
        if hi <= lo:
            continue
        if lo > cursor + eps:
            pieces.append(("bubble", cursor, lo))
        pieces.append(("wait", lo, hi))
        cursor = hi
    if b > cursor + eps:
        pieces.append(("bubble", cursor, b))
    return pieces


def _rect(x0: float, x1: float, y0: float, y1: float) -> list[tuple[float, float]]:
    return [(x0, y0), (x0, y1), (x1, y1), (x1, y0)]


def _fill(category: str, microbatch: int | None):
    return style.fill(category, microbatch)


def _label_candidates(event: Event, chunks: int) -> list[str]:
    return style.bar_labels(event.action, event.label, chunks)


# ----------------------------------------------------------------------------- drawing


def _draw_one(
    ax,
    timeline: Timeline,
    *,
    title: str | None,
    show_bubble: bool,
    labels: bool,
    xmax: float,
    px_per_unit: float,
    row_px: float,
    colour: str = "micro-batch",
) -> set[str]:
    """Draw one timeline into `ax`; returns the categories it contains (for the legend)."""
    p = timeline.num_devices
    start, makespan, _ = _stats(timeline)
    scale, unit = _time_unit(timeline)
    _, _, chunks = _shape(timeline)
    has_comm = any(not e.action.is_compute for e in timeline.events)
    # Row geometry (device d is centred on y=d): compute bar, then a thin comm lane.
    if has_comm:
        bar0, bar1, lane0, lane1 = -0.38, 0.22, 0.27, 0.42
    else:
        bar0, bar1, lane0, lane1 = -0.34, 0.34, 0.0, 0.0

    verts: dict[str, list] = {c[0]: [] for c in CATEGORIES}
    colors: dict[str, list] = {c[0]: [] for c in CATEGORIES}
    compute_by_device: list[list[tuple[float, float]]] = [[] for _ in range(p)]
    narrowest = float("inf")
    for e in timeline.events:
        x0, x1 = (e.start - start) * scale, (e.end - start) * scale
        cat = _category(e)
        if cat == "comm":
            verts[cat].append(_rect(x0, x1, e.device + lane0, e.device + lane1))
        else:
            verts[cat].append(_rect(x0, x1, e.device + bar0, e.device + bar1))
            if 0 <= e.device < p:
                compute_by_device[e.device].append((x0, x1))
            if x1 > x0:  # zero-length bars (e.g. W with --weight-cost 0) are invisible anyway
                narrowest = min(narrowest, (x1 - x0) * px_per_unit)
        colors[cat].append(_fill(cat, e.action.microbatch))

    present: set[str] = set()
    if show_bubble:
        # Idle time is the pipeline's bubble, except while the device's own communication
        # runs: then it waits for a collective (e.g. a gradient all-reduce), drawn apart.
        # A point-to-point transfer holds nobody up: the sender could compute meanwhile.
        comm_by_device: list[list[tuple[float, float]]] = [[] for _ in range(p)]
        for e in timeline.events:
            if not e.action.is_compute and not e.action.is_p2p and 0 <= e.device < p:
                comm_by_device[e.device].append(
                    ((e.start - start) * scale, (e.end - start) * scale)
                )
        idle: dict[str, list] = {"bubble": [], "wait": []}
        for d in range(p):
            for a, b in _idle_segments(compute_by_device[d], makespan * scale):
                for kind, x0, x1 in _split_by(a, b, comm_by_device[d]):
                    idle[kind].append(_rect(x0, x1, d + bar0, d + bar1))
        for kind, rects in idle.items():
            if not rects:
                continue
            present.add(kind)
            ax.add_collection(
                PolyCollection(
                    rects,
                    facecolors=style.BUBBLE_COLOR if kind == "bubble" else style.WAIT_COLOR,
                    edgecolors="none",
                    hatch=style.BUBBLE_HATCH if kind == "bubble" else style.WAIT_HATCH,
                    hatchcolor=style.BUBBLE_HATCH_COLOR if kind == "bubble" else style.COMM_COLOR,
                    linewidths=0,
                    zorder=1,
                )
            )
    # Thin white edges separate neighbours, unless bars are only a few pixels wide.
    # Hatches on bars a few pixels wide are invisible but cost seconds to render in Agg,
    # so narrow bars are told apart by shade alone.
    edge_lw = 0.6 if narrowest > 6 else 0.0
    hatched = narrowest >= MIN_HATCH_PX
    for key, _label, hatch in CATEGORIES:
        if not verts[key]:
            continue
        present.add(key)
        hatchcolor = (1, 1, 1, 0.55) if style.is_dark(key) else (0, 0, 0, 0.35)
        ax.add_collection(
            PolyCollection(
                verts[key],
                facecolors=colors[key],
                edgecolors=style.EDGE_COLOR if key != "comm" else "none",
                linewidths=edge_lw if key != "comm" else 0,
                hatch=(hatch or None) if hatched else None,
                hatchcolor=hatchcolor,
                zorder=2 if key != "comm" else 3,
            )
        )

    if labels and row_px * (bar1 - bar0) >= LABEL_FONTSIZE * 1.45:
        _add_labels(ax, timeline, start, scale, chunks, px_per_unit, (bar0 + bar1) / 2)

    ax.set_xlim(0, xmax)
    ax.set_ylim(p - 0.5, -0.5)  # device 0 at the top
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"dev {d}" for d in range(p)])
    ax.tick_params(axis="y", length=0)
    ax.set_ylabel("device")
    ax.set_xlabel(f"time ({unit})")
    ax.grid(True, axis="x")
    ax.grid(False, axis="y")
    ax.set_title(title_for(timeline, title, colour), loc="left")
    return present


def _add_labels(ax, timeline, start, scale, chunks, px_per_unit, y_mid) -> None:
    char_px = 0.62 * LABEL_FONTSIZE * ax.figure.dpi / 72  # average glyph width
    texts = []
    for e in timeline.events:
        if not e.action.is_compute:
            continue
        width_px = (e.end - e.start) * scale * px_per_unit
        for text in _label_candidates(e, chunks):
            if len(text) * char_px + 4 <= width_px:
                x = ((e.start + e.end) / 2 - start) * scale
                texts.append((x, e.device + y_mid, text, e))
                break
    if len(texts) > MAX_LABELS:
        return
    for x, y, text, e in texts:
        fill = _fill(_category(e), e.action.microbatch)
        ax.text(
            x,
            y,
            text,
            ha="center",
            va="center",
            fontsize=LABEL_FONTSIZE,
            color=style.text_color_on(fill),
            zorder=4,
            clip_on=True,
        )


def _legend_handles(present: set[str], colour: str = "micro-batch") -> list[Patch]:
    handles = []
    for key, label, hatch in CATEGORIES:
        if key not in present:
            continue
        fill = _fill(key, None) if key != "F" else style.microbatch_color(None)
        hatchcolor = (1, 1, 1, 0.7) if style.is_dark(key) else (0, 0, 0, 0.4)
        handles.append(
            Patch(facecolor=fill, edgecolor="white", hatch=hatch, label=label)
            if key != "comm"
            else Patch(facecolor=fill, label=label)
        )
        handles[-1].set_hatchcolor(hatchcolor)
    if "bubble" in present:
        bubble = Patch(
            facecolor=style.BUBBLE_COLOR,
            hatch=style.BUBBLE_HATCH,
            # only a pipeline's idle time is a bubble (see title_for)
            label=style.BUBBLE_LABEL if colour == "micro-batch" else "idle",
        )
        bubble.set_hatchcolor(style.BUBBLE_HATCH_COLOR)
        handles.append(bubble)
    if "wait" in present:
        wait = Patch(facecolor=style.WAIT_COLOR, hatch=style.WAIT_HATCH, label=style.WAIT_LABEL)
        wait.set_hatchcolor(style.COMM_COLOR)
        handles.append(wait)
    return handles


def _new_figure(width: float, height: float, pyplot: bool) -> Figure:
    if pyplot:
        import matplotlib.pyplot as plt  # notebooks: shown once at the end of the cell

        return plt.figure(figsize=(width, height))
    return Figure(figsize=(width, height))  # explorer and CLI: no global pyplot state


def draw(
    timeline_or_list: Timeline | list[Timeline] | tuple[Timeline, ...],
    ax=None,
    title: str | list[str] | None = None,
    show_bubble: bool = True,
    labels: bool = True,
    legend: bool = True,
    width: float = style.FIGURE_WIDTH,
    share_x: bool | None = None,
    pyplot: bool = True,
    colour: str = "micro-batch",
) -> Figure:
    """Draw a timeline (or a list of them, stacked) as a Gantt chart; returns the Figure.

    `colour` says what a bar's colour stands for in the legend: "micro-batch" for pipelines,
    "step" for data-parallel timelines whose micro-batch number counts training steps,
    "expert" for expert-parallel ones (`course_utils.parallel.moe`), whose bars carry the
    expert id there. Only "micro-batch" puts m= in a default title.

    `title` replaces the schedule-name part of the title (makespan and bubble are always
    shown); for a list it may be a list of titles. `share_x=None` shares the time axis
    when all timelines use the same unit. `pyplot=False` makes a Figure outside pyplot
    (no global state, nothing auto-displayed), for the commands and for saving to files.
    """
    style.use_course_style()
    timelines = (
        list(timeline_or_list) if isinstance(timeline_or_list, list | tuple) else [timeline_or_list]
    )
    if not timelines or not all(isinstance(t, Timeline) for t in timelines):
        raise CourseInputError("timeline_or_list must be a Timeline or a non-empty list of them")
    titles = title if isinstance(title, list | tuple) else [title] * len(timelines)
    if len(titles) != len(timelines):
        raise CourseInputError(f"title must be one string or {len(timelines)} strings")
    if ax is not None and len(timelines) > 1:
        raise CourseInputError("ax can only be given for a single timeline, not a list")
    if share_x is None:
        share_x = len({t.unit for t in timelines}) == 1
    spans = [_stats(t)[1] * _time_unit(t)[0] for t in timelines]
    xmaxes = [max(spans) if share_x else s for s in spans]
    xmaxes = [1.005 * x if x > 0 else 1.0 for x in xmaxes]

    if ax is not None:  # draw into the caller's axes
        fig = ax.figure
        bbox = ax.get_window_extent()
        p = max(1, timelines[0].num_devices)
        present = _draw_one(
            ax,
            timelines[0],
            title=titles[0],
            show_bubble=show_bubble,
            labels=labels,
            xmax=xmaxes[0],
            px_per_unit=bbox.width / xmaxes[0],
            row_px=bbox.height / p,
            colour=colour,
        )
        if legend:
            ax.legend(
                handles=_legend_handles(present, colour), loc="upper left", bbox_to_anchor=(1, 1)
            )
        return fig

    plot_hs = [min(MAX_PLOT_H, max(MIN_PLOT_H, ROW_H * max(1, t.num_devices))) for t in timelines]
    note = clock_note(timelines)
    if note:  # about 14 characters of the small font per inch of axes
        note = textwrap.fill(note, width=int(14 * (width - LEFT - RIGHT)))
    lines = note.count("\n") + 1 if note else 0
    height = TOP_PAD + sum(TITLE_H + h for h in plot_hs) + XAXIS_H + (LEGEND_H if legend else 0)
    height += NOTE_H * lines
    if not share_x:
        height += XAXIS_H * (len(timelines) - 1)
    fig = _new_figure(width, height, pyplot)
    dpi = fig.dpi
    axes_w = width - LEFT - RIGHT
    present = set()
    top = height - TOP_PAD
    if note:  # what the clock measured and what it modelled, above the charts
        top -= NOTE_H * lines
        fig.text(LEFT / width, (top + 0.08) / height, note, fontsize=8, color="#555555")
    axes: list[Axes] = []
    for i, (t, h) in enumerate(zip(timelines, plot_hs, strict=True)):
        top -= TITLE_H
        rect = (LEFT / width, (top - h) / height, axes_w / width, h / height)
        shared = axes[0] if (share_x and axes) else None
        a = fig.add_axes(rect, sharex=shared)
        present |= _draw_one(
            a,
            t,
            title=titles[i],
            show_bubble=show_bubble,
            labels=labels,
            xmax=xmaxes[i],
            px_per_unit=axes_w * dpi / xmaxes[i],
            row_px=h * dpi / max(1, t.num_devices),
            colour=colour,
        )
        last = i == len(timelines) - 1
        if share_x and not last:
            a.tick_params(axis="x", labelbottom=False)
            a.set_xlabel("")
        top -= h + (0 if share_x or last else XAXIS_H)
        axes.append(a)
    if legend:
        handles = _legend_handles(present, colour)
        fig.legend(
            handles=handles,
            loc="lower left",
            bbox_to_anchor=(LEFT / width, 0.02 / height),
            ncol=len(handles) + 1,
            handlelength=1.6,
            columnspacing=1.2,
            title=f"colour = {colour}",
            alignment="left",
        )
    return fig


def beside_reference(
    mine: dict[str, Timeline], reference: dict[str, Timeline] | None = None, **kwargs
) -> Figure:
    """This machine's measured timelines, then the reference recording's, titled as such.

    `mine` maps a title ("naive", "GPipe") to a timeline; `reference` has the same keys
    (a recording's `timelines`) or is None when the course has no recording of them.
    """
    charts = [*mine.values()]
    titles = [f"This machine: {name}" for name in mine]
    if reference and all(name in reference for name in mine):
        charts += [reference[name] for name in mine]
        titles += [f"Reference: {name}" for name in mine]
    return draw(charts, title=titles, **kwargs)


def compare(simulated: Timeline, measured: Timeline, **kwargs) -> Figure:
    """Simulated above measured on one time axis.

    When the units differ (cost units vs seconds) the simulated timeline is converted to
    seconds with one calibration factor: total measured compute time / total simulated
    compute time. Where the bars then disagree, the cost model missed something real
    (communication, thread start-up, uneven stages).
    """
    if simulated.unit != measured.unit:
        sim_busy = sum(_stats(simulated)[2])
        real_busy = sum(_stats(measured)[2])
        if sim_busy <= 0 or real_busy <= 0:
            raise CourseInputError("compare needs compute events in both timelines")
        factor = real_busy / sim_busy
        scale, unit = _time_unit(measured)
        events = [replace(e, start=e.start * factor, end=e.end * factor) for e in simulated.events]
        name = schedule_label(simulated.name or "timeline")
        p, m, v = _shape(simulated)
        simulated = Timeline(
            events,
            simulated.num_devices,
            name=(
                f"{name}, p={p}, m={m}{f', v={v}' if v > 1 else ''} (simulated, "
                f"1 unit = {factor * scale:.3g} {unit})"
            ),
            source="simulated",
            unit=measured.unit,
            peak_activations=simulated.peak_activations,
            meta=dict(simulated.meta),
            stages=simulated.stages,
            microbatches=simulated.microbatches,
            chunks=simulated.chunks,
        )
    return draw([simulated, measured], share_x=True, **kwargs)


def save(fig: Figure, path: str | Path, dpi: float | None = None) -> Path:
    """Save as PNG, SVG or PDF (chosen by the file extension); creates missing folders."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("png", "svg", "pdf"):
        raise CourseInputError(f"output file must end in .png, .svg or .pdf, got {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format=fmt, dpi=dpi or fig.dpi, facecolor="white")
    return path
