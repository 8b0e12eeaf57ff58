"""The planner on screen: a memory and step-time chart of one layout, the widget with sliders
that lesson 12 uses (its text fallback prints the same numbers), lesson 07's layout explorer,
and a drawing of the cluster (nodes with an NVSwitch, NICs to the network)."""

from __future__ import annotations

import functools

from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import RECOMMENDED
from course_utils.plan.gpu_memory import MEMORY_KEYS
from course_utils.plan.inputs import (
    DEFAULT_GPU,
    GIB,
    HARDWARE_PRESETS,
    LOOPING,
    MICROBATCH_SIZES,
    MODEL_PRESETS,
    PLANNED_SCHEDULES,
    PRECISIONS,
    RECOMPUTE,
    SEARCH_CHUNKS,
    Config,
    Hardware,
    ModelShape,
)
from course_utils.plan.model import TIME_KEYS, Estimate, evaluate
from course_utils.plan.search import format_memory, format_time

MEMORY_PARTS = MEMORY_KEYS  # parameters, gradients, optimizer, activations, buffers
TIME_PARTS = TIME_KEYS  # compute, bubble, dp_comm, tp_comm, cp_comm, pp_comm, ep_comm
RESERVE_STYLE = {"facecolor": "white", "edgecolor": "#8c8c8c", "hatch": "///"}


def _memory_bar(ax, estimate: Estimate, hardware: Hardware) -> None:
    """Stacked memory parts, the reserve hatched at the top of the GPU, its memory dashed."""
    bottom = 0.0
    for part in MEMORY_PARTS:
        value = estimate.memory[part] / GIB
        ax.bar(["per GPU"], [value], bottom=bottom, label=part)
        bottom += value
    limit, usable = hardware.gpu_memory_gib, hardware.usable_gib
    ax.bar(["per GPU"], [hardware.reserve], bottom=usable, width=1.0, alpha=0.6,
           label=f"reserve {hardware.reserve:.1f} GiB", **RESERVE_STYLE)  # fmt: skip
    ax.axhline(limit, color="black", ls="--", label=f"GPU memory {limit:g} GiB")
    ax.set_ylim(0, max(bottom, limit) * 1.15)
    ax.set_ylabel("GiB")
    ax.set_title("Memory per GPU")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def draw_plan(estimate: Estimate, hardware: Hardware = Hardware(), title: str | None = None):
    """Two charts: stacked memory bar against the GPU's memory, and the step-time breakdown."""
    import matplotlib.pyplot as plt

    fig, (ax_mem, ax_time) = plt.subplots(1, 2, figsize=(10, 3.6))
    _memory_bar(ax_mem, estimate, hardware)
    left = 0.0
    for part in TIME_PARTS:
        value = estimate.time[part]
        ax_time.barh(["step"], [value], left=left, label=part)
        left += value
    ax_time.set_xlabel("seconds per step")
    mfu = estimate.utilisation.get("mfu")
    share = f", MFU {mfu:.0%}" if mfu is not None else ""
    ax_time.set_title(f"Step time {estimate.time['total']:.2f} s{share}")
    ax_time.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4)
    verdict = "fits" if estimate.fits else "does not fit"
    fig.suptitle(title or f"{estimate.config.short()}  ({verdict})", fontsize=10)
    fig.tight_layout()
    return fig


def describe(estimate: Estimate, hardware: Hardware = Hardware()) -> str:
    """The text fallback of the widget: memory and time breakdowns, utilisation, the verdict,
    and the hardware assumptions they rest on."""
    lines = [estimate.config.short(), "", format_memory(estimate.memory, hardware=hardware)]
    lines += ["", format_time(estimate.time)]
    if estimate.utilisation:
        u = estimate.utilisation
        lines += [
            f"MFU {u['mfu']:.1%} (the model's FLOPs), HFU {u['hfu']:.1%} (all FLOPs executed, "
            "recomputation included)"
        ]
    if estimate.reason:
        lines += ["", f"does not fit: {estimate.reason}"]
    lines += ["", "assumed: " + hardware.describe()]
    return "\n".join(lines)


