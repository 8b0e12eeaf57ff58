"""Who holds which tokens: the plain (contiguous) and the zig-zag split, and the block products
each worker computes under a causal mask."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from course_utils import validation
from course_utils.parallel.context_parallel.checks import MAX_WORKERS

# -- who holds which tokens ---------------------------------------------------------------


def sequence_chunks(workers: int, zigzag: bool = False) -> list[list[int]]:
    """The chunks of the sequence each worker holds, in the order it stores them.

    Plain: N chunks, worker i holds [i]. Zig-zag: 2N chunks, worker i holds [i, 2N-1-i].
    """
    validation.integer(workers, "workers", 1, MAX_WORKERS)
    if zigzag:
        return [[i, 2 * workers - 1 - i] for i in range(workers)]
    return [[i] for i in range(workers)]


def split_sequence(x: torch.Tensor, workers: int, zigzag: bool = False) -> list[torch.Tensor]:
    """Worker i's tokens of `x` (..., seq, d): its chunks, concatenated in the order held."""
    layout = sequence_chunks(workers, zigzag)
    chunks = x.chunk(sum(len(c) for c in layout), dim=-2)
    return [torch.cat([chunks[c] for c in held], dim=-2).contiguous() for held in layout]


def gather_sequence(
    parts: Sequence[torch.Tensor], zigzag: bool = False, dim: int = -2
) -> torch.Tensor:
    """Undo `split_sequence`: the full sequence from every worker's part (dim -1 for an lse)."""
    return gather_chunks(parts, sequence_chunks(len(parts), zigzag), dim)


def gather_chunks(
    parts: Sequence[torch.Tensor], layout: Sequence[Sequence[int]], dim: int
) -> torch.Tensor:
    """The full sequence from `parts`, where part i holds chunks `layout[i]` in that order."""
    by_chunk = {}
    for held, part in zip(layout, parts, strict=True):
        for c, piece in zip(held, part.chunk(len(held), dim=dim), strict=True):
            by_chunk[c] = piece
    return torch.cat([by_chunk[c] for c in sorted(by_chunk)], dim=dim)


@dataclass(frozen=True)
class BlockProduct:
    """One product of some of a worker's queries with some rows of the K/V block in hand."""

    q_rows: slice
    kv_rows: slice
    diagonal: bool  # the same chunk of tokens on both sides: a causal mask inside

    def elements(self) -> int:
        """Attention scores this product computes (per head)."""
        return (self.q_rows.stop - self.q_rows.start) * (self.kv_rows.stop - self.kv_rows.start)


def block_products(
    rank: int, owner: int, workers: int, zigzag: bool, causal: bool, chunk: int
) -> list[BlockProduct]:
    """The products worker `rank` computes against `owner`'s K/V block (chunks of `chunk` tokens).

    Without a mask: one product, all its queries against the whole block. With the causal
    mask, chunk by chunk: a key chunk after the query chunk is skipped (fully masked, as a
    real kernel would skip it), the same chunk is computed with the triangular mask, an
    earlier chunk is computed whole.
    """
    layout = sequence_chunks(workers, zigzag)
    mine, theirs = layout[rank], layout[owner]
    if not causal:
        return [BlockProduct(slice(0, len(mine) * chunk), slice(0, len(theirs) * chunk), False)]
    products = []
    for q_slot, q_chunk in enumerate(mine):
        for k_slot, k_chunk in enumerate(theirs):
            if k_chunk <= q_chunk:
                products.append(
                    BlockProduct(
                        slice(q_slot * chunk, (q_slot + 1) * chunk),
                        slice(k_slot * chunk, (k_slot + 1) * chunk),
                        diagonal=k_chunk == q_chunk,
                    )
                )
    return products
