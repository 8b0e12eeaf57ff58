"""Context parallelism on paper: work, bytes and memory per worker, and the predicted timeline.

`simulate_ring` predicts what `ring.RingAttention` measures, with or without overlapping
the transfers with compute; `measured_costs` reads the costs off a measured run.
"""

from __future__ import annotations

import math

from course_utils import validation
from course_utils.actions import Action
from course_utils.errors import CourseInputError
from course_utils.parallel.context_parallel.checks import (
    MAX_WORKERS,
    check_seq_split,
)
from course_utils.parallel.context_parallel.layout import block_products, sequence_chunks
from course_utils.parallel.context_parallel.ring import RingResult
from course_utils.threads.links import Links
from course_utils.timeline import Event, Timeline

FLASH_BACKWARD_FACTOR = 2.5  # backward / forward matmuls: 5 (S, dV, dP, dQ, dK) over 2 (S, PV)


# -- closed forms: work, bytes, memory ----------------------------------------------------


def causal_work(workers: int, zigzag: bool) -> list[int]:
    """Block products each worker computes in a causal ring pass (forward; backward the same).

    Plain split: worker i computes i+1 (its own diagonal block and the i blocks before
    it); the last worker does N, the first 1. Zig-zag: every worker computes 2N+1 chunk
    products (its early chunk i sees chunks 0..i: i+1; its late chunk 2N-1-i sees chunks
    0..2N-1-i: 2N-i). The chunks of the zig-zag split are half as long, so a zig-zag
    product is a quarter of a plain one; see `score_elements` for work in one unit.
    """
    validation.integer(workers, "workers", 1, MAX_WORKERS)
    if zigzag:
        return [2 * workers + 1] * workers
    return [i + 1 for i in range(workers)]