def planner_widget(global_batch: int = 512, hardware: Hardware | None = None):
    """Sliders for model size, GPU type and count, and parallel degrees; a stacked memory
    bar and step time, with the same numbers as text under them. Where widgets are not
    rendered, the chart and text of the starting values show instead. `hardware` fixes the
    GPU (else a drop-down of the presets)."""
    import ipywidgets as widgets
    from IPython.display import display

    from course_utils.charts.display import picker
    from course_utils.charts.style import use_course_style

    use_course_style()

    style = {"description_width": "110px"}
    slider = widgets.SelectionSlider
    controls = {
        "size": widgets.Dropdown(options=list(MODEL_PRESETS), value="30B", description="model"),
        "gpu": widgets.Dropdown(
            options=list(HARDWARE_PRESETS) if hardware is None else ["as given"],
            value=DEFAULT_GPU if hardware is None else "as given",
            description="GPU",
        ),
        "gpus": slider(options=[8, 16, 32, 64, 128, 256, 512], value=8, description="GPUs"),
        "tp": slider(options=[1, 2, 4, 8], value=8, description="tensor (tp)"),
        "cp": slider(options=[1, 2, 4, 8], value=1, description="context (cp)"),
        "pp": slider(options=[1, 2, 4, 8, 16], value=1, description="pipeline (pp)"),
        "ep": slider(options=[1, 2, 4, 8], value=1, description="expert (ep)"),
        "b": slider(options=list(MICROBATCH_SIZES), value=1, description="micro-batch"),
        "schedule": widgets.Dropdown(
            options=list(PLANNED_SCHEDULES), value=RECOMMENDED, description="schedule"
        ),
        "zero": widgets.IntSlider(value=1, min=0, max=3, description="ZeRO stage"),
        "recompute": widgets.Dropdown(
            options=list(RECOMPUTE), value="selective", description="recompute"
        ),
        "precision": widgets.Dropdown(
            options=list(PRECISIONS), value="bf16-mixed", description="precision"
        ),
    }
    for w in controls.values():
        w.style = style

    @functools.lru_cache(maxsize=1)  # draw and words ask for the same setting in turn
    def current(size, gpu, gpus, tp, cp, pp, ep, b, schedule, zero, recompute, precision):
        hw = hardware if hardware is not None else HARDWARE_PRESETS[gpu]
        return hw, estimate_from_sliders(
            size, gpus, tp, pp, b, schedule, zero, recompute, precision, global_batch, hw,
            cp=cp, ep=ep,
        )  # fmt: skip

    def draw(**values):
        try:
            hw, estimate = current(**values)
        except CourseInputError:
            return None  # words() says why
        return draw_plan(estimate, hw)

    def words(**values) -> str:
        try:
            hw, estimate = current(**values)
        except CourseInputError as exc:
            return f"not a valid layout: {exc}"
        return describe(estimate, hw)

    column = list(controls.values())
    columns = widgets.HBox([widgets.VBox(column[:6]), widgets.VBox(column[6:])])
    shown = picker(controls, draw, words, box=columns)
    display(shown)
    return shown.widget


def estimate_from_sliders(
    size: str,
    gpus: int,
    tp: int,
    pp: int,
    microbatch_size: int,
    schedule: str,
    zero: int,
    recompute: str,
    precision: str,
    global_batch: int = 512,
    hardware: Hardware = Hardware(),
    *,
    cp: int = 1,
    ep: int = 1,
) -> Estimate:
    """The widget's arithmetic, callable without widgets (dp = gpus / (tp cp pp))."""
    if size not in MODEL_PRESETS:
        raise CourseInputError(f"size must be one of {', '.join(MODEL_PRESETS)}, got {size!r}")
    model = MODEL_PRESETS[size]
    if gpus % (tp * cp * pp):
        raise CourseInputError(f"tp x cp x pp = {tp * cp * pp} must divide gpus={gpus}")
    dp = gpus // (tp * cp * pp)
    if global_batch % (dp * microbatch_size):
        raise CourseInputError(
            f"dp x micro-batch size = {dp * microbatch_size} must divide the global batch "
            f"({global_batch})"
        )
    if ep > 1 and not model.is_moe:
        raise CourseInputError(f"ep={ep} needs a mixture-of-experts model: choose one with experts")
    m = global_batch // (dp * microbatch_size)
    chunks = SEARCH_CHUNKS if schedule in LOOPING and pp > 1 else 1
    config = Config(tp, pp, dp, microbatch_size, m, schedule, chunks, zero, recompute, tp > 1,
                    cp=cp, ep=ep)  # fmt: skip
    return evaluate(model, config, precision, hardware)


