"""Gantt charts painted pixel by pixel: the explorer's renderer, fast enough for a slider.

A matplotlib redraw of 2,000-8,000 bars takes a few hundred milliseconds; a slider must
answer in well under 100 ms (benchmarks/bench_explorer.py). So `paint(timeline, title)`
fills the bars with numpy (a colour table indexed per pixel column, hatch masks) and writes
the text with Pillow. It reads the same `Timeline` as `course_utils.charts.gantt` and takes
its categories, fills, hatch meanings and bar labels from `course_utils.charts.style`, so a
learner sees one visual language (tests/test_raster.py checks the two draw the same bars).
"""

from __future__ import annotations

import io
from functools import lru_cache

import numpy as np

from course_utils.actions import PIPELINE_KINDS
from course_utils.charts import style
from course_utils.timeline import Timeline

# Chart geometry in pixels.
WIDTH = 940
LEFT, RIGHT = 86, 18  # device labels on the left
TITLE_H, XAXIS_H, LEGEND_H = 34, 44, 34
PLOT_H_MAX = 340  # taller charts scroll badly in a notebook
COMM_H = 3  # communication: a thin dark bar at the bottom of the device's row
MAX_LABELS = 400  # beyond this many labels the chart is too dense to read them anyway


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
_KIND = {kind: i for i, kind in enumerate(PIPELINE_KINDS)}
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
            plain = np.array(_u8(style.fill(kind, k)), float)
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


