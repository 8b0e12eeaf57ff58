"""The course's model laid out on a DeviceMesh, one way per `--parallel` mode.

    ddp            a full copy per rank (DistributedDataParallel), the batch split over all
    fsdp           FSDP2 `fully_shard` over all ranks: each keeps 1/N of every parameter
    pipeline       `torch.distributed.pipelining`: the model cut into stages, one pipeline
                   rank per process, any schedule of the course (or the learner's CSV)
    fsdp+pipeline  a 2-D mesh ("pp", "dp"): pipeline ranks across nodes, and each stage
                   sharded with FSDP2 over the processes of its node (lesson 12's layout:
                   the chatty collectives stay inside a node, only activations cross nodes)

As in torchtitan, a pipeline rank's part is the whole model with the layers of other
stages replaced by `nn.Identity`, so its parameters keep their names in the whole model
(`blocks.2.attn.qkv.weight`): checkpoints and comparisons need no renaming. Each part has
its own optimizer (`optimizer`). `Parallel.step(i)` trains step i on the course's batch of step i,
and every rank records when it computed what, for a Gantt chart of the real processes.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from course_utils import models
from course_utils.actions import Schedule
from course_utils.distributed.fsdp import shard_model
from course_utils.distributed.job import MOMENTUM
from course_utils.distributed.setup import Setup, build_model, loss_fn, make_batch


def optimizer(params, lr: float) -> torch.optim.Optimizer:
    """SGD with momentum: it has a state to checkpoint (one buffer per parameter), and it
    stays within rounding of one process. Adam would not: it divides each step by the
    gradient's size, so a gradient that is zero in exact arithmetic (the attention's key
    bias: softmax ignores a shift shared by all keys) turns rounding noise into full-size
    steps, and two correct runs drift apart by ~1e-6 per step."""
    return torch.optim.SGD(params, lr=lr, momentum=MOMENTUM)


@dataclass
class Parallel:
    """What one rank trains: its parts (checkpointed), their optimizers, and a step."""

    parts: list[nn.Module]
    optimizers: list[torch.optim.Optimizer]
    train_step: Callable[[int], tuple[float, int]]  # step -> (sum of losses known here, count)
    records: list[tuple] = field(default_factory=list)  # (action, label, start_ns, end_ns)

    def step(self, step: int) -> tuple[float, int]:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        loss = self.train_step(step)
        for opt in self.optimizers:
            opt.step()
        return loss

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter this rank holds, whole and on the CPU, by its name in the model.

        A sharded parameter is put together from its shards: a collective over its mesh, so
        every rank calls this at the same point.
        """
        from torch.distributed.tensor import DTensor

        out = {}
        for part in self.parts:
            inner = getattr(part, "module", part)  # DDP keeps the model as .module
            for name, p in inner.named_parameters():
                full = p.full_tensor() if isinstance(p, DTensor) else p
                out[name] = full.detach().cpu().clone()
        return out


def batch_share(setup: Setup, step: int, index: int, count: int, device: torch.device):
    """Share `index` of `count` equal shares of the course's batch for training step `step`
    (counted from 1; the one-process reference trains on make_batch(setup, 0), (.., 1), ...)."""
    x, y = make_batch(setup, step - 1)
    size = setup.batch // count
    share = slice(index * size, (index + 1) * size)
    return x[share].to(device), y[share].to(device)


def _sync(device: torch.device) -> Callable[[], None] | None:
    """On a GPU, calls only queue kernels: wait for them before reading the clock."""
    return torch.cuda.synchronize if device.type == "cuda" else None


def _timed_step(model, setup, rank, world, device, records) -> Callable[[int], tuple[float, int]]:
    """Forward and backward of this rank's share, each recorded as an action."""
    criterion, sync = loss_fn(setup), _sync(device)

    def train_step(step: int) -> tuple[float, int]:
        x, y = batch_share(setup, step, rank, world, device)
        t0 = time.time_ns()
        loss = criterion(model(x), y)
        t1 = time.time_ns()
        loss.backward()  # DDP all-reduces and FSDP reduce-scatters gradients in here
        if sync:
            sync()
        t2 = time.time_ns()
        records.extend([(f"0F{step}", None, t0, t1), (f"0B{step}", None, t1, t2)])
        return loss.item(), 1

    return train_step