# --------------------------------------------------------------------------- lesson 07's layouts

LAYOUT_COLOURS = {"tensor": "#c44e52", "pipeline": "#4c72b0", "data": "#55a467"}
_TIME_KEY = {"tensor": "tp_comm", "pipeline": "pp_comm", "data": "dp_comm"}


def layout(
    model: ModelShape,
    gpus: int,
    tp: int,
    pp: int,
    global_batch: int,
    hardware: Hardware = Hardware(),
    **config,
) -> Estimate:
    """One layout of `gpus` GPUs: data parallelism takes what tp x pp leaves; one micro-batch
    per sequence of the replica's share of the batch. Other Config fields go in `config`."""
    if gpus % (tp * pp):
        raise CourseInputError(f"tp x pp = {tp * pp} does not divide {gpus} GPUs")
    dp = gpus // (tp * pp)
    if global_batch % dp:
        raise CourseInputError(f"dp = {dp} does not divide the global batch {global_batch}")
    chosen = Config(tp=tp, pp=pp, dp=dp, microbatches=global_batch // dp, **config)
    return evaluate(model, chosen, hardware=hardware)


def describe_layout(estimate: Estimate, hardware: Hardware = Hardware()) -> str:
    """One line: the degrees, memory and whether it fits, bytes sent, communication, step."""
    c, sent = estimate.config, estimate.traffic
    fits = "fits" if estimate.fits else "does NOT fit"
    comm = sum(estimate.time[key] for key in _TIME_KEY.values())
    return (
        f"tp={c.tp:<2} pp={c.pp:<2} dp={c.dp:<2} memory {estimate.memory['total'] / GIB:6.1f} GiB "
        f"({fits:12s}) sent: TP {sent['tensor'] / 1e9:6.1f} GB, PP {sent['pipeline'] / 1e9:5.2f} "
        f"GB, DP {sent['data'] / 1e9:5.1f} GB; comm {comm:6.2f} s, step "
        f"{estimate.time['total']:6.2f} s"
    )


def draw_layout(estimate: Estimate, hardware: Hardware = Hardware(), title: str = ""):
    """Memory per GPU against the GPU's, and communication time per step by kind (bytes on
    each bar): what lesson 07's layout explorer shows."""
    import matplotlib.pyplot as plt

    fig, (ax_mem, ax_com) = plt.subplots(1, 2, figsize=(10, 3.4))
    _memory_bar(ax_mem, estimate, hardware)
    kinds = list(_TIME_KEY)
    seconds = [estimate.time[_TIME_KEY[k]] for k in kinds]
    ax_com.barh(kinds, seconds, color=[LAYOUT_COLOURS[k] for k in kinds], label="seconds per step")
    for i, kind in enumerate(kinds):
        text = f" {estimate.traffic[kind] / 1e9:.1f} GB"
        ax_com.text(seconds[i], i, text, va="center", fontsize=9)
    overlap = "DP overlapped" if estimate.config.dp_overlap else "no overlap"
    ax_com.set_xlabel(f"communication time per step (s, {overlap})")
    ax_com.set_title("Communication per GPU (bytes sent on the bars)")
    ax_com.legend(fontsize=8, loc="lower right")
    fig.suptitle(title or estimate.config.short(), fontsize=10)
    fig.tight_layout()
    return fig


def layout_explorer(
    model: ModelShape,
    global_batch: int,
    name: str = "",
    gpus: tuple[int, ...] = (8, 16, 32, 64),
    per_node: tuple[int, ...] = (8, 4),
    degrees: tuple[int, ...] = (1, 2, 4, 8),
    start: tuple[int, int, int, int] = (32, 8, 4, 2),
    **config,
):
    """Drop-downs for the number of GPUs and GPUs per node, sliders for tp and pp: the
    memory and communication of that layout, drawn and described (where widgets are not
    rendered, the chart and text of the starting layout)."""
    import ipywidgets as widgets
    from IPython.display import display

    from course_utils.charts.display import picker
    from course_utils.charts.style import use_course_style

    use_course_style()

    @functools.lru_cache(maxsize=1)  # draw and words ask for the same layout in turn
    def estimate(gpus: int, per_node: int, tp: int, pp: int) -> tuple[Estimate, Hardware]:
        hardware = Hardware(gpus_per_node=per_node)
        return layout(model, gpus, tp, pp, global_batch, hardware, **config), hardware

    def draw(gpus: int, per_node: int, tp: int, pp: int):
        try:
            shown, hardware = estimate(gpus, per_node, tp, pp)
        except CourseInputError:
            return None  # words() says why
        title = f"{name} on {gpus} GPUs, nodes of {per_node}: {shown.config.short()}"
        return draw_layout(shown, hardware, title.strip())

    def words(gpus: int, per_node: int, tp: int, pp: int) -> str:
        try:
            shown, hardware = estimate(gpus, per_node, tp, pp)
        except CourseInputError as exc:
            return f"not a valid layout: {exc}"
        return describe_layout(shown, hardware)

    g, n, t, p = start
    controls = {
        "gpus": widgets.Dropdown(options=list(gpus), value=g, description="GPUs"),
        "per_node": widgets.Dropdown(options=list(per_node), value=n, description="GPUs / node"),
        "tp": widgets.SelectionSlider(options=list(degrees), value=t, description="tensor (tp)"),
        "pp": widgets.SelectionSlider(options=list(degrees), value=p, description="pipeline (pp)"),
    }
    explorer = picker(controls, draw, words, box=widgets.HBox(list(controls.values())))
    display(explorer)
    return explorer.widget


# --------------------------------------------------------------------------- the cluster


def draw_cluster(hardware: Hardware = Hardware(), nodes: int = 2, title: str | None = None):
    """Nodes as they are wired: inside each, every GPU has its own NVLink ports into an
    NVSwitch, so any two GPUs of a node talk at full speed at once (all-to-all, not a ring);
    each GPU also has its own network card (NIC) into the cluster's switch fabric."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= 4:
        raise CourseInputError(f"nodes must be an integer from 1 to 4, got {nodes!r}")
    per = hardware.gpus_per_node
    shown = min(per, 8)
    nvlink, network = "#2ca02c", "#d62728"
    width = 1.15 * shown + 0.6
    fig, ax = plt.subplots(figsize=(min(12, 1.2 + nodes * (width + 0.6)), 4.6))

    def box(x, y, w, h, text, color, size=8):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec="black"))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)

    for n in range(nodes):
        x0 = 0.3 + n * (width + 0.6)
        box(x0, 0.9, width, 3.0, "", "#f2f2f2")
        ax.text(x0 + 0.1, 3.78, f"node {n}: {per} GPUs", fontsize=9, weight="bold", va="top")
        switch_y = 3.05
        box(x0 + 0.3, switch_y, width - 0.6, 0.4, "NVSwitch", "#c7e9c0", 8)
        for g in range(shown):
            gx = x0 + 0.35 + 1.15 * g
            box(gx, 1.75, 0.85, 0.6, f"GPU\n{n * per + g}", "#aec7e8", 7)
            ax.plot([gx + 0.425, gx + 0.425], [2.35, switch_y], color=nvlink, lw=2.5)
            box(gx + 0.12, 1.05, 0.6, 0.35, "NIC", "#fdd0a2", 7)
            ax.plot([gx + 0.425, gx + 0.425], [1.4, 1.75], color="black", lw=1)
            ax.plot([gx + 0.425, gx + 0.425], [0.55, 1.05], color=network, lw=1.5)
    total = 0.3 + nodes * (width + 0.6) - 0.6
    box(0.3, 0.15, total, 0.4, "network switches (InfiniBand fabric)", "#fcbba1", 8)
    ax.plot([], [], color=nvlink, lw=2.5,
            label=f"NVLink into the NVSwitch: {hardware.intra_node_gbs:g} GB/s per GPU per "
            "direction, to any GPU of the node")  # fmt: skip
    ax.plot([], [], color=network, lw=1.5,
            label=f"one NIC per GPU: {hardware.inter_node_gbs:g} GB/s per direction between "
            "nodes")  # fmt: skip
    ax.set(xlim=(0, total + 0.6), ylim=(0, 4.0))
    ax.set_title(title or f"{nodes} nodes of {per} {hardware.name or 'GPUs'}: who is wired to whom")
    ax.axis("off")  # a diagram, not a plot
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=1, frameon=False, fontsize=8)
    fig.tight_layout()
    return fig
