"""An FSDP step written as a per-rank program, run on the course's devices and watched.

`ShardedDataParallel` runs the course's own ZeRO-3 step; here the step is a program of one's
own, the program every rank runs (`threads.ranks`), as a learner writes it:

    def fsdp_step(ctx):
        full = ctx.comm.all_gather(ctx.shards[0])   # layer 0, whole, from every rank's shard
        x = ctx.layer(0, full, ctx.inputs[ctx.rank])
        del full                                    # free it: only the shard stays
        ...

    run = run_fsdp_program(fsdp_step, model, workers=2, inputs=x, targets=y)

Each rank's ctx holds, besides `rank`, `world` and `comm`:
- `ctx.shards[i]`: its shard of layer i (`FlatLayout`: the layer's parameters as one flat
  vector, padded with zeros to a multiple of N, cut into N equal slices; rank r holds slice r);
- `ctx.layer(i, flat, x)`: layer i computed on `x` with its parameters read from `flat`, the
  layer's whole flat vector (padded, as an all-gather of the shards gives it); autograd flows
  back to `flat`;
- `ctx.inputs[ctx.rank]`, `ctx.targets[ctx.rank]`: its slice of the batch (data parallelism),
  and `ctx.loss(out, ctx.rank)`, its share of the batch's mean loss: the ranks' gradients
  add up to one device's;
- `ctx.lr`: the learning rate of plain SGD (`shard -= lr * gradient`).

The run is watched (`threads.watched`): the bytes each collective sent, and the memory held:
the rank's shards plus every gathered layer, reduce-scattered gradient or message still
alive, named ("layer 1's gathered parameters"). After the run `shards(run)` reads each rank's
shards; `one_device_shards` is what one device's SGD step gives, cut the same way.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.func import functional_call

from course_utils import validation
from course_utils.errors import CourseInputError
from course_utils.models import loss_fn
from course_utils.parallel.fsdp.shards import FlatLayout
from course_utils.parallel.fsdp.trainer import _as_layers
from course_utils.threads.ranks import Rank
from course_utils.threads.watched import Watch, WatchedRun, run_watched

LR = 0.1


def run_fsdp_program(
    program: Callable[[Rank], object],
    model: nn.Module | Sequence[nn.Module],
    workers: int,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    lr: float = LR,
    timeout: float = 20.0,
    raise_failure: bool = True,
) -> WatchedRun:
    """Run `program(ctx)` on `workers` ranks, each holding its shards of `model`'s layers
    (the course's MLP, an nn.Sequential or a list of layers; each layer one FSDP unit) and its
    slice of the batch (see the module docstring). `model` is not changed."""
    validation.integer(workers, "workers", 1, 16)
    validation.number(lr, "lr", 0.0, 10.0)
    layers = _as_layers(model)
    layouts = [FlatLayout.of(layer, workers) for layer in layers]
    cut = cut_in_shards(layers, workers)
    skeletons = [copy.deepcopy(layer) for layer in layers]

    def setup(ctx: Rank, watch: Watch) -> None:
        shards = [shard.clone() for shard in cut[ctx.rank]]
        ctx.shards, ctx.lr = shards, lr  # type: ignore[attr-defined]
        ctx.layer = _layer_function(layouts, [copy.deepcopy(s) for s in skeletons])  # type: ignore[attr-defined]
        watch.fixed = sum(s.numel() * s.element_size() for s in shards)
        watch.name_gather = lambda t: next(
            (f"layer {i}" for i, s in enumerate(ctx.shards) if t.data_ptr() == s.data_ptr()),  # type: ignore[attr-defined]
            None,
        )

    return run_watched(
        program, workers, setup, inputs, targets, timeout, raise_failure=raise_failure
    )


def _layer_function(layouts: list[FlatLayout], skeletons: list[nn.Module]):
    def layer(i: int, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Layer `i` on `x`, its parameters read from `flat` (the layer's whole flat vector)."""
        if not (isinstance(i, int) and 0 <= i < len(layouts)):
            raise CourseInputError(f"ctx.layer: i must be a layer 0..{len(layouts) - 1}, got {i!r}")
        padded = layouts[i].padded
        if not isinstance(flat, torch.Tensor) or flat.shape != (padded,):
            got = tuple(flat.shape) if isinstance(flat, torch.Tensor) else type(flat).__name__
            raise CourseInputError(
                f"ctx.layer({i}, flat, x): flat must be layer {i}'s whole flat vector, "
                f"{padded} numbers (N shards side by side), got {got}"
            )
        return functional_call(skeletons[i], layouts[i].views(flat), (x,))

    return layer


def shards(run: WatchedRun) -> list[list[torch.Tensor]]:
    """Each rank's shards at the end of its program."""
    return [[s.detach().clone() for s in w.ctx.shards] for w in run.watches]  # type: ignore[attr-defined]


def one_device_shards(
    model: nn.Module | Sequence[nn.Module],
    workers: int,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    lr: float = LR,
) -> list[list[torch.Tensor]]:
    """One SGD step of `model` on one device on the whole batch, then each rank's shards of
    the updated layers (what every rank of a right FSDP step ends with)."""
    layers = [copy.deepcopy(layer) for layer in _as_layers(model)]
    loss_fn(nn.Sequential(*layers)(inputs), targets).backward()
    with torch.no_grad():
        for p in (p for layer in layers for p in layer.parameters()):
            p -= lr * p.grad  # type: ignore[operator, misc]  # every parameter has one
    return cut_in_shards(layers, workers)


def cut_in_shards(model: nn.Module | Sequence[nn.Module], workers: int) -> list[list[torch.Tensor]]:
    """shards[r][i]: rank r's shard of layer i (`FlatLayout`: flat, padded, slice r)."""
    layers = _as_layers(model)
    layouts = [FlatLayout.of(layer, workers) for layer in layers]
    flats = [lay.flatten(layer, torch.float32) for lay, layer in zip(layouts, layers, strict=True)]
    return [
        [flat[lay.shard_slice(r)] for flat, lay in zip(flats, layouts, strict=True)]
        for r in range(workers)
    ]
