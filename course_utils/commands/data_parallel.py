"""`python -m course_utils data-parallel --workers N`: N data-parallel replicas on threads,
trained side by side with one worker on the whole batch; parameters compared, steps timed.

The speed-up's baseline is one device doing the same work as the N workers: the global batch
as N micro-batches of a worker's size, their gradients accumulated (a single GPU short of
memory does the same). One device on the whole batch at once would be slower per sample on
a CPU thread (a batch N times larger misses its caches), so N workers would beat N x.

The default workload is a small model (16,522 parameters) on a large batch: data
parallelism pays off when each worker computes much more than it communicates, and the
gradient all-reduce grows with the parameters while the compute grows with the batch. On
the virtual clock with the default cluster (8 GPUs per node) 8 workers reach about 7.5x and
16 workers, whose ring crosses the slower network between two nodes, about 10x.

The step is timed 15 times in turns with its baseline, after two warm-up steps (the first
steps of a pool still fault their memory in), and each compute burst is kept at its least CPU
time (`measure.timing`): on a 2-core laptop the same burst's CPU time varies by 15-30% from
moment to moment, and with three runs 16 workers read anywhere from 7.9x to 11.9x. Both
take turns on the same core (the process's, `threads.devices`), and the links are scaled to
the core's compute rate probed between the steps (`rate_probe`): probed once when the
process started, the rate read 65-93 GFLOP/s, and 16 workers 8.8-10.2x with it.
"""

from __future__ import annotations

import argparse
import math
from typing import cast

from course_utils.commands.common import (
    add_allreduce_argument,
    add_json_and_clock_arguments,
    allreduce_from_args,
    check_trace,
    clock_words,
    int_flag,
    links_from_args,
    printed_as_json,
    write_trace,
)
from course_utils.errors import CourseInputError
from course_utils.validation import MAX_THREADS

HELP = "data-parallel step on threads vs one worker"

# threads, samples, steps: laptop limits (under 1.5 GB at every corner: tests/test_limits.py;
# the batches are made one step at a time, so the steps cost time, not memory)
MAX_WORKERS, MAX_BATCH, MAX_STEPS = MAX_THREADS, 65_536, 20
BATCH = 65_536  # samples per step (of 64 numbers each)
D_IN, WIDTH, DEPTH, CLASSES = 64, 96, 2, 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"{HELP}. Limits: at most {MAX_WORKERS} workers, a batch of {MAX_BATCH} and "
        f"{MAX_STEPS} steps."
    )
    parser.add_argument(
        "--workers", type=int, default=2, help=f"data-parallel replicas (1-{MAX_WORKERS})"
    )
    add_allreduce_argument(parser)
    parser.add_argument(
        "--batch",
        type=int,
        default=BATCH,
        help=f"global mini-batch size, --workers to {MAX_BATCH} (default {BATCH})",
    )
    parser.add_argument(
        "--steps", type=int, default=3, help=f"steps compared with one worker (1-{MAX_STEPS})"
    )
    add_json_and_clock_arguments(parser)


def _model(seed: int = 0):
    """A small MLP: few parameters to all-reduce, much compute per sample batch."""
    import torch

    from course_utils.models import MLP

    torch.manual_seed(seed)
    return MLP(D_IN, WIDTH, CLASSES, depth=DEPTH)


