"""Simulated step timelines of data parallelism, alone and beside a pipeline.

Predictions, not measurements: compute phases from a cost model and gradient all-reduces
timed by the ring formula of `course_utils.parallel.costs`, on a communication lane beside
each device's compute. Lesson 06 compares `data_parallel_timeline` (buckets, overlap on or
off) with what DDP measures; lesson 05 uses `dp_pp_timeline` to show why breadth-first hides
its gradient reduction behind the backward pass and depth-first interleaving does not.
Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from course_utils import validation
from course_utils.actions import Action
from course_utils.errors import CourseInputError
from course_utils.parallel.costs import ring_allreduce_time
from course_utils.pipeline.schedules import make_schedule
from course_utils.pipeline.simulate import CostModel, simulate
from course_utils.timeline import Event, Timeline


def data_parallel_timeline(
    workers: int,
    compute_forward: float,
    compute_backward: float,
    grad_bytes: float,
    bandwidth: float,
    buckets: int = 1,
    overlap: bool = False,
    latency: float = 0.0,
) -> Timeline:
    """One data-parallel step: forward, backward, gradient all-reduce on every replica.

    Gradients are reduced in `buckets` equal buckets with a ring all-reduce. The backward
    produces the buckets one by one (last layers first); with `overlap` each bucket's
    all-reduce starts as soon as its gradients exist, on a communication lane beside the
    compute (as PyTorch DDP does), otherwise all reductions wait for the whole backward.
    """
    validation.integer(workers, "workers")
    validation.integer(buckets, "buckets")
    if min(compute_forward, compute_backward, grad_bytes) < 0:
        raise CourseInputError("compute times and grad_bytes must be >= 0")
    per_bucket = ring_allreduce_time(grad_bytes / buckets, workers, bandwidth, latency)
    piece = compute_backward / buckets
    events: list[Event] = []
    comm_free = 0.0
    for k in range(buckets):
        ready = compute_forward + piece * (k + 1) if overlap else compute_forward + compute_backward
        start = max(ready, comm_free)
        comm_free = start + per_bucket
        for w in range(workers):
            events.append(
                Event(w, Action(0, "REDUCE_GRAD"), start, comm_free, f"all-reduce bucket {k + 1}")
            )
    for w in range(workers):
        events.append(Event(w, Action(0, "F", 0), 0.0, compute_forward))
        for k in range(buckets):
            start = compute_forward + piece * k
            label = f"backward bucket {k + 1}" if buckets > 1 else None
            events.append(Event(w, Action(0, "B", 0), start, start + piece, label))
    compute = compute_forward + compute_backward
    return Timeline(
        events=events,
        num_devices=workers,
        name=f"data parallel x{workers}, {buckets} bucket(s), overlap {'on' if overlap else 'off'}",
        source="simulated",
        unit="s",
        meta={
            "compute": compute,
            "allreduce_per_bucket": per_bucket,
            "allreduce_total": per_bucket * buckets,
            "exposed_communication": comm_free - compute,
        },
    )


def dp_pp_timeline(
    schedule_name: str,
    devices: int,
    microbatches: int,
    chunks: int,
    dp_workers: int,
    costs: CostModel | None = None,
    grad_bytes_per_stage: float | Sequence[float] = 1.0,
    bandwidth: float = 1.0,
    latency: float = 0.0,
) -> Timeline:
    """One pipeline replica of a DP x PP step, with each stage's gradient all-reduce.

    Every one of the `dp_workers` replicas runs the same pipeline schedule; a stage's
    gradients are all-reduced across replicas once that stage's last backward (B or W) is
    done, on the device's communication lane (one reduction at a time per device). The
    step ends when the last reduction ends. Breadth-first finishes each stage's backward
    early, so its reductions hide behind the remaining backward; depth-first interleaved
    finishes all stages near the end, so its reductions are exposed. Give `costs` in the
    time unit of `bytes / bandwidth` (e.g. seconds with bytes/s).
    """
    costs = costs or CostModel()
    sched = make_schedule(schedule_name, devices, microbatches, chunks)
    timeline = simulate(sched, costs)
    validation.integer(dp_workers, "dp_workers")
    stages = sched.stages
    if isinstance(grad_bytes_per_stage, int | float):
        grad_bytes = [float(grad_bytes_per_stage)] * stages
    else:
        grad_bytes = [float(x) for x in grad_bytes_per_stage]
        if len(grad_bytes) != stages:
            raise CourseInputError(
                f"grad_bytes_per_stage needs one value per stage ({stages}), got {len(grad_bytes)}"
            )
    done: dict[int, float] = {}
    for e in timeline.events:
        if e.action.is_backward:
            done[e.action.stage] = max(done.get(e.action.stage, 0.0), e.end)
    owner = sched.device_of_stage()
    lane_free = [0.0] * sched.num_devices
    comm = []
    for s in sorted(done, key=lambda s: (done[s], s)):
        d = owner[s]
        start = max(done[s], lane_free[d])
        lane_free[d] = start + ring_allreduce_time(grad_bytes[s], dp_workers, bandwidth, latency)
        comm.append(
            Event(d, Action(s, "REDUCE_GRAD"), start, lane_free[d], f"all-reduce stage {s}")
        )
    compute_end = timeline.makespan
    step_end = max([compute_end, *lane_free])
    return Timeline(
        events=timeline.events + comm,
        num_devices=sched.num_devices,
        name=f"{schedule_name} x DP{dp_workers}",
        source="simulated",
        unit=timeline.unit,
        peak_activations=timeline.peak_activations,
        meta={
            "compute_end": compute_end,
            "step_end": step_end,
            "exposed_reduction": step_end - compute_end,
            "reduction_start": {e.action.stage: e.start for e in comm},
        },
    )
