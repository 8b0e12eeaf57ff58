"""All-reduce by hand: a message-passing group of threads, and the naive and ring algorithms.

Data and tensor parallelism both need every worker to end up with the *sum* of a tensor
that each worker holds a different version of. That is an all-reduce. Here it is written
out with nothing but point-to-point messages between threads, so a learner can read
every send and receive:

    group = ThreadGroup(world_size=4)          # shared by the 4 threads
    comm = group.comm(rank)                    # inside thread `rank`
    comm.all_reduce(grad, op="mean", algorithm="ring")

Each ordered pair of ranks (src, dst) has its own mailbox (a FIFO queue), like one
direction of a network link. Every message is a copy, and its size is added to
`group.bytes_sent[src]` (and `group.bytes_received[dst]`), so the lesson can compare
the two algorithms' traffic:

- naive: everybody sends to rank 0, which sums and sends the result back.
  Rank 0 receives (N-1) x S bytes and sends (N-1) x S bytes: it is the bottleneck.
- ring (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of
  workstations"; the algorithm in NCCL and Horovod): cut the data into N chunks; in N-1
  reduce-scatter steps every rank passes one chunk to its right neighbour, which adds
  it to its own copy, until each rank owns one fully summed chunk; in N-1 all-gather
  steps the finished chunks travel once more around the ring. Every rank sends
  2(N-1)/N x S bytes, whatever N is.

The two halves of the ring are also collectives of their own, used by sharded data
parallelism (ZeRO/FSDP) and sequence parallelism: `Communicator.all_gather` (every rank
ends with all ranks' shards, concatenated) and `Communicator.reduce_scatter` (every rank
ends with its own chunk of the sum). Each moves (N-1)/N x S bytes per rank, half of an
all-reduce; `ring_all_gather_bytes` and `ring_reduce_scatter_bytes` give the exact counts.

Expert parallelism needs a different pattern, the all-to-all: every rank has a separate
chunk for every other rank (the tokens routed to that rank's experts) and receives one
chunk from each. `Communicator.all_to_all` writes it as N-1 sends and N-1 receives per
rank; `all_to_all_bytes` says how many bytes each rank sends.

The plans and byte counts on paper, and `ring_allreduce_steps` (the ring replayed on one
thread, recording who holds what after every step), are in `threads.ring`.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Sequence

import torch

from course_utils.actions import Action
from course_utils.errors import CourseInputError, WorkerError
from course_utils.parallel.costs import ALGORITHMS
from course_utils.threads import trace
from course_utils.threads.devices import Aborted
from course_utils.threads.mailboxes import Mailboxes
from course_utils.threads.ring import (  # re-exported: the lessons import them from here
    RingStep,
    all_to_all_bytes,
    chunk_bounds,
    chunk_sizes,
    naive_bytes_per_rank,
    ring_all_gather_bytes,
    ring_allreduce_steps,
    ring_bytes_per_rank,
    ring_plan,
    ring_reduce_scatter_bytes,
)

__all__ = [
    "CommAborted",
    "CommError",
    "Communicator",
    "OPS",
    "RingStep",
    "ThreadGroup",
    "all_to_all_bytes",
    "check_options",
    "chunk_bounds",
    "chunk_sizes",
    "naive_bytes_per_rank",
    "ring_all_gather_bytes",
    "ring_allreduce_steps",
    "ring_bytes_per_rank",
    "ring_plan",
    "ring_reduce_scatter_bytes",
    "run_all_gather",
    "run_all_reduce",
    "run_reduce_scatter",
]

OPS = ("sum", "mean")
_POLL_S = 0.02  # how often a blocked recv looks at the abort event


def _burst():
    """Compute inside a collective (the additions): timed on the calling thread's stream."""
    stream = trace.current()
    return stream.burst() if stream is not None else contextlib.nullcontext()


class CommError(WorkerError):
    """A receive that gave up: timed out, or a peer failed and the group was aborted."""


class CommAborted(Aborted, CommError):
    """A receive gave up because the abort event was set (another worker failed first)."""


def check_options(op: str, algorithm: str) -> None:
    """Raise a one-line CourseInputError for an unknown reduction op or algorithm."""
    if op not in OPS:
        raise CourseInputError(f"op must be one of {', '.join(OPS)}, got {op!r}")
    if algorithm not in ALGORITHMS:
        raise CourseInputError(
            f"algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}"
        )


