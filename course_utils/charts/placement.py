"""Where the pieces live: pictures of how a model, or a batch, is shared out over devices.

- `layer_cuts`         pipeline (between layers) against tensor parallelism (inside layers)
- `looping_placement`  p*v stages dealt out like cards: stage s on device s mod p
- `stage_paths`        a micro-batch's path through the stages, at the height of each device
- `batch_shards`       data parallelism: a mini-batch cut into disjoint shards, one per worker

Diagrams, not measurements: each draws what its arguments say, in the course's colours.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from course_utils.charts.style import use_course_style
from course_utils.errors import CourseInputError

DEVICE_COLOURS = ["#4c72b0", "#dd8452", "#55a467", "#c44e52"]


def _cycle_colours() -> list[str]:
    return plt.rcParams["axes.prop_cycle"].by_key()["color"]


def layer_cuts(layers: int = 8, devices: int = 4) -> Figure:
    """The same model split over `devices` two ways: whole layers per device (pipeline) and a
    column block of every layer per device (tensor)."""
    if devices > len(DEVICE_COLOURS) or layers % devices:
        raise CourseInputError(
            f"devices must be at most {len(DEVICE_COLOURS)} and divide layers, "
            f"got {devices} devices for {layers} layers"
        )
    use_course_style()
    per_device = layers // devices
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, mode in zip(axes, ["pipeline", "tensor"], strict=True):
        for layer in range(layers):
            y = layers - 1 - layer
            if mode == "pipeline":  # whole consecutive layers per device
                colour = DEVICE_COLOURS[layer // per_device]
                ax.add_patch(Rectangle((0, y + 0.1), devices, 0.8, color=colour))
            else:  # every layer cut into column blocks, one per device
                for d in range(devices):
                    ax.add_patch(Rectangle((d, y + 0.1), 0.95, 0.8, color=DEVICE_COLOURS[d]))
            ax.text(-0.15, y + 0.5, f"layer {layer}", ha="right", va="center", fontsize=9)
        ax.set_xlim(-1.6, devices + 0.2)
        ax.set_ylim(-0.2, layers + 0.2)
        ax.set_xlabel("width of each layer (weight matrix columns)")
        ax.set_ylabel("depth (input at the top)")
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0].set_title(
        "Pipeline parallelism: cut between layers\n(activations flow device to device)"
    )
    axes[1].set_title("Tensor parallelism: cut inside every layer\n(an all-reduce in every layer)")
    handles = [Patch(color=DEVICE_COLOURS[d], label=f"device {d}") for d in range(devices)]
    fig.legend(handles=handles, loc="lower center", ncol=devices)
    fig.suptitle(f"Two ways to split one model over {devices} devices")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def looping_placement(p: int, v: int) -> Figure:
    """The model as p*v stages in a row, coloured by device, and each device's share below."""
    use_course_style()
    colors = _cycle_colours()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 4.2), height_ratios=[1, 1.6])
    for s in range(p * v):
        d = s % p
        top.add_patch(Rectangle((s, 0), 0.9, 1, color=colors[d]))
        top.text(s + 0.45, 0.5, f"stage {s}", ha="center", va="center", color="white")
        bottom.add_patch(Rectangle((s, p - 1 - d), 0.9, 0.8, color=colors[d]))
        bottom.text(s + 0.45, p - 0.6 - d, str(s), ha="center", va="center", color="white")
        if s + 1 < p * v:  # the hop to the next stage always changes device
            top.annotate("", (s + 1, 0.5), (s + 0.9, 0.5), arrowprops={"arrowstyle": "->"})
    top.set_xlim(0, p * v)
    top.set_ylim(0, 1)
    top.set_yticks([])
    top.set_xticks([])
    top.set_xlabel("the model, input to output")
    top.set_title(f"{p * v} stages on {p} devices: stage s lives on device s mod {p}")
    bottom.set_xlim(0, p * v)
    bottom.set_ylim(0, p + 0.1)
    bottom.set_yticks([p - 0.6 - d for d in range(p)], [f"device {d}" for d in range(p)])
    bottom.set_xticks(np.arange(p * v) + 0.45, [str(s) for s in range(p * v)])
    bottom.set_xlabel("stage index")
    bottom.set_ylabel("which device holds it")
    handles = [Rectangle((0, 0), 1, 1, color=colors[d]) for d in range(p)]
    bottom.legend(
        handles, [f"device {d}" for d in range(p)], loc="upper left", bbox_to_anchor=(1.01, 1)
    )
    fig.tight_layout()
    return fig


