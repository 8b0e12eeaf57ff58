"""A tensor x data-parallel grid's process groups, built by the program every rank runs
(Exercise 7.5).

`tp * dp` ranks are numbered with tensor parallelism innermost, as in lesson 07: the rank
with tensor rank t in replica d is t + tp d. A program `program(ctx, tp, dp)` builds its
groups with `ctx.new_group(ranks)` (`threads.groups`: the group of those ranks, or None when
the rank is not in it), all-reduces `ctx.value` (its own tensor) in its tensor-parallel
group and then in its data-parallel group, and returns {"tensor": ..., "data": ...}: the two
sums. `run_grid_program(program, tp, dp, values)` runs it; `run.extra` holds each rank's
`groups` (the group calls it made, in order) and `results` (what it returned).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
from torch import nn

from course_utils import validation
from course_utils.threads.groups import Groups
from course_utils.threads.rank_run import RankRun
from course_utils.threads.ranks import Rank, run_ranks


def run_grid_program(
    program: Callable[[Rank, int, int], object],
    tp: int,
    dp: int,
    values: Sequence[torch.Tensor],
    raise_failure: bool = True,
) -> RankRun:
    """Run `program(ctx, tp, dp)` on tp x dp ranks, rank r holding `ctx.value = values[r]`."""
    validation.integer(tp, "tp", 1, 8)
    validation.integer(dp, "dp", 1, 8)
    world = tp * dp
    validation.integer(len(values), "len(values)", world, world)
    groups = Groups(world)
    results: list[object] = [None] * world

    def each(ctx: Rank) -> None:
        ctx.value = values[ctx.rank].clone()  # type: ignore[attr-defined]
        ctx.new_group = functools.partial(groups.new_group, ctx)  # type: ignore[attr-defined]
        got = program(ctx, tp, dp)
        if isinstance(got, dict):
            got = {str(k): v.detach().clone() for k, v in got.items() if torch.is_tensor(v)}
        results[ctx.rank] = got if isinstance(got, dict) else f"a {type(got).__name__}"

    stages, rows = [nn.Identity() for _ in range(world)], torch.zeros(world, 1)
    run = run_ranks(each, world, stages, rows, rows, raise_failure=False)
    run.extra |= {"groups": groups.calls, "results": results}
    if run.failure is not None and raise_failure:
        raise run.failure
    return run