def _check_dim(tensor: torch.Tensor, dim: int, name: str) -> int:
    """`dim` as a non-negative axis of `tensor`, or a one-line CourseInputError."""
    ndim = tensor.dim()
    if ndim == 0:
        raise CourseInputError("tensor must have at least one dimension to split or join")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
        raise CourseInputError(f"{name} must be an axis in {-ndim}..{ndim - 1}, got {dim!r}")
    return dim % ndim


# -- the group of threads -----------------------------------------------------------------


class ThreadGroup:
    """N ranks (threads) with a mailbox per ordered pair of ranks and a shared barrier.

    Create it once, outside the threads, then give thread `r` its handle `group.comm(r)`.
    `abort` is the event that makes blocked receives give up (pass the pool's
    `DeviceThreads.abort` so one failing worker does not leave the others hanging);
    `timeout` bounds any single receive. With `mail` (a `Mailboxes`, as the per-rank harness
    `threads.ranks` gives) the messages go through it instead, keyed ("comm", src, dst): a
    collective that some rank never joins is then reported as a deadlock at once.
    """

    def __init__(
        self,
        world_size: int,
        abort: threading.Event | None = None,
        timeout: float = 60.0,
        devices: Sequence[int] | None = None,
        mail: Mailboxes | None = None,
    ) -> None:
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise CourseInputError(f"world_size must be an integer >= 1, got {world_size!r}")
        if not timeout > 0:
            raise CourseInputError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.world_size = world_size
        self.abort = abort if abort is not None else threading.Event()
        self.timeout = timeout
        if devices is None:
            devices = range(world_size)
        self.devices = [int(d) for d in devices]  # the device rank r stands for (its links)
        if len(self.devices) != world_size or min(self.devices) < 0:
            raise CourseInputError(
                f"devices must give one device number >= 0 per rank ({world_size}), got {devices!r}"
            )
        # Every message carries its sender's running number, so a receive names exactly the
        # message it took (the virtual clock matches sends and receives by it).
        self._sent: dict[tuple[int, int], int] = {}
        self._mailboxes: dict[tuple[int, int], queue.SimpleQueue[tuple[int, torch.Tensor]]] = {
            (src, dst): queue.SimpleQueue()
            for src in range(world_size)
            for dst in range(world_size)
            if src != dst
        }
        self._cond = threading.Condition()  # the barrier: arrivals in this generation
        self._arrived = 0
        self._generation = 0
        self._lock = threading.Lock()
        self.bytes_sent = [0] * world_size
        self.messages_sent = [0] * world_size
        self.bytes_received = [0] * world_size
        self.mail = mail

    def comm(self, rank: int) -> Communicator:
        """The handle thread `rank` uses to talk to the others."""
        if not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise CourseInputError(
                f"rank must be an integer in 0..{self.world_size - 1}, got {rank!r}"
            )
        return Communicator(self, rank)

    def reset_counters(self) -> None:
        with self._lock:
            self.bytes_sent = [0] * self.world_size
            self.messages_sent = [0] * self.world_size
            self.bytes_received = [0] * self.world_size

    def reset(self) -> None:
        """Empty the mailboxes and reset the barrier (after an aborted run)."""
        for box in self._mailboxes.values():
            while not box.empty():
                box.get_nowait()
        self._sent.clear()
        with self._cond:
            self._arrived = 0
            self._generation += 1

    def _count(self, rank: int, nbytes: int) -> None:
        with self._lock:
            self.bytes_sent[rank] += nbytes
            self.messages_sent[rank] += 1

    def _count_received(self, rank: int, nbytes: int) -> None:
        with self._lock:
            self.bytes_received[rank] += nbytes


