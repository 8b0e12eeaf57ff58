"""DistributedDataParallel on real processes, checked against one process and the threads.

Each rank holds a full copy of the model and `batch / workers` samples; DDP averages the
gradients with all-reduce during the backward pass (Li et al. 2020, arXiv 2006.15704), so
every rank must end up with exactly the gradient of the full batch on one process.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from course_utils.distributed.cluster import Cluster, run_job
from course_utils.distributed.setup import (
    DistributedResult,
    Setup,
    build_model,
    data_parallel_setup,
    gradient_arrays,
    largest,
    loss_fn,
    make_batch,
    max_abs_diff,
    measured_timeline,
    one_process_training,
)


def timed_allreduce(records: list, world: int):
    """A DDP communication hook doing what DDP's default does (average each gradient bucket
    with one all-reduce), recording when each bucket's all-reduce started and finished."""

    def hook(state, bucket):
        start = time.time_ns()
        buf = bucket.buffer().div_(world)
        fut = dist.all_reduce(buf, async_op=True).get_future()

        def done(f):
            records.append(("0REDUCE_GRAD", f"all-reduce {bucket.index()}", start, time.time_ns()))
            return f.value()[0]

        return fut.then(done)

    return hook


def _ddp_worker(rank: int, world: int, payload: dict) -> dict:
    """One DDP rank: shard of the batch, forward, backward with all-reduce, SGD step."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    setup, steps = payload["setup"], payload["steps"]
    model = build_model(setup)
    records: list[tuple] = []
    # Small buckets so several all-reduces happen during one backward pass (as in real
    # DDP on a big model), which the timeline then shows overlapping the backward.
    ddp = DDP(model, bucket_cap_mb=payload["bucket_mb"])
    ddp.register_comm_hook(None, timed_allreduce(records, world))
    opt = torch.optim.SGD(ddp.parameters(), lr=payload["lr"])
    criterion = loss_fn(setup)
    shard = setup.batch // world
    losses, grads = [], []
    for step in range(steps):
        x, y = make_batch(setup, step)
        x, y = x[rank * shard : (rank + 1) * shard], y[rank * shard : (rank + 1) * shard]
        opt.zero_grad(set_to_none=True)
        t0 = time.time_ns()
        loss = criterion(ddp(x), y)
        t1 = time.time_ns()
        loss.backward()  # DDP's hooks all-reduce gradient buckets while this runs
        t2 = time.time_ns()
        records += [(f"0F{step}", None, t0, t1), (f"0B{step}", None, t1, t2)]
        losses.append(loss.item())
        grads.append(gradient_arrays(model))
        opt.step()
    return {"losses": losses, "grads": grads, "records": records}


def reference_ddp(setup: Setup, steps: int = 1, lr: float = 0.1) -> tuple[list[float], list[dict]]:
    """The same training on one process with the full batch: losses and grads per step."""
    losses, grads, _ = one_process_training(
        setup, steps, lambda params: torch.optim.SGD(params, lr=lr)
    )
    return losses, grads


def threads_ddp(setup: Setup, workers: int, steps: int = 1, lr: float = 0.1):
    """The course's thread data parallelism on the same model and batches.

    Returns (losses, grads per step, timeline of the last step).
    """
    from course_utils.parallel.data_parallel import DataParallel, sgd

    losses, grads = [], []
    with DataParallel(build_model(setup), workers, loss_fn=loss_fn(setup), optimizer=sgd(lr)) as dp:
        for step in range(steps):
            result = dp.step(*make_batch(setup, step))
            losses.append(float(result.loss))
            grads.append(gradient_arrays(dp.replicas[0]))  # .grad holds the all-reduced gradient
    return losses, grads, result.timeline


def run_ddp(
    workers: int | None = None,
    steps: int = 1,
    batch: int = 8,
    model: str | None = None,
    seed: int = 0,
    lr: float = 0.1,
    bucket_mb: float = 0.05,
    port: int | None = None,
    timeout: float = 60.0,
    cluster: Cluster | None = None,
    compare_threads: bool = True,
) -> DistributedResult:
    """Train `steps` SGD steps with DistributedDataParallel on `workers` processes.

    Each rank holds a full copy of the model and `batch / workers` samples; DDP averages
    the gradients with all-reduce, so every rank must end up with exactly the gradient of
    the full batch on one process (Li et al., 2020, arXiv:2006.15704). We check that.
    With `compare_threads`, the course's thread `DataParallel` runs the same steps too.
    Pass a started `Cluster` to reuse its processes; otherwise a fresh one is spawned.
    """
    workers, steps, setup = data_parallel_setup(workers, cluster, steps, batch, model, seed)
    payload = {"setup": setup, "steps": steps, "lr": lr, "bucket_mb": bucket_mb}
    start = time.perf_counter()
    outs = run_job(cluster, _ddp_worker, workers, payload, port, timeout)
    seconds = time.perf_counter() - start
    ref_losses, ref_grads = reference_ddp(setup, steps, lr)
    max_grad_diff = largest(
        max_abs_diff(out["grads"][s], ref_grads[s]) for out in outs for s in range(steps)
    )
    losses = [sum(out["losses"][s] for out in outs) / workers for s in range(steps)]
    timeline = measured_timeline(
        [out["records"] for out in outs], f"DDP on {workers} processes", {"model": setup.model}
    )
    extra: dict = {}
    if compare_threads:
        th_losses, th_grads, th_timeline = threads_ddp(setup, workers, steps, lr)
        extra["threads_losses"] = th_losses
        extra["threads_max_grad_diff"] = largest(
            max_abs_diff(out["grads"][s], th_grads[s]) for out in outs for s in range(steps)
        )
        extra["threads_timeline"] = th_timeline
    return DistributedResult(workers, losses, ref_losses, max_grad_diff, seconds, timeline, extra)