def score_elements(seq: int, workers: int, zigzag: bool = False, causal: bool = True) -> list[int]:
    """Attention scores (query-key pairs, per head) each worker computes in one ring pass.

    Without a mask every worker computes (L/N) x L. Causal, plain: (i+1)(L/N)^2, since a
    diagonal block is computed whole and masked. Causal, zig-zag: (2N+1)(L/2N)^2 each,
    = L^2/(2N) + (L/2N)^2: the causal half of the work plus one chunk product, evenly.
    """
    check_seq_split(seq, workers, zigzag)
    if not causal:
        return [seq * seq // workers] * workers
    if zigzag:
        chunk = seq // (2 * workers)
        return [(2 * workers + 1) * chunk * chunk] * workers
    block = seq // workers
    return [(i + 1) * block * block for i in range(workers)]


def kv_bytes_per_step(
    seq: int, workers: int, heads: int, dim: int, element_size: int = 4, batch: int = 1
) -> int:
    """Bytes one worker sends in one ring step: its K/V block, 2 x (L/N) x H x D elements."""
    check_seq_split(seq, workers, False)
    for name, value in {
        "heads": heads,
        "dim": dim,
        "element_size": element_size,
        "batch": batch,
    }.items():
        validation.integer(value, name)
    return 2 * (seq // workers) * heads * dim * element_size * batch


def ring_bytes_per_worker(
    seq: int, workers: int, heads: int, dim: int, element_size: int = 4, batch: int = 1
) -> dict[str, int]:
    """Bytes every worker sends: forward (N-1) K/V blocks; backward (N-1) K/V blocks + N dK/dV.

    With kv = `kv_bytes_per_step(...)`: forward (N-1) kv, backward (2N-1) kv (dK/dV have
    K/V's size and make one hop more, home). The forward sends (N-1)/N x 2 L H D elements
    per worker, like a ring all-gather of K and V: nearly constant as N grows, while each
    worker's compute shrinks like 1/N. So the blocks must stay big enough for a block's
    compute to hide its transfer (Liu et al. 2023, section 3).
    """
    kv = kv_bytes_per_step(seq, workers, heads, dim, element_size, batch)
    n = workers
    return {"forward": (n - 1) * kv, "backward": (2 * n - 1) * kv if n > 1 else 0}


def attention_activation_bytes(
    seq: int, workers: int, heads: int, dim: int, element_size: int = 4, batch: int = 1
) -> int:
    """Peak activation bytes one worker needs for one attention layer with ring attention.

    Assumptions (per worker, t = ceil(L/N) tokens, H heads of size D, all in one dtype):
    it keeps q, k, v and the output of its tokens (4 t H D, needed again by the backward),
    the log-sum-exp (t H), the buffer for the next K/V block arriving from the left
    (2 t H D), and the scores and probabilities of the one block product being computed
    (2 t^2 H; a tiled flash-style kernel would keep only one tile of it, ignored here):

        bytes = element_size x batch x H x (6 t D + t + 2 t^2).

    With N = 1 this is plain attention with its whole L x L score matrix. Raising the
    context-parallel degree N divides the linear terms by N and the score term by N^2.
    """
    for name, value in {"seq": seq, "workers": workers, "heads": heads, "dim": dim}.items():
        validation.integer(value, name)
    validation.integer(element_size, "element_size")
    validation.integer(batch, "batch")
    t = -(-seq // workers)
    return element_size * batch * heads * (6 * t * dim + t + 2 * t * t)


# -- predicting the timeline --------------------------------------------------------------


def _step_cost(
    rank: int, owner: int, workers: int, zigzag: bool, causal: bool, diagonal_factor: float = 1.0
) -> float:
    """Compute of one ring step, in full (L/N) x (L/N) blocks; a masked diagonal product
    counts `diagonal_factor` times its scores (1: whole, as the course's count; 0.5: a
    kernel that skips the masked half; a CPU that computes the mask too may pay more)."""
    per_worker = len(sequence_chunks(workers, zigzag)[rank])
    products = block_products(rank, owner, workers, zigzag, causal, chunk=1)
    weight = {True: diagonal_factor, False: 1.0}
    return sum(p.elements() * weight[p.diagonal] for p in products) / per_worker**2


def simulate_ring(
    workers: int,
    zigzag: bool = False,
    causal: bool = True,
    block_time: float = 1.0,
    transfer_time: float = 0.5,
    overlap: bool = True,
    backward: bool = False,
    backward_factor: float = FLASH_BACKWARD_FACTOR,
    unit: str = "units",
    diagonal_factor: float = 1.0,
    step_costs: dict[tuple[str, int, int], float] | None = None,
) -> Timeline:
    """Predict a ring-attention timeline (forward, and backward if asked) from a cost model.

    `block_time`: forward compute of one (L/N) x (L/N) block product (a zig-zag step costs
    its share of it: 3/4 on the diagonal, 1/2 otherwise). `transfer_time`: passing one K/V
    block to the right neighbour; dK/dV blocks have the same size. The backward costs
    `backward_factor` times the forward (2.5: five matmuls instead of two, Dao et al. 2022).
    Each link (worker -> right neighbour) carries one block at a time.

    overlap=True: a worker sends its block as a step starts and computes meanwhile; the
    next step waits only for the arriving block. The transfer hides completely when
    block_time >= transfer_time (Liu et al. 2023: the block must be big enough for its
    compute to cover its transfer). overlap=False: compute, then exchange blocks.

    `step_costs` replaces the cost model's compute by what each step measured:
    `{(kind, rank, owner): seconds}` (`measured_step_costs`), so the simulator lays out
    a run's own work and predicts only its waiting and its transfers.
    """
    if step_costs is not None:
        validation.instance(step_costs, "step_costs", dict, "a dict (measured_step_costs)")
    validation.integer(workers, "workers", 1, MAX_WORKERS)
    for name, value in {
        "block_time": block_time,
        "transfer_time": transfer_time,
        "backward_factor": backward_factor,
        "diagonal_factor": diagonal_factor,
    }.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0 <= value < math.inf
        ):
            raise CourseInputError(f"{name} must be a finite number >= 0, got {value!r}")
    n = workers
    events: list[Event] = []
    free = [0.0] * n  # when each worker can start its next piece of work
    link_free = [0.0] * n  # when the link worker -> right neighbour is idle again

    def send(rank: int, ready: float, kind: str, owner: int, what: str) -> float:
        start = max(ready, link_free[rank])
        end = start + transfer_time
        link_free[rank] = end
        right = (rank + 1) % n
        events.append(Event(rank, Action(0, kind, owner), start, end, f"{what}{owner}→{right}"))
        return end

    def compute(rank: int, start: float, kind: str, owner: int, cost: float) -> float:
        if cost > 0:
            events.append(
                Event(rank, Action(0, kind, owner), start, start + cost, f"q{rank}·kv{owner}")
            )
        return start + cost

    passes = [("F", 1.0)] + ([("B", backward_factor)] if backward else [])
    for kind, factor in passes:
        kv_arrival = [0.0] * n  # the block each worker needs in the current step
        dkv_arrival = [0.0] * n  # the dK/dV accumulator each worker needs (backward)
        for step in range(n):
            next_kv, next_dkv = [0.0] * n, [0.0] * n
            for rank in range(n):
                owner, right = (rank - step) % n, (rank + 1) % n
                if step_costs is not None:
                    cost = step_costs.get((kind, rank, owner), 0.0)
                else:
                    cost = block_time * _step_cost(rank, owner, n, zigzag, causal, diagonal_factor)
                    cost *= factor
                ready = max(free[rank], kv_arrival[rank])
                last = step == n - 1
                if overlap:
                    if not last:
                        next_kv[right] = send(rank, ready, "SEND_F", owner, "kv")
                    done = compute(rank, ready, kind, owner, cost)
                    if kind == "B" and n > 1:
                        done = max(done, dkv_arrival[rank] if step > 0 else 0.0)
                        next_dkv[right] = send(rank, done, "SEND_B", owner, "dkv")
                    free[rank] = done
                else:
                    done = compute(rank, ready, kind, owner, cost)
                    if kind == "B" and n > 1:
                        done = max(done, dkv_arrival[rank] if step > 0 else 0.0)
                        done = next_dkv[right] = send(rank, done, "SEND_B", owner, "dkv")
                    if not last:
                        done = next_kv[right] = send(rank, done, "SEND_F", owner, "kv")
                    free[rank] = done
            kv_arrival, dkv_arrival = next_kv, next_dkv
        # the last dK/dV hop must reach its owner before the pass is over
        free = [max(f, a) for f, a in zip(free, dkv_arrival, strict=True)]
    split = "zig-zag" if zigzag else "plain"
    return Timeline(
        events,
        n,
        name=f"ring attention ({split} split, {'causal' if causal else 'full'}), p={n}",
        source="simulated",
        unit=unit,
        meta={"zigzag": zigzag, "causal": causal, "overlap": overlap},
    )


def measured_costs(result: RingResult, seq: int, links: Links | None = None) -> dict[str, float]:
    """The cost model `simulate_ring` needs, read off a measured run (in seconds).

    block_time: forward compute per full (L/N) x (L/N) block, from all workers' F time;
    backward_factor: backward time per score over forward time per score;
    transfer_time: one K/V block over `links` (the virtual clock's), or without links the
    mean time of one K/V send as measured (on threads: the copy into the mailbox).
    """
    workers = len(result.bytes_forward)
    block = (seq // workers) ** 2
    sends = [e.duration for e in result.timeline.events if e.action.kind == "SEND_F"]
    forward_full, forward_diagonal = _per_score(result, "F", seq)
    backward_full, _ = _per_score(result, "B", seq)
    return {
        "block_time": forward_full * block,
        "diagonal_factor": forward_diagonal / forward_full if forward_full > 0 else 1.0,
        "backward_factor": (
            backward_full / forward_full
            if backward_full and forward_full > 0
            else FLASH_BACKWARD_FACTOR
        ),
        "transfer_time": (
            _block_transfer_time(result, links)
            if links is not None
            else sum(sends) / len(sends)
            if sends
            else 0.0
        ),
    }


def measured_step_costs(result: RingResult) -> dict[tuple[str, int, int], float]:
    """What each ring step's compute took in a measured run: {(kind, rank, owner): s}."""
    costs: dict[tuple[str, int, int], float] = {}
    for e in result.timeline.events:
        if e.action.kind in ("F", "B") and e.label is not None and "·" in e.label:
            key = (e.action.kind, e.device, e.action.microbatch or 0)
            costs[key] = costs.get(key, 0.0) + e.duration
    return costs


def _per_score(result: RingResult, kind: str, seq: int) -> tuple[float, float]:
    """Seconds per score of full and of masked diagonal products, fitted to the run's
    `kind` events (least squares: an event lasts full scores x a + diagonal scores x b)."""
    workers = len(result.bytes_forward)
    zigzag, causal = result.timeline.meta["zigzag"], result.timeline.meta["causal"]
    chunk = seq // workers // len(sequence_chunks(workers, zigzag)[0])  # tokens per chunk
    rows = []  # (full scores, diagonal scores, seconds) per compute event
    for e in result.timeline.events:
        if e.action.kind != kind or e.label is None or "·" not in e.label:
            continue
        products = block_products(
            e.device, e.action.microbatch or 0, workers, zigzag, causal, chunk
        )
        full = sum(p.elements() for p in products if not p.diagonal)
        rows.append((full, sum(p.elements() for p in products) - full, e.duration))
    sxx = sum(f * f for f, _, _ in rows)
    syy = sum(d * d for _, d, _ in rows)
    sxy = sum(f * d for f, d, _ in rows)
    sxt = sum(f * t for f, _, t in rows)
    syt = sum(d * t for _, d, t in rows)
    det = sxx * syy - sxy * sxy
    if det > 1e-9 * max(sxx * syy, 1.0):
        return (sxt * syy - syt * sxy) / det, (syt * sxx - sxt * sxy) / det
    total = sum(f + d for f, d, _ in rows)  # one kind of product only: one cost per score
    per = sum(t for _, _, t in rows) / total if total else 0.0
    return per, per


def _block_transfer_time(result: RingResult, links: Links) -> float:
    """One K/V block (one message per ring step) over the ring's slowest link."""
    workers = len(result.bytes_forward)
    if workers == 1:
        return 0.0
    per_step = result.bytes_forward[0] / (workers - 1)
    return links.latency + per_step / links.ring_bandwidth(workers)
