"""A mixture of experts' routing, drawn: the router's choices and where the tokens travel.

- `router_choices`  router probabilities per token and expert (the top-1 choice boxed),
                    beside the number of tokens each expert receives
- `dispatch`        the dispatch all-to-all: assignments each worker sends to each worker
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from course_utils.charts.style import use_course_style


def router_choices(probs: np.ndarray, choice: Sequence[int]) -> Figure:
    """Left: `probs[token, expert]` with each token's `choice` boxed; right: tokens per expert."""
    use_course_style()
    experts = probs.shape[1]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 4), gridspec_kw={"width_ratios": [1.2, 1]})
    im = ax.imshow(probs, cmap="Blues", vmin=0, vmax=1, aspect="auto")
    for t, e in enumerate(choice):
        ax.add_patch(Rectangle((e - 0.5, t - 0.5), 1, 1, fill=False, edgecolor="crimson", lw=2))
    ax.set_xticks(range(experts))
    ax.set(xlabel="expert", ylabel="token", title="router probabilities p (box: the top-1 choice)")
    ax.grid(False)
    fig.colorbar(im, ax=ax, label="probability")
    counts = np.bincount(np.asarray(choice, dtype=int), minlength=experts)
    bx.bar(range(experts), counts, color="#4c72b0", label="tokens routed to the expert")
    bx.set_xticks(range(experts))
    bx.set(xlabel="expert", ylabel="tokens", title="tokens per expert (top-1)")
    bx.legend(loc="upper left")
    return fig


def dispatch(sent: np.ndarray, receivers: Sequence[str], title: str = "") -> Figure:
    """`sent[s, r]`: assignments worker s sends to worker r (the diagonal stays home)."""
    use_course_style()
    n = len(sent)
    fig, ax = plt.subplots(figsize=(4.8, 3.6))
    im = ax.imshow(sent, cmap="Oranges")
    for s in range(n):
        for r in range(n):
            note = "stays home" if s == r else "sent"
            ax.text(r, s, f"{sent[s, r]}\n{note}", ha="center", va="center", color="black")
    ax.set_xticks(range(n), list(receivers))
    ax.set_yticks(range(n), [f"worker {w}" for w in range(n)])
    ax.set(xlabel="receiver", ylabel="sender", title=title)
    ax.grid(False)
    fig.colorbar(im, ax=ax, label="assignments")
    return fig
