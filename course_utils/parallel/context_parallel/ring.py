"""Ring attention run on threads: K/V blocks travel around the ring, dK/dV follow them home.

`ring_attention_forward` / `_backward` are what one worker runs; `RingAttention` runs N of
them on `DeviceThreads`, checks them against one device and records a measured timeline.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch

from course_utils.actions import Action
from course_utils.errors import WorkerError
from course_utils.parallel.context_parallel.attention import (
    block_attention_backward_unchecked,
    block_attention_unchecked,
    causal_mask,
    merge_partials_unchecked,
)
from course_utils.parallel.context_parallel.checks import (
    MAX_WORKERS,
    check_ring_inputs,
    check_timeout,
)
from course_utils.parallel.context_parallel.layout import (
    BlockProduct,
    block_products,
    gather_chunks,
    sequence_chunks,
    split_sequence,
)
from course_utils.threads.devices import Aborted, ThreadRunner
from course_utils.threads.links import Links
from course_utils.threads.trace import Recorder, current, on
from course_utils.timeline import Timeline

# -- the ring, as run by one worker -------------------------------------------------------


class PointToPoint(Protocol):
    """All a ring worker needs from its link to the others: the threads' `Communicator`,
    or `course_utils.distributed.ring.GlooRing` on real processes."""

    rank: int
    world_size: int

    def send(self, dst: int, tensor: torch.Tensor) -> None: ...

    def recv(self, src: int) -> torch.Tensor: ...


class Record(NamedTuple):
    """One thing a worker did: compute ("F", "B") or a send ("SEND_F" K/V, "SEND_B" dK/dV)."""

    kind: str
    owner: int  # whose K/V block
    label: str
    start_ns: int
    end_ns: int
    products: int = 0
    elements: int = 0


def _send(comm: PointToPoint, dst: int, pair, kind: str, owner: int, label: str, trace):
    """Send two same-shaped blocks (K and V, or dK and dV) as one message, as ring
    attention kernels do with one buffer: one transfer per step."""
    start = time.perf_counter_ns()
    both = torch.stack(pair)
    if current() is not None:  # on threads: the transfer is drawn on the virtual clock
        comm.send(dst, both, action=Action(0, kind, owner), label=label)  # type: ignore[call-arg]
    else:
        comm.send(dst, both)
    if trace is not None:
        trace.append(Record(kind, owner, label, start, time.perf_counter_ns()))


def _recv(comm: PointToPoint, src: int) -> tuple[torch.Tensor, torch.Tensor]:
    first, second = comm.recv(src).unbind(0)
    return first, second


def _adding() -> AbstractContextManager:
    """CPU time on the calling thread's stream without a bar (the dK/dV accumulation)."""
    stream = current()
    return stream.burst() if stream else nullcontext()


def _computing(kind: str, owner: int, label: str) -> AbstractContextManager:
    """A compute bar on the calling thread's stream, when one records (threads)."""
    stream = current()
    return stream.compute(Action(0, kind, owner), label) if stream else nullcontext()


def _block_in_hand(
    comm: PointToPoint, step: int, k, v, causal: bool, zigzag: bool, chunk: int, trace
) -> tuple[int, list[BlockProduct]]:
    """Step `step` of a pass around the ring: whose K/V block the worker holds, and the
    products to compute with it. The block goes on to the right first (but in the last
    step), so that its transfer could overlap with the compute."""
    n, rank = comm.world_size, comm.rank
    right, owner = (rank + 1) % n, (rank - step) % n
    if step < n - 1:
        _send(comm, right, (k, v), "SEND_F", owner, f"kv{owner}→{right}", trace)
    return owner, block_products(rank, owner, n, zigzag, causal, chunk)


@contextmanager
def _computing_products(
    kind: str, rank: int, owner: int, products: list[BlockProduct], trace
) -> Iterator[None]:
    """One step's compute ("F" or "B") with `owner`'s block: a bar on the thread's stream
    and a `Record` in `trace` when there are products (a causal skip computes nothing)."""
    start = time.perf_counter_ns()
    label = f"q{rank}·kv{owner}"
    with _computing(kind, owner, label) if products else nullcontext():
        yield
    if trace is not None and products:
        elements = sum(p.elements() for p in products)
        trace.append(
            Record(kind, owner, label, start, time.perf_counter_ns(), len(products), elements)
        )


