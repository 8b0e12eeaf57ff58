"""`python -m course_utils fsdp`: ZeRO stage 1, 2 or 3 on threads, checked against one device.

Trains a small MLP (float64, so that rounding does not hide a real difference) for a few
Adam steps with `course_utils.parallel.fsdp.ShardedDataParallel`, trains the same MLP on one
device, and reports: the largest parameter difference, the bytes each worker sent per
step (all-gather and reduce-scatter, next to plain data parallelism's all-reduce), the
model-state memory each worker held (measured, and the ZeRO formula of
`course_utils.plan.model_state_bytes`), and the last step's measured time next to the
time `simulate_fsdp` predicts from the costs read off that step.
"""

from __future__ import annotations

import argparse

from course_utils.commands.common import (
    add_json_and_clock_arguments,
    check_trace,
    clock_words,
    links_from_args,
    printed_as_json,
    write_trace,
)
from course_utils.errors import CourseInputError

HELP = "ZeRO 1/2/3 (FSDP) on threads vs one device: bytes, memory, timeline"

LIMITS = {"workers": (1, 8), "prefetch": (0, 8), "steps": (1, 20), "microbatches": (1, 8)}
STAGES = (1, 2, 3)
BATCH = 64  # >= workers x microbatches at the limits
LAYERS = {"d_in": 32, "d_hidden": 64, "d_out": 10, "depth": 4}
LR = 0.01


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"{HELP}. Limits: " + ", ".join(f"{k} {lo}-{hi}" for k, (lo, hi) in LIMITS.items()) + "."
    )
    lo, hi = LIMITS["workers"]
    parser.add_argument("--workers", type=int, default=2, help=f"workers ({lo}..{hi})")
    parser.add_argument(
        "--stage",
        type=int,
        default=3,
        help="ZeRO stage: 1 optimizer state, 2 + gradients, 3 + parameters (FSDP)",
    )
    lo, hi = LIMITS["prefetch"]
    parser.add_argument(
        "--prefetch", type=int, default=1, help=f"layers gathered ahead ({lo}..{hi}; stage 3)"
    )
    lo, hi = LIMITS["steps"]
    parser.add_argument("--steps", type=int, default=3, help=f"Adam steps ({lo}..{hi})")
    lo, hi = LIMITS["microbatches"]
    parser.add_argument(
        "--microbatches", type=int, default=1, help=f"gradient accumulation ({lo}..{hi})"
    )
    add_json_and_clock_arguments(parser)


def validate(args) -> None:
    """One-line CourseInputError for any argument out of range (before torch is imported)."""
    for name, (lo, hi) in LIMITS.items():
        value = getattr(args, name)
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise CourseInputError(f"--{name} must be an integer in {lo}..{hi}, got {value!r}")
    if args.stage not in STAGES:
        raise CourseInputError(f"--stage must be 1, 2 or 3, got {args.stage!r}")


def model_and_batches(steps: int):
    """The command's MLP (float64, seed 0) and `steps` batches of `BATCH` samples."""
    import torch

    from course_utils.models import MLP

    torch.manual_seed(0)
    model = MLP(**LAYERS).double()
    gen = torch.Generator().manual_seed(1)
    batches = [
        (
            torch.randn(BATCH, LAYERS["d_in"], generator=gen, dtype=torch.float64),
            torch.randint(LAYERS["d_out"], (BATCH,), generator=gen),
        )
        for _ in range(steps)
    ]
    return model, batches


def simulation(result, numels, element_size, stage, prefetch, microbatches, links=None):
    """The costs read off a measured step (`FSDPStepResult`) and `simulate_fsdp`'s step from
    them: (costs, simulated timeline). `links`: the run's emulated links (virtual clock)."""
    from course_utils.parallel.fsdp import costs_from_timeline, simulate_fsdp

    workers = len(result.memory)
    costs = costs_from_timeline(result.timeline, numels, workers, element_size, links)
    return costs, simulate_fsdp(costs, workers, stage, prefetch, microbatches)


