"""Megatron's sequence parallelism written as the program every rank runs (Exercise 9.1).

The block is a transformer's MLP sub-block with its residual: y = x + W2 GeLU(W1 LN(x) + b1)
+ b2, on a sequence of s tokens of width h. Tensor parallelism splits W1 by columns and W2 by
rows over N ranks (Shoeybi et al. 2019, arXiv 1909.08053), but leaves the LayerNorm, the
residual (and dropout) on every rank for the whole sequence. Sequence parallelism (Korthikanti
et al. 2022, arXiv 2205.05198) cuts those per-token operations along the sequence instead:
rank r holds only its tokens lo:hi (`chunk_bounds`: as even as can be, rank 0 first), runs
the LayerNorm on them, all-gathers the sequence (g) before the column-parallel layer and
reduce-scatters it (g-bar) after the row-parallel one, where tensor parallelism alone would
all-reduce. In the backward the two swap: g's backward reduce-scatters, g-bar's all-gathers.

`run_sequence_parallel(program, shards, x, dy)` runs `y = program(ctx, x_r)` on each rank's
tokens of `x` (rank r's `ctx.stage` is `shards[r]`: `norm`, `up`, `down`, `b2`, `lo`, `hi`),
then y's backward from the rank's tokens of `dy`. Beside the run's own evidence (collectives,
bytes, saved activations) `run.extra` holds per rank its `outputs`, `input_grads`, the shapes
the LayerNorm saw (`norm_inputs`) and what the column-parallel layer was given (`up_inputs`),
watched by forward hooks the harness puts on the shard's modules.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from course_utils.threads.collectives import chunk_bounds
from course_utils.threads.rank_run import RankRun
from course_utils.threads.ranks import Rank, run_ranks


class SPShard(nn.Module):
    """Rank r's share of the block: the whole LayerNorm `norm` and bias `b2` (every rank
    keeps a copy), hidden units of the MLP (`up`: those outputs of W1, `down`: those inputs
    of W2, no bias), and its tokens `lo`:`hi` of the sequence."""

    def __init__(
        self, norm: nn.LayerNorm, linear1: nn.Linear, linear2: nn.Linear, cols, rows
    ) -> None:
        super().__init__()
        (c0, c1), (self.lo, self.hi) = cols, rows
        self.cols = (c0, c1)
        self.norm = nn.LayerNorm(norm.normalized_shape, eps=norm.eps)
        self.norm.load_state_dict(norm.state_dict())
        self.up = nn.Linear(linear1.in_features, c1 - c0)
        self.up.weight = nn.Parameter(linear1.weight[c0:c1].detach().clone())
        self.up.bias = nn.Parameter(linear1.bias[c0:c1].detach().clone())
        self.down = nn.Linear(c1 - c0, linear2.out_features, bias=False)
        self.down.weight = nn.Parameter(linear2.weight[:, c0:c1].detach().clone())
        self.b2 = nn.Parameter(linear2.bias.detach().clone())


def sp_shards(
    norm: nn.LayerNorm, linear1: nn.Linear, linear2: nn.Linear, ranks: int, tokens: int
) -> list[SPShard]:
    """Every rank's `SPShard`: hidden units and tokens each as even as can be."""
    cols, rows = chunk_bounds(linear1.out_features, ranks), chunk_bounds(tokens, ranks)
    return [SPShard(norm, linear1, linear2, c, t) for c, t in zip(cols, rows, strict=True)]


def block_on_one_device(
    norm: nn.LayerNorm, linear1: nn.Linear, linear2: nn.Linear, x: torch.Tensor
):
    """The block on one device: x + W2 GeLU(W1 LN(x) + b1) + b2."""
    return x + linear2(torch.nn.functional.gelu(linear1(norm(x))))


def run_sequence_parallel(
    program: Callable[[Rank, torch.Tensor], torch.Tensor],
    shards: list[SPShard],
    x: torch.Tensor,
    dy: torch.Tensor,
    timeout: float = 20.0,
    raise_failure: bool = True,
) -> RankRun:
    """Run `program(ctx, x[lo:hi])` on rank r's `shards[r]`, then y's backward from
    `dy[lo:hi]` (see the module docstring)."""
    ranks = len(shards)
    keys = ("outputs", "input_grads", "norm_inputs", "up_inputs")
    seen: dict[str, list] = {k: [None] * ranks for k in keys}
    seen["norm_inputs"] = [[] for _ in range(ranks)]
    hooks = []
    for r, shard in enumerate(shards):

        def norm_saw(_module, args, _out, r=r) -> None:
            seen["norm_inputs"][r].append(list(args[0].shape))

        def up_saw(_module, args, _out, r=r) -> None:
            seen["up_inputs"][r] = args[0].detach().clone()

        hooks += [
            shard.norm.register_forward_hook(norm_saw),
            shard.up.register_forward_hook(up_saw),
        ]

    def each(ctx: Rank) -> None:
        s = ctx.stage
        mine = x[s.lo : s.hi].detach().clone().requires_grad_()
        with ctx.forward(0):
            y = program(ctx, mine)
        if not isinstance(y, torch.Tensor):
            raise ctx.fail("not a tensor", f"returned {y!r:.40} from its forward, not a tensor")
        seen["outputs"][ctx.rank] = y.detach().clone()
        want = dy[s.lo : s.hi]
        if y.shape != want.shape:
            raise ctx.fail(
                "wrong shape",
                f"returned a tensor of shape {tuple(y.shape)} from its forward; the rank's "
                f"tokens of the output have shape {tuple(want.shape)}",
            )
        with ctx.backward(0):
            torch.autograd.backward(y, want)
        seen["input_grads"][ctx.rank] = None if mine.grad is None else mine.grad.clone()

    try:
        run = run_ranks(each, ranks, shards, x, x, timeout=timeout, raise_failure=False)
    finally:
        for hook in hooks:
            hook.remove()
    run.extra |= seen
    if run.failure is not None and raise_failure:
        raise run.failure
    return run
