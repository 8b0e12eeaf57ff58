"""`python -m course_utils data-parallel --workers N`: N data-parallel replicas on threads,
trained side by side with one worker on the whole batch; parameters compared, steps timed."""

from __future__ import annotations

import argparse
import json
import time

from course_utils.commands.common import int_flag
from course_utils.errors import CourseInputError
from course_utils.parallel.costs import ALGORITHMS

HELP = "data-parallel step on threads vs one worker"


MAX_WORKERS, MAX_BATCH, MAX_STEPS = 8, 65_536, 100  # threads, samples, steps: laptop limits


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"{HELP}. Limits: at most {MAX_WORKERS} workers, a batch of {MAX_BATCH} and "
        f"{MAX_STEPS} steps."
    )
    parser.add_argument(
        "--workers", type=int, default=2, help=f"data-parallel replicas (1-{MAX_WORKERS})"
    )
    parser.add_argument(
        "--allreduce", default="ring", help=f"all-reduce algorithm: {', '.join(ALGORITHMS)}"
    )
    parser.add_argument("--batch", type=int, default=256, help="global mini-batch size")
    parser.add_argument("--steps", type=int, default=3, help="steps compared with one worker")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def _model(seed: int = 0):
    """An MLP big enough that a step takes tens of ms on one core: (model, d_in, classes)."""
    import torch

    from course_utils.models import MLP

    torch.manual_seed(seed)
    d_in, width, classes = 256, 512, 10
    return MLP(d_in, width, classes, depth=3), d_in, classes


def _time_steps(dp, x, y, repeats: int):
    """Best step time of `repeats` steps after one warm-up step (and the last result)."""
    result = dp.step(x, y)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        result = dp.step(x, y)
        best = min(best, time.perf_counter() - start)
    return best, result


def compare(
    workers: int, algorithm: str = "ring", batch: int = 256, steps: int = 3, repeats: int = 5
) -> dict:
    """Train N replicas and one worker side by side; return the CLI's figures as a dict."""
    import torch

    from course_utils.parallel.data_parallel import (
        DataParallel,
        max_param_diff,
        single_worker_steps,
    )

    model, d_in, classes = _model()
    gen = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(batch, d_in, generator=gen), torch.randint(classes, (batch,), generator=gen))
        for _ in range(steps)
    ]
    reference, _ = single_worker_steps(model, batches)
    with DataParallel(model, workers, algorithm) as dp, DataParallel(model, 1) as one:
        for x, y in batches:
            dp.step(x, y)
        diff = max_param_diff(dp.replicas[0], reference)
        x, y = batches[0]
        t_one, _ = _time_steps(one, x, y, repeats)
        t_dp, last = _time_steps(dp, x, y, repeats)
        param_bytes = dp.param_bytes
    return {
        "workers": workers,
        "allreduce": algorithm,
        "batch": batch,
        "max_param_diff": diff,
        "speedup": t_one / t_dp,
        "step_time_one_worker_s": t_one,
        "step_time_s": t_dp,
        "bytes_sent_per_worker": last.bytes_sent,
        "param_bytes": param_bytes,
        "events": [
            {**e.to_dict(), "label": e.label}
            for e in sorted(last.timeline.events, key=lambda e: (e.start, e.device))
        ],
    }


def run(args: argparse.Namespace) -> int:
    workers = int_flag(args, "--workers", 1, MAX_WORKERS)
    if args.allreduce not in ALGORITHMS:
        raise CourseInputError(
            f"--allreduce must be one of {', '.join(ALGORITHMS)}, got {args.allreduce!r}"
        )
    int_flag(args, "--steps", 1, MAX_STEPS)
    int_flag(args, "--batch", 1, MAX_BATCH)
    if args.batch < workers:
        raise CourseInputError(f"--batch must be at least --workers ({workers}), got {args.batch}")
    result = compare(workers, args.allreduce, args.batch, args.steps)
    if args.json:
        print(json.dumps(result, indent=2, allow_nan=False))
        return 0
    n = result["workers"]
    print(f"data parallel: {n} workers, {result['allreduce']} all-reduce, batch {args.batch}")
    print(f"  max |param diff| vs one worker on the whole batch: {result['max_param_diff']:.2e}")
    print(
        f"  step time: {1e3 * result['step_time_s']:.1f} ms vs "
        f"{1e3 * result['step_time_one_worker_s']:.1f} ms on one worker "
        f"-> speed-up {result['speedup']:.2f}x (ideal {n}x)"
    )
    sent = ", ".join(f"{b / 1e6:.3f}" for b in result["bytes_sent_per_worker"])
    print(f"  gradient bytes: {result['param_bytes'] / 1e6:.3f} MB; sent per worker (MB): {sent}")
    return 0
