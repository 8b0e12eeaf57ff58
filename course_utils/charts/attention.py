"""Attention split over workers: the softmax of key blocks, and causal work per worker.

- `softmax_blocks`  each key block's own softmax, then rescaled to the softmax over all keys
- `causal_split`    which worker computes each (query, key) square of causal attention

Diagrams of lesson 09's mechanisms; each draws the numbers it is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from course_utils.charts.style import use_course_style


def softmax_blocks(
    own: Sequence[float],
    rescaled: Sequence[float],
    full: Sequence[float],
    weights: tuple[float, float],
) -> Figure:
    """Two key blocks (the first and second half of the keys): left, each block's own
    softmax; right, both rescaled by their `weights` against the softmax over all keys."""
    use_course_style()
    keys, half = len(own), len(own) // 2
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), sharey=True)
    colours = ["C0"] * half + ["C1"] * (keys - half)
    axes[0].bar(range(keys), own, color=colours)
    axes[0].set_title("Each block's own softmax (each sums to 1)")
    axes[1].bar(range(keys), rescaled, color=colours)
    axes[1].plot(range(keys), full, "k_", markersize=22, mew=2)
    axes[1].set_title(
        f"Rescaled by exp(lse_x - lse): weights {weights[0]:.2f} and {weights[1]:.2f}"
    )
    for ax in axes:
        ax.set_xlabel("key")
    axes[0].set_ylabel("attention weight")
    handles = [
        Rectangle((0, 0), 1, 1, color="C0", label=f"block a (keys 0-{half - 1})"),
        Rectangle((0, 0), 1, 1, color="C1", label=f"block b (keys {half}-{keys - 1})"),
        Line2D(
            [],
            [],
            color="k",
            marker="_",
            linestyle="",
            markersize=15,
            mew=2,
            label=f"softmax over all {keys}",
        ),  # fmt: skip
    ]
    axes[1].legend(handles=handles, loc="upper right")
    fig.tight_layout()
    return fig


def owners(chunks: Sequence[Sequence[int]]) -> np.ndarray:
    """`grid[q, k]`: the worker that computes query chunk q against key chunk k (causal: only
    k <= q; NaN elsewhere), given the chunks each worker holds."""
    owner_of_chunk = {c: w for w, held in enumerate(chunks) for c in held}
    n = len(owner_of_chunk)
    grid = np.full((n, n), np.nan)
    for qc in range(n):
        for kc in range(qc + 1):  # causal: key chunks up to the query's own
            grid[qc, kc] = owner_of_chunk[qc]
    return grid


def causal_split(splits: Mapping[str, tuple[Sequence[Sequence[int]], Sequence[int]]]) -> Figure:
    """One panel per split, `name -> (chunks held by each worker, work per worker)`: who
    computes each square of causal attention (white: masked, skipped)."""
    use_course_style()
    fig, axes = plt.subplots(1, len(splits), figsize=(10, 4.4), squeeze=False)
    workers = 0
    for ax, (name, (chunks, work)) in zip(axes[0], splits.items(), strict=True):
        grid = owners(chunks)
        workers = len(chunks)
        unit = "chunk" if len(grid) > workers else "block"
        ax.imshow(grid, cmap="tab10", vmin=0, vmax=9)
        ax.set_title(f"{name} split: {unit} products per worker {list(work)}")
        ax.set_xticks(range(len(grid)))
        ax.set_yticks(range(len(grid)))
        ax.set_xlabel(f"key {unit}")
        ax.set_ylabel(f"query {unit}")
    handles = [
        Rectangle((0, 0), 1, 1, color=plt.get_cmap("tab10")(w / 9), label=f"worker {w}")
        for w in range(workers)
    ]
    axes[0][-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle("Causal attention: which worker computes each square (white: masked, skipped)")
    fig.tight_layout()
    return fig
