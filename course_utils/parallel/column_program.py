"""A column-parallel linear layer written as the program every rank runs (Exercise 7.1).

The layer is $Y = XA + b$, $A$ of shape d_in x d_out (the maths convention). Rank r keeps a
block of consecutive columns of $A$ and the same slice of $b$ (`column_shards`: as even as
can be, rank 0 first), so it computes its slice of the output, $X A_r + b_r$, with no
communication at all; an all-gather along the last dimension then gives every rank the
whole $Y$ (Shoeybi et al. 2019, arXiv 1909.08053, when a column-parallel layer is not
followed by a row-parallel one). In the backward every rank already holds all of dL/dY:
the all-gather's backward keeps the rank's own columns of it, with no communication.

`run_column_parallel(program, shards, x, dy)` is `rank_programs.run_tensor_parallel` on these
shards: rank r's ctx has `ctx.stage` (`a`, `b`, and `lo`, `hi`: the columns it holds), the
forward `y = program(ctx, x)` and y's backward from `dy`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from course_utils.parallel.rank_programs import run_tensor_parallel
from course_utils.threads.collectives import chunk_bounds
from course_utils.threads.rank_run import RankRun
from course_utils.threads.ranks import Rank


class ColumnShard(nn.Module):
    """Columns lo:hi of a layer Y = XA + b: `a` (d_in x (hi - lo)) and `b` (hi - lo)."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, lo: int, hi: int) -> None:
        super().__init__()
        self.lo, self.hi = lo, hi
        self.a = nn.Parameter(a[:, lo:hi].detach().clone())
        self.b = nn.Parameter(b[lo:hi].detach().clone())


def column_shards(a: torch.Tensor, b: torch.Tensor, ranks: int) -> list[ColumnShard]:
    """Every rank's block of consecutive columns of A (and of b), as even as can be."""
    return [ColumnShard(a, b, lo, hi) for lo, hi in chunk_bounds(a.shape[1], ranks)]


def run_column_parallel(
    program: Callable[[Rank, torch.Tensor], torch.Tensor],
    shards: list[ColumnShard],
    x: torch.Tensor,
    dy: torch.Tensor,
    raise_failure: bool = True,
) -> RankRun:
    """Run `program(ctx, x)` on rank r's `shards[r]`, then y's backward from `dy`;
    `run.extra` holds each rank's `outputs` and `input_grads`, `run.grads[r]` its shard's
    gradients ("r.a", "r.b")."""
    return run_tensor_parallel(program, shards, x, dy, raise_failure=raise_failure)