def ddp(setup: Setup, lr: float, device: torch.device) -> Parallel:
    """DistributedDataParallel over every rank (Li et al. 2020, arXiv 2006.15704)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from course_utils.distributed.ddp import timed_allreduce

    rank, world = dist.get_rank(), dist.get_world_size()
    records: list[tuple] = []
    ids = [device.index] if device.type == "cuda" else None
    # Small buckets: several all-reduces overlap one backward pass, as on a big model.
    model = DDP(build_model(setup).to(device), device_ids=ids, bucket_cap_mb=0.05)
    model.register_comm_hook(None, timed_allreduce(records, world))
    opt = optimizer(model.parameters(), lr)
    return Parallel(
        [model], [opt], _timed_step(model, setup, rank, world, device, records), records
    )


def fsdp(setup: Setup, lr: float, device: torch.device, mesh) -> Parallel:
    """FSDP2 over `mesh` (ZeRO-3; Zhao et al. 2023, arXiv 2304.11277): every layer a unit."""
    model = shard_model(build_model(setup).to(device), mesh=mesh)
    opt = optimizer(model.parameters(), lr)
    records: list[tuple] = []
    rank, world = mesh.get_local_rank(), mesh.size()
    return Parallel(
        [model], [opt], _timed_step(model, setup, rank, world, device, records), records
    )


def model_part(setup: Setup, first: int, last: int) -> nn.Module:
    """The whole model with only layers first..last-1 (of `model.layers()`) kept: every
    other layer is an nn.Identity, so the part runs just its layers and its parameters
    keep their names in the whole model."""
    model = build_model(setup)
    name_of = {id(m): name for name, m in model.named_modules()}
    for i, layer in enumerate(model.layers()):
        if not first <= i < last:
            parent, _, child = name_of[id(layer)].rpartition(".")
            setattr(model.get_submodule(parent), child, nn.Identity())
    return model


def stage_layers(setup: Setup, num_stages: int) -> list[tuple[int, int]]:
    """Each stage's layer range, cut as everywhere in the course (balanced parameters)."""
    return [stage.layer_range for stage in models.partition(build_model(setup), num_stages)]


@dataclass(frozen=True)
class PipelinePlan:
    """Which schedule runs, on how many stages, and which pipeline rank owns each stage."""

    kind: str  # a schedule of PIPELINES (PyTorch's class), or "csv"
    stages: int
    microbatches: int
    placement: dict[int, int]  # stage -> pipeline rank
    csv: str | None = None  # the learner's compute-only CSV file (kind "csv") ...
    course: Schedule | None = None  # ... or a course schedule, written to one for PyTorch


def pipeline(
    setup: Setup, lr: float, device: torch.device, plan: PipelinePlan, pp_mesh, dp_mesh=None
) -> Parallel:
    """This rank's stages of a pipeline over `pp_mesh`, each sharded over `dp_mesh` if given.

    With FSDP each stage keeps its gathered parameters from forward to backward
    (`reshard_after_forward=False`, torchtitan's choice for pipelines): otherwise every
    micro-batch's backward would gather them again.
    """
    from torch.distributed.pipelining import PipelineStage

    from course_utils.distributed.pipelining import record_stage_times, torch_schedule
    from course_utils.pipeline.export import to_pytorch_csv

    pp_rank = pp_mesh.get_local_rank()
    dp_rank, dp_size = (dp_mesh.get_local_rank(), dp_mesh.size()) if dp_mesh else (0, 1)
    ranges = stage_layers(setup, plan.stages)
    mine = [s for s in range(plan.stages) if plan.placement[s] == pp_rank]
    records: list[tuple] = []
    parts, stages = [], []
    for s in mine:
        part = model_part(setup, *ranges[s]).to(device)
        if dp_mesh is not None:
            shard_model(part, mesh=dp_mesh, reshard_after_forward=False)
        stage = PipelineStage(part, s, plan.stages, device, group=pp_mesh.get_group())
        record_stage_times(stage, records, _sync(device))
        parts.append(part)
        stages.append(stage)
    if plan.course is not None:  # PyTorch's runtime reads a course schedule from a CSV file
        with tempfile.TemporaryDirectory() as tmp:
            path = to_pytorch_csv(plan.course, Path(tmp) / "schedule.csv")
            sched = torch_schedule(stages, "csv", plan.microbatches, loss_fn(setup), str(path))
    else:
        sched = torch_schedule(stages, plan.kind, plan.microbatches, loss_fn(setup), plan.csv)
    first, last = 0 in mine, plan.stages - 1 in mine

    def train_step(step: int) -> tuple[float, int]:
        x, y = batch_share(setup, step, dp_rank, dp_size, device)
        losses: list[torch.Tensor] = []
        args = (x,) if first else ()
        kwargs = {"target": y, "losses": losses} if last else {}
        sched.step(*args, **kwargs)
        if not last:
            return 0.0, 0
        return sum(float(v.detach()) for v in losses) / len(losses), 1

    optimizers = [optimizer(part.parameters(), lr) for part in parts]
    return Parallel(parts, optimizers, train_step, records)
