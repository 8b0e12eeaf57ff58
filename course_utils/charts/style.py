"""The course's plotting style: one call for consistent figures, and the shared colours.

Every chart in the course (Gantt charts, memory plans, loss curves) calls
`use_course_style()` once, so fonts, sizes and grids look the same in every notebook.
The colours live here too, so a micro-batch has the same colour in every chart and
forward / backward / weight-gradient / communication / bubble always look alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import matplotlib as mpl
from matplotlib.colors import to_rgb
from matplotlib.rcsetup import cycler

from course_utils.actions import INPUT_GRAD, KINDS, PIPELINE_KINDS, WEIGHT_GRAD

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

# A notebook cell is about 10 inches wide at dpi 100; taller figures scroll badly.
FIGURE_WIDTH = 10.0
DPI = 100

# Micro-batch colours: the 10 "tab10" hues then their 10 light partners ("tab20"
# odd entries). Micro-batch k always gets MICROBATCH_COLORS[k % 20], so the same
# micro-batch has the same colour across charts. 20 is more than the eye can tell
# apart anyway; labels inside the bars disambiguate when there is room.
MICROBATCH_COLORS: tuple[str, ...] = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#c7c7c7",
    "#dbdb8d",
    "#9edae5",
)

# How each kind of work is drawn. The micro-batch colour is the fill; the kind is
# told apart by shade and hatch, so colour stays free to mean "which micro-batch".
FORWARD_HATCH = ""  # forward: plain micro-batch colour
BACKWARD_HATCH = "////"  # full backward: darker shade, diagonal hatch
INPUT_GRAD_HATCH = "\\\\\\\\"  # input-gradient backward (zero-bubble "B"): other diagonal
WEIGHT_GRAD_HATCH = "...."  # weight-gradient backward (zero-bubble "W"): lighter, dotted
BACKWARD_DARKEN = 0.55  # backward colour = micro-batch colour x this (towards black)
WEIGHT_LIGHTEN = 0.45  # weight-grad colour = micro-batch colour mixed this much with white

COMM_COLOR = "#3a3a3a"  # communication: thin dark bars on their own lane
BUBBLE_COLOR = "#efefef"  # idle time: light grey background ...
BUBBLE_HATCH_COLOR = "#b8b8b8"  # ... with a grey cross-hatch
BUBBLE_HATCH = "xx"
WAIT_COLOR = "#e4e8ef"  # idle while the device's own communication runs ...
WAIT_HATCH = "--"  # ... drawn apart from the pipeline bubble
EDGE_COLOR = "white"  # thin white edges keep neighbouring bars apart
LEGEND_SWATCH = "#8a8fa0"  # neutral colour for legend entries (fill colour = micro-batch)


def microbatch_color(microbatch: int | None) -> tuple[float, float, float]:
    """The fill colour of `microbatch` (grey for whole-batch work such as all-reduce)."""
    if microbatch is None:
        return to_rgb(LEGEND_SWATCH)
    return to_rgb(MICROBATCH_COLORS[microbatch % len(MICROBATCH_COLORS)])


def darken(color, factor: float = BACKWARD_DARKEN) -> tuple[float, float, float]:
    """Scale a colour towards black (factor 1 keeps it, 0 is black)."""
    r, g, b = to_rgb(color)
    return (r * factor, g * factor, b * factor)


def lighten(color, amount: float = WEIGHT_LIGHTEN) -> tuple[float, float, float]:
    """Mix a colour with white (amount 0 keeps it, 1 is white)."""
    r, g, b = to_rgb(color)
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


def text_color_on(color) -> str:
    """Black or white, whichever reads better on `color` (perceived luminance)."""
    r, g, b = to_rgb(color)
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


COURSE_RC: dict[RcKeyType, Any] = {
    "figure.figsize": (FIGURE_WIDTH, 4.0),
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "figure.facecolor": "white",
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "axes.grid": True,
    "axes.grid.axis": "x",
    "grid.color": "#dddddd",
    "grid.linewidth": 0.6,
    "axes.axisbelow": True,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.prop_cycle": cycler(color=list(MICROBATCH_COLORS[:10])),
    "hatch.linewidth": 0.6,
    "svg.fonttype": "none",  # keep text as text in SVG files (smaller, searchable)
}


# Kinds of bar, in legend order: (category, legend label, hatch). Both renderers (gantt.py's
# matplotlib charts and raster.py's painted ones) draw these, with the same fills and labels.
CATEGORIES = (
    ("F", "forward (F)", FORWARD_HATCH),
    ("B", "backward (B)", BACKWARD_HATCH),
    ("I", "input-grad (I)", INPUT_GRAD_HATCH),
    ("W", "weight-grad (W)", WEIGHT_GRAD_HATCH),
    ("comm", "communication", ""),
)
BUBBLE_LABEL = "idle (bubble)"
WAIT_LABEL = "waiting for communication"


def category(kind: str) -> str:
    """The bar category of an action kind: F, B, I, W, or "comm" for every communication."""
    return kind if kind in PIPELINE_KINDS else "comm"


def is_dark(category: str) -> bool:
    """Bars of the kinds that make the input gradient (B, I) are darker (light hatching)."""
    return category in PIPELINE_KINDS and KINDS[category].produces == INPUT_GRAD


def fill(category: str, microbatch: int | None) -> tuple[float, float, float]:
    """A bar's fill: the micro-batch colour, darker for B and I, lighter for W."""
    base = microbatch_color(microbatch)
    if is_dark(category):
        return darken(base)
    if category in PIPELINE_KINDS and KINDS[category].produces == WEIGHT_GRAD:
        return lighten(base)
    if category == "comm":
        return to_rgb(COMM_COLOR)
    return base


def bar_labels(action, label: str | None, chunks: int) -> list[str]:
    """What a bar may say, longest first; a renderer shows the first that fits.

    An event's own label wins. With several chunks per device the stage number tells the
    chunk ("5F3"); otherwise the row already says the stage, so "F3", then just "3".
    """
    if label:
        return [label]
    mb = "" if action.microbatch is None else str(action.microbatch)
    short = f"{action.kind}{mb}"
    full = [str(action)] if chunks > 1 else []
    return full + [short] + ([mb] if mb else [])


def use_course_style() -> None:
    """Apply the course's matplotlib settings (safe to call many times)."""
    mpl.rcParams.update(COURSE_RC)
