"""Ulysses attention written as the program every rank runs (Exercise 9.7), watched.

`UlyssesAttention` runs the course's own Ulysses; here it is a program of one's own. Rank r
of N holds the queries, keys and values of its t = L/N tokens for all H heads, and changes
the split twice (Jacobs et al. 2023, arXiv 2309.14509):

    def ulysses(ctx):
        qkv = torch.stack([ctx.q, ctx.k, ctx.v])     # (3, H, t, d): this rank's tokens
        parts = ctx.comm.all_to_all(...)             # head group j to rank j
        ...                                          # H/N heads of all L tokens: attend
        back = ctx.comm.all_to_all(...)              # sequence slice i back to rank i
        return ...                                   # (H, t, d): all heads of its tokens

Each rank's ctx holds, besides `rank`, `world` and `comm` (its collectives, `all_to_all`
among them): `ctx.q`, `ctx.k`, `ctx.v`, (H, t, d) each, rank r's tokens r t ... (r+1) t - 1;
`ctx.causal`, whether a query may look only at itself and earlier tokens; and
`ctx.attend(q, k, v, mask=None)`, plain attention `(out, lse)` over (..., len, d) tensors
(`block_attention`; `mask`, (q_len, k_len) bool, True where a query may see a key).

The run is watched (`threads.watched`): every collective with the bytes it sent to each rank,
and every `ctx.attend` written down as [heads, query length, key length, mask], the mask
"none", "causal" (lower-triangular over the whole sequence), "local" (lower-triangular over
fewer tokens) or "other".
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from course_utils import validation
from course_utils.errors import CourseInputError
from course_utils.parallel.context_parallel.attention import block_attention
from course_utils.parallel.context_parallel.ulysses import check_ulysses_degree
from course_utils.threads.ranks import Rank
from course_utils.threads.watched import Watch, WatchedRun, run_watched


def _mask_kind(mask, length: int) -> str:
    if mask is None:
        return "none"
    if not isinstance(mask, torch.Tensor) or mask.dim() < 2:
        return "other"
    if bool(mask.all()):
        return "none"
    rows, cols = mask.shape[-2:]
    if rows == cols and torch.equal(mask, torch.ones(rows, cols, dtype=torch.bool).tril()):
        return "causal" if rows == length else "local"
    return "other"


def run_ulysses_program(
    program: Callable[[Rank], object],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    workers: int,
    causal: bool = False,
    timeout: float = 20.0,
    raise_failure: bool = True,
) -> WatchedRun:
    """Run `program(ctx)` on `workers` ranks, rank r holding the r-th of `workers` equal
    slices of the sequence of `q`, `k`, `v` ((H, L, d) each, `workers` dividing H and L);
    see the module docstring. `attended(run)[r]`: rank r's calls of ctx.attend."""
    validation.integer(workers, "workers", 1, 16)
    if q.dim() != 3 or q.shape != k.shape or k.shape != v.shape:
        raise CourseInputError("q, k, v must be (heads, seq, dim) each, one shape")
    heads, length = q.shape[0], q.shape[1]
    check_ulysses_degree(workers, heads)
    if length % workers:
        raise CourseInputError(f"seq must be a multiple of workers = {workers}, got {length}")
    qs, ks, vs = (t.detach().chunk(workers, dim=1) for t in (q, k, v))
    attended: list[list[list]] = [[] for _ in range(workers)]

    def setup(ctx: Rank, watch: Watch) -> None:
        r = ctx.rank

        def attend(q_, k_, v_, mask=None):
            out = block_attention(q_, k_, v_, mask)
            heads_seen = q_.shape[0] if q_.dim() == 3 else 1
            record = [heads_seen, q_.shape[-2], k_.shape[-2], _mask_kind(mask, length)]
            attended[r].append(record)
            return out

        mine = (qs[r].contiguous(), ks[r].contiguous(), vs[r].contiguous())
        ctx.q, ctx.k, ctx.v = mine  # type: ignore[attr-defined]
        ctx.attend, ctx.causal = attend, bool(causal)  # type: ignore[attr-defined]

    run = run_watched(program, workers, setup, timeout=timeout, raise_failure=raise_failure)
    run.run.extra["attended"] = attended  # in the run's evidence
    return run


def attended(run: WatchedRun) -> list[list[list]]:
    """Each rank's calls of ctx.attend, in order: [heads, query length, key length, mask]."""
    return run.run.extra["attended"]


def beside_ring(ulysses, ring, workers: int, tokens: int, heads: int, dim: int) -> list[str]:
    """Exercise 9.7's printed run: `ulysses` (a Ulysses program) on `workers` ranks of
    `tokens` tokens, `heads` heads, causal, beside `ring` (Exercise 9.2's causal ring, one
    head) run on each head of the same tensors: what each sent, measured, as lines to print."""
    from course_utils.parallel.context_parallel.attention import attention
    from course_utils.parallel.context_parallel.rank_program import run_ring_program

    gen = torch.Generator().manual_seed(97)
    q, k, v = (torch.randn(heads, workers * tokens, dim, generator=gen) for _ in range(3))
    run = run_ulysses_program(ulysses, q, k, v, workers, causal=True)
    off = (torch.cat(run.results, dim=1) - attention(q, k, v, causal=True)).abs().max()
    per_call = [[sum(c[1]) for c in w.collectives] for w in run.watches]
    ring_sent = 0
    for h in range(heads):  # the ring's blocks are one head's: each head is a ring of its own
        ring_sent += run_ring_program(ring, q[h], k[h], v[h], workers).bytes_sent()[0]
    ulysses_sent = sum(per_call[0])
    return [
        f"largest difference from full causal attention: {off.item():.1e}",
        f"bytes each rank's all-to-alls sent: {per_call}",
        f"rank 0 sent {ulysses_sent:,} bytes with Ulysses; your ring of Exercise 9.2 on the "
        f"same {heads} heads sent {ring_sent:,}: {ring_sent / ulysses_sent:.2f}x as much",
    ]
