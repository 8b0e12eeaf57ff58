"""The schedule explorer: move a slider, watch the pipeline's Gantt chart and bubble change.

    from course_utils.explorer import show_explorer
    show_explorer("gpipe", stages=4, microbatches=8)

One update simulates the schedule and paints its chart. It must feel instant (under
100 ms for up to 16 devices and 64 micro-batches, see benchmarks/bench_explorer.py), and
a full matplotlib redraw of 2,000-8,000 bars takes a few hundred milliseconds, so the
explorer paints its chart itself: numpy fills the bars pixel by pixel, Pillow writes
the text and encodes the PNG. The colours and hatches are the course's (style.py), the
same as the static charts of gantt.py, so a learner sees one visual language.

Without a widget frontend (nbval, a plain notebook viewer, `print`), the explorer shows
its chart as a PNG and its numbers as text.
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from course_utils import style
from course_utils.errors import CourseInputError, ScheduleError

# The schedules the explorer offers, with the names a learner reads in the drop-down.
SCHEDULE_LABELS: dict[str, str] = {
    "naive": "naive (no micro-batches)",
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved": "interleaved 1F1B",
    "breadth-first": "breadth-first",
    "zb-h1": "zero bubble (ZB-H1)",
}
USES_CHUNKS = ("interleaved", "breadth-first")
MAX_STAGES, MAX_MICROBATCHES, MAX_CHUNKS = 16, 64, 4

# Chart geometry in pixels.
WIDTH = 940
LEFT, RIGHT = 86, 18  # device labels on the left
TITLE_H, XAXIS_H, LEGEND_H = 34, 44, 34
PLOT_H_MAX = 340  # taller charts scroll badly in a notebook


@dataclass(frozen=True)
class Settings:
    """What the explorer's controls say. Costs are per micro-batch on one device's share."""

    schedule: str = "gpipe"
    stages: int = 4
    microbatches: int = 8
    chunks: int = 2  # used by interleaved and breadth-first only
    backward_ratio: float = 2.0  # backward time / forward time
    comm_cost: float = 0.0  # point-to-point transfer time, in forward units

    def validated(self) -> Settings:
        """These settings, or a CourseInputError naming the first bad one."""
        if self.schedule not in SCHEDULE_LABELS:
            raise CourseInputError(
                f"schedule must be one of {', '.join(SCHEDULE_LABELS)}, not {self.schedule!r}"
            )
        for name, value, top in (
            ("stages", self.stages, MAX_STAGES),
            ("microbatches", self.microbatches, MAX_MICROBATCHES),
            ("chunks", self.chunks, MAX_CHUNKS),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise CourseInputError(
                    f"{name} must be a whole number from 1 to {top}, not {value!r}"
                )
        if not 0.25 <= self.backward_ratio <= 8:
            raise CourseInputError(
                f"backward_ratio must be between 0.25 and 8, not {self.backward_ratio!r}"
            )
        if not 0 <= self.comm_cost <= 10:
            raise CourseInputError(f"comm_cost must be between 0 and 10, not {self.comm_cost!r}")
        return self

    @property
    def effective_chunks(self) -> int:
        return self.chunks if self.schedule in USES_CHUNKS else 1


@dataclass
class View:
    """One state of the explorer: the numbers, the text a learner reads, and the chart."""

    settings: Settings
    makespan: float
    bubble_fraction: float
    formula: str | None  # the closed form that predicts this bubble, when one applies
    formula_value: float | None
    peak_activations: list[int]
    png: bytes = field(repr=False)

    @property
    def title(self) -> str:
        s = self.settings
        chunks = f", v={s.chunks}" if s.schedule in USES_CHUNKS else ""
        return (
            f"{SCHEDULE_LABELS[s.schedule]} · p={s.stages}, m={s.microbatches}{chunks} — "
            f"makespan {self.makespan:.1f} units, bubble {100 * self.bubble_fraction:.1f}%"
        )

    @property
    def text(self) -> str:
        """The metrics in one or two plain lines (the widget shows the same)."""
        v = self.settings.effective_chunks
        first, last = (self._held(self.peak_activations[i], v) for i in (0, -1))
        lines = [
            f"{SCHEDULE_LABELS[self.settings.schedule]}: bubble {100 * self.bubble_fraction:.1f}% "
            f"of devices x makespan; makespan {self.makespan:.1f} units; peak activations held "
            f"on device 0: {first}, on the last device: {last}"
        ]
        if self.formula:
            lines.append(f"closed form {self.formula} = {100 * self.formula_value:.1f}%")
        return "\n".join(lines)

    @staticmethod
    def _held(chunks_held: int, v: int) -> str:
        if v == 1:
            return f"{chunks_held} micro-batches"
        # Each chunk holds 1/v of a device's layers, so 1/v of a micro-batch's activations.
        return f"{chunks_held} chunks (= {chunks_held / v:g} micro-batches)"

    def html(self) -> str:
        text = html.escape(self.text).replace("\n", "<br>")
        bubble = f"bubble {100 * self.bubble_fraction:.1f}%"
        return text.replace(bubble, f"<b>{bubble}</b>", 1)


def closed_form(settings: Settings) -> tuple[str, float] | None:
    """The bubble formula the lessons derive, when it applies (equal stages, free transfers)."""
    s = settings
    if s.comm_cost > 0:
        return None  # the formulas assume free point-to-point transfers
    p, m, v = s.stages, s.microbatches, s.effective_chunks
    if s.schedule == "naive":
        return "(p-1)/p", (p - 1) / p
    if s.schedule in ("gpipe", "1f1b"):
        return "(p-1)/(m+p-1)", (p - 1) / (m + p - 1)
    if s.schedule in USES_CHUNKS and m >= p:
        return "(p-1)/(v·m+p-1)", (p - 1) / (v * m + p - 1)
    return None


@lru_cache(maxsize=32)
def _schedule(name: str, p: int, m: int, v: int):
    """Schedules are immutable values: moving a cost slider back and forth reuses them."""
    from course_utils.schedules import make_schedule

    if name in USES_CHUNKS:
        return make_schedule(name, p, m, chunks=v)
    return make_schedule(name, p, m)


def explorer_update(settings: Settings | None = None, **changes) -> View:
    """Simulate the schedule the settings describe and paint its chart.

    Raises CourseInputError for settings no schedule accepts (e.g. interleaved with m not
    a multiple of p); the widget shows that message instead of a chart.
    """
    from course_utils.simulate import CostModel, simulate_arrays

    s = replace(settings or Settings(), **changes).validated()
    try:
        schedule = _schedule(s.schedule, s.stages, s.microbatches, s.effective_chunks)
        result = simulate_arrays(
            schedule, CostModel(forward=1.0, backward=s.backward_ratio, p2p=s.comm_cost)
        )
    except ScheduleError as exc:  # cannot happen for the course's schedules; say so if it does
        raise CourseInputError(str(exc)) from exc
    form = closed_form(s)
    view = View(
        settings=s,
        makespan=result["makespan"],
        bubble_fraction=result["bubble_fraction"],
        formula=form[0] if form else None,
        formula_value=form[1] if form else None,
        peak_activations=list(result["peak_activations"]),
        png=b"",
    )
    view.png = paint(result, view.title, chunks=s.effective_chunks)
    return view


# ------------------------------------------------------------------------------ painting


@lru_cache(maxsize=4)
def _font(size: int):
    import matplotlib
    from PIL import ImageFont

    path = f"{matplotlib.get_data_path()}/fonts/ttf/DejaVuSans.ttf"  # ships with matplotlib
    return ImageFont.truetype(path, size)


def _u8(color) -> tuple[int, int, int]:
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(color)
    return (round(255 * r), round(255 * g), round(255 * b))


def _nice_step(span: float, target: int = 8) -> float:
    raw = span / target
    power = 10 ** np.floor(np.log10(raw)) if raw > 0 else 1.0
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= mult * power:
            return mult * power
    return 10 * power


_NCOL = len(style.MICROBATCH_COLORS)
_KIND = {"F": 0, "B": 1, "I": 2, "W": 3}
_WHITE, _BUBBLE = 0, 1  # colour-table indices; index + 1 is the hatched variant
_IDLE_PATTERN = 5  # index into _patterns()


def _base_index(kind_codes: np.ndarray, microbatches: np.ndarray) -> np.ndarray:
    return 3 + 2 * (kind_codes * _NCOL + microbatches)


@lru_cache(maxsize=1)
def _colour_table() -> np.ndarray:
    """All colours a chart uses, so painting is integer indexing: [white, bubble, bubble
    hatch, then for each kind F/B/I/W and micro-batch colour: plain, hatched]."""
    table = [(255, 255, 255), _u8(style.BUBBLE_COLOR), _u8(style.BUBBLE_HATCH_COLOR)]
    for kind in "FBIW":
        for k in range(_NCOL):
            base = style.microbatch_color(k)
            fill = {"F": base, "B": style.darken(base), "I": style.darken(base)}.get(
                kind, style.lighten(base)
            )
            plain = np.array(_u8(fill), float)
            tint = 255.0 if kind in "BI" else 0.0  # light stripes on dark, dark dots on light
            table += [tuple(plain), tuple(plain * 0.55 + tint * 0.45)]
    return np.array(table).round().astype(np.uint8)


@lru_cache(maxsize=8)
def _patterns(height: int, width: int) -> np.ndarray:
    """Hatch masks (0 or 1) indexed [pattern, y, x]: none, none, B, I, W, idle."""
    yy, xx = np.mgrid[0:height, 0:width]
    none = np.zeros((height, width), bool)
    return np.stack(
        [
            none,
            none,
            (xx + yy) % 7 == 0,  # backward: one diagonal
            (xx - yy) % 7 == 0,  # input-gradient backward: the other diagonal
            (xx % 4 == 0) & (yy % 4 == 0),  # weight-gradient backward: dots
            ((xx + yy) % 8 == 0) | ((xx - yy) % 8 == 0),  # idle: cross-hatch
        ]
    ).astype(np.int16)


def paint(result: dict, title: str, chunks: int = 1) -> bytes:
    """A PNG Gantt chart of `simulate_arrays` output: rows = devices, bars = actions."""
    from PIL import Image, ImageDraw

    actions, starts, ends = result["actions"], result["starts"], result["ends"]
    p = len(actions)
    makespan = result["makespan"] or 1.0
    t0 = min((s[0] for s in starts if s), default=0.0)
    row_h = int(min(30, max(10, PLOT_H_MAX // max(p, 1))))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, row_h * p
    height = TITLE_H + plot_h + XAXIS_H + LEGEND_H
    canvas = np.full((height, WIDTH, 3), 255, np.uint8)
    scale = plot_w / makespan
    pad = 2 if row_h >= 14 else 1
    bar_h = row_h - 2 * pad
    table, masks = _colour_table(), _patterns(bar_h, plot_w)
    cols = np.arange(plot_w)
    rows_y = np.arange(bar_h)[:, None]
    labels: list[tuple[int, int, int, str, str]] = []
    kinds_present: set[str] = set()
    label_room = bar_h >= 12
    for d in range(p):
        # Per pixel column: which colour (index into `table`) and which hatch pattern.
        colour = np.full(plot_w, _BUBBLE, np.int16)
        pattern = np.full(plot_w, _IDLE_PATTERN, np.int16)
        if actions[d]:
            # A device runs its actions in list order, so x0 is already sorted.
            x0 = np.floor((np.asarray(starts[d]) - t0) * scale).astype(int)
            x1 = np.maximum(np.ceil((np.asarray(ends[d]) - t0) * scale).astype(int), x0 + 1)
            acts = actions[d]
            kind_codes = np.array([_KIND[a.kind] for a in acts], np.int16)
            mbs = np.array([a.microbatch % _NCOL for a in acts], np.int16)
            kinds_present.update(a.kind for a in acts)
            which = np.searchsorted(x0, cols, side="right") - 1
            covered = (which >= 0) & (cols < x1[np.maximum(which, 0)])
            which = np.maximum(which, 0)
            colour[covered] = _base_index(kind_codes, mbs)[which[covered]]
            wide = (x1 - x0) >= 8  # hatch only bars wide enough to show it
            # Pattern k+1 for kind code k (1 = forward = plain); 0 = too narrow to hatch.
            pattern[covered] = np.where(wide, kind_codes + 1, 0)[which[covered]]
        image = colour[None, :] + masks[pattern[None, :], rows_y, cols[None, :]]
        if actions[d]:
            edges = x0[((x1 - x0) >= 4) & (x0 < plot_w)]  # white line where bars meet
            image[:, edges] = _WHITE
        top = TITLE_H + d * row_h + pad
        canvas[top : top + bar_h, LEFT : LEFT + plot_w] = table[image]
        if label_room and actions[d]:
            for a, b, act in zip(x0, x1, acts, strict=True):
                if b - a >= 18:  # the narrowest label ("F0") needs about 14 px
                    # "F3" is enough on a row when each device holds one stage; "5F3" otherwise.
                    text = str(act) if chunks > 1 else f"{act.kind}{act.microbatch}"
                    labels.append((d, int(a), int(b), text, act.kind))
    # Frame of the plot area.
    frame = (60, 60, 60)
    canvas[TITLE_H - 1, LEFT - 1 : LEFT + plot_w + 1] = frame
    canvas[TITLE_H + plot_h, LEFT - 1 : LEFT + plot_w + 1] = frame
    canvas[TITLE_H - 1 : TITLE_H + plot_h + 1, LEFT - 1] = frame
    canvas[TITLE_H - 1 : TITLE_H + plot_h + 1, LEFT + plot_w] = frame

    img = Image.fromarray(canvas)
    draw = ImageDraw.Draw(img)
    small, body, big = _font(10), _font(12), _font(14)
    draw.text((LEFT, 8), title, fill=(20, 20, 20), font=big)
    # y axis: one "device d" label per row (every other row when rows are short).
    every = 1 if row_h >= 13 else 2
    for d in range(0, p, every):
        y = TITLE_H + d * row_h + row_h // 2
        draw.text((LEFT - 6, y), f"device {d}", fill=(40, 40, 40), font=small, anchor="rm")
    # x axis: ticks at round numbers of units.
    step = _nice_step(makespan)
    y_axis = TITLE_H + plot_h
    tick = 0.0
    while tick <= makespan + 1e-9:
        x = LEFT + int(round(tick * scale))
        draw.line([(x, y_axis), (x, y_axis + 4)], fill=frame)
        value = f"{tick:g}"
        draw.text((x, y_axis + 6), value, fill=(40, 40, 40), font=small, anchor="mt")
        tick += step
    draw.text(
        (LEFT + plot_w // 2, y_axis + 22),
        "time (units: one micro-batch forward on one device's share = 1)",
        fill=(20, 20, 20),
        font=body,
        anchor="mt",
    )
    # Labels inside bars that are wide enough.
    if len(labels) <= 400:
        for d, a, b, text, kind in labels:
            w = draw.textlength(text, font=small)
            if b - a >= w + 4:
                mid_y = TITLE_H + d * row_h + row_h // 2
                color = (255, 255, 255) if kind in ("B", "I") else (20, 20, 20)
                draw.text((LEFT + (a + b) / 2, mid_y), text, fill=color, font=small, anchor="mm")
    _legend(draw, canvas.shape[0] - LEGEND_H + 8, kinds_present, body)
    # A chart has a few hundred colours at most: as a palette image, PNG encodes it three
    # times faster than as RGB (no per-row filtering) and the file is half the size.
    fast = Image.Quantize.FASTOCTREE
    palette_img = img.quantize(colors=256, method=fast, dither=Image.Dither.NONE)
    buf = io.BytesIO()
    palette_img.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _legend(draw, y: int, kinds: set[str], font) -> None:
    grey = style.LEGEND_SWATCH
    entries = [("F", "forward", _u8(grey))]
    if "B" in kinds:
        entries.append(("B", "backward", _u8(style.darken(grey))))
    if "I" in kinds:
        entries.append(("I", "input-grad backward (I)", _u8(style.darken(grey))))
    if "W" in kinds:
        entries.append(("W", "weight-grad backward (W)", _u8(style.lighten(grey))))
    entries.append(("idle", "idle (bubble)", _u8(style.BUBBLE_COLOR)))
    x = LEFT
    for kind, label, fill in entries:
        draw.rectangle([x, y, x + 18, y + 12], fill=fill, outline=(120, 120, 120))
        if kind == "idle":
            for k in range(0, 18, 6):
                draw.line([(x + k, y), (x + k + 6, y + 12)], fill=_u8(style.BUBBLE_HATCH_COLOR))
        elif kind in ("B", "I"):
            for k in range(0, 18, 6):
                draw.line([(x + k, y + 12), (x + k + 6, y)], fill=(220, 220, 220))
        draw.text((x + 24, y + 6), label, fill=(30, 30, 30), font=font, anchor="lm")
        x += 34 + int(draw.textlength(label, font=font))
    draw.text((x + 10, y + 6), "colour = micro-batch", fill=(90, 90, 90), font=font, anchor="lm")


# ------------------------------------------------------------------------------ the widget


class ScheduleExplorer:
    """The widget: a drop-down, five sliders, the chart and the metrics, kept in sync.

    Displayed in JupyterLab it is interactive; elsewhere it shows the PNG and the text.
    """

    def __init__(self, settings: Settings) -> None:
        import ipywidgets as widgets

        self.view = explorer_update(settings)
        s = self.view.settings
        wide = {"description_width": "150px"}
        layout = widgets.Layout(width="460px")
        self.schedule = widgets.Dropdown(
            options=[(label, key) for key, label in SCHEDULE_LABELS.items()],
            value=s.schedule,
            description="schedule",
            style=wide,
            layout=layout,
        )
        self.stages = widgets.IntSlider(
            s.stages, 1, MAX_STAGES, description="stages (devices) p", style=wide, layout=layout
        )
        self.microbatches = widgets.IntSlider(
            s.microbatches, 1, MAX_MICROBATCHES, description="micro-batches m", style=wide,
            layout=layout,
        )  # fmt: skip
        self.chunks = widgets.IntSlider(
            s.chunks, 1, MAX_CHUNKS, description="chunks per device v", style=wide, layout=layout
        )
        self.backward = widgets.FloatSlider(
            s.backward_ratio, min=0.5, max=4.0, step=0.25, description="backward / forward",
            style=wide, layout=layout,
        )  # fmt: skip
        self.comm = widgets.FloatSlider(
            s.comm_cost, min=0.0, max=2.0, step=0.05, description="transfer cost",
            style=wide, layout=layout,
        )  # fmt: skip
        self.chart = widgets.Image(value=self.view.png, format="png")
        self.metrics = widgets.HTML(self.view.html())
        for widget, name in (
            (self.schedule, "schedule"),
            (self.stages, "stages"),
            (self.microbatches, "microbatches"),
            (self.chunks, "chunks"),
            (self.backward, "backward"),
            (self.comm, "comm"),
            (self.chart, "chart"),
            (self.metrics, "metrics"),
        ):
            widget.add_class(f"explorer-{name}")
        self._sync_enabled()
        for control in self.controls:
            control.observe(self._on_change, names="value")
        self.ui = widgets.VBox(
            [
                widgets.HBox(
                    [
                        widgets.VBox([self.schedule, self.stages, self.microbatches]),
                        widgets.VBox([self.chunks, self.backward, self.comm]),
                    ]
                ),
                self.metrics,
                self.chart,
            ]
        )
        self.ui.add_class("schedule-explorer")

    @property
    def controls(self) -> tuple:
        return (
            self.schedule,
            self.stages,
            self.microbatches,
            self.chunks,
            self.backward,
            self.comm,
        )

    def settings(self) -> Settings:
        return Settings(
            schedule=self.schedule.value,
            stages=self.stages.value,
            microbatches=self.microbatches.value,
            chunks=self.chunks.value,
            backward_ratio=float(self.backward.value),
            comm_cost=float(self.comm.value),
        )

    def _sync_enabled(self) -> None:
        self.chunks.disabled = self.schedule.value not in USES_CHUNKS

    def _on_change(self, _change=None) -> None:
        self._sync_enabled()
        try:
            self.view = explorer_update(self.settings())
        except CourseInputError as exc:  # keep the last chart; say what to change
            self.metrics.value = f"<b>⚠ {html.escape(str(exc))}</b>"
            return
        self.chart.value = self.view.png
        self.metrics.value = self.view.html()

    def _repr_mimebundle_(self, **kwargs) -> dict:
        from course_utils.display import fallback_bundle

        return fallback_bundle(self.ui, self.view.text, self.view.png, **kwargs)

    def __repr__(self) -> str:
        return self.view.text


def schedule_explorer(
    schedule: str = "gpipe",
    stages: int = 4,
    microbatches: int = 8,
    chunks: int = 2,
    backward_ratio: float = 2.0,
    comm_cost: float = 0.0,
) -> ScheduleExplorer:
    """Build the explorer (display it, or use `show_explorer`)."""
    return ScheduleExplorer(
        Settings(schedule, stages, microbatches, chunks, backward_ratio, comm_cost).validated()
    )


def show_explorer(*args, **kwargs) -> ScheduleExplorer:
    """Build and display the explorer; the same arguments as `schedule_explorer`."""
    from IPython.display import display

    explorer = schedule_explorer(*args, **kwargs)
    display(explorer)
    return explorer