def compare(
    workers: int,
    algorithm: str = "ring",
    batch: int = BATCH,
    steps: int = 3,
    repeats: int = 15,
    clock: str = "virtual",
    links=None,
) -> dict:
    """Train N replicas and one worker side by side; return the CLI's figures as a dict."""
    import torch

    from course_utils.measure.timing import compare as time_in_turns
    from course_utils.measure.timing import step_time
    from course_utils.parallel.data_parallel import (
        DataParallel,
        DPStepResult,
        max_param_diff,
        simulated_step_s,
        single_worker_steps,
    )

    model = _model()

    def batches():
        """The same `steps` batches each time, made one at a time (100 steps of 65,536
        samples held at once would be 1.7 GB)."""
        gen = torch.Generator().manual_seed(1)
        for _ in range(steps):
            x = torch.randn(batch, D_IN, generator=gen)
            yield x, torch.randint(CLASSES, (batch,), generator=gen)

    reference, _ = single_worker_steps(model, batches())
    options = {"clock": clock, "links": links}
    with DataParallel(model, workers, algorithm, **options) as dp:
        for x, y in batches():
            dp.step(x, y)
        diff = max_param_diff(dp.replicas[0], reference)
    x, y = next(batches())
    with (
        DataParallel(model, 1, microbatches=workers, **options) as one,
        DataParallel(model, workers, algorithm, **options) as dp,
    ):
        # in turns, so that a change in the machine's load hits both alike; no time budget;
        # the links scaled to the compute rate of the moments timed
        runs = time_in_turns(
            {"one": lambda: one.step(x, y), "dp": lambda: dp.step(x, y)},
            repeats=repeats,
            warmup=2,
            budget_s=math.inf,
            time_of=step_time,
            rate_probe=True,
        )
        first = cast(DPStepResult, runs["one"].best_result)
        last = cast(DPStepResult, runs["dp"].best_result)
        t_one, t_dp = runs["one"].best, runs["dp"].best
        param_bytes = dp.param_bytes
    modelled = (last.trace.links if last.trace else links) if clock == "virtual" else None
    sim_one = simulated_step_s(first, param_bytes, modelled)
    sim_dp = simulated_step_s(last, param_bytes, modelled)
    return {
        "workers": workers,
        "allreduce": algorithm,
        "batch": batch,
        "max_param_diff": diff,
        "measured_step_s": t_dp,
        "simulated_step_s": sim_dp,
        "speedup": t_one / t_dp,
        "simulated_speedup": sim_one / sim_dp,
        "one_worker_step_s": t_one,
        "bytes_sent_per_worker": last.bytes_sent,
        "param_bytes": param_bytes,
        "timeline": last.timeline,  # the command writes it to --trace, then drops it
        "links_used": modelled or links,  # scaled to the rate probed between the steps
        "events": [
            {**e.to_dict(), "label": e.label}
            for e in sorted(last.timeline.events, key=lambda e: (e.start, e.device))
        ],
    }


def run(args: argparse.Namespace) -> int:
    workers = int_flag(args, "--workers", 1, MAX_WORKERS)
    algorithm = allreduce_from_args(args)
    int_flag(args, "--steps", 1, MAX_STEPS)
    int_flag(args, "--batch", 1, MAX_BATCH)
    if args.batch < workers:
        raise CourseInputError(f"--batch must be at least --workers ({workers}), got {args.batch}")
    check_trace(args)
    links = links_from_args(args)
    result = compare(workers, algorithm, args.batch, args.steps, clock=args.clock, links=links)
    write_trace(args, result.pop("timeline"), f"data-parallel, {workers} workers")
    links = result.pop("links_used")
    if printed_as_json(args, links, result):
        return 0
    n = result["workers"]
    print(f"data parallel: {n} workers, {result['allreduce']} all-reduce, batch {args.batch}")
    print(f"  max |param diff| vs one worker on the whole batch: {result['max_param_diff']:.2e}")
    print(
        f"  step time: {1e3 * result['measured_step_s']:.1f} ms vs "
        f"{1e3 * result['one_worker_step_s']:.1f} ms on one worker ({n} micro-batches of a "
        f"worker's size, accumulated) "
        f"-> speed-up {result['speedup']:.2f}x (ideal {n}x; simulated "
        f"{result['simulated_speedup']:.2f}x)"
    )
    print(f"  ({clock_words(args, links)})")
    sent = ", ".join(f"{b / 1e6:.3f}" for b in result["bytes_sent_per_worker"])
    print(f"  gradient bytes: {result['param_bytes'] / 1e6:.3f} MB; sent per worker (MB): {sent}")
    return 0
