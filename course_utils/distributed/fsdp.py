"""FSDP2 (`torch.distributed.fsdp.fully_shard`) on real processes, checked against one
process and against the course's thread FSDP (`course_utils.parallel.fsdp`).

PyTorch's FSDP2 is ZeRO stage 3 (Zhao et al. 2023, arXiv 2304.11277): each rank keeps a
1/N shard of every parameter (a DTensor sharded on dimension 0), all-gathers a layer
before using it and reduce-scatters its gradient. Every layer with parameters becomes one
FSDP unit, as in the threads. Each rank trains on `batch / workers` samples with Adam;
FSDP2 averages the gradients over the ranks, so the gradients of the first step, put
together from the shards, must equal the full batch's on one process, and the parameters
after every step must equal one process's Adam steps (within float tolerance).
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch

from course_utils.distributed.cluster import Cluster, run_job
from course_utils.distributed.setup import (
    DistributedResult,
    Setup,
    build_model,
    data_parallel_setup,
    largest,
    loss_fn,
    make_batch,
    max_abs_diff,
    measured_timeline,
    one_process_training,
)
from course_utils.versions import require


def fsdp_units(model: Any) -> list[torch.nn.Module]:
    """The modules that become FSDP units: the layers that own parameters."""
    layers = model.layers() if hasattr(model, "layers") else list(model.children())
    return [m for m in layers if any(True for _ in m.parameters())]


def shard_model(model: Any, **options: Any) -> Any:
    """FSDP2 on every unit, then the whole model (its parameters become DTensors).

    FSDP2 warns, at every forward, that a unit returned a view: `nn.Linear` on a 3-D input
    reshapes its output. The warning is about an in-place op on that view skipping the
    all-gather; the course's models and losses apply none (the gradients are checked against
    one process), so the warning is silenced in this process, for that message alone."""
    from torch.distributed.fsdp import fully_shard

    warnings.filterwarnings(
        "ignore", message=r"FSDP2-wrapped module \(\w+\) returned a view", category=UserWarning
    )
    for unit in fsdp_units(model):
        fully_shard(unit, **options)
    return fully_shard(model, **options)


def _fsdp2_worker(rank: int, world: int, payload: dict) -> dict:
    """One FSDP2 rank: shard the model, train on its slice of each batch, return full views."""
    setup, steps, lr = payload["setup"], payload["steps"], payload["lr"]
    model: Any = shard_model(build_model(setup))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    criterion = loss_fn(setup)
    shard = setup.batch // world
    held = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    losses, records, first_grads = [], [], {}
    for step in range(steps):
        x, y = make_batch(setup, step)
        x, y = x[rank * shard : (rank + 1) * shard], y[rank * shard : (rank + 1) * shard]
        opt.zero_grad(set_to_none=True)
        t0 = time.time_ns()
        loss = criterion(model(x), y)  # each unit's all-gather runs in its pre-forward hook
        t1 = time.time_ns()
        loss.backward()  # ... and its reduce-scatter after its backward
        t2 = time.time_ns()
        records += [(f"0F{step}", None, t0, t1), (f"0B{step}", None, t1, t2)]
        losses.append(loss.item())
        if step == 0:
            first_grads = {
                n: p.grad.full_tensor().detach().numpy() for n, p in model.named_parameters()
            }
        opt.step()
    params = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
    return {
        "losses": losses,
        "grads": first_grads,
        "params": params,
        "held_bytes": held,
        "records": records,
    }


def reference_fsdp(setup: Setup, steps: int, lr: float) -> tuple[list[float], dict, dict]:
    """One process, full batches, Adam: (losses, first step's gradients, final parameters)."""
    losses, grads, params = one_process_training(
        setup, steps, lambda ps: torch.optim.Adam(ps, lr=lr), grads_of=1
    )
    return losses, grads[0], params


def threads_fsdp(setup: Setup, workers: int, steps: int, lr: float) -> list[torch.Tensor]:
    """The course's thread FSDP (ZeRO-3) on the same batches: each layer's flat parameters."""
    from course_utils.parallel.fsdp import ShardedDataParallel

    with ShardedDataParallel(build_model(setup), workers, stage=3, lr=lr) as fsdp:
        for step in range(steps):
            fsdp.step(*make_batch(setup, step))
        return fsdp.full_parameters()


def _flat_per_unit(setup: Setup, params: dict) -> list[torch.Tensor]:
    """Named full parameters regrouped as the threads keep them: one flat vector per unit."""
    model = build_model(setup)
    names = {id(p): n for n, p in model.named_parameters()}
    return [
        torch.cat([params[names[id(p)]].flatten() for p in unit.parameters()])
        for unit in fsdp_units(model)
    ]


def run_fsdp(
    workers: int | None = None,
    steps: int = 2,
    batch: int = 8,
    model: str | None = "mlp",
    seed: int = 0,
    lr: float = 1e-3,
    port: int | None = None,
    timeout: float = 60.0,
    cluster: Cluster | None = None,
) -> DistributedResult:
    """Train `steps` Adam steps with FSDP2 `fully_shard` on `workers` processes.

    `max_grad_diff` compares the first step's gradients (gathered from the shards) with one
    process; `extra` holds the largest parameter difference after the last step against
    one process (`max_param_diff`) and against the threads' ZeRO-3 (`threads_max_param_diff`,
    MLP only: the threads need a stack of layers without buffers), and the parameter bytes
    each rank holds (`held_bytes`) beside the whole model's (`model_bytes`).
    """
    workers, steps, setup = data_parallel_setup(workers, cluster, steps, batch, model, seed)
    require("fully_shard")
    payload = {"setup": setup, "steps": steps, "lr": lr}
    start = time.perf_counter()
    outs = run_job(cluster, _fsdp2_worker, workers, payload, port, timeout)
    seconds = time.perf_counter() - start
    ref_losses, ref_grads, ref_params = reference_fsdp(setup, steps, lr)
    losses = [sum(out["losses"][s] for out in outs) / workers for s in range(steps)]
    timeline = measured_timeline(
        [out["records"] for out in outs], f"FSDP2 on {workers} processes", {"model": setup.model}
    )
    extra: dict = {
        "max_param_diff": largest(max_abs_diff(out["params"], ref_params) for out in outs),
        "held_bytes": [out["held_bytes"] for out in outs],
        "model_bytes": sum(p.numel() * p.element_size() for p in ref_params.values()),
    }
    if setup.model == "mlp":
        mine = _flat_per_unit(setup, outs[0]["params"])
        theirs = threads_fsdp(setup, workers, steps, lr)
        extra["threads_max_param_diff"] = largest(
            (a - b).abs().max().item() for a, b in zip(mine, theirs, strict=True)
        )
    max_grad_diff = largest(max_abs_diff(out["grads"], ref_grads) for out in outs)
    return DistributedResult(workers, losses, ref_losses, max_grad_diff, seconds, timeline, extra)
