"""Plan a training run before renting the GPUs: will it fit, how fast will it go, what to change.

    from course_utils import plan
    plan.memory(plan.MODEL_PRESETS["30B"], plan.Config(tp=8, zero=1))
    plan.search(plan.MODEL_PRESETS["70B"], gpus=64, global_batch=512)

- `inputs`  precisions, model shapes and presets, a layout (`Config`), hardware
- `model`   memory per GPU and time per step of one layout, formula by formula
- `search`  every layout that fits, fastest first, and why the rest does not
- `widget`  the charts and widgets: lesson 07's layout explorer, lesson 12's planner

Nothing here imports torch: it is arithmetic (and the pipeline simulator, for bubbles).
"""

from course_utils.plan.inputs import (
    GIB,
    LOOPING,
    MICROBATCH_SIZES,
    MODEL_PRESETS,
    PRECISIONS,
    RECOMPUTE,
    SCHEDULES,
    SEARCH_CHUNKS,
    ZERO_STAGES,
    Config,
    Hardware,
    ModelShape,
    Precision,
    check_config,
    get_precision,
    parse_count,
    replace_config,
)
from course_utils.plan.model import (
    SIMULATE_LIMIT,
    Estimate,
    Traffic,
    activation_bytes_per_layer,
    communication,
    evaluate,
    inflight_microbatches,
    memory,
    model_state_bytes,
    pipeline_bubble,
    ring_allreduce_time,
    step_time,
    traffic,
    training_flops,
)
from course_utils.plan.search import format_memory, format_time, search, search_to_dict
from course_utils.plan.widget import (
    MEMORY_PARTS,
    TIME_PARTS,
    describe,
    describe_layout,
    draw_layout,
    draw_plan,
    estimate_from_sliders,
    layout,
    layout_explorer,
    planner_widget,
)

__all__ = [
    "GIB", "LOOPING", "MEMORY_PARTS", "MICROBATCH_SIZES", "MODEL_PRESETS", "PRECISIONS",
    "RECOMPUTE", "SCHEDULES", "SEARCH_CHUNKS", "SIMULATE_LIMIT", "TIME_PARTS", "ZERO_STAGES",
    "Config", "Estimate", "Hardware", "ModelShape", "Precision", "activation_bytes_per_layer",
    "check_config", "describe", "draw_plan", "estimate_from_sliders", "evaluate",
    "format_memory", "format_time", "get_precision", "inflight_microbatches", "memory",
    "model_state_bytes", "parse_count", "pipeline_bubble", "planner_widget", "replace_config",
    "ring_allreduce_time", "search", "search_to_dict", "step_time", "training_flops",
    "Traffic", "communication", "traffic", "describe_layout", "draw_layout", "layout",
    "layout_explorer",
]  # fmt: skip
