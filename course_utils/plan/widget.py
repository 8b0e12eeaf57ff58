"""The planner on screen: a memory and step-time chart of one layout, and the widget with
sliders that lesson 12 uses (its text fallback prints the same numbers)."""

from __future__ import annotations

from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import RECOMMENDED
from course_utils.plan.inputs import (
    GIB,
    LOOPING,
    MICROBATCH_SIZES,
    MODEL_PRESETS,
    PRECISIONS,
    RECOMPUTE,
    SCHEDULES,
    SEARCH_CHUNKS,
    Config,
    Hardware,
    ModelShape,
)
from course_utils.plan.model import Estimate, evaluate
from course_utils.plan.search import format_memory, format_time

MEMORY_PARTS = ("parameters", "gradients", "optimizer", "activations")
TIME_PARTS = ("compute", "bubble", "dp_comm", "tp_comm", "pp_comm")


def draw_plan(estimate: Estimate, hardware: Hardware = Hardware(), title: str | None = None):
    """Two charts: stacked memory bar against the GPU's memory, and the step-time breakdown."""
    import matplotlib.pyplot as plt

    fig, (ax_mem, ax_time) = plt.subplots(1, 2, figsize=(10, 3.6))
    bottom = 0.0
    for part in MEMORY_PARTS:
        value = estimate.memory[part] / GIB
        ax_mem.bar(["per GPU"], [value], bottom=bottom, label=part)
        bottom += value
    ax_mem.axhline(hardware.gpu_memory_gib, color="black", ls="--", label="GPU memory")
    ax_mem.set_ylabel("GiB")
    ax_mem.set_title("Memory per GPU")
    ax_mem.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax_mem.set_ylim(0, max(bottom, hardware.gpu_memory_gib) * 1.15)

    left = 0.0
    for part in TIME_PARTS:
        value = estimate.time[part]
        ax_time.barh(["step"], [value], left=left, label=part)
        left += value
    ax_time.set_xlabel("seconds per step")
    ax_time.set_title(f"Step time {estimate.time['total']:.2f} s")
    ax_time.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=5)
    verdict = "fits" if estimate.fits else "does not fit"
    fig.suptitle(title or f"{estimate.config.short()}  ({verdict})", fontsize=10)
    fig.tight_layout()
    return fig


def describe(estimate: Estimate, hardware: Hardware = Hardware()) -> str:
    """The text fallback of the widget: memory and time breakdowns, and the verdict."""
    lines = [estimate.config.short(), "", format_memory(estimate.memory, hardware.gpu_memory_gib)]
    lines += ["", format_time(estimate.time)]
    if estimate.reason:
        lines += ["", f"does not fit: {estimate.reason}"]
    return "\n".join(lines)


def planner_widget(global_batch: int = 512, hardware: Hardware = Hardware()):
    """Sliders for model size, GPUs and parallel degrees; a stacked memory bar and step time.

    Prints the same numbers as text, so the notebook reads well without a widget frontend.
    """
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    from course_utils.charts.display import WithFallback
    from course_utils.charts.style import use_course_style

    use_course_style()

    style = {"description_width": "110px"}
    size = widgets.SelectionSlider(
        options=list(MODEL_PRESETS), value="30B", description="model", style=style
    )
    gpus = widgets.SelectionSlider(
        options=[8, 16, 32, 64, 128, 256, 512], value=8, description="GPUs", style=style
    )
    tp = widgets.SelectionSlider(options=[1, 2, 4, 8], value=8, description="tensor (tp)")
    pp = widgets.SelectionSlider(options=[1, 2, 4, 8, 16], value=1, description="pipeline (pp)")
    b = widgets.SelectionSlider(options=list(MICROBATCH_SIZES), value=1, description="micro-batch")
    schedule = widgets.Dropdown(options=list(SCHEDULES), value=RECOMMENDED, description="schedule")
    zero = widgets.IntSlider(value=1, min=0, max=3, description="ZeRO stage")
    recompute = widgets.Dropdown(
        options=list(RECOMPUTE), value="selective", description="recompute"
    )
    precision = widgets.Dropdown(
        options=list(PRECISIONS), value="bf16-mixed", description="precision"
    )
    for w in (tp, pp, b, schedule, zero, recompute, precision):
        w.style = style
    out = widgets.Output()

    def update(*_) -> None:
        with out:
            out.clear_output(wait=True)
            try:
                estimate = estimate_from_sliders(
                    size.value, gpus.value, tp.value, pp.value, b.value, schedule.value,
                    zero.value, recompute.value, precision.value, global_batch, hardware,
                )  # fmt: skip
            except CourseInputError as exc:
                print(f"not a valid layout: {exc}")
                return
            fig = draw_plan(estimate, hardware)
            plt.show(fig)
            print(describe(estimate, hardware))

    controls = (size, gpus, tp, pp, b, schedule, zero, recompute, precision)
    for w in controls:
        w.observe(update, names="value")
    ui = widgets.VBox([widgets.HBox([widgets.VBox(controls[:5]), widgets.VBox(controls[5:])]), out])
    display(WithFallback(ui, _planner_fallback_text(controls, global_batch, hardware)))
    update()
    return ui


