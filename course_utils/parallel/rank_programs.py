"""Data- and tensor-parallel programs written per rank, run on the course's devices.

Three shapes of per-rank program (`threads.ranks.run_ranks`), the ones lessons 06 and 07
show and then ask learners to write:

- a collective built from messages: `run_collective(program, tensors)` runs
  `program(ctx, tensor)` on rank r with its own copy of `tensors[r]` and keeps what it returns;
- data parallelism: `run_data_parallel(program, model, inputs, targets, ranks, microbatches)`
  gives every rank a replica of `model` (`ctx.stage`) and its own equal shard of the batch,
  cut into micro-batches (`ctx.inputs[mb]`, `ctx.targets[mb]`; `ctx.loss(out, mb)` is the
  micro-batch's mean loss over the rank's number of micro-batches). After the program every
  replica takes one SGD step, `w -= lr * w.grad`: with the gradients averaged over the ranks
  the replicas then hold the weights one worker gets on the whole batch;
- tensor parallelism: `run_tensor_parallel(program, shards, x, dy)` gives rank r its shard
  of a layer (`ctx.stage`: `shards[r]`, e.g. `mlp_shards(linear1, linear2, ranks)[r]`, the
  hidden units `chunk_bounds(hidden, ranks)[r]` of the MLP linear1 -> GeLU -> linear2),
  runs `y = program(ctx, x)` as its forward action and y's backward from the gradient `dy`
  as its backward action, and keeps each rank's y and input gradient.

Each returns the run's `RankRun`, with what the shape adds in `run.extra` (so in
`run.evidence()`, what a grader judges: `checks.rank_cases`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import nn

from course_utils.errors import CourseInputError
from course_utils.threads.collectives import chunk_bounds
from course_utils.threads.rank_run import RankRun
from course_utils.threads.ranks import Rank, run_ranks

LR = 0.1  # the SGD step after a data-parallel program


def _returned(value) -> torch.Tensor | str | None:
    """What a rank's program returned, as data: a tensor (a copy), None, or its type's name."""
    if value is None or isinstance(value, torch.Tensor):
        return None if value is None else value.detach().clone()
    return f"a {type(value).__name__}"


def run_collective(
    program: Callable[[Rank, torch.Tensor], torch.Tensor],
    tensors: Sequence[torch.Tensor],
    timeout: float = 20.0,
    raise_failure: bool = True,
) -> RankRun:
    """Run `program(ctx, tensors[r])` on every rank r (no model: each rank's stage is an
    `nn.Identity`); `run.extra["results"][r]` is what rank r returned."""
    tensors = [t.detach().clone() for t in tensors]
    if not tensors or not all(t.dim() == 1 for t in tensors):
        raise CourseInputError("tensors must hold one 1-D tensor per rank")
    return run_returning(
        lambda ctx: program(ctx, tensors[ctx.rank]), len(tensors), _returned, timeout, raise_failure
    )


def run_returning(
    program: Callable[[Rank], object],
    world: int,
    as_data: Callable[[object], object],
    timeout: float = 20.0,
    raise_failure: bool = True,
) -> RankRun:
    """Run `program(ctx)` on `world` ranks with no model (each rank's stage an `nn.Identity`);
    `run.extra["results"][r]` is what rank r returned, through `as_data`."""
    results: list = [None] * world

    def each(ctx: Rank) -> None:
        results[ctx.rank] = program(ctx)

    nothing = torch.zeros(world, 1)
    stages = [nn.Identity() for _ in range(world)]
    run = run_ranks(each, world, stages, nothing, nothing, timeout=timeout, raise_failure=False)
    run.extra["results"] = [as_data(r) for r in results]
    if run.failure is not None and raise_failure:
        raise run.failure
    return run


def run_data_parallel(
    program: Callable[..., None],
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    ranks: int,
    microbatches: int = 1,
    lr: float = LR,
    timeout: float = 20.0,
    raise_failure: bool = True,
    **args,
) -> RankRun:
    """Run `program(ctx, **args)` on `ranks` replicas of `model` (see the module docstring);
    `run.extra["weights"][r]` holds replica r's weights after its SGD step. `model` itself
    is left as it was."""
    if len(inputs) != len(targets) or len(inputs) % (ranks * microbatches):
        raise CourseInputError(
            f"the batch ({len(inputs)}) must cut into {ranks} ranks x {microbatches} "
            "micro-batches of one size"
        )
    replicas = [copy.deepcopy(model) for _ in range(ranks)]
    shards = list(zip(inputs.chunk(ranks), targets.chunk(ranks), strict=True))

    def each(ctx: Rank) -> None:
        x, y = shards[ctx.rank]
        ctx.inputs, ctx.targets = list(x.chunk(microbatches)), list(y.chunk(microbatches))
        program(ctx, **args)
        with torch.no_grad():  # one SGD step with whatever gradient the program left
            for p in ctx.stage.parameters():
                if p.grad is not None:
                    p.sub_(lr * p.grad)

    x0, y0 = shards[0]
    run = run_ranks(
        each, ranks, replicas, x0, y0, microbatches, timeout=timeout, raise_failure=False
    )
    run.extra["weights"] = [
        {name: p.detach().clone() for name, p in replica.named_parameters()} for replica in replicas
    ]
    if run.failure is not None and raise_failure:
        raise run.failure
    return run


def max_weight_diff(run: RankRun, model: nn.Module) -> float:
    """The largest difference between any replica's weights after a data-parallel run and
    `model`'s (e.g. one worker's after its step on the whole batch)."""
    want = dict(model.named_parameters())
    return max(
        (w - want[k]).abs().max().item()
        for weights in run.extra["weights"]
        for k, w in weights.items()
    )


def exposed_communication(events) -> tuple[float, int, int]:
    """From a data-parallel run's events on the virtual clock ((device, action, start, end),
    e.g. a Timeline's): the seconds of all-reduce still running once every backward has
    ended; and per rank (the fewest over the ranks) the all-reduces, and those that started
    before the rank's own backward ended."""
    events = [(e.device, e.action, e.start, e.end) if hasattr(e, "action") else e for e in events]
    ends: dict[int, float] = {}
    for device, action, _, end in events:
        if action.kind == "B":
            ends[device] = max(ends.get(device, 0.0), end)
    backward = max(ends.values(), default=0.0)
    reduces = [e for e in events if e[1].kind == "ALL_REDUCE"]
    left = max([e[3] for e in reduces], default=backward) - backward
    ranks = sorted({e[0] for e in events})
    count = min((sum(e[0] == r for e in reduces) for r in ranks), default=0)
    early = min(
        (sum(e[0] == r and e[2] < ends.get(r, 0.0) for e in reduces) for r in ranks), default=0
    )
    return max(0.0, left), count, early


