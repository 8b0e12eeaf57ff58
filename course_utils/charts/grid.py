"""Who talks to whom on a tp x pp x dp grid of GPUs, and which node each GPU is in.

`rank_grid` draws every GPU as a box (column = pipeline stage, row = replica and tensor
rank, ranks numbered tensor-innermost as Megatron-LM does), tinted by its node, and joins
the members of each communication group: the tensor-parallel pairs, the pipeline's hops
from stage to stage and the data-parallel replicas.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, Rectangle

from course_utils.charts.style import use_course_style

NODE_TINTS = ["#dbe6f4", "#f7dfcc", "#d9eedc", "#f2d5d6"]
TENSOR, PIPELINE, DATA = "#c44e52", "#4c72b0", "#55a467"


def rank_grid(
    tp: int,
    pp: int,
    per_node: int,
    tensor: Sequence[Sequence[int]],
    pipeline: Sequence[Sequence[int]],
    data: Sequence[Sequence[int]],
) -> Figure:
    """The GPUs of a tp x pp x dp grid (dp = the size of a data group) and their groups:
    tensor pairs as thick red bars, pipeline hops as blue arrows, data groups dashed green."""
    use_course_style()
    dp = len(data[0])

    def position(r: int) -> tuple[float, float]:  # column = stage, row = (replica, tensor rank)
        t, s, d = r % tp, (r // tp) % pp, r // (tp * pp)
        return 2.2 * s, -(1.2 * (tp * d + t) + 0.6 * d)

    fig, ax = plt.subplots(figsize=(10, 5.2))
    for r in range(tp * pp * dp):
        x, y = position(r)
        node = r // per_node
        tint = NODE_TINTS[node % len(NODE_TINTS)]
        ax.add_patch(Rectangle((x, y), 1.4, 0.8, facecolor=tint, edgecolor="black"))
        ax.text(x + 0.7, y + 0.4, f"GPU {r}\nnode {node}", ha="center", va="center", fontsize=9)
    for group in tensor:  # vertical neighbours
        (x0, y0), (x1, y1) = position(group[0]), position(group[-1])
        ax.plot([x0 + 1.45, x1 + 1.45], [y0 + 0.4, y1 + 0.4], color=TENSOR, lw=4)
    for group in pipeline:  # left to right
        for a, c in zip(group[:-1], group[1:], strict=True):
            (x0, y0), (x1, y1) = position(a), position(c)
            hop = FancyArrowPatch(
                (x0 + 1.4, y0 + 0.55), (x1, y1 + 0.55), arrowstyle="->", color=PIPELINE,
                mutation_scale=14, lw=1.5,
            )  # fmt: skip
            ax.add_patch(hop)
    for group in data:  # between the replicas, drawn left of the boxes
        (x0, y0), (x1, y1) = position(group[0]), position(group[-1])
        xl = x0 - 0.08 - 0.14 * (group[0] % tp)
        ax.plot([x0, xl, xl, x1], [y0 + 0.4, y0 + 0.4, y1 + 0.4, y1 + 0.4], color=DATA, lw=1.5,
                ls="--")  # fmt: skip
    ax.set_xlim(-0.5, 2.2 * pp)
    ax.set_ylim(-1.2 * (tp * dp - 1) - 0.6 * (dp - 1) - 0.2, 1.0)
    ax.set_xticks([2.2 * s + 0.7 for s in range(pp)], [f"stage {s}" for s in range(pp)])
    ax.set_yticks([])
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel(", ".join(f"replica {d}" for d in range(dp)) + " (top to bottom)")
    ax.set_title(
        f"{tp * pp * dp} GPUs as tp={tp} x pp={pp} x dp={dp} (nodes of {per_node} GPUs): "
        "who talks to whom"
    )
    handles = [
        Line2D([], [], color=TENSOR, lw=4, label="tensor parallel: all-reduce every layer"),
        Line2D([], [], color=PIPELINE, marker=">", label="pipeline: send activations / gradients"),
        Line2D([], [], color=DATA, ls="--", label="data parallel: all-reduce gradients per step"),
    ]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    return fig
