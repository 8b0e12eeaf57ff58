"""Causal ring attention on the zig-zag split, written as the program every rank runs
(Exercise 9.4), with every chunk product counted.

Under a causal mask the plain split is uneven: rank r's queries see r + 1 of the N blocks.
The zig-zag split (Dubey et al. 2024, arXiv 2407.21783) cuts the sequence into 2N chunks of
c tokens and gives rank r chunks r and 2N-1-r, an early one and a late one; then every rank
computes 2N + 1 chunk products (`costs.causal_work`). A program on this split:

    def zigzag_ring(ctx):
        kv = torch.stack([ctx.k, ctx.v])        # this rank's two chunks' keys and values
        for step in range(ctx.world):
            ...                                 # attend to the chunks in hand it may see,
            ctx.send(kv, to=...)                # merge, pass them on, take the next ones
        return torch.cat([out_early, out_late])

Rank r's ctx holds, besides `rank`, `world`, `send` and `recv`: `ctx.q`, `ctx.k`, `ctx.v`,
(2, c, d) each: index 0 its early chunk (number r), index 1 its late chunk (2N-1-r);
`ctx.chunks`, the two chunk numbers; `ctx.attend(q, k, v, mask=None)`, one chunk product,
`(out, lse)` (`block_attention`); `ctx.merge(out, lse, out_b, lse_b)`, lesson 09's
`merge_partials`. The program returns its two chunks' outputs, early first, (2c, d).

The run is watched (`threads.watched`): each message is named by whose chunks it carries
("kv2": rank 2's keys and values stacked), and every `ctx.attend` is written down as
(query chunk, key chunk, mask): "none", "causal" (lower-triangular), "hidden" (all False)
or "other"; a tensor that is no chunk is chunk -1.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from course_utils import validation
from course_utils.errors import CourseInputError
from course_utils.parallel.context_parallel.attention import block_attention, merge_partials
from course_utils.threads.ranks import Rank
from course_utils.threads.watched import Watch, WatchedRun, run_watched


def _mask_kind(mask) -> str:
    if mask is None or (isinstance(mask, torch.Tensor) and bool(mask.all())):
        return "none"
    if not isinstance(mask, torch.Tensor):
        return "other"
    if not bool(mask.any()):
        return "hidden"
    tril = torch.ones(mask.shape[-2:], dtype=torch.bool).tril()
    return "causal" if mask.shape[-2:] == tril.shape and torch.equal(mask, tril) else "other"


def run_zigzag_program(
    program: Callable[[Rank], object],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    workers: int,
    raise_failure: bool = True,
) -> WatchedRun:
    """Run `program(ctx)` on `workers` ranks holding the zig-zag split of `q`, `k`, `v`
    ((L, d) each, L a multiple of 2 workers); see the module docstring. `products(run)[r]`:
    rank r's chunk products, in the order computed."""
    validation.integer(workers, "workers", 1, 16)
    if q.shape != k.shape or k.shape != v.shape or q.dim() != 2 or len(q) % (2 * workers):
        raise CourseInputError("q, k, v must be (L, d) each, L a multiple of 2 x workers")
    cq, ck, cv = (t.detach().chunk(2 * workers) for t in (q, k, v))
    held = [(r, 2 * workers - 1 - r) for r in range(workers)]
    mine = {
        name: [torch.stack([chunks[a], chunks[b]]) for a, b in held]
        for name, chunks in (("q", cq), ("k", ck), ("v", cv))
    }
    named = [(f"kv{r}", torch.stack([mine["k"][r], mine["v"][r]])) for r in range(workers)]
    named += [(f"k{r}", mine["k"][r]) for r in range(workers)]
    named += [(f"v{r}", mine["v"][r]) for r in range(workers)]
    products: list[list[list]] = [[] for _ in range(workers)]

    def find(tensor, chunks) -> int:
        same = (
            c for c, t in enumerate(chunks) if t.shape == tensor.shape and torch.equal(t, tensor)
        )
        return next(same, -1)  # noqa: E501

    def setup(ctx: Rank, watch: Watch) -> None:
        r = ctx.rank

        def attend(q_, k_, v_, mask=None):
            out = block_attention(q_, k_, v_, mask)
            products[r].append([find(q_, cq), find(k_, ck), _mask_kind(mask)])
            return out

        ctx.q, ctx.k, ctx.v = mine["q"][r], mine["k"][r], mine["v"][r]  # type: ignore[attr-defined]
        ctx.chunks, ctx.attend, ctx.merge = held[r], attend, merge_partials  # type: ignore[attr-defined]
        watch.name_message = lambda t: next(
            (n for n, x in named if x.shape == t.shape and torch.equal(x, t)), None
        )

    run = run_watched(program, workers, setup, raise_failure=raise_failure)
    run.run.extra["products"] = products  # in the run's evidence
    return run


def products(run: WatchedRun) -> list[list[list]]:
    """Each rank's chunk products, in the order computed: [query chunk, key chunk, mask]."""
    return run.run.extra["products"]