def _planner_fallback_text(controls, global_batch: int, hardware: Hardware) -> str:
    """What the planner widget shows at its starting values, as text."""
    try:
        size, gpus, tp, pp, b, schedule, zero, recompute, precision = (c.value for c in controls)
        estimate = estimate_from_sliders(
            size, gpus, tp, pp, b, schedule, zero, recompute, precision, global_batch, hardware
        )
    except CourseInputError as exc:
        return f"Planner (widgets not shown here): not a valid layout: {exc}"
    return "Planner at its starting values (widgets not shown here):\n" + describe(
        estimate, hardware
    )


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
) -> Estimate:
    """The widget's arithmetic, callable without widgets (dp = gpus / (tp pp))."""
    if size not in MODEL_PRESETS:
        raise CourseInputError(f"size must be one of {', '.join(MODEL_PRESETS)}, got {size!r}")
    if gpus % (tp * pp):
        raise CourseInputError(f"tp x pp = {tp * pp} must divide gpus={gpus}")
    dp = gpus // (tp * pp)
    if global_batch % (dp * microbatch_size):
        raise CourseInputError(
            f"dp x micro-batch size = {dp * microbatch_size} must divide the global batch "
            f"({global_batch})"
        )
    m = global_batch // (dp * microbatch_size)
    chunks = SEARCH_CHUNKS if schedule in LOOPING and pp > 1 else 1
    config = Config(tp, pp, dp, microbatch_size, m, schedule, chunks, zero, recompute, tp > 1)
    return evaluate(MODEL_PRESETS[size], config, precision, hardware)


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
    bottom = 0.0
    for part in MEMORY_PARTS:
        value = estimate.memory[part] / GIB
        ax_mem.bar(["per GPU"], [value], bottom=bottom, label=part)
        bottom += value
    limit = hardware.gpu_memory_gib
    ax_mem.axhline(limit, color="black", ls="--", label=f"{limit:g} GiB")
    ax_mem.set_ylim(0, max(bottom, limit) * 1.15)
    ax_mem.set_ylabel("GiB")
    ax_mem.set_title("Memory per GPU")
    ax_mem.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    kinds = list(_TIME_KEY)
    seconds = [estimate.time[_TIME_KEY[k]] for k in kinds]
    ax_com.barh(kinds, seconds, color=[LAYOUT_COLOURS[k] for k in kinds], label="seconds per step")
    for i, kind in enumerate(kinds):
        text = f" {estimate.traffic[kind] / 1e9:.1f} GB"
        ax_com.text(seconds[i], i, text, va="center", fontsize=9)
    ax_com.set_xlabel("communication time per step (s, no overlap)")
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
    memory and communication of that layout, drawn and printed (text everywhere else)."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    from course_utils.charts.display import WithFallback
    from course_utils.charts.style import use_course_style

    use_course_style()

    def show(gpus: int, per_node: int, tp: int, pp: int) -> None:
        hardware = Hardware(gpus_per_node=per_node)
        try:
            estimate = layout(model, gpus, tp, pp, global_batch, hardware, **config)
        except CourseInputError as exc:
            print(f"not a valid layout: {exc}")
            return
        title = f"{name} on {gpus} GPUs, nodes of {per_node}: {estimate.config.short()}"
        draw_layout(estimate, hardware, title.strip())
        plt.show()
        print(describe_layout(estimate, hardware))

    g, n, t, p = start
    controls = {
        "gpus": widgets.Dropdown(options=list(gpus), value=g, description="GPUs"),
        "per_node": widgets.Dropdown(options=list(per_node), value=n, description="GPUs / node"),
        "tp": widgets.SelectionSlider(options=list(degrees), value=t, description="tensor (tp)"),
        "pp": widgets.SelectionSlider(options=list(degrees), value=p, description="pipeline (pp)"),
    }
    out = widgets.interactive_output(show, controls)
    ui = widgets.VBox([widgets.HBox(list(controls.values())), out])
    try:
        text = describe_layout(
            layout(model, g, t, p, global_batch, Hardware(gpus_per_node=n), **config)
        )
    except CourseInputError as exc:
        text = f"not a valid layout: {exc}"
    display(
        WithFallback(
            ui, f"Layout explorer at its starting values (widgets not shown here):\n{text}"
        )
    )
    return ui