def row_height(devices: int) -> int:
    return int(min(30, max(10, PLOT_H_MAX // max(devices, 1))))


def paint(timeline: Timeline, title: str, xlabel: str | None = None) -> bytes:
    """A PNG Gantt chart of `timeline`: rows = devices, bars = compute, thin bars = messages."""
    from PIL import Image, ImageDraw

    p = timeline.num_devices
    makespan = timeline.makespan or 1.0
    t0 = timeline.start
    seconds = timeline.unit == "s"  # measured: drawn in milliseconds
    row_h = row_height(p)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, row_h * p
    height = TITLE_H + plot_h + XAXIS_H + LEGEND_H
    canvas = np.full((height, WIDTH, 3), 255, np.uint8)
    scale = plot_w / makespan
    pad = 2 if row_h >= 14 else 1
    bar_h = row_h - 2 * pad
    table, masks = _colour_table(), _patterns(bar_h, plot_w)
    cols = np.arange(plot_w)
    rows_y = np.arange(bar_h)[:, None]
    labels: list[tuple[int, int, int, list[str], tuple]] = []
    present: set[str] = set()
    label_room = bar_h >= 12
    comm_colour = np.array(_u8(style.COMM_COLOR), np.uint8)
    for d, (actions, starts, ends) in enumerate(timeline.lanes()):
        compute = [i for i, a in enumerate(actions) if a.is_compute]
        top = TITLE_H + d * row_h + pad
        # Per pixel column: which colour (index into `table`) and which hatch pattern.
        colour = np.full(plot_w, _BUBBLE, np.int16)
        pattern = np.full(plot_w, _IDLE_PATTERN, np.int16)
        if compute:
            acts = [actions[i] for i in compute]
            # Lanes are in time order, so x0 is sorted.
            x0 = np.floor((np.asarray([starts[i] for i in compute]) - t0) * scale).astype(int)
            x1 = np.ceil((np.asarray([ends[i] for i in compute]) - t0) * scale).astype(int)
            x1 = np.maximum(x1, x0 + 1)
            kind_codes = np.array([_KIND[a.kind] for a in acts], np.int16)
            mbs = np.array([(a.microbatch or 0) % _NCOL for a in acts], np.int16)
            present.update(a.kind for a in acts)
            which = np.searchsorted(x0, cols, side="right") - 1
            covered = (which >= 0) & (cols < x1[np.maximum(which, 0)])
            which = np.maximum(which, 0)
            colour[covered] = _base_index(kind_codes, mbs)[which[covered]]
            wide = (x1 - x0) >= 8  # hatch only bars wide enough to show it
            # Pattern k+1 for kind code k (1 = forward = plain); 0 = too narrow to hatch.
            pattern[covered] = np.where(wide, kind_codes + 1, 0)[which[covered]]
        image = colour[None, :] + masks[pattern[None, :], rows_y, cols[None, :]]
        if compute:
            edges = x0[((x1 - x0) >= 4) & (x0 < plot_w)]  # white line where bars meet
            image[:, edges] = _WHITE
        canvas[top : top + bar_h, LEFT : LEFT + plot_w] = table[image]
        for i, a in enumerate(actions):
            if not a.is_compute:  # a message: a thin dark bar along the row's bottom
                present.add("comm")
                c0 = LEFT + int((starts[i] - t0) * scale)
                c1 = max(c0 + 1, LEFT + int(np.ceil((ends[i] - t0) * scale)))
                canvas[top + bar_h - COMM_H : top + bar_h, c0 : min(c1, LEFT + plot_w)] = (
                    comm_colour
                )
        if label_room and compute:
            for a, b, k in zip(x0, x1, compute, strict=True):
                if b - a >= 14:  # the narrowest label ("3") needs a few pixels more than this
                    fill = style.fill(style.category(actions[k].kind), actions[k].microbatch)
                    texts = style.bar_labels(actions[k], None, timeline.chunks)
                    labels.append((d, int(a), int(b), texts, fill))
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
    # x axis: ticks at round numbers (milliseconds for measured timelines).
    shown = 1000.0 if seconds else 1.0
    step = _nice_step(makespan * shown)
    y_axis = TITLE_H + plot_h
    tick = 0.0
    while tick <= makespan * shown + 1e-9:
        x = LEFT + int(round(tick / shown * scale))
        draw.line([(x, y_axis), (x, y_axis + 4)], fill=frame)
        draw.text((x, y_axis + 6), f"{tick:g}", fill=(40, 40, 40), font=small, anchor="mt")
        tick += step
    if xlabel is None:
        xlabel = "time (ms)" if seconds else f"time ({timeline.unit})"
    draw.text((LEFT + plot_w // 2, y_axis + 22), xlabel, fill=(20, 20, 20), font=body, anchor="mt")
    # Labels inside bars: the first candidate that fits (gantt.py's rule).
    if len(labels) <= MAX_LABELS:
        for d, left, right, texts, fill in labels:
            for text in texts:
                if right - left >= draw.textlength(text, font=small) + 4:
                    mid_y = TITLE_H + d * row_h + row_h // 2
                    ink = style.text_color_on(fill)
                    mid_x = LEFT + (left + right) / 2
                    draw.text((mid_x, mid_y), text, fill=ink, font=small, anchor="mm")
                    break
    _legend(draw, canvas.shape[0] - LEGEND_H + 8, present, body)
    # A chart has a few hundred colours at most: as a palette image, PNG encodes it three
    # times faster than as RGB (no per-row filtering) and the file is half the size.
    fast = Image.Quantize.FASTOCTREE
    palette_img = img.quantize(colors=256, method=fast, dither=Image.Dither.NONE)
    buf = io.BytesIO()
    palette_img.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _legend(draw, y: int, present: set[str], font) -> None:
    """The same entries, in the same order and words, as gantt.py's legend."""
    entries = [
        (key, label, _u8(style.fill(key, None)))
        for key, label, _hatch in style.CATEGORIES
        if key in present or key == "F"
    ]
    entries.append(("idle", style.BUBBLE_LABEL, _u8(style.BUBBLE_COLOR)))
    x = LEFT
    for kind, label, fill in entries:
        draw.rectangle([x, y, x + 18, y + 12], fill=fill, outline=(120, 120, 120))
        if kind == "idle":
            for k in range(0, 18, 6):
                draw.line([(x + k, y), (x + k + 6, y + 12)], fill=_u8(style.BUBBLE_HATCH_COLOR))
        elif style.is_dark(kind):
            for k in range(0, 18, 6):
                start, end = ((x + k, y + 12), (x + k + 6, y)) if kind == "B" else (
                    (x + k, y), (x + k + 6, y + 12))  # fmt: skip
                draw.line([start, end], fill=(220, 220, 220))
        draw.text((x + 24, y + 6), label, fill=(30, 30, 30), font=font, anchor="lm")
        x += 34 + int(draw.textlength(label, font=font))
    draw.text((x + 10, y + 6), "colour = micro-batch", fill=(90, 90, 90), font=font, anchor="lm")
