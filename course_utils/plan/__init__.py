"""Plan a training run before renting the GPUs: will it fit, how fast will it go, what to change.

    from course_utils import plan
    plan.memory(plan.MODEL_PRESETS["30B"], plan.Config(tp=8, zero=1))
    plan.search(plan.MODEL_PRESETS["70B"], gpus=64, global_batch=512)

- `inputs`  precisions, model shapes and presets (dense and MoE), a layout (`Config`: tp, cp,
            pp, dp, ep, ...), hardware and its named presets (A100-80GB, H100-80GB, ...)
- `gpu_memory`  memory per GPU of one layout: model states, activations, buffers, formula by formula
- `network`  the bytes each GPU sends per step, per kind of parallelism
- `model`   FLOPs and time per step, and `evaluate`: one layout's whole estimate
- `search`  every layout that fits, fastest first, why the rest does not, the fewest GPUs
- `widget`  the charts and widgets: lesson 07's layout explorer, lesson 12's planner, the
            cluster drawing

Nothing here imports torch: it is arithmetic (and the pipeline simulator, for bubbles).
"""

from course_utils.parallel.costs import ring_allreduce_time
from course_utils.plan.gpu_memory import (
    SIMULATE_LIMIT,
    activation_bytes_per_layer,
    activation_terms,
    buffers,
    inflight_microbatches,
    memory,
    model_state_bytes,
    model_states,
    pipeline_bubble,
    ring_attention_bytes,
    ulysses_attention_bytes,
)
from course_utils.plan.inputs import (
    CP_KINDS,
    DEFAULT_GPU,
    GB,
    GIB,
    HARDWARE_PRESETS,
    LOOPING,
    MICROBATCH_SIZES,
    MIN_CP_TOKENS,
    MODEL_PRESETS,
    PLANNED_SCHEDULES,
    PRECISIONS,
    RECOMPUTE,
    RESERVE_FIXED_GIB,
    RESERVE_FRACTION,
    SEARCH_CHUNKS,
    ZERO_STAGES,
    Config,
    Hardware,
    ModelShape,
    Precision,
    check_config,
    get_precision,
    hardware,
    params_disagree,
    parse_count,
    replace_config,
)
from course_utils.plan.model import (
    Estimate,
    evaluate,
    step_time,
    training_flops,
    utilisation,
)
from course_utils.plan.network import (
    Collective,
    Traffic,
    communication,
    data_parallel_collectives,
    traffic,
)
from course_utils.plan.search import (
    context_degrees,
    format_bytes,
    format_memory,
    format_time,
    gpu_counts,
    min_gpus,
    search,
    search_to_dict,
    states_lower_bound,
)
from course_utils.plan.widget import (
    MEMORY_PARTS,
    TIME_PARTS,
    describe,
    describe_layout,
    draw_cluster,
    draw_layout,
    draw_plan,
    estimate_from_sliders,
    layout,
    layout_explorer,
    planner_widget,
)

__all__ = [
    "CP_KINDS", "DEFAULT_GPU", "GB", "GIB", "HARDWARE_PRESETS", "LOOPING", "MEMORY_PARTS",
    "MICROBATCH_SIZES", "MIN_CP_TOKENS", "MODEL_PRESETS", "PRECISIONS", "RECOMPUTE",
    "RESERVE_FIXED_GIB", "RESERVE_FRACTION", "PLANNED_SCHEDULES", "SEARCH_CHUNKS", "SIMULATE_LIMIT",
    "TIME_PARTS", "ZERO_STAGES", "Collective", "Config", "Estimate", "Hardware", "ModelShape",
    "Precision", "Traffic", "activation_bytes_per_layer", "activation_terms", "buffers",
    "check_config", "communication", "context_degrees", "data_parallel_collectives",
    "describe", "describe_layout", "draw_cluster", "draw_layout", "draw_plan",
    "estimate_from_sliders", "evaluate", "format_bytes", "format_memory", "format_time",
    "get_precision", "gpu_counts", "hardware", "inflight_microbatches", "layout", "layout_explorer",
    "memory", "min_gpus", "model_state_bytes", "model_states", "params_disagree",
    "parse_count", "pipeline_bubble", "planner_widget", "replace_config",
    "ring_allreduce_time", "ring_attention_bytes", "search", "search_to_dict",
    "states_lower_bound", "step_time", "traffic", "training_flops", "ulysses_attention_bytes",
    "utilisation",
]  # fmt: skip
