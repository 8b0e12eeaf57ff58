"""Who holds which piece during a collective: grids of workers against chunks or steps.

- `ring_allreduce_states`  a ring all-reduce step by step: how many workers' gradients each
                           chunk of each rank contains, and the messages of the step
- `kv_ring`                ring attention: which K/V block each worker holds at each step
- `all_to_all_layout`      Ulysses: which worker holds each (head, token slice) piece, before
                           and after the all-to-all

Diagrams of the course's own collectives; each draws the state it is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from course_utils.charts.style import use_course_style


def ring_allreduce_states(states: Sequence) -> Figure:
    """One panel per state of `ring_allreduce_steps` (the start, then each reduce-scatter and
    all-gather step): rank x chunk cells counting the workers summed in, arrows the messages."""
    use_course_style()
    n = len(states[0].contributors)
    fig, axes = plt.subplots(1, len(states), figsize=(13, 3.2), sharey=True)
    cmap = plt.get_cmap("Blues", n + 1)
    for ax, state in zip(axes, states, strict=True):
        counts = np.array([[len(c) for c in row] for row in state.contributors])
        ax.imshow(counts, cmap=cmap, vmin=0, vmax=n, aspect="equal")
        ax.grid(False)
        for r in range(n):
            for c in range(n):
                colour = "white" if counts[r, c] == n else "black"
                ax.text(c, r, counts[r, c], ha="center", va="center", color=colour, fontsize=9)
        for src, dst, chunk in state.transfers:  # one arrow per message: src row -> dst row
            arrow = {"arrowstyle": "->", "color": "crimson", "lw": 1.2,
                     "connectionstyle": "arc3,rad=0.3"}  # fmt: skip
            ax.annotate("", xy=(chunk + 0.3, dst), xytext=(chunk + 0.3, src), arrowprops=arrow)
        name = "start" if state.phase == "start" else f"{state.phase}\nstep {state.step}"
        ax.set_title(name, fontsize=9)
        ax.set_xticks(range(n))
        ax.set_xlabel("chunk")
    axes[0].set_yticks(range(n))
    axes[0].set_ylabel("rank")
    fig.suptitle(f"Ring all-reduce, N = {n}: how many workers' gradients each chunk contains")
    fig.legend(
        handles=[Rectangle((0, 0), 1, 1, color=cmap(k)) for k in (1, n)]
        + [FancyArrowPatch((0, 0), (1, 0), color="crimson")],
        labels=["1 = own gradient only", f"{n} = fully summed", "message to the right neighbour"],
        loc="lower center",
        ncol=3,
        fontsize=8,
    )
    fig.subplots_adjust(bottom=0.2, top=0.8)
    return fig


def kv_ring(held: np.ndarray) -> Figure:
    """`held[w, step]`: the worker whose K/V block worker w holds at that step of the ring."""
    use_course_style()
    workers, steps = held.shape
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.imshow(held, cmap="tab10", vmin=0, vmax=9)
    for w in range(workers):
        for step in range(steps):
            ax.text(step, w, f"kv{held[w, step]}", ha="center", va="center", color="white")
    ax.set_xticks(range(steps), [f"step {k}" for k in range(steps)])
    ax.set_yticks(range(workers), [f"worker {w}" for w in range(workers)])
    ax.set_xlabel("ring step (between steps every block moves one worker down, w -> w+1)")
    ax.set_title(f"Which K/V block each worker holds: owner (w - step) mod {workers}")
    handles = [
        Rectangle((0, 0), 1, 1, color=plt.get_cmap("tab10")(o / 9), label=f"worker {o}'s block")
        for o in range(workers)
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1))
    return fig


def all_to_all_layout(layouts: Mapping[str, np.ndarray]) -> Figure:
    """One panel per layout: `grid[head, token slice]` is the worker holding that piece."""
    use_course_style()
    fig, axes = plt.subplots(1, len(layouts), figsize=(10, 3.4), sharey=True, squeeze=False)
    for ax, (title, grid) in zip(axes[0], layouts.items(), strict=True):
        heads, slices = grid.shape
        ax.imshow(grid, cmap="tab10", vmin=0, vmax=9)
        for h in range(heads):
            for s in range(slices):
                ax.text(s, h, f"w{grid[h, s]}", ha="center", va="center", color="white")
        ax.set_xticks(range(slices), [f"tokens {s}" for s in range(slices)])
        ax.set_title(title)
    heads = next(iter(layouts.values())).shape[0]
    axes[0][0].set_yticks(range(heads), [f"head {h}" for h in range(heads)])
    return fig