def stage_paths(placements: Mapping[str, Sequence[int]]) -> Figure:
    """One panel per placement (stage s on device placement[s]): the stages in model order
    along x, each at the height of its device, joined by a micro-batch's path."""
    use_course_style()
    colours = _cycle_colours()
    fig, axes = plt.subplots(1, len(placements), figsize=(11, 3.4), sharey=True, squeeze=False)
    for ax, (title, device_of) in zip(axes[0], placements.items(), strict=True):
        stages = range(len(device_of))
        ys = list(device_of)
        ax.plot(stages, ys, "-", color="#bbbbbb", zorder=1)
        for s in stages:
            ax.scatter(s, ys[s], s=260, color=colours[ys[s]], zorder=2)
            ax.text(s, ys[s], str(s), ha="center", va="center", color="white", fontsize=9, zorder=3)
        crossing = sum(ys[s] != ys[s + 1] for s in range(len(ys) - 1))
        ax.set_title(f"{title}: {crossing} of {len(ys) - 1} hops change device")
        ax.set_xlabel("stage (model order, input to loss)")
        ax.set_yticks(range(max(ys) + 1), [f"device {d}" for d in range(max(ys) + 1)])
    axes[0][0].invert_yaxis()  # shared: device 0 on top in every panel
    axes[0][0].set_ylabel("device")
    path = [plt.Line2D([], [], color="#bbbbbb", label="a micro-batch's path")]
    axes[0][-1].legend(handles=path, loc="lower right")
    fig.tight_layout()
    return fig


def batch_shards(sizes: Sequence[int]) -> Figure:
    """A mini-batch of sum(sizes) samples (one square each) cut into disjoint shards, shard r
    (sizes[r] samples) going to worker r, which holds a full replica of the model."""
    use_course_style()
    batch, workers = sum(sizes), len(sizes)
    colors = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]
    fig, ax = plt.subplots(figsize=(10, 3.6))
    owner = [r for r, n in enumerate(sizes) for _ in range(n)]
    for i, r in enumerate(owner):  # the mini-batch, one square per sample
        ax.add_patch(Rectangle((i * 0.75, 3.2), 0.65, 0.65, color=colors[r]))
    ax.text(-0.2, 3.5, f"mini-batch\nB = {batch}", ha="right", va="center")
    box_w = (batch * 0.75) / workers - 0.3
    for r, n in enumerate(sizes):
        x0 = r * (box_w + 0.3)
        ax.add_patch(Rectangle((x0, 0), box_w, 1.9, fill=False, lw=1.5))
        ax.text(x0 + box_w / 2, 1.55, f"worker {r}", ha="center", weight="bold")
        ax.text(x0 + box_w / 2, 1.1, "full model replica", ha="center", fontsize=9)
        for j in range(n):
            ax.add_patch(Rectangle((x0 + 0.2 + j * 0.55, 0.25), 0.45, 0.45, color=colors[r]))
        first = sum(sizes[:r])
        ax.add_patch(
            FancyArrowPatch(
                ((first + n / 2) * 0.75, 3.15),
                (x0 + box_w / 2, 2.0),
                arrowstyle="-|>",
                mutation_scale=12,
                color=colors[r],
            )
        )
    ax.set_xlim(-2.2, batch * 0.75 + 0.2)
    ax.set_ylim(-0.2, 4.1)
    ax.axis("off")
    ax.set_title(f"Data parallelism: B = {batch} samples split into {workers} disjoint shards")
    ax.legend(
        handles=[Rectangle((0, 0), 1, 1, color=colors[r]) for r in range(workers)],
        labels=[f"shard {r}: {n} samples" for r, n in enumerate(sizes)],
        loc="center left",
        bbox_to_anchor=(1.0, 0.3),
        fontsize=8,
    )
    return fig
