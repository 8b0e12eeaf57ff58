"""The four collectives at a glance: who holds which piece before and after each.

- `collective_states`  before/after grids (rank x chunk) of all-reduce, reduce-scatter,
                       all-gather and all-to-all, each cell naming whose data it holds
- `collectives_primer` the eight grids drawn, with the bytes each worker sends

Worker r's data is a letter (A, B, C, ...), its chunk c a number: "B2" is chunk 2 of worker 1's
tensor, "Σ2" the sum of every worker's chunk 2, "" nothing.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from course_utils.charts.style import use_course_style
from course_utils.errors import CourseInputError

COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all")
# bytes each worker sends, as a share of S (one worker's whole tensor before, or the gathered
# tensor after, for all-gather), by a ring (all-reduce and its halves) or direct sends
SENDS = {
    "all-reduce": "2(N-1)/N",
    "reduce-scatter": "(N-1)/N",
    "all-gather": "(N-1)/N",
    "all-to-all": "(N-1)/N",
}


def collective_states(name: str, workers: int = 4) -> tuple[list[list[str]], list[list[str]]]:
    """(before, after): for each rank, what each of its `workers` chunks holds."""
    if name not in COLLECTIVES:
        raise CourseInputError(f"name must be one of {', '.join(COLLECTIVES)}, got {name!r}")
    if not isinstance(workers, int) or not 2 <= workers <= 8:
        raise CourseInputError(f"workers must be an integer from 2 to 8, got {workers!r}")
    n, who = workers, "ABCDEFGH"
    own = [[f"{who[r]}{c}" for c in range(n)] for r in range(n)]
    if name == "all-reduce":
        return own, [[f"Σ{c}" for c in range(n)] for _ in range(n)]
    if name == "reduce-scatter":
        return own, [[f"Σ{c}" if c == r else "" for c in range(n)] for r in range(n)]
    if name == "all-gather":
        mine = [[f"{who[r]}{c}" if c == r else "" for c in range(n)] for r in range(n)]
        return mine, [[f"{who[c]}{c}" for c in range(n)] for _ in range(n)]
    return own, [[f"{who[c]}{r}" for c in range(n)] for r in range(n)]  # all-to-all: transpose


def _grid(ax, cells: list[list[str]], title: str) -> None:
    n = len(cells)
    colours = plt.get_cmap("tab10")
    for r, row in enumerate(cells):
        for c, label in enumerate(row):
            face: str | tuple[float, ...]
            if not label:
                face = "white"
            elif label.startswith("Σ"):
                face = "#555555"
            else:
                face = colours("ABCDEFGH".index(label[0]))
            ax.add_patch(Rectangle((c, r), 1, 1, facecolor=face, edgecolor="black", lw=0.6))
            text_colour = "white" if label.startswith("Σ") else "black"
            ax.text(
                c + 0.5, r + 0.5, label, ha="center", va="center", fontsize=8, color=text_colour
            )
    ax.set_xlim(0, n)
    ax.set_ylim(n, 0)
    ax.set_aspect("equal")
    ax.grid(False)
    ax.set_xticks(np.arange(n) + 0.5, range(n), fontsize=7)
    ax.set_yticks(np.arange(n) + 0.5, range(n), fontsize=7)
    ax.set_title(title, fontsize=9)


def collectives_primer(workers: int = 4) -> Figure:
    """Before (top) and after (bottom) of the four collectives on `workers` workers."""
    use_course_style()
    fig, axes = plt.subplots(2, len(COLLECTIVES), figsize=(12, 6.8))
    for k, name in enumerate(COLLECTIVES):
        before, after = collective_states(name, workers)
        _grid(axes[0, k], before, f"{name}: before")
        _grid(axes[1, k], after, f"after (each sends {SENDS[name]} S)")
        axes[1, k].set_xlabel("chunk")
    axes[0, 0].set_ylabel("rank")
    axes[1, 0].set_ylabel("rank")
    fig.suptitle(
        f"The four collectives on {workers} workers: a letter is whose data, a number which "
        "chunk, Σ a sum over all workers"
    )
    fig.tight_layout()
    return fig
