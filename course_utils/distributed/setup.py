"""What every comparison on processes shares: the identical model and batch on every rank,
the single-process reference's bookkeeping, and the result a comparison returns."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from course_utils import models, validation
from course_utils.actions import Action
from course_utils.distributed.cluster import MAX_WORKERS, Cluster, worker_count
from course_utils.distributed.job import MODELS
from course_utils.errors import CourseInputError, WorkerError
from course_utils.timeline import Event, Timeline


@dataclass(frozen=True)
class Setup:
    """Everything every process needs to build the identical model and batch.

    "gpt" is the course's TinyGPT (course_utils.models), shrunk so a step on two
    processes takes milliseconds; "mlp" is the course's MLP on a fixed random task.
    """

    model: str = "gpt"
    batch: int = 8
    seed: int = 0
    block_size: int = 32
    d_model: int = 64
    n_layer: int = 4


@functools.lru_cache(maxsize=4)
def _dataset(block_size: int):
    """The course's character dataset (loaded once per process)."""
    return models.CharDataset(block_size=block_size)


def build_model(setup: Setup) -> models.MLP | models.TinyGPT:
    """The same weights on every call with the same setup (seeded)."""
    torch.manual_seed(setup.seed)
    if setup.model == "gpt":
        vocab = _dataset(setup.block_size).vocab_size
        cfg = models.GPTConfig(
            vocab_size=vocab,
            block_size=setup.block_size,
            n_layer=setup.n_layer,
            n_head=4,
            d_model=setup.d_model,
        )
        return models.TinyGPT(cfg)
    return models.MLP()


def make_batch(setup: Setup, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets for training step `step` (deterministic from seed and step)."""
    g = torch.Generator().manual_seed(1000 * setup.seed + step)
    if setup.model == "gpt":
        return _dataset(setup.block_size).batch(setup.batch, generator=g)
    x = torch.randn(setup.batch, 32, generator=g)
    return x, torch.randint(10, (setup.batch,), generator=g)


def loss_fn(setup: Setup):
    """Mean cross-entropy over every token (or row): the course's loss_fn."""
    return models.loss_fn


def split_stages(
    model: models.MLP | models.TinyGPT, setup: Setup, num_stages: int
) -> list[nn.Module]:
    """The model cut into `num_stages` consecutive stages (course_utils.models.partition)."""
    return list(models.partition(model, num_stages))


def one_process_training(
    setup: Setup,
    steps: int,
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
    grads_of: int | None = None,
) -> tuple[list[float], list[dict], dict]:
    """The training every comparison checks against: one process, the full batch of each step.

    Returns the losses, the gradients (numpy) of the first `grads_of` steps (None: every step;
    each is a copy of the model: 1,000 steps of the GPT would hold 0.8 GB) and the final
    parameters.
    """
    model = build_model(setup)
    opt = optimizer(model.parameters())
    criterion = loss_fn(setup)
    losses, grads = [], []
    for step in range(steps):
        x, y = make_batch(setup, step)
        opt.zero_grad(set_to_none=True)
        loss = criterion(model(x), y)
        loss.backward()
        losses.append(loss.item())
        if grads_of is None or step < grads_of:
            grads.append(gradient_arrays(model))
        opt.step()
    return losses, grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def gradient_arrays(module: nn.Module) -> dict:
    """Each parameter's gradient, by name, as a numpy copy (after the backward pass)."""
    grads = {}
    for n, p in module.named_parameters():
        assert p.grad is not None, f"{n} has no gradient"  # called after the backward pass
        grads[n] = p.grad.detach().clone().numpy()
    return grads


def largest(values: Iterable[float]) -> float:
    """The largest of `values` (0.0 for none), or NaN if any is NaN. Python's `max` keeps the
    first value a NaN is compared with, so a run whose gradients became NaN would be reported
    as equal to its reference ("difference 0.0")."""
    out = 0.0
    for value in values:
        if math.isnan(value):
            return math.nan
        out = max(out, value)
    return out


def max_abs_diff(a: dict, b: dict) -> float:
    """Largest |a - b| over arrays with the same names (0 for none, NaN if any is NaN); names
    must match."""
    if a.keys() != b.keys():
        raise WorkerError(f"parameter names differ: {sorted(a)[:3]} vs {sorted(b)[:3]}")
    return largest(float(abs(a[k] - b[k]).max()) for k in a)


def measured_timeline(per_rank: list[list[tuple]], name: str, meta: dict) -> Timeline:
    """Turn each rank's (action, label, start_ns, end_ns) records into one measured Timeline."""
    t0 = min((rec[2] for recs in per_rank for rec in recs), default=0)
    events = [
        Event(rank, Action.parse(action), (s - t0) / 1e9, (e - t0) / 1e9, label)
        for rank, recs in enumerate(per_rank)
        for action, label, s, e in recs
    ]
    return Timeline(events, len(per_rank), name=name, source="measured", unit="s", meta=meta)


@dataclass
class DistributedResult:
    """What a distributed run measured, next to its single-process reference."""

    workers: int
    losses: list[float]  # per step, averaged over ranks (equal shards -> full-batch loss)
    reference_losses: list[float]
    max_grad_diff: float  # largest |grad_distributed - grad_reference| over all steps/params
    seconds: float  # wall time of the whole run: spawning, rendezvous, work, shutdown
    timeline: Timeline
    extra: dict = field(default_factory=dict)

    @property
    def max_loss_diff(self) -> float:
        pairs = zip(self.losses, self.reference_losses, strict=True)
        return largest(abs(a - b) for a, b in pairs)

    def to_dict(self) -> dict:
        return {
            "workers": self.workers,
            "max_grad_diff": self.max_grad_diff,
            "seconds": self.seconds,
        }


def checked_model(model: str | None) -> str:
    """`model` if it is one of `MODELS` ("gpt" for None), else a one-line error."""
    return validation.choice("gpt" if model is None else model, "model", MODELS)


def data_parallel_setup(
    workers: int | None,
    cluster: Cluster | None,
    steps: int,
    batch: int,
    model: str | None,
    seed: int,
) -> tuple[int, int, Setup]:
    """(workers, steps, setup) of a data-parallel comparison (DDP, FSDP), checked: every
    rank takes `batch / workers` samples, so the batch must split evenly."""
    workers = validation.integer(worker_count(workers, cluster), "workers", 1, MAX_WORKERS)
    steps = validation.integer(steps, "steps", 1, validation.MAX_COMPARED_STEPS)
    model = checked_model(model)
    batch = validation.integer(batch, "batch", 1, validation.MAX_PROCESS_BATCH[model])
    if batch % workers:
        raise CourseInputError(f"batch must be a multiple of workers ({workers}), got {batch}")
    return workers, steps, Setup(model, batch, seed)
