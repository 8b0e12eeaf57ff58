"""DeepSeek-V3's bias balancing written as the program every rank runs (Exercise 10.9).

Every rank keeps its own copy of the router, its bias included, and routes only its own
tokens. After the step each copy moves its bias by gamma, down for an expert that got more
than the mean load and up for one that got less (`balancing.update_bias`): the copies stay
the same only if every rank counts the load of the whole batch, every rank's tokens.

    def balance(ctx):
        ...                      # choose with ctx.scores + ctx.bias, count, share the counts
        return chosen, new_bias

    run = run_bias_program(balance, scores, bias, gamma, ranks=2)

Rank r gets `ctx.scores`, the scores (T, E) of its T consecutive tokens of the batch,
`ctx.bias` (E,), its copy of the bias, and `ctx.gamma`; it returns each token's expert (T,)
and its bias after the update. `run.extra["results"][r]` is what rank r returned, as data.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from course_utils.errors import CourseInputError
from course_utils.parallel.rank_programs import run_returning
from course_utils.threads.collectives import chunk_bounds
from course_utils.threads.rank_run import RankRun
from course_utils.threads.ranks import Rank


def _as_data(value) -> list:
    """A rank's (chosen, new_bias) as two tensors, or the names of what they were."""
    if not isinstance(value, tuple | list) or len(value) != 2:
        return [f"a {type(value).__name__}", "not a pair (chosen, new_bias)"]
    return [
        v.detach().clone() if isinstance(v, torch.Tensor) else f"a {type(v).__name__}"
        for v in value
    ]


def run_bias_program(
    program: Callable[[Rank], object],
    scores: torch.Tensor,
    bias: torch.Tensor,
    gamma: float,
    ranks: int,
    timeout: float = 20.0,
    raise_failure: bool = True,
) -> RankRun:
    """Run `program(ctx)` on `ranks` ranks, each with its share of `scores` (tokens, experts)
    and a copy of `bias` (see the module docstring)."""
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2 or len(scores) < ranks:
        raise CourseInputError(
            "scores must be a tensor (tokens, experts), a token per rank at least"
        )
    parts = [scores[lo:hi].detach().clone() for lo, hi in chunk_bounds(len(scores), ranks)]

    def each(ctx: Rank):
        ctx.scores, ctx.bias, ctx.gamma = parts[ctx.rank], bias.detach().clone(), gamma  # type: ignore[attr-defined]
        return program(ctx)

    return run_returning(each, ranks, _as_data, timeout, raise_failure)
