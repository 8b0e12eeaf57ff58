"""The planner on screen: a memory and step-time chart of one layout, and the widget with
sliders that lesson 08 uses (its text fallback prints the same numbers)."""

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
        estimate = estimate_from_sliders(*(c.value for c in controls), global_batch, hardware)
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