class MLPShard(nn.Module):
    """Rank r's share of the MLP linear1 -> GeLU -> linear2: hidden units lo:hi. `w1`, `b1`:
    those rows of linear1 (column-parallel: a slice of its outputs); `w2`: those columns of
    linear2 (row-parallel: a slice of its inputs); `b2`: linear2's whole bias, to add once."""

    def __init__(self, linear1: nn.Linear, linear2: nn.Linear, lo: int, hi: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(linear1.weight[lo:hi].detach().clone())
        self.b1 = nn.Parameter(linear1.bias[lo:hi].detach().clone())
        self.w2 = nn.Parameter(linear2.weight[:, lo:hi].detach().clone())
        self.b2 = nn.Parameter(linear2.bias.detach().clone())


def mlp_shards(linear1: nn.Linear, linear2: nn.Linear, ranks: int) -> list[MLPShard]:
    """Every rank's `MLPShard` of the MLP linear1 -> GeLU -> linear2, as even as can be."""
    if linear1.bias is None or linear2.bias is None or linear2.in_features != linear1.out_features:
        raise CourseInputError("linear1 and linear2 must chain (d -> hidden -> d), with biases")
    bounds = chunk_bounds(linear2.in_features, ranks)
    return [MLPShard(linear1, linear2, lo, hi) for lo, hi in bounds]


def run_tensor_parallel(
    program: Callable[[Rank, torch.Tensor], torch.Tensor],
    shards: Sequence[nn.Module],
    x: torch.Tensor,
    dy: torch.Tensor,
    timeout: float = 20.0,
    raise_failure: bool = True,
) -> RankRun:
    """Run the tensor-parallel `program` on rank r's `shards[r]` (see the module docstring);
    `run.extra` holds per rank its `outputs` and `input_grads`; `run.grads[r]` its shard's
    gradients ("r.w1", ...)."""
    ranks = len(shards)
    outputs: list = [None] * ranks
    input_grads: list = [None] * ranks

    def each(ctx: Rank) -> None:
        mine = x.detach().clone().requires_grad_()
        with ctx.forward(0):
            y = program(ctx, mine)
        if not isinstance(y, torch.Tensor):
            raise ctx.fail("not a tensor", f"returned {y!r:.40} from its forward, not a tensor")
        outputs[ctx.rank] = y.detach().clone()
        with ctx.backward(0):
            torch.autograd.backward(y, dy)
        input_grads[ctx.rank] = None if mine.grad is None else mine.grad.clone()

    run = run_ranks(each, ranks, shards, x, x, timeout=timeout, raise_failure=False)
    run.extra |= {"outputs": outputs, "input_grads": input_grads}
    if run.failure is not None and raise_failure:
        raise run.failure
    return run
