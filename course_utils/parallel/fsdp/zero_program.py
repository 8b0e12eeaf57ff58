"""ZeRO's sharded optimizer step (stages 1 and 2) written as the program every rank runs.

ZeRO-1 and -2 (Rajbhandari et al. 2019, arXiv 1910.02054) keep the parameters whole on every
rank, as plain data parallelism does, but shard what the optimizer needs: each rank
reduce-scatters the gradient (keeping only its slice of the batch's gradient: stage 2),
updates only its shard of the parameters with only its shard of the optimizer state (stage
1), and all-gathers the updated shards so that every rank holds the whole new parameters
for the next forward. (Exercise 8.6, FSDP, shards the parameters too: stage 3.)

`run_zero_program(program, model, workers, inputs, targets, steps)` runs `program(ctx)` once
per step on every rank. Rank r's ctx holds, besides `rank`, `world` and `comm`:
- `ctx.flat`: the model's parameters as one flat vector of `numel` numbers, not padded, the
  same on every rank; the program leaves the new parameters there (same length);
- `ctx.gradient()`: the gradient of the rank's mean loss on its slice of the batch at the
  parameters `ctx.flat`, as one flat vector like it;
- `ctx.state`: a dict, empty at the first step and kept from step to step: the rank's
  optimizer state;
- `ctx.lr`, `ctx.momentum`: SGD with momentum, `m = momentum * m + g; p -= lr * m`.

The run is watched (`threads.watched`): the bytes each collective sent. After it,
`flats(run)` is each rank's `ctx.flat` after every step and `state_numels(run)` the numbers
each rank's `ctx.state` held at the end; `one_device_flats` what one device's steps give.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call

from course_utils import validation
from course_utils.errors import CourseInputError
from course_utils.models import loss_fn
from course_utils.threads.ranks import Rank
from course_utils.threads.watched import Watch, WatchedRun, run_watched

LR, MOMENTUM = 0.1, 0.9


def flatten(model: nn.Module) -> torch.Tensor:
    """The model's parameters as one flat float32 vector (a copy), in `parameters()` order."""
    return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])


def gradient_at(model: nn.Module, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor):
    """The gradient of the mean loss of `model` on (x, y), its parameters read from `flat`."""
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    leaf = flat.detach().clone().requires_grad_()
    views, offset = {}, 0
    for name, shape in zip(names, shapes, strict=True):
        views[name] = leaf[offset : offset + shape.numel()].view(shape)
        offset += shape.numel()
    loss_fn(functional_call(model, views, (x,)), y).backward()
    return leaf.grad


def run_zero_program(
    program: Callable[[Rank], object],
    model: nn.Module,
    workers: int,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    steps: int = 2,
    raise_failure: bool = True,
) -> WatchedRun:
    """Run `steps` steps of `program(ctx)` on `workers` ranks (see the module docstring);
    each rank's slice of the batch is an equal share of `inputs`. `model` is not changed."""
    validation.integer(workers, "workers", 1, 16)
    validation.integer(steps, "steps", 1, 8)
    if len(inputs) % workers:
        raise CourseInputError(f"the batch ({len(inputs)} rows) must split evenly over workers")
    start, numel = flatten(model), sum(p.numel() for p in model.parameters())
    xs, ys = inputs.chunk(workers), targets.chunk(workers)

    replicas = [copy.deepcopy(model) for _ in range(workers)]  # functional_call swaps its
    # parameters in and out: one module per rank thread

    def setup(ctx: Rank, watch: Watch) -> None:
        ctx.flat, ctx.state = start.clone(), {}  # type: ignore[attr-defined]
        ctx.lr, ctx.momentum, ctx.flats = LR, MOMENTUM, []  # type: ignore[attr-defined]

        def gradient() -> torch.Tensor:
            flat = ctx.flat  # type: ignore[attr-defined]
            if not isinstance(flat, torch.Tensor) or tuple(flat.shape) != (numel,):
                got = tuple(flat.shape) if isinstance(flat, torch.Tensor) else type(flat).__name__
                raise CourseInputError(
                    f"ctx.flat must be the model's {numel} parameters as one vector, got "
                    f"{got}: cut the padding off after the all-gather"
                )
            return gradient_at(replicas[ctx.rank], flat, xs[ctx.rank], ys[ctx.rank])

        ctx.gradient = gradient  # type: ignore[attr-defined]

    def steps_of(ctx: Rank) -> None:
        for _ in range(steps):
            program(ctx)
            flat = ctx.flat  # type: ignore[attr-defined]
            kept = flat.detach().clone() if isinstance(flat, torch.Tensor) else None
            ctx.flats.append(kept)  # type: ignore[attr-defined]

    return run_watched(steps_of, workers, setup, raise_failure=raise_failure)


def flats(run: WatchedRun) -> list[list[torch.Tensor | None]]:
    """Each rank's `ctx.flat` after each of its steps."""
    return [list(w.ctx.flats) for w in run.watches]  # type: ignore[attr-defined]


def state_numels(run: WatchedRun) -> list[int]:
    """The numbers each rank's optimizer state (`ctx.state`) held at the end of its run."""

    def numels(value) -> int:
        if isinstance(value, torch.Tensor):
            return value.numel()
        if isinstance(value, dict):
            return sum(numels(v) for v in value.values())
        if isinstance(value, list | tuple):
            return sum(numels(v) for v in value)
        return 0

    return [numels(getattr(w.ctx, "state", None)) for w in run.watches]


def one_device_flats(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, steps: int = 2
) -> list[torch.Tensor]:
    """The parameters after each of `steps` SGD-with-momentum steps on one device, whole batch."""
    flat, m, out = flatten(model), None, []
    for _ in range(steps):
        g = gradient_at(model, flat, inputs, targets)
        m = g if m is None else MOMENTUM * m + g
        flat = flat - LR * m
        out.append(flat)
    return out
