"""Ring attention written as a per-rank program, run on the course's devices and watched.

`RingAttention` runs the course's own ring; here the ring is a program of one's own, the
program every rank runs (`threads.ranks`):

    def ring_forward(ctx):
        k, v = ctx.k, ctx.v                          # this rank's own K/V block first
        for step in range(ctx.world):
            ...                                      # attend to the block in hand, merge,
            ctx.send(torch.stack([k, v]), to=...)    # pass it on, take the next one
        return out

    run = run_ring_program(ring_forward, q, k, v, workers=4, causal=True)

Each rank's ctx holds, besides `rank`, `world`, `send` and `recv`: `ctx.q`, `ctx.k`,
`ctx.v`, its own tokens' queries, keys and values ((t, d) each, t = L/N: the plain split,
rank r holds tokens r t ... (r+1) t - 1); `ctx.attend(q, k, v, mask=None)`, attention of `q`
to one block of keys, `(out, lse)` (`block_attention`: a query that sees no key gets out 0
and lse -inf); and `ctx.causal`, whether a query may look only at itself and earlier tokens.
The program returns its queries' attention output, (t, d).

The run is watched (`threads.watched`): every message a rank sends is written down with
what it carried, named by whose block it is ("kv2": rank 2's keys and values stacked, "k2",
"v2"), so the order of the blocks round the ring can be read from the run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from course_utils import validation
from course_utils.parallel.context_parallel.attention import block_attention
from course_utils.parallel.context_parallel.checks import check_ring_inputs
from course_utils.parallel.context_parallel.layout import split_sequence
from course_utils.threads.ranks import Rank
from course_utils.threads.watched import Watch, WatchedRun, run_watched


def run_ring_program(
    program: Callable[[Rank], object],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    workers: int,
    causal: bool = True,
    timeout: float = 20.0,
    raise_failure: bool = True,
) -> WatchedRun:
    """Run `program(ctx)` on `workers` ranks, rank r holding the r-th of `workers` equal
    blocks of the sequence of `q`, `k`, `v` ((L, d) each); see the module docstring."""
    validation.integer(workers, "workers", 1, 16)
    check_ring_inputs({"q": q, "k": k, "v": v}, workers, False)
    qs, ks, vs = (split_sequence(t.detach(), workers) for t in (q, k, v))
    named = [(f"kv{r}", torch.stack([ks[r], vs[r]])) for r in range(workers)]
    named += [(f"kv{r}", torch.cat([ks[r], vs[r]], dim)) for r in range(workers) for dim in (0, 1)]
    named += [(f"k{r}", ks[r]) for r in range(workers)] + [(f"v{r}", vs[r]) for r in range(workers)]

    def name(tensor: torch.Tensor) -> str | None:
        same = (n for n, t in named if t.shape == tensor.shape and torch.equal(t, tensor))
        return next(same, None)

    def setup(ctx: Rank, watch: Watch) -> None:
        ctx.q, ctx.k, ctx.v = qs[ctx.rank], ks[ctx.rank], vs[ctx.rank]  # type: ignore[attr-defined]
        ctx.attend, ctx.causal = block_attention, bool(causal)  # type: ignore[attr-defined]
        watch.name_message = name

    return run_watched(program, workers, setup, timeout=timeout, raise_failure=raise_failure)


def outputs(run: WatchedRun) -> list:
    """What each rank's program returned, its output (the first of a tuple it returned)."""
    found = [r[0] if isinstance(r, tuple | list) and r else r for r in run.results]
    return [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in found]