class Communicator:
    """One rank's view of a `ThreadGroup`: send, recv, barrier and all-reduce."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = group.world_size

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, world_size={self.world_size})"

    # -- point to point --

    def send(
        self,
        dst: int,
        tensor: torch.Tensor,
        *,
        action: Action | None = None,
        label: str | None = None,
    ) -> None:
        """Put a copy of `tensor` in the (self.rank, dst) mailbox; never blocks.

        `action` (e.g. `Action(0, "SEND_F", 2)`) draws the message's transfer as a bar of
        the recorded timeline, labelled `label`.
        """
        self._check_peer(dst, "dst")
        g = self.group
        message = tensor.detach().clone()  # a message is a copy: the sender may keep editing
        nbytes = message.numel() * message.element_size()
        g._count(self.rank, nbytes)
        pair = (self.rank, dst)
        number = g._sent.get(pair, 0)  # only this rank's thread sends on this pair
        g._sent[pair] = number + 1
        stream = trace.current()
        if stream is not None:
            stream.send((id(g), *pair, number), g.devices[dst], nbytes, action, label)
        if g.mail is not None:
            g.mail.put(("comm", *pair), (number, message))
        else:
            g._mailboxes[pair].put((number, message))

    def recv(self, src: int) -> torch.Tensor:
        """Take the next message from `src`; give up on abort or after the group's timeout."""
        self._check_peer(src, "src")
        if self.group.mail is not None:
            what = f"rank {src}'s part of a collective"
            number, message = self.group.mail.get(("comm", src, self.rank), self.rank, what)
            return self._received(src, number, message)
        box = self.group._mailboxes[(src, self.rank)]
        deadline = time.monotonic() + self.group.timeout
        while True:
            try:
                number, message = box.get(timeout=_POLL_S)
            except queue.Empty:
                pass
            else:
                return self._received(src, number, message)
            if self.group.abort.is_set():
                raise CommAborted(f"rank {self.rank}: gave up waiting for rank {src} (aborted)")
            if time.monotonic() > deadline:
                raise CommError(
                    f"rank {self.rank}: no message from rank {src} after "
                    f"{self.group.timeout:g} s (did every rank call the same collective?)"
                )

    def _received(self, src: int, number: int, message: torch.Tensor) -> torch.Tensor:
        """Count and trace message `number` from `src`, now taken."""
        self.group._count_received(self.rank, message.numel() * message.element_size())
        stream = trace.current()
        if stream is not None:
            stream.recv((id(self.group), src, self.rank, number))
        return message

    def barrier(self) -> None:
        """Wait until every rank arrives (or give up on abort/timeout)."""
        g = self.group
        deadline = time.monotonic() + g.timeout
        with g._cond:
            generation = g._generation
            stream = trace.current()
            if stream is not None:  # on the virtual clock: a zero-byte message to everybody
                others = [r for r in range(self.world_size) if r != self.rank]
                for r in others:
                    stream.send(("barrier", id(g), generation, self.rank, r), g.devices[r], 0)
                for r in others:
                    stream.recv(("barrier", id(g), generation, r, self.rank))
            g._arrived += 1
            if g._arrived == self.world_size:  # the last one in lets everybody go
                g._arrived = 0
                g._generation += 1
                g._cond.notify_all()
                return
            while g._generation == generation:
                if g.abort.is_set():
                    raise CommAborted(f"rank {self.rank}: barrier aborted")
                if time.monotonic() > deadline:
                    raise CommError(
                        f"rank {self.rank}: barrier not reached by all ranks after {g.timeout:g} s"
                    )
                g._cond.wait(_POLL_S)

    def _check_peer(self, peer: int, name: str) -> None:
        if not isinstance(peer, int) or not 0 <= peer < self.world_size or peer == self.rank:
            raise CourseInputError(
                f"{name} must be another rank in 0..{self.world_size - 1} (not {self.rank}), "
                f"got {peer!r}"
            )

    # -- all-reduce --

    def all_reduce(
        self,
        tensor: torch.Tensor | Sequence[torch.Tensor],
        op: str = "sum",
        algorithm: str = "ring",
    ) -> torch.Tensor | Sequence[torch.Tensor]:
        """Sum (or average) `tensor` over all ranks, in place; returns it.

        `tensor` may be one tensor of any shape or a list of tensors of different shapes
        (they are flattened into one buffer, reduced together and copied back).
        Every rank must call this with the same shapes, op and algorithm.
        """
        check_options(op, algorithm)
        tensors = [tensor] if isinstance(tensor, torch.Tensor) else list(tensor)
        if any(not isinstance(t, torch.Tensor) for t in tensors):
            raise CourseInputError("tensor must be a torch.Tensor or a list of tensors")
        if not tensors:
            return tensor
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        if algorithm == "ring":
            self._ring_all_reduce(flat)
        else:
            self._naive_all_reduce(flat)
        if op == "mean":
            with _burst():
                flat /= self.world_size
        offset = 0
        with torch.no_grad():
            for t in tensors:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()
        return tensor  # the very object passed in (a list stays that list), now reduced

    def _naive_all_reduce(self, flat: torch.Tensor) -> None:
        """Gather to rank 0, sum there, broadcast back."""
        if self.world_size == 1:
            return
        if self.rank == 0:
            for src in range(1, self.world_size):  # always the same order: deterministic sum
                incoming = self.recv(src)
                with _burst():
                    flat += incoming
            for dst in range(1, self.world_size):
                self.send(dst, flat)
        else:
            self.send(0, flat)
            flat.copy_(self.recv(0))

    def _ring_all_reduce(self, flat: torch.Tensor) -> None:
        """Reduce-scatter then all-gather around the ring rank -> rank + 1 (in place)."""
        n = self.world_size
        if n == 1:
            return
        bounds = chunk_bounds(flat.numel(), n)
        right, left = (self.rank + 1) % n, (self.rank - 1) % n
        for phase, _step, send_idx, recv_idx in ring_plan(self.rank, n):
            s0, s1 = bounds[send_idx]
            self.send(right, flat[s0:s1])
            r0, r1 = bounds[recv_idx]
            incoming = self.recv(left)
            if phase == "reduce-scatter":
                with _burst():
                    flat[r0:r1] += incoming  # add the left neighbour's partial sum
            else:
                flat[r0:r1] = incoming  # a finished chunk: just keep it

    # -- all-gather and reduce-scatter: the two halves of the ring all-reduce, on their own --
    #
    # Sharded data parallelism (ZeRO, FSDP) and sequence parallelism call the two halves
    # separately: all-gather rebuilds a full tensor from the shards the ranks hold, and
    # reduce-scatter sums full tensors but leaves each rank only its own chunk of the sum.
    # Both take N-1 steps in which every rank passes one chunk to its right neighbour.

    def all_gather(
        self, shard: torch.Tensor, dim: int = 0, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Concatenate every rank's `shard` along `dim`, in rank order; the same on all ranks.

        Ring: in step k rank r sends shard (r - k) to the right and receives shard
        (r - k - 1) from the left, so after N-1 steps every shard has visited every rank.
        Shards may differ in length along `dim` (every message carries its own size; the
        other dimensions must agree), so no padding is needed here. With `out` given, the
        result is written into it (no second full-size buffer) and `out` is returned.
        """
        if not isinstance(shard, torch.Tensor):
            raise CourseInputError("shard must be a torch.Tensor")
        dim = _check_dim(shard, dim, "dim")
        n = self.world_size
        # Filled in ring order: in step k the shard sent is one this rank already has.
        pieces: list[torch.Tensor] = [shard.detach()] * n
        right, left = (self.rank + 1) % n, (self.rank - 1) % n
        for k in range(n - 1):
            self.send(right, pieces[(self.rank - k) % n])
            pieces[(self.rank - k - 1) % n] = self.recv(left)
        if out is None:
            return torch.cat(pieces, dim=dim) if n > 1 else shard.detach().clone()
        total = sum(p.shape[dim] for p in pieces)
        if out.shape[dim] != total:
            raise CourseInputError(
                f"out must have size {total} along dim {dim} (all shards together), "
                f"got {out.shape[dim]}"
            )
        offset = 0
        with torch.no_grad():
            for piece in pieces:
                target = out.narrow(dim, offset, piece.shape[dim])
                if target.data_ptr() != piece.data_ptr():  # our own shard may already be there
                    target.copy_(piece)
                offset += piece.shape[dim]
        return out

    def reduce_scatter(
        self,
        tensor: torch.Tensor,
        op: str = "sum",
        dim: int = 0,
        sizes: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Sum `tensor` over all ranks and return only chunk `rank` of the sum (a new tensor).

        `tensor` is cut along `dim` into N chunks: `sizes[r]` long for rank r, or as even
        as `chunk_bounds` makes them (the first length % N chunks one longer). Every rank
        must pass the same shape. Ring: in step k rank r sends its running sum of chunk
        (r - k - 1) to the right and adds its own copy of chunk (r - k - 2) to what arrives
        from the left; after N-1 steps the sum that arrives last is chunk r, complete.
        """
        check_options(op, "ring")
        if not isinstance(tensor, torch.Tensor):
            raise CourseInputError("tensor must be a torch.Tensor")
        dim = _check_dim(tensor, dim, "dim")
        n, length = self.world_size, tensor.shape[dim]
        if sizes is None:
            bounds = chunk_bounds(length, n)
        else:
            sizes = [int(x) for x in sizes]
            if len(sizes) != n or min(sizes) < 0 or sum(sizes) != length:
                raise CourseInputError(
                    f"sizes must be {n} lengths >= 0 (one per rank) adding up to {length}, "
                    f"got {sizes}"
                )
            starts = [sum(sizes[:r]) for r in range(n)]
            bounds = [(a, a + size) for a, size in zip(starts, sizes, strict=True)]
        data = tensor.detach()
        chunks = [data.narrow(dim, a, b - a) for a, b in bounds]
        right, left = (self.rank + 1) % n, (self.rank - 1) % n
        running = chunks[self.rank].clone()  # n == 1: our chunk is already the whole sum
        for k in range(n - 1):
            self.send(right, chunks[(self.rank - k - 1) % n] if k == 0 else running)
            running = self.recv(left)  # a fresh copy: safe to add into
            with _burst():
                running += chunks[(self.rank - k - 2) % n]
        if op == "mean":
            with _burst():
                running /= n
        return running

    # -- all-to-all --

    def all_to_all(self, chunks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Send `chunks[d]` to rank d, for every d; return `received`, where `received[s]`
        is the chunk rank s addressed to this rank.

        The chunks may have different shapes (expert parallelism sends as many tokens as
        were routed, which differ from rank to rank). Our own chunk is kept, not sent:
        it costs no bytes, as on real hardware where it never leaves the device.
        Every rank must call this at the same point, each with `world_size` chunks.
        """
        n = self.world_size
        if isinstance(chunks, torch.Tensor) or len(chunks) != n:
            got = "a tensor" if isinstance(chunks, torch.Tensor) else f"{len(chunks)} chunks"
            raise CourseInputError(
                f"chunks must be a list of {n} tensors (one per rank), got {got}"
            )
        if any(not isinstance(c, torch.Tensor) for c in chunks):
            raise CourseInputError("chunks must be a list of torch.Tensor, one per rank")
        # Sends never block (a mailbox is a queue), so everybody can first post all its
        # messages and then collect; no ordering of pairs is needed to avoid deadlock.
        # Rank r starts with its right neighbour so not all ranks hit rank 0 first.
        for offset in range(1, n):
            dst = (self.rank + offset) % n
            self.send(dst, chunks[dst])
        received: list[torch.Tensor] = [None] * n  # type: ignore[list-item]
        received[self.rank] = chunks[self.rank].detach().clone()
        for offset in range(1, n):
            src = (self.rank - offset) % n
            received[src] = self.recv(src)
        return received


def run_all_reduce(
    tensors: Sequence[torch.Tensor],
    op: str = "sum",
    algorithm: str = "ring",
    threads=None,
) -> tuple[list[torch.Tensor], list[int]]:
    """All-reduce `tensors[r]` (rank r's data) on N real threads; return results and bytes sent.

    A convenience for lessons and tests: makes a `ThreadGroup`, runs one all-reduce per
    rank on `threads` (a `DeviceThreads` with >= N devices; a temporary one if None) and
    returns (each rank's reduced copy, `bytes_sent` per rank). The inputs are not modified.
    """
    check_options(op, algorithm)
    return _run_collective(
        tensors, lambda comm, t: comm.all_reduce(t, op=op, algorithm=algorithm), threads
    )


def _run_collective(inputs: Sequence[torch.Tensor], call, threads) -> tuple[list, list[int]]:
    """Run `call(comm, input)` on every rank's input on real threads; (results, bytes sent)."""
    from course_utils.threads.devices import DeviceThreads

    n = len(inputs)
    if n < 1:
        raise CourseInputError("tensors must hold one tensor per rank (at least one)")
    if any(not isinstance(t, torch.Tensor) for t in inputs):
        raise CourseInputError("tensors must hold one torch.Tensor per rank")
    pool = threads if threads is not None else DeviceThreads(n, name="rank")
    try:
        group = ThreadGroup(n, abort=pool.abort)
        copies = [t.detach().clone() for t in inputs]

        def work(rank: int):
            return lambda: call(group.comm(rank), copies[rank])

        results = pool.run([work(r) for r in range(n)])
        return results, list(group.bytes_sent)
    finally:
        if threads is None:
            pool.close()


def run_all_gather(
    shards: Sequence[torch.Tensor], dim: int = 0, threads=None
) -> tuple[list[torch.Tensor], list[int]]:
    """All-gather `shards[r]` (rank r's shard) on N threads; (each rank's result, bytes sent)."""
    return _run_collective(shards, lambda comm, t: comm.all_gather(t, dim=dim), threads)


def run_reduce_scatter(
    tensors: Sequence[torch.Tensor],
    op: str = "sum",
    dim: int = 0,
    sizes: Sequence[int] | None = None,
    threads=None,
) -> tuple[list[torch.Tensor], list[int]]:
    """Reduce-scatter `tensors[r]` on N threads; (rank r's chunk of the sum, bytes sent)."""
    check_options(op, "ring")
    return _run_collective(
        tensors, lambda comm, t: comm.reduce_scatter(t, op=op, dim=dim, sizes=sizes), threads
    )
