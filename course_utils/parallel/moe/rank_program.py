"""Expert dispatch and combine written as a per-rank program, run on the devices and watched.

`ExpertParallel` runs the course's own expert-parallel step; here the forward of the MoE
layer is a program of one's own, the program every rank runs (`threads.ranks`):

    def moe_layer(ctx):
        ...                                     # line up the tokens by the rank of their expert
        received = ctx.comm.all_to_all(chunks)  # dispatch: received[s] came from rank s
        ...                                     # the local experts, then the way back
        return y

    run = run_moe_program(moe_layer, moe, x, workers=2)

Rank r of N holds the experts r E/N ... (r+1) E/N - 1 and the r-th of N consecutive groups
of the tokens. Its ctx holds, besides `rank`, `world` and `comm`: `ctx.x`, its tokens (T, d);
`ctx.h`, the same tokens normalised (`moe.norm`), what the experts take; `ctx.experts_of`
and `ctx.gates`, (T, k) each: the k experts the router chose for each token and their gates
(`route`, no capacity: no token is dropped); `ctx.experts`, {expert number: module} of the
experts it holds; and `ctx.num_experts`. The program returns its tokens' output
y = x + sum_j gate_j expert_j(h), (T, d): `moe(x).output`, on one device.

With `capacity_factor` (Exercise 10.2) the choices are still the router's, before capacity,
and `ctx.capacity` is the slots each expert has for this rank's group: the program applies
the capacity itself, and one device's output is `moe(x, groups=workers).output` for an `moe`
with that capacity factor.

The run is watched (`threads.watched`): every all-to-all is written down with the bytes
this rank sent to every other, so the byte matrix of the dispatch can be read from the run.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from course_utils import validation
from course_utils.errors import CourseInputError
from course_utils.parallel.moe.block import MoE
from course_utils.parallel.moe.limits import check_tokens
from course_utils.parallel.moe.routing import experts_of_worker, route
from course_utils.threads.collectives import chunk_bounds
from course_utils.threads.ranks import Rank
from course_utils.threads.watched import Watch, WatchedRun, run_watched


def run_moe_program(
    program: Callable[[Rank], object],
    moe: MoE,
    x: torch.Tensor,
    workers: int,
    timeout: float = 20.0,
    raise_failure: bool = True,
    capacity_factor: float | None = None,
) -> WatchedRun:
    """Run `program(ctx)` on `workers` ranks holding `moe`'s experts and `x`'s tokens (T, d),
    routed by `moe`'s router, its capacity `capacity_factor` left to the program (see the
    module docstring). `moe` is copied."""
    validation.integer(workers, "workers", 1, 16)
    if not isinstance(moe, MoE) or moe.num_experts % workers:
        raise CourseInputError(
            "moe must be an MoE block whose number of experts the workers divide"
        )
    tokens = check_tokens(x, moe.d_model, workers, "workers")
    flat = x.detach().reshape(tokens, moe.d_model)
    groups = [flat[lo:hi] for lo, hi in chunk_bounds(tokens, workers)]
    with torch.no_grad():
        normed = [moe.norm(group) for group in groups]
        routed = [route(moe.router(h), moe.top_k, capacity_factor) for h in normed]

    def setup(ctx: Rank, watch: Watch) -> None:
        r = ctx.rank
        ctx.x, ctx.h = groups[r], normed[r]  # type: ignore[attr-defined]
        ctx.experts_of, ctx.gates = routed[r].expert, routed[r].gate  # type: ignore[attr-defined]
        mine = experts_of_worker(r, moe.num_experts, workers)
        ctx.experts = {e: copy.deepcopy(moe.experts[e]) for e in mine}  # type: ignore[attr-defined]
        ctx.num_experts = moe.num_experts  # type: ignore[attr-defined]
        ctx.capacity = routed[r].capacity  # type: ignore[attr-defined]

    return run_watched(program, workers, setup, timeout=timeout, raise_failure=raise_failure)


def routed_counts(moe: MoE, x: torch.Tensor, workers: int) -> list[list[int]]:
    """routed[s][e]: how many of rank s's tokens chose expert e (every one of their k)."""
    tokens = check_tokens(x, moe.d_model, workers, "workers")
    flat = x.detach().reshape(tokens, moe.d_model)
    with torch.no_grad():
        return [
            route(moe.router(moe.norm(flat[lo:hi])), moe.top_k, None).counts()
            for lo, hi in chunk_bounds(tokens, workers)
        ]
