"""How tensor parallelism cuts a matrix multiply, drawn as blocks of the matrices.

- `matmul_split`  Y = X A over 2 devices: A by columns (slices of Y) or by rows (partial sums)
- `megatron_mlp`  Megatron-LM's MLP, Y = GeLU(X A) B: A by columns, B by rows, one all-reduce

Diagrams, not measurements; device 0 and 1 have the course's first two device colours.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from course_utils.charts.placement import DEVICE_COLOURS
from course_utils.charts.style import use_course_style

GREY = "#9a9a9a"  # held by both devices (replicated)


def _block(ax: Axes, x, y, w, h, color, text="", alpha=1.0) -> None:
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="white", lw=2, alpha=alpha))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=10, color="white")


def _canvas(ax: Axes, width: float, height: float, xlabel: str, ylabel: str) -> None:
    """A drawing of `width` x `height` units (with a margin of 0.3), axes without ticks."""
    ax.set_xlim(-0.3, width + 0.3)
    ax.set_ylim(-0.3, height + 0.3)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def matmul_split() -> Figure:
    """Y = X A cut over 2 devices: by the columns of A (each device a slice of Y, no sum) and
    by its rows (each device a partial sum of the whole Y, added by an all-reduce)."""
    use_course_style()
    c0, c1 = DEVICE_COLOURS[:2]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    ax = axes[0]  # by columns: X (replicated) x [A1 | A2] = [Y1 | Y2]
    _block(ax, 0, 0, 2, 3, GREY, "X\n(both)")
    _block(ax, 3, 0.5, 1, 2, c0, "A₁")
    _block(ax, 4, 0.5, 1, 2, c1, "A₂")
    _block(ax, 6.5, 0, 1, 3, c0, "Y₁")
    _block(ax, 7.5, 0, 1, 3, c1, "Y₂")
    ax.text(2.5, 1.5, "×", fontsize=18, ha="center", va="center")
    ax.text(5.75, 1.5, "=", fontsize=18, ha="center", va="center")
    ax.set_title("Split A by columns: each device gets a slice of Y\n(no sum needed)")
    ax = axes[1]  # by rows: [X1 | X2] x [A1 ; A2] = X1 A1 + X2 A2
    _block(ax, 0, 0, 1, 3, c0, "X₁")
    _block(ax, 1, 0, 1, 3, c1, "X₂")
    _block(ax, 3, 1.5, 2, 1, c0, "A₁")
    _block(ax, 3, 0.5, 2, 1, c1, "A₂")
    _block(ax, 6.3, 0, 2, 3, c0, "X₁A₁", alpha=0.8)
    _block(ax, 9.0, 0, 2, 3, c1, "X₂A₂", alpha=0.8)
    ax.text(2.5, 1.5, "×", fontsize=18, ha="center", va="center")
    ax.text(5.65, 1.5, "=", fontsize=18, ha="center", va="center")
    ax.text(8.65, 1.5, "+", fontsize=18, ha="center", va="center")
    ax.set_title(
        "Split A by rows: each device gets a partial sum\nof the whole Y (an all-reduce adds them)"
    )
    for ax in axes:
        _canvas(ax, 11, 3, "features (columns)", "tokens (rows)")
        ax.set_aspect("equal")
    handles = [Patch(color=c, label=f"held by device {d}") for d, c in enumerate((c0, c1))]
    handles.append(Patch(color=GREY, label="held by both"))
    fig.legend(handles=handles, loc="lower center", ncol=3)
    fig.suptitle("Cutting Y = X A over 2 devices")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def megatron_mlp() -> Figure:
    """Megatron-LM's MLP on 2 devices: X copied (f), A by columns, GeLU on each slice, B by
    rows, and one all-reduce (g) that adds the two partial results into Y."""
    use_course_style()
    fig, ax = plt.subplots(figsize=(11, 3.6))
    _block(ax, 0, 1.0, 1.2, 2, GREY, "X")
    for i, y0 in enumerate([2.2, 0.0]):
        c = DEVICE_COLOURS[i]
        sub = "₁₂"[i]
        _block(ax, 2.2, y0, 1.4, 1.6, c, f"A{sub}\n(columns)")
        _block(ax, 4.4, y0, 1.4, 1.6, c, f"GeLU\nZ{sub}")
        _block(ax, 6.6, y0, 1.4, 1.6, c, f"B{sub}\n(rows)")
        _block(ax, 8.8, y0, 1.4, 1.6, c, f"Z{sub}B{sub}\npartial", alpha=0.8)
        for x0 in (1.2, 3.6, 5.8, 8.0):
            arrow = FancyArrowPatch(
                (x0, y0 + 0.8), (x0 + 0.6, y0 + 0.8), arrowstyle="->", mutation_scale=15
            )
            ax.add_patch(arrow)
    _block(ax, 11.6, 1.0, 1.2, 2, GREY, "Y")
    ax.add_patch(FancyArrowPatch((10.2, 3.0), (11.6, 2.2), arrowstyle="->", mutation_scale=15))
    ax.add_patch(FancyArrowPatch((10.2, 0.8), (11.6, 1.8), arrowstyle="->", mutation_scale=15))
    ax.text(10.9, 2.0, "all-reduce\n(g)", ha="center", va="center", fontsize=10, fontweight="bold")
    ax.text(1.7, 2.0, "copy\n(f)", ha="center", va="center", fontsize=10, fontweight="bold")
    _canvas(ax, 12.8, 3.8, "forward pass, left to right", "device 0 (top), device 1 (bottom)")
    ax.set_title(
        "Megatron MLP on 2 devices: Y = GeLU(X A) B with one all-reduce in the forward pass"
    )
    handles = [Patch(color=c, label=f"device {d}") for d, c in enumerate(DEVICE_COLOURS[:2])]
    handles.append(Patch(color=GREY, label="replicated on both"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
    return fig
