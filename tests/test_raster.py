"""One timeline, one look: the painted charts (raster.py) draw the bars gantt.py draws.

For every compute event both renderers put a bar on the same device row, over the same
time span, filled with the same colour (the micro-batch's, shaded by kind); idle time is the
bubble colour in both, and messages are thin dark bars on the device's row.
"""

from __future__ import annotations

import io
from collections import Counter

import matplotlib
import numpy as np
import pytest
from PIL import Image

matplotlib.use("Agg")

from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

from course_utils.charts import gantt, style  # noqa: E402
from course_utils.charts.raster import LEFT, RIGHT, TITLE_H, WIDTH, paint, row_height  # noqa: E402
from course_utils.parallel.timelines import dp_pp_timeline  # noqa: E402
from course_utils.pipeline import CostModel, make_schedule, simulate  # noqa: E402

PLOT_W = WIDTH - LEFT - RIGHT


def u8(color) -> np.ndarray:
    return np.array([round(255 * c) for c in to_rgb(color)])


def painted(timeline) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(paint(timeline, "t"))).convert("RGB")).astype(int)


def dominant(img: np.ndarray, x0: int, x1: int, y0: int, y1: int) -> np.ndarray:
    """The most common colour in a box (hatch lines are a minority of a bar's pixels)."""
    box = img[y0:y1, x0:x1].reshape(-1, 3)
    colour, _ = Counter(map(tuple, box)).most_common(1)[0]
    return np.array(colour)


def gantt_bars(timeline) -> dict:
    """(device, start, end) -> fill of every compute bar matplotlib drew."""
    fig = gantt.draw(timeline, pyplot=False, labels=False)
    out = {}
    for coll in fig.axes[0].collections:
        if not isinstance(coll, PolyCollection):
            continue
        fills = coll.get_facecolors()
        for i, path in enumerate(coll.get_paths()):
            xs, ys = path.vertices[:, 0], path.vertices[:, 1]
            device = round(float(ys.mean()))
            fill = tuple(round(255 * c) for c in fills[i if len(fills) > 1 else 0][:3])
            out.setdefault((device, round(xs.min(), 6), round(xs.max(), 6)), set()).add(fill)
    return out


@pytest.mark.parametrize(
    "name, p, m, v",
    [("gpipe", 3, 4, 1), ("zb-h1", 3, 4, 1), ("interleaved", 2, 4, 2), ("breadth-first", 2, 3, 2)],
)
def test_both_renderers_draw_the_same_bars(name, p, m, v):
    timeline = simulate(make_schedule(name, p, m, v), CostModel(forward=1.0, backward=2.0))
    img = painted(timeline)
    drawn = gantt_bars(timeline)
    scale = PLOT_W / timeline.makespan
    row = row_height(p)
    for e in timeline.events:
        fill = u8(style.fill(style.category(e.action.kind), e.action.microbatch))
        # matplotlib: a bar on the event's row, over its span, in that fill
        assert tuple(fill) in drawn[(e.device, round(e.start, 6), round(e.end, 6))]
        # painted: the middle of the same span on the same row has that fill
        x0 = LEFT + int(np.ceil((e.start - timeline.start) * scale)) + 2
        x1 = LEFT + int((e.end - timeline.start) * scale) - 2
        y0 = TITLE_H + e.device * row + 4
        got = dominant(img, x0, x1, y0, y0 + row - 8)
        assert np.abs(got - fill).max() <= 3, (str(e.action), got, fill)


def test_idle_time_is_the_bubble_in_both():
    timeline = simulate(make_schedule("gpipe", 3, 2))
    img = painted(timeline)
    # device 2 idles until micro-batch 0 reaches it (2 forward units)
    scale = PLOT_W / timeline.makespan
    y0 = TITLE_H + 2 * row_height(3) + 4
    got = dominant(img, LEFT + 2, LEFT + int(2 * scale) - 2, y0, y0 + 8)
    assert np.abs(got - u8(style.BUBBLE_COLOR)).max() <= 3
    fig = gantt.draw(timeline, pyplot=False)
    bubble = {tuple(round(255 * c) for c in f[:3]) for coll in fig.axes[0].collections
              for f in coll.get_facecolors()}  # fmt: skip
    assert tuple(u8(style.BUBBLE_COLOR)) in bubble


def test_messages_are_thin_dark_bars_on_their_row():
    timeline = dp_pp_timeline("1f1b", 2, 4, 1, dp_workers=2, grad_bytes_per_stage=4.0)
    img = painted(timeline)
    scale = PLOT_W / timeline.makespan
    row = row_height(2)
    for e in timeline.events:
        if e.action.is_compute:
            continue
        x = LEFT + int(((e.start + e.end) / 2 - timeline.start) * scale)
        pad = 2 if row >= 14 else 1
        bottom = TITLE_H + e.device * row + row - pad - 1
        assert np.abs(img[bottom, x] - u8(style.COMM_COLOR)).max() <= 3


def test_measured_timelines_get_a_millisecond_axis():
    timeline = simulate(make_schedule("1f1b", 2, 2))
    units = painted(timeline)
    timeline.unit = "s"  # the same bars, read as seconds: ticks and label in ms
    seconds = painted(timeline)
    plot_bottom = TITLE_H + 2 * row_height(2)
    assert np.abs(units[:plot_bottom] - seconds[:plot_bottom]).max() <= 3  # same bars (palette)
    assert np.abs(units[plot_bottom:] - seconds[plot_bottom:]).max() > 100  # another axis
