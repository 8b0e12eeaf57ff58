"""`torch.distributed.pipelining` on real processes, checked against one process and the
course's thread executor.

A schedule with a PyTorch class in the registry (`course_utils.pipeline.schedules.SCHEDULES`,
field `pytorch`) runs as that class; any other course schedule is written to PyTorch's CSV
format (`course_utils.pipeline.export`) and run by PyTorch's `_PipelineScheduleRuntime`.
Stage s lives on rank s % workers (looping placement, as in the course), and every rank
records when each of its stages computed, for a measured Timeline.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import record_function

from course_utils import validation
from course_utils.actions import Schedule
from course_utils.distributed.cluster import MAX_WORKERS, Cluster, run_job, worker_count
from course_utils.distributed.job import MAX_MICROBATCHES
from course_utils.distributed.setup import (
    DistributedResult,
    Setup,
    build_model,
    checked_model,
    gradient_arrays,
    largest,
    loss_fn,
    make_batch,
    max_abs_diff,
    measured_timeline,
    split_stages,
)
from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import BASELINE, SCHEDULES, make_schedule
from course_utils.timeline import Timeline
from course_utils.versions import require

# The course schedules PyTorch has a class for, run natively (the rest go through the CSV).
PIPELINES = tuple(name for name, info in SCHEDULES.items() if info.pytorch)


def _pytorch(name: str) -> str:
    """The PyTorch class of one of PIPELINES."""
    return str(SCHEDULES[name].pytorch)


def v_placement(placement: dict[int, int]) -> bool:
    """True when a rank holds two adjacent stages, s and s + 1 (the turn of a V)."""
    return any(placement[s] == placement.get(s + 1) for s in placement)


def record_stage_times(stage: Any, records: list, sync: Callable[[], None] | None = None) -> None:
    """Wrap one PipelineStage's compute calls so each records (action, start, end).

    On a GPU the calls only queue kernels: `sync` (torch.cuda.synchronize) makes each
    record end when the work has really finished.
    """
    fwd, bwd, wgt = (
        stage.forward_one_chunk,
        stage.backward_one_chunk,
        stage.backward_weight_one_chunk,
    )
    s = stage.stage_index

    def end() -> int:
        if sync is not None:
            sync()
        return time.time_ns()

    def forward_one_chunk(chunk, *args, **kwargs):
        t0 = time.time_ns()
        with record_function(f"{s}F{chunk}"):  # the same name on torch.profiler's rows
            out = fwd(chunk, *args, **kwargs)
        records.append((f"{s}F{chunk}", None, t0, end()))
        return out

    def backward_one_chunk(chunk, *args, **kwargs):
        t0 = time.time_ns()
        kind = "B" if kwargs.get("full_backward", True) else "I"
        with record_function(f"{s}{kind}{chunk}"):
            out = bwd(chunk, *args, **kwargs)
        records.append((f"{s}{kind}{chunk}", None, t0, end()))
        return out

    def backward_weight_one_chunk(chunk, *args, **kwargs):
        t0 = time.time_ns()
        with record_function(f"{s}W{chunk}"):
            out = wgt(chunk, *args, **kwargs)
        records.append((f"{s}W{chunk}", None, t0, end()))
        return out

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk


def torch_schedule(stages: list, kind: str, microbatches: int, loss, csv: str | None = None):
    """PyTorch's schedule object driving this rank's `stages` (PipelineStage objects).

    `kind` is "csv" (PyTorch's runtime loads the compute-only CSV file `csv`: any course
    schedule, or the learner's own) or a schedule of `PIPELINES` (PyTorch's own class,
    named in the registry).
    """
    from torch.distributed.pipelining import schedules as torch_schedules

    if kind == "csv":
        if csv is None:
            raise CourseInputError("a CSV schedule needs its file: csv=PATH")
        sched = torch_schedules._PipelineScheduleRuntime(
            stages, n_microbatches=microbatches, loss_fn=loss
        )
        sched._load_csv(csv, format="compute_only")
        return sched
    if SCHEDULES[kind].pytorch is None:
        raise CourseInputError(
            f"schedule must be one of {', '.join(PIPELINES)} or 'csv', got {kind!r}"
        )
    cls = getattr(torch_schedules, _pytorch(kind))
    single = issubclass(cls, torch_schedules.PipelineScheduleSingle)
    return cls(stages[0] if single else stages, n_microbatches=microbatches, loss_fn=loss)


def _pipeline_worker(rank: int, world: int, payload: dict) -> dict:
    """One pipeline rank: build the stages it owns (stage s on rank s % world), run a step."""
    from torch.distributed.pipelining import PipelineStage

    setup, kind, m, num_stages = payload["setup"], payload["kind"], payload["m"], payload["stages"]
    pieces = split_stages(build_model(setup), setup, num_stages)
    placement = payload["placement"]  # stage -> rank, as the course schedule places them
    mine = [s for s in range(num_stages) if placement[s] == rank]
    records: list[tuple] = []
    stages = []
    for s in mine:
        stage = PipelineStage(pieces[s], s, num_stages, torch.device("cpu"))
        record_stage_times(stage, records)
        stages.append(stage)
    sched = torch_schedule(stages, kind, m, loss_fn(setup), payload.get("csv"))
    x, y = make_batch(setup)
    losses: list = []
    kwargs: dict[str, Any] = {}
    args: tuple[torch.Tensor, ...]
    if 0 in mine:
        args = (x,)
    else:
        args = ()
    if num_stages - 1 in mine:
        kwargs = {"target": y, "losses": losses}
    sched.step(*args, **kwargs)
    return {
        "records": records,
        "losses": [float(v.detach()) for v in losses],
        "grads": {s: gradient_arrays(pieces[s]) for s in mine},
    }


def reference_pipeline(setup: Setup, num_stages: int) -> tuple[float, dict]:
    """Full batch on one process: the loss and each stage's gradients."""
    pieces = split_stages(build_model(setup), setup, num_stages)
    x, y = make_batch(setup)
    h = x
    for piece in pieces:
        h = piece(h)
    loss = loss_fn(setup)(h, y)
    loss.backward()
    return loss.item(), {s: gradient_arrays(p) for s, p in enumerate(pieces)}


