"""`python -m course_utils run NAME --devices P --microbatches M`: one pipelined training step
for real on CPU threads, checked against the unsplit model and timed against it.

Arguments are checked before torch is imported, so a typo costs well under a second.
"""

from __future__ import annotations

import argparse
import json
import sys

from course_utils.actions import Action
from course_utils.commands.common import (
    add_clock_arguments,
    add_devices_argument,
    add_trace_argument,
    check_trace,
    clock_figures,
    clock_words,
    int_flag,
    links_from_args,
    schedule_from_args,
    write_trace,
)
from course_utils.errors import CourseInputError, ScheduleError, WorkerError
from course_utils.validation import MAX_PIPELINE_DEVICES as MAX_DEVICES
from course_utils.validation import MAX_PIPELINE_STAGES as MAX_STAGES
from course_utils.validation import integer, matplotlib_ready, output_file, seed

HELP = "run one pipelined training step for real on CPU threads"
MODELS = ("gpt", "mlp")
# Limits that fit a laptop (under 1.5 GB, tests/test_limits.py): threads, layers (a stage
# each, 4 at least), micro-batches, samples. Activations grow with samples x layers: a GPT
# layer keeps about 190 kB per sample (32 tokens) for its backward, an MLP layer about 15 kB
# (both measured with all of them in flight: 6,144 GPT sample-layers peaked at 1.4 GB).
MAX_MICROBATCHES, MAX_BATCH = 64, 4096
MAX_SAMPLE_LAYERS = {"gpt": 4096, "mlp": 65_536}
DEFAULT_PER_MICROBATCH = {"gpt": 16, "mlp": 64}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from course_utils.pipeline.schedules import SCHEDULES

    parser.description = (
        f"{HELP}. Limits: at most {MAX_DEVICES} devices (threads), {MAX_STAGES} stages in all, "
        f"{MAX_MICROBATCHES} micro-batches and a batch of {MAX_BATCH}; the batch times the "
        f"layers (one a stage, 4 at least) at most {MAX_SAMPLE_LAYERS['gpt']:,} for gpt and "
        f"{MAX_SAMPLE_LAYERS['mlp']:,} for mlp (activations stay under 1.5 GB)."
    )
    parser.add_argument("name", help=f"the schedule: {', '.join(SCHEDULES)}")
    add_devices_argument(
        parser, False, default=2, help=f"pipeline devices P (threads, at most {MAX_DEVICES})"
    )
    parser.add_argument(
        "--microbatches", type=int, default=4, help=f"micro-batches M (at most {MAX_MICROBATCHES})"
    )
    with_chunks = ", ".join(n for n, i in SCHEDULES.items() if i.uses_chunks)
    parser.add_argument(
        "--chunks",
        type=int,
        default=1,
        help=f"stages per device V ({with_chunks}; the V schedules always have 2)",
    )
    parser.add_argument("--model", choices=MODELS, default="gpt")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"samples in the step, a multiple of M: at most {MAX_BATCH} and batch x layers "
        "within the limit above (default: 16 x M for gpt, 64 x M for mlp, lowered to fit)",
    )
    parser.add_argument("--fail-at", default=None, help="inject an error in ACTION, e.g. 1F2")
    parser.add_argument("--gantt", default=None, metavar="PNG", help="draw measured vs simulated")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    add_trace_argument(parser)
    parser.add_argument("--seed", type=int, default=0, help="random seed, 0 to 2**31 - 1")
    add_clock_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from course_utils.pipeline.schedules import schedule_info

    info = schedule_info(args.name)
    int_flag(args, "--devices", 1, MAX_DEVICES)
    m = int_flag(args, "--microbatches", 1, MAX_MICROBATCHES)
    int_flag(args, "--chunks")
    stages = args.devices * info.chunks(args.chunks)
    if stages > MAX_STAGES:
        raise CourseInputError(
            f"--devices x --chunks = {stages} stages, over the limit of {MAX_STAGES} (a layer each)"
        )
    seed(args.seed, "--seed")
    batch = _batch(args, m, layers=max(4, stages))
    if args.gantt is not None:
        output_file(args.gantt, "--gantt", (".png", ".svg", ".pdf"))
        matplotlib_ready()
    check_trace(args)
    schedule = schedule_from_args(args)
    fail_at = None
    if args.fail_at is not None:
        try:
            fail_at = Action.parse(args.fail_at)
        except CourseInputError:
            raise CourseInputError(
                f"--fail-at must be an action like 1F2 or 0B3, got {args.fail_at!r}"
            ) from None
        if not any(fail_at in actions for actions in schedule.devices):
            raise CourseInputError(f"--fail-at must be an action of the schedule, got {fail_at}")
    links = links_from_args(args)

    import copy

    import torch

    from course_utils.measure.timing import least_disturbed
    from course_utils.models import build_model, loss_fn, partition
    from course_utils.pipeline.executor import (
        PipelineExecutor,
        ideal_speedup,
        simulated_from_measured,
        unsplit_step_time,
    )

    p, v = args.devices, info.chunks(args.chunks)  # the V schedules always have 2 per device
    model = build_model(args.model, p * v, args.seed)
    x, y = model.example_batch(batch, torch.Generator().manual_seed(args.seed))
    reference = copy.deepcopy(model)
    unsplit_s = unsplit_step_time(reference, loss_fn, x, y, clock=args.clock)
    ref_loss = loss_fn(reference(x), y)
    ref_loss.backward()

    stages = partition(model, p * v)
    with PipelineExecutor(stages, p, loss_fn, clock=args.clock, links=links) as ex:
        try:
            ex.step(schedule, x, y, fail_at=fail_at)  # warm-up (first-call costs)
            # three steps put together, each burst at its least CPU time (the same batch, so
            # the gradients compared below are the same whichever step they come from)
            result = least_disturbed([ex.step(schedule, x, y) for _ in range(3)])
        except (WorkerError, ScheduleError) as err:
            print(f"python -m course_utils run: {err}", file=sys.stderr)
            return 1

    def grad(param: torch.Tensor) -> torch.Tensor:
        assert param.grad is not None  # both models ran their backward pass above
        return param.grad

    grad_diff = max(
        (grad(a) - grad(b)).abs().max().item()
        for a, b in zip(model.parameters(), reference.parameters(), strict=True)
    )
    simulated = simulated_from_measured(result, schedule)
    measured = result.timeline
    figures = {
        "schedule": schedule.name,
        **clock_figures(args, links, measured.makespan, simulated.makespan),
        "unsplit_step_s": unsplit_s,
        "speedup": unsplit_s / measured.makespan,
        "ideal_speedup": ideal_speedup(schedule),
        "max_grad_diff": grad_diff,
        "loss": result.loss,
        "reference_loss": ref_loss.item(),
        "events": [e.to_dict() for e in measured.events],
    }
    if args.gantt:
        from course_utils.charts import gantt

        fig = gantt.compare(simulated, measured, pyplot=False)
        try:
            gantt.save(fig, args.gantt)
        except OSError as exc:
            raise CourseInputError(f"cannot write {args.gantt!r}: {exc.strerror or exc}") from None
    write_trace(args, measured, f"run {schedule.name}")
    if args.json:
        print(json.dumps(figures, indent=1, allow_nan=False))
    else:
        print(str(schedule))
        print(
            f"loss {result.loss:.5f} (unsplit {ref_loss.item():.5f}), "
            f"max gradient difference {grad_diff:.2e}"
        )
        print(
            f"measured {measured.makespan * 1e3:.2f} ms ({clock_words(args, links)}), unsplit "
            f"on one thread {unsplit_s * 1e3:.2f} ms: speed-up {figures['speedup']:.2f}x "
            f"(ideal {figures['ideal_speedup']:.2f}x); "
            f"simulated from measured stage costs {simulated.makespan * 1e3:.2f} ms"
        )
        if v == 1:
            print(f"peak activations per device (micro-batches): {measured.peak_activations}")
        else:  # a chunk holds 1/v of a device's layers
            print(
                f"peak activations per device: {measured.peak_activations} chunks "
                f"(1/{v} of the device's layers each)"
            )
        if args.gantt:
            print(f"wrote {args.gantt}")
    return 0


def _batch(args: argparse.Namespace, m: int, layers: int) -> int:
    """--batch-size, checked: a multiple of M, at most MAX_BATCH, and batch x layers within
    the model's limit; by default the most of 16 (gpt) or 64 (mlp) per micro-batch that fits."""
    most = min(MAX_BATCH, MAX_SAMPLE_LAYERS[args.model] // layers)
    if args.batch_size is None:  # enough work per micro-batch that threads pay off
        return max(m, min(DEFAULT_PER_MICROBATCH[args.model] * m, most // m * m))
    batch = integer(args.batch_size, "--batch-size", 1, MAX_BATCH)
    if batch % m:
        raise CourseInputError(f"--batch-size must be a positive multiple of --microbatches ({m})")
    if batch > most:
        raise CourseInputError(
            f"--batch-size must be at most {most} for {layers} layers of {args.model} (batch x "
            f"layers <= {MAX_SAMPLE_LAYERS[args.model]:,} keeps a run under 1.5 GB), got {batch}"
        )
    return batch