def compare(
    workers: int,
    stage: int = 3,
    prefetch: int = 1,
    steps: int = 3,
    microbatches: int = 1,
    clock: str = "virtual",
    links=None,
) -> dict:
    """Train with ZeRO on threads and on one device; the figures the command prints."""
    from course_utils.measure.timing import least_disturbed
    from course_utils.parallel.data_parallel import max_param_diff
    from course_utils.parallel.fsdp import (
        ShardedDataParallel,
        dp_traffic_bytes,
        fsdp_traffic_bytes,
        single_device_steps,
        zero_memory_bytes,
    )

    model, batches = model_and_batches(steps)
    reference, _ = single_device_steps(model, batches, lr=LR)
    with ShardedDataParallel(
        model,
        workers,
        stage=stage,
        prefetch=prefetch,
        microbatches=microbatches,
        lr=LR,
        clock=clock,
        links=links,
    ) as zero:
        results = [zero.step(x, y) for x, y in batches]
        diff = max_param_diff(reference, zero.to_model())
        numels, element_size = zero.layer_numels, zero.element_size
    # bytes and memory: the last step; time: the steps after the first (its first calls
    # allocate and initialise) put together, each burst at its least CPU time
    last = results[-1]
    timed = least_disturbed(results[1:] or results)
    modelled = links if clock == "virtual" else None
    costs, simulated = simulation(
        timed, numels, element_size, stage, prefetch, microbatches, modelled
    )
    formula = zero_memory_bytes(numels, workers, stage, element_size)
    traffic = fsdp_traffic_bytes(numels, workers, stage, microbatches, element_size)
    dp = dp_traffic_bytes(numels, workers, element_size)
    return {
        "workers": workers,
        "stage": stage,
        "prefetch": prefetch,
        "microbatches": microbatches,
        "steps": steps,
        "parameters": sum(numels),
        "layer_parameters": numels,
        "max_param_diff": diff,
        "bytes_all_gather_per_worker": last.bytes_all_gather,
        "bytes_reduce_scatter_per_worker": last.bytes_reduce_scatter,
        "bytes_formula_per_worker": traffic,
        "bytes_dp_all_reduce_per_worker": dp,
        "memory_measured_per_worker": [m.persistent for m in last.memory],
        "memory_peak_per_worker": [m.peak for m in last.memory],
        "memory_formula_per_worker": formula,
        "measured_step_s": timed.step_time_s,
        "simulated_step_s": simulated.makespan,
        "bandwidth_bytes_per_s": (costs.bandwidth if costs.bandwidth != float("inf") else None),
        "timeline": timed.timeline,  # the command writes it to --trace, then drops it
    }


def run(args) -> int:
    validate(args)
    check_trace(args)
    links = links_from_args(args)
    result = compare(
        args.workers,
        args.stage,
        args.prefetch,
        args.steps,
        args.microbatches,
        clock=args.clock,
        links=links,
    )
    write_trace(args, result.pop("timeline"), f"ZeRO-{args.stage}, {args.workers} workers")
    if printed_as_json(args, links, result):
        return 0
    n, stage = result["workers"], result["stage"]
    name = f"ZeRO-{stage}" + (" (FSDP)" if stage == 3 else "")
    print(
        f"{name} on {n} workers, prefetch {result['prefetch']}, "
        f"{result['microbatches']} micro-batch(es), {result['steps']} Adam steps; "
        f"MLP with {result['parameters']:,} float64 parameters in "
        f"{len(result['layer_parameters'])} layers"
    )
    print(f"  max |parameter diff| vs one device: {result['max_param_diff']:.1e}")
    gather = result["bytes_all_gather_per_worker"][0]
    scatter = result["bytes_reduce_scatter_per_worker"][0]
    dp = max(result["bytes_dp_all_reduce_per_worker"])
    ratio = f"{(gather + scatter) / dp:.2f}x" if dp else "n/a"
    print(
        f"  bytes sent per worker per step:     all-gather {gather:,} + reduce-scatter "
        f"{scatter:,} (formula {result['bytes_formula_per_worker']['total']:,}); "
        f"plain DP all-reduce {dp:,} -> {ratio}"
    )
    measured = sum(result["memory_measured_per_worker"][0].values())
    formula = sum(result["memory_formula_per_worker"].values())
    peak = result["memory_peak_per_worker"][0]
    print(
        f"  model states per worker:            {measured:,} B held after the step, "
        f"formula {formula:,.0f} B (the rest is padding)"
    )
    print(
        f"  peak during the step:               {sum(peak.values()):,} B "
        f"(gathered layers {peak.get('gathered', 0):,} B, "
        f"layer gradients {peak.get('layer gradients', 0):,} B)"
    )
    print(
        f"  step time (best step):              "
        f"measured {1e3 * result['measured_step_s']:.2f} ms, "
        f"simulated {1e3 * result['simulated_step_s']:.2f} ms "
        "(compute read off the measured step)"
    )
    print(f"  ({clock_words(args, links)})")
    return 0