def executor_pipeline(setup: Setup, schedule: Schedule) -> tuple[float, dict, Timeline]:
    """The course's thread executor on the same model, batch and schedule, on the wall clock
    (as the processes it is compared with are timed)."""
    from course_utils.pipeline.executor import PipelineExecutor

    pieces = split_stages(build_model(setup), setup, schedule.stages)
    x, y = make_batch(setup)
    devices, loss = schedule.num_devices, loss_fn(setup)
    with PipelineExecutor(pieces, devices, loss_fn=loss, clock="wall") as ex:
        result = ex.step(schedule, x, y)
    loss = float(result.loss)
    return loss, {s: gradient_arrays(p) for s, p in enumerate(pieces)}, result.timeline


def course_schedule(name: str, workers: int, microbatches: int) -> Schedule:
    """The course's own schedule `name` on `workers` ranks (2 chunks each where it takes them)."""
    chunks = 2 if SCHEDULES[name].uses_chunks else 1
    return make_schedule(name, workers, microbatches, chunks)


def run_pipeline(
    schedule: str | Schedule = BASELINE,
    workers: int | None = None,
    microbatches: int = 4,
    batch: int = 8,
    model: str | None = None,
    seed: int = 0,
    port: int | None = None,
    timeout: float = 60.0,
    compare_executor: bool = True,
    cluster: Cluster | None = None,
) -> DistributedResult:
    """One training step of a pipeline on `workers` processes with PyTorch's pipelining.

    `schedule` is the name of a schedule PyTorch has a class for (`PIPELINES`: run as that
    class, with 2 stages per rank where the schedule takes chunks), or a course `Schedule`:
    that one is written to PyTorch's CSV format and run by `_PipelineScheduleRuntime`.
    Losses and gradients are compared with one process on the full batch, and with the
    course's thread executor running the matching course schedule.
    Pass a started `Cluster` to reuse its processes; otherwise a fresh one is spawned.
    """
    workers = validation.integer(worker_count(workers, cluster), "workers", 2, MAX_WORKERS)
    model = checked_model(model)
    batch = validation.integer(batch, "batch", 1, validation.MAX_PROCESS_BATCH[model])
    setup = Setup(model, batch, seed)
    payload: dict = {"setup": setup}
    csv_file = None
    if isinstance(schedule, Schedule):
        if schedule.num_devices != workers:
            raise CourseInputError(
                f"workers must equal the schedule's devices ({schedule.num_devices}), got {workers}"
            )
        from course_utils.pipeline.export import pytorch_microbatches, runnable_problem

        layers = len(build_model(setup).layers())
        if problem := runnable_problem(schedule, MAX_MICROBATCHES, layers):
            raise CourseInputError(f"schedule {schedule.name!r}: {problem}")
        payload.update(kind="csv", stages=schedule.stages)
        microbatches = pytorch_microbatches(schedule)
        course = schedule
        name = f"{schedule.name} (CSV) on {workers} processes"
    elif schedule in PIPELINES:
        course = course_schedule(schedule, workers, microbatches)
        payload.update(kind=schedule, stages=course.stages)
        name = f"PyTorch {schedule} on {workers} processes"
    else:
        raise CourseInputError(
            f"schedule must be one of {', '.join(PIPELINES)} or a course Schedule, got {schedule!r}"
        )
    microbatches = validation.integer(microbatches, "microbatches", 1, MAX_MICROBATCHES)
    if batch % microbatches:
        raise CourseInputError(
            f"batch must be a multiple of microbatches ({microbatches}), got {batch}"
        )
    payload["m"] = microbatches
    payload["placement"] = course.device_of_stage()
    # Stop before any process starts when this torch cannot run it (course_utils.versions).
    require("_PipelineScheduleRuntime" if isinstance(schedule, Schedule) else _pytorch(schedule))
    require("pipelines on gloo")
    if v_placement(payload["placement"]):
        require("V placement on gloo")
    # Everything is checked: the CSV file PyTorch's runtime reads, removed whatever happens.
    try:
        if isinstance(schedule, Schedule):
            from course_utils.pipeline.export import to_pytorch_csv

            csv_file = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
            csv_file.close()
            to_pytorch_csv(schedule, csv_file.name)
            payload["csv"] = csv_file.name
        start = time.perf_counter()
        outs = run_job(cluster, _pipeline_worker, workers, payload, port, timeout)
        seconds = time.perf_counter() - start
    finally:
        if csv_file is not None:
            Path(csv_file.name).unlink(missing_ok=True)
    mb_losses = [v for out in outs for v in out["losses"]]
    loss = sum(mb_losses) / len(mb_losses)
    grads = {s: g for out in outs for s, g in out["grads"].items()}
    ref_loss, ref_grads = reference_pipeline(setup, payload["stages"])
    max_grad_diff = largest(max_abs_diff(grads[s], ref_grads[s]) for s in ref_grads)
    extra: dict = {"schedule": schedule if isinstance(schedule, str) else schedule.name}
    if compare_executor:
        ex_loss, ex_grads, ex_timeline = executor_pipeline(setup, course)
        extra["executor_loss"] = ex_loss
        extra["executor_max_grad_diff"] = largest(
            max_abs_diff(grads[s], ex_grads[s]) for s in ex_grads
        )
        extra["executor_timeline"] = ex_timeline
    timeline = measured_timeline([out["records"] for out in outs], name, {"model": setup.model})
    timeline.stages, timeline.microbatches = payload["stages"], microbatches
    timeline.chunks = payload["stages"] // workers
    return DistributedResult(
        workers, [loss], [ref_loss], max_grad_diff, seconds, timeline, extra=extra
    )