def ring_attention_forward(
    comm: PointToPoint,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    zigzag: bool = False,
    trace: list[Record] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Worker `comm.rank`'s part of ring attention: (output, log-sum-exp) for its own queries.

    `q`, `k`, `v` are this worker's tokens (`split_sequence`). In step s it holds the K/V
    block of worker (rank - s) mod N; it first passes that block on to the right (so the
    transfer could overlap with the compute), then merges its queries' attention to the
    block into the running result, then takes the next block from the left.
    """
    n, rank = comm.world_size, comm.rank
    left = (rank - 1) % n
    chunk = q.shape[-2] // len(sequence_chunks(n, zigzag)[rank])
    diagonal_mask = causal_mask(chunk, chunk, q.device)
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    for step in range(n):
        owner, products = _block_in_hand(comm, step, k, v, causal, zigzag, chunk, trace)
        with _computing_products("F", rank, owner, products, trace):
            for p in products:
                mask = diagonal_mask if p.diagonal else None
                block_out, block_lse = block_attention_unchecked(
                    q[..., p.q_rows, :], k[..., p.kv_rows, :], v[..., p.kv_rows, :], mask
                )
                out[..., p.q_rows, :], lse[..., p.q_rows] = merge_partials_unchecked(
                    out[..., p.q_rows, :], lse[..., p.q_rows], block_out, block_lse
                )
        if step < n - 1:
            k, v = _recv(comm, left)
    return out, lse


def ring_attention_backward(
    comm: PointToPoint,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    causal: bool = False,
    zigzag: bool = False,
    trace: list[Record] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Worker `comm.rank`'s part of the ring backward: (dq, dk, dv) for its own tokens.

    The K/V blocks go around the ring again. Each block's dK/dV accumulator follows one
    hop behind it: in step s the worker computes its share for the block in hand, takes
    the block's accumulator from the left (every worker before it has added its share),
    adds its own and passes it right. After the last step one more hop brings every
    accumulator home to the block's owner.
    """
    n, rank = comm.world_size, comm.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    chunk = q.shape[-2] // len(sequence_chunks(n, zigzag)[rank])
    diagonal_mask = causal_mask(chunk, chunk, q.device)
    delta = (dout * out).sum(dim=-1)  # D_i = dO_i . O_i, the same for every key block
    dq = torch.zeros_like(q)
    for step in range(n):
        owner, products = _block_in_hand(comm, step, k, v, causal, zigzag, chunk, trace)
        with _computing_products("B", rank, owner, products, trace):
            dk_part, dv_part = torch.zeros_like(k), torch.zeros_like(v)
            for p in products:
                qr, kr = p.q_rows, p.kv_rows
                dq_p, dk_p, dv_p = block_attention_backward_unchecked(
                    q[..., qr, :],
                    k[..., kr, :],
                    v[..., kr, :],
                    dout[..., qr, :],
                    lse[..., qr],
                    delta[..., qr],
                    diagonal_mask if p.diagonal else None,
                )
                dq[..., qr, :] += dq_p
                dk_part[..., kr, :] += dk_p
                dv_part[..., kr, :] += dv_p
        if step == 0:
            dk_acc, dv_acc = dk_part, dv_part  # our own block: we are the first to add to it
        else:
            dk_acc, dv_acc = _recv(comm, left)
            with _adding():  # compute too, but no bar of its own
                dk_acc += dk_part
                dv_acc += dv_part
        if n > 1:
            _send(comm, right, (dk_acc, dv_acc), "SEND_B", owner, f"dkv{owner}→{right}", trace)
        if step < n - 1:
            k, v = _recv(comm, left)
    if n == 1:
        return dq, dk_acc, dv_acc
    return (dq, *_recv(comm, left))  # our own block's dK, dV, complete


# -- running it on threads ----------------------------------------------------------------


@dataclass
class RingResult:
    """One ring-attention run, put back in sequence order.

    `out`, `lse` (and `dq`, `dk`, `dv` when a backward ran) are full-sequence tensors.
    Per worker: bytes sent in the forward and in the backward (from the group's counters),
    block products and attention-score elements (per head) computed in each pass.
    `timeline` is measured (seconds since the run started).
    """

    out: torch.Tensor
    lse: torch.Tensor
    dq: torch.Tensor | None
    dk: torch.Tensor | None
    dv: torch.Tensor | None
    bytes_forward: list[int]
    bytes_backward: list[int]
    products_forward: list[int]
    products_backward: list[int]
    elements_forward: list[int]
    elements_backward: list[int]
    timeline: Timeline
    trace: Recorder | None = None  # draws the same run on the other clock

    @property
    def compute_seconds(self) -> list[float]:
        """Measured compute time of each worker (forward and backward)."""
        return self.timeline.busy_per_device()


class RingAttention(ThreadRunner):
    """Ring attention over `workers` threads; plain or zig-zag split; causal or not.

    Use as a context manager (or call `close()`) to stop the threads:

        with RingAttention(4, causal=True, zigzag=True) as ring:
            result = ring.forward_backward(q, k, v, dout)   # q, k, v: (..., seq, d)
    """

    def __init__(
        self,
        workers: int,
        causal: bool = False,
        zigzag: bool = False,
        timeout: float = 60.0,
        clock: str = "virtual",
        links: Links | None = None,
    ) -> None:
        self._keep_workers_and_clock(workers, MAX_WORKERS, clock, links)
        check_timeout(timeout)
        self.causal, self.zigzag = bool(causal), bool(zigzag)
        self._start_threads("cp", timeout, one_core=self.clock == "virtual")
        self._warm_up()

    def _warm_up(self) -> None:
        """One tiny float32 ring, forward and backward, whose result is thrown away.

        On fresh threads the first run now and then came out less exact than every later
        one: up to 5.9e-5 from full attention in float32 (about 1 fresh process in 8 here,
        torch 2.13; the same inputs recomputed gave the right value, so a first call in a
        new thread, not the ring, is to blame). After one run every result was within
        2.4e-7 (in 140 fresh processes), and no timing includes the threads' first steps.
        """
        tokens = 2 * self.workers if self.zigzag else self.workers
        q = torch.linspace(-1.0, 1.0, 2 * tokens, dtype=torch.float32).reshape(tokens, 2)
        try:
            self.forward_backward(q, q.flip(0), q, q)
        except BaseException:
            self.close()
            raise

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> RingResult:
        """The forward only: output and log-sum-exp (dq, dk, dv are None)."""
        return self._run(q, k, v, None)

    def forward_backward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor
    ) -> RingResult:
        """Forward, then backward with dL/d(out) = `dout`, both as rings."""
        return self._run(q, k, v, dout)

    def _run(self, q, k, v, dout) -> RingResult:
        tensors = {"q": q, "k": k, "v": v} | ({} if dout is None else {"dout": dout})
        check_ring_inputs(tensors, self.workers, self.zigzag)
        split = {
            name: split_sequence(t.detach(), self.workers, self.zigzag)
            for name, t in tensors.items()
        }
        self.group.reset_counters()
        sent = self.group.bytes_sent  # each worker only adds to its own entry
        opts = {"causal": self.causal, "zigzag": self.zigzag}

        recorder = Recorder()

        def work(rank: int):
            stream = recorder.stream(rank)

            def run():
                comm, trace, doing = self.group.comm(rank), [], "forward"
                qr, kr, vr = split["q"][rank], split["k"][rank], split["v"][rank]
                try:
                    with torch.no_grad():
                        out, lse = ring_attention_forward(comm, qr, kr, vr, trace=trace, **opts)
                        after_forward, grads = sent[rank], None
                        if dout is not None:
                            doing = "backward"
                            grads = ring_attention_backward(
                                comm, qr, kr, vr, out, lse, split["dout"][rank], trace=trace, **opts
                            )
                except Aborted:
                    raise  # a peer failed first; the pool reports that one
                except Exception as exc:
                    last = f", after {trace[-1].kind} {trace[-1].label}" if trace else ""
                    raise WorkerError(
                        f"device {rank} failed in the ring attention {doing}{last}: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                return out, lse, grads, after_forward, sent[rank] - after_forward, trace

            return on(stream, run)

        results = self.run_jobs([work(r) for r in range(self.workers)], recorder)
        return self._result(results, recorder, dout is not None)

    def _result(self, results, recorder: Recorder, backward: bool) -> RingResult:
        layout = sequence_chunks(self.workers, self.zigzag)

        def gather(i: int, j: int | None = None, dim: int = -2):
            return gather_chunks([r[i] if j is None else r[i][j] for r in results], layout, dim)

        traces = [r[5] for r in results]

        def count(kind: str, field: str) -> list[int]:
            return [sum(getattr(x, field) for x in t if x.kind == kind) for t in traces]

        split = "zig-zag" if self.zigzag else "plain"
        mask = "causal" if self.causal else "full"
        timeline = self._timeline(
            recorder,
            name=f"ring attention ({split} split, {mask}), p={self.workers}",
            meta={"zigzag": self.zigzag, "causal": self.causal},
        )
        return RingResult(
            out=gather(0),
            lse=gather(1, dim=-1),
            dq=gather(2, 0) if backward else None,
            dk=gather(2, 1) if backward else None,
            dv=gather(2, 2) if backward else None,
            bytes_forward=[r[3] for r in results],
            bytes_backward=[r[4] for r in results],
            products_forward=count("F", "products"),
            products_backward=count("B", "products"),
            elements_forward=count("F", "elements"),
            elements_backward=count("B", "elements"),
            timeline=timeline,
            trace=recorder,
        )
