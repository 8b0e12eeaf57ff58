"""The collectives on paper: how the ring cuts data into chunks and who sends which chunk in
which step, the bytes every rank sends in each collective (ring all-reduce, all-gather,
reduce-scatter, naive all-reduce, all-to-all), and a one-thread replay of the ring that
records who holds what after every step, for printing and drawing in the lessons.

`threads.collectives` runs the same plans on real threads; its tests check that the bytes
counted there are the bytes predicted here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from course_utils import validation
from course_utils.errors import CourseInputError

# -- chunking and the ring's step plan (shared by the threaded code and the trace) ---------


def chunk_bounds(length: int, parts: int) -> list[tuple[int, int]]:
    """Split range(length) into `parts` contiguous chunks, sizes differing by at most one.

    The first `length % parts` chunks get one extra element; with length < parts some
    chunks are empty (they are still "sent", as zero-byte messages, to keep the ring simple).
    """
    validation.integer(length, "length", 0)
    validation.integer(parts, "parts", 1, validation.MAX_GPUS)
    base, extra = divmod(length, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def ring_plan(rank: int, world_size: int) -> list[tuple[str, int, int, int]]:
    """What `rank` does in each of the 2(N-1) ring steps: (phase, step, send_chunk, recv_chunk).

    Reduce-scatter step k: send chunk (rank - k) to the right neighbour, receive chunk
    (rank - k - 1) from the left one and add it in. After N-1 steps rank r holds the full
    sum of chunk (r + 1) mod N. All-gather step k: send chunk (rank + 1 - k), receive
    chunk (rank - k) and overwrite: the finished chunks go once around the ring.
    """
    n = validation.integer(world_size, "world_size", 1, validation.MAX_GPUS)
    validation.integer(rank, "rank", 0, n - 1)
    plan = []
    for k in range(n - 1):
        plan.append(("reduce-scatter", k, (rank - k) % n, (rank - k - 1) % n))
    for k in range(n - 1):
        plan.append(("all-gather", k, (rank + 1 - k) % n, (rank - k) % n))
    return plan


def _check_sizes(numel: int, world_size: int, element_size: int) -> None:
    validation.integer(numel, "numel", 0)
    validation.integer(world_size, "world_size", 1, validation.MAX_GPUS)
    validation.integer(element_size, "element_size", 1, 16)


def ring_bytes_per_rank(numel: int, world_size: int, element_size: int = 4) -> list[int]:
    """Exact bytes each rank sends in a ring all-reduce of `numel` elements (uneven chunks)."""
    _check_sizes(numel, world_size, element_size)
    bounds = chunk_bounds(numel, world_size)
    sizes = [(end - start) * element_size for start, end in bounds]
    return [
        sum(sizes[send] for _, _, send, _ in ring_plan(r, world_size)) for r in range(world_size)
    ]


def chunk_sizes(length: int, parts: int) -> list[int]:
    """The lengths of `chunk_bounds(length, parts)`: how a ring splits `length` elements."""
    return [end - start for start, end in chunk_bounds(length, parts)]


def ring_all_gather_bytes(shard_numels: Sequence[int], element_size: int = 4) -> list[int]:
    """Exact bytes each rank sends in a ring all-gather; `shard_numels[r]` is rank r's shard.

    Rank r forwards every shard but one: the shard of its right neighbour r+1, which
    started the ring right there. With equal shards of S/N elements that is
    (N-1)/N x S x element_size per rank (half a ring all-reduce).
    """
    total = sum(shard_numels)
    n = len(shard_numels)
    return [(total - shard_numels[(r + 1) % n]) * element_size for r in range(n)]


def ring_reduce_scatter_bytes(chunk_numels: Sequence[int], element_size: int = 4) -> list[int]:
    """Exact bytes each rank sends in a ring reduce-scatter; chunk r ends up on rank r.

    Rank r sends a (partial) sum of every chunk except its own: (N-1)/N x S x element_size
    per rank for equal chunks, the other half of a ring all-reduce.
    """
    total = sum(chunk_numels)
    return [(total - own) * element_size for own in chunk_numels]


def naive_bytes_per_rank(numel: int, world_size: int, element_size: int = 4) -> list[int]:
    """Bytes each rank sends in the naive all-reduce: rank 0 sends N-1 copies, others one."""
    _check_sizes(numel, world_size, element_size)
    size = numel * element_size
    if world_size == 1:
        return [0]
    return [(world_size - 1) * size] + [size] * (world_size - 1)


def all_to_all_bytes(
    numel: Sequence[Sequence[int]], element_size: int = 4, direction: str = "sent"
) -> list[int]:
    """Bytes each rank sends (or receives) in one `all_to_all`.

    `numel[s][d]` is the number of elements rank s addresses to rank d. A rank's own
    chunk (s == d) stays where it is and costs nothing, so rank s sends
    sum over d != s of numel[s][d] x element_size bytes, and receives the column sum.
    """
    n = len(numel)
    if any(len(row) != n for row in numel):
        raise CourseInputError(f"numel must be a square list ({n} x {n}: source x destination)")
    if any(not isinstance(x, int) or x < 0 for row in numel for x in row):
        raise CourseInputError("numel must hold integers >= 0")
    if direction not in ("sent", "received"):
        raise CourseInputError(f"direction must be 'sent' or 'received', got {direction!r}")
    if direction == "sent":
        return [sum(numel[s][d] for d in range(n) if d != s) * element_size for s in range(n)]
    return [sum(numel[s][d] for s in range(n) if s != d) * element_size for d in range(n)]


# -- a one-thread trace of the ring, for the lesson ----------------------------------------


@dataclass(frozen=True)
class RingStep:
    """The state after one ring step.

    `transfers` lists (src, dst, chunk) sent in this step; `values[r][c]` is rank r's
    current chunk c (a list of floats); `contributors[r][c]` is which ranks' original
    data that chunk already includes (all N of them means "fully reduced").
    """

    phase: str  # "start", "reduce-scatter" or "all-gather"
    step: int
    transfers: tuple[tuple[int, int, int], ...]
    values: tuple[tuple[tuple[float, ...], ...], ...]
    contributors: tuple[tuple[frozenset[int], ...], ...]

    def describe(self) -> str:
        """A few readable lines: which rank holds which partial sum of each chunk."""
        head = "start" if self.phase == "start" else f"{self.phase} step {self.step}"
        sends = ", ".join(f"{s}->{d} chunk {c}" for s, d, c in self.transfers)
        lines = [f"{head}" + (f": {sends}" if sends else "")]
        for r, chunks in enumerate(self.contributors):
            cells = " | ".join("+".join(f"x{w}" for w in sorted(c)) for c in chunks)
            lines.append(f"  rank {r}: {cells}")
        return "\n".join(lines)


def ring_allreduce_steps(values_per_worker: Sequence[Sequence[float]]) -> list[RingStep]:
    """Replay the ring all-reduce on one thread; return the start state and each step's state.

    `values_per_worker[r]` is rank r's data (numbers, or a 1-D tensor); all must have
    the same length. The last state has every rank holding the element-wise sum.
    """
    data = [[float(x) for x in row] for row in values_per_worker]
    n = len(data)
    if n < 1:
        raise CourseInputError("values_per_worker must hold one sequence per worker (>= 1)")
    length = len(data[0])
    if any(len(row) != length for row in data):
        raise CourseInputError("values_per_worker: every worker must hold the same length")
    bounds = chunk_bounds(length, n)
    chunks = [[row[a:b] for a, b in bounds] for row in data]
    who = [[frozenset([r]) for _ in range(n)] for r in range(n)]

    def snapshot(phase: str, step: int, transfers) -> RingStep:
        return RingStep(
            phase,
            step,
            tuple(transfers),
            tuple(tuple(tuple(c) for c in row) for row in chunks),
            tuple(tuple(row) for row in who),
        )

    states = [snapshot("start", 0, [])]
    plans = [ring_plan(r, n) for r in range(n)]
    for i in range(2 * (n - 1)):
        # All ranks send at once, so read every outgoing chunk before anybody updates.
        outgoing = [(list(chunks[r][plans[r][i][2]]), who[r][plans[r][i][2]]) for r in range(n)]
        transfers = [(r, (r + 1) % n, plans[r][i][2]) for r in range(n)]
        for r in range(n):
            phase, _, _, recv_idx = plans[r][i]
            vals, contrib = outgoing[(r - 1) % n]
            if phase == "reduce-scatter":
                mine = chunks[r][recv_idx]
                chunks[r][recv_idx] = [a + b for a, b in zip(mine, vals, strict=True)]
                who[r][recv_idx] = who[r][recv_idx] | contrib
            else:
                chunks[r][recv_idx] = vals
                who[r][recv_idx] = contrib
        states.append(snapshot(plans[0][i][0], plans[0][i][1], transfers))
    return states
