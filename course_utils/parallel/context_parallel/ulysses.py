"""Ulysses: sequence parallelism for attention by all-to-all over heads, run on threads.

DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv 2309.14509) splits the sequence like ring
attention: worker i of N holds the queries, keys and values of its L/N tokens, for all H
heads. Instead of passing K/V blocks round a ring it changes the split for attention:

    1. all-to-all: worker i sends head group j of its tokens to worker j, and receives its
       own head group of every worker's tokens. It now holds H/N heads of the WHOLE sequence.
    2. attention on those heads runs locally, exactly as on one device (causal or not: every
       worker sees whole sequences, so the causal mask costs every worker the same);
    3. all-to-all back: worker i sends the outputs of worker j's tokens to worker j and
       receives the other head groups of its own tokens: the sequence split again.

The backward mirrors it: dO goes to the head split, the local backward gives dQ, dK, dV
of H/N heads for the whole sequence, and one more all-to-all returns them to their tokens.
(DeepSpeed's `DistributedAttention` in deepspeed/sequence/layer.py does the same with
`all_to_all_single`: scatter the heads, gather the sequence, and back; it sends q, k and v
as three all-to-alls, which carry the same bytes as the one packed message sent here.)

Bytes. An all-to-all keeps 1/N of a worker's tensor home and sends the other (N-1)/N, so
with t = L/N tokens per worker every all-to-all of a [t, H, D] tensor sends (N-1)/N x tHD
elements. The forward has four (q, k, v, out), the backward four (dO, dQ, dK, dV):

    bytes per worker, each pass = 4 (N-1)/N x (L/N) H D e        (e bytes per value)

which shrinks like 1/N as workers are added, while the ring's forward, 2 (N-1)/N x L H D e,
stays nearly constant (`ring_bytes_per_worker`). The paper (Section 3.2) counts the same:
all-to-alls of aggregate size 3Nh (q, k, v) and Nh (output) for sequence length N, hidden
size h on P GPUs, 4Nh/P per link, its (P-1)/P rounded to 1.

Limits. Each worker computes whole heads, so the degree is bounded by the number of heads
(with grouped-query attention by the K/V heads, unless they are copied). This implementation
also splits them evenly, so N must divide H (and the K/V heads). DeepSpeed's
`DistributedAttention` no longer needs that: when N does not divide the heads it switches to
`uneven_heads_all2all` (deepspeed/sequence/layer.py), which gives some workers one head more
than others, still with fewer workers than heads. Beyond the heads, combine: Ulysses inside
a group of H workers and a ring across groups (the 2D "USP" scheme of Fang & Zhao 2024,
arXiv 2405.07719). Memory: a worker builds the scores of
H/N heads over the whole sequence, H L^2 / N, where the ring builds H (L/N)^2 per block;
with a tiled FlashAttention kernel neither builds them whole. `ulysses_activation_bytes`
counts it the way `attention_activation_bytes` counts the ring.

`UlyssesAttention` runs it on `DeviceThreads` with `Communicator.all_to_all`, and its result
holds the measured bytes per worker and a timeline (compute `F`/`B`, `ALL_TO_ALL` on the
communication lane).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch

from course_utils import validation
from course_utils.actions import Action
from course_utils.errors import CourseInputError, WorkerError
from course_utils.parallel.context_parallel.attention import (
    block_attention_backward_unchecked,
    block_attention_unchecked,
    causal_mask,
)
from course_utils.parallel.context_parallel.checks import (
    MAX_WORKERS,
    check_matching_tensors,
    check_timeout,
)
from course_utils.threads.devices import Aborted, ThreadRunner
from course_utils.timeline import Event, Timeline

# -- on paper ---------------------------------------------------------------------------


def ulysses_max_degree(heads: int, kv_heads: int | None = None) -> int:
    """The largest Ulysses degree without copying heads: the K/V heads (all heads for
    multi-head attention). Any degree used must also divide them."""
    validation.integer(heads, "heads")
    kv = heads if kv_heads is None else kv_heads
    validation.integer(kv, "kv_heads")
    if heads % kv:
        raise CourseInputError(f"kv_heads ({kv}) must divide heads ({heads})")
    return kv


def check_ulysses_degree(workers: int, heads: int, kv_heads: int | None = None) -> None:
    """A one-line error unless `workers` divides the (K/V) heads: each worker takes whole heads,
    as many as every other worker here (DeepSpeed also runs uneven splits, below the heads)."""
    validation.integer(workers, "workers", 1, MAX_WORKERS)
    kv = ulysses_max_degree(heads, kv_heads)
    if heads % workers or kv % workers:
        what = f"{kv} K/V heads" if kv != heads else f"{heads} heads"
        raise CourseInputError(
            f"workers must divide the {what} for Ulysses (each worker computes whole heads, "
            f"an equal share in this implementation), got {workers}"
        )


def ulysses_bytes_per_worker(
    seq: int,
    workers: int,
    heads: int,
    dim: int,
    element_size: int = 4,
    batch: int = 1,
    kv_heads: int | None = None,
) -> dict[str, int]:
    """Bytes every worker sends in the all-to-alls: forward (q, k, v, out), backward (dO, dQ,
    dK, dV); each all-to-all sends (N-1)/N of the worker's tokens of that tensor.

    With grouped-query attention (`kv_heads` < heads) k, v, dK and dV have kv_heads heads:
    per pass (N-1)/N x (L/N) x D x e x (2 H + 2 H_kv).
    """
    validation.integer(seq, "seq")
    check_ulysses_degree(workers, heads, kv_heads)
    for name, value in {"dim": dim, "element_size": element_size, "batch": batch}.items():
        validation.integer(value, name)
    if seq % workers:
        raise CourseInputError(f"seq must be a multiple of workers = {workers}, got {seq}")
    kv = heads if kv_heads is None else kv_heads
    n, t = workers, seq // workers
    # each all-to-all sends N-1 chunks of (heads / N) x t x D values; N divides both counts
    one_pass = (n - 1) * t * dim * element_size * batch * (2 * heads + 2 * kv) // n
    return {"forward": one_pass, "backward": one_pass}


def ulysses_activation_bytes(
    seq: int, workers: int, heads: int, dim: int, element_size: int = 4, batch: int = 1
) -> int:
    """Peak activation bytes of one worker for one attention layer with Ulysses.

    The same assumptions as `attention_activation_bytes` for the ring (t = L/N tokens, H heads
    of size D, one dtype): the worker keeps q, k, v and the output of its tokens (4 t H D),
    holds them in the head split while attention runs (the same number of elements, 4 t H D:
    H/N heads of all L tokens), the log-sum-exp (t H) and the scores and probabilities of
    its H/N heads over the whole sequence, 2 (H/N) L^2 = 2 N t^2 H:

        bytes = element_size x batch x H x (8 t D + t + 2 N t^2).

    The score term shrinks like 1/N (the ring's 2 t^2 H like 1/N^2): without a tiled kernel
    the ring needs less memory at the same degree.
    """
    for name, value in {"seq": seq, "workers": workers, "heads": heads, "dim": dim}.items():
        validation.integer(value, name)
    validation.integer(element_size, "element_size")
    validation.integer(batch, "batch")
    t = -(-seq // workers)
    return element_size * batch * heads * (8 * t * dim + t + 2 * workers * t * t)


# -- what one worker runs ---------------------------------------------------------------


class AllToAll(Protocol):
    """All a Ulysses worker needs from the others: `Communicator.all_to_all`."""

    rank: int
    world_size: int

    def all_to_all(self, chunks: list[torch.Tensor]) -> list[torch.Tensor]: ...


def _exchange(comm: AllToAll, chunks: list[torch.Tensor], trace, label: str, owner: int):
    start = time.perf_counter_ns()
    received = comm.all_to_all([c.contiguous() for c in chunks])
    if trace is not None:
        trace.append(("ALL_TO_ALL", label, start, time.perf_counter_ns(), owner))
    return received


def _to_heads(comm: AllToAll, x: torch.Tensor, trace, label: str) -> torch.Tensor:
    """Sequence split -> head split: x is (..., H, t, D) of this worker's tokens; returns
    (..., H/N, L, D) of this worker's heads over the whole sequence."""
    n = comm.world_size
    groups = x.chunk(n, dim=-3)  # head group j goes to worker j
    received = _exchange(comm, list(groups), trace, label, comm.rank)
    return torch.cat(received, dim=-2)  # worker s sent the tokens of sequence slice s


def _to_sequence(comm: AllToAll, x: torch.Tensor, trace, label: str) -> torch.Tensor:
    """Head split -> sequence split: x is (..., H/N, L, D); returns (..., H, t, D)."""
    n = comm.world_size
    slices = x.chunk(n, dim=-2)  # sequence slice i goes back to worker i
    received = _exchange(comm, list(slices), trace, label, comm.rank)
    return torch.cat(received, dim=-3)  # worker j sent head group j


def _compute(trace, kind: str, label: str, start: int) -> None:
    if trace is not None:
        trace.append((kind, label, start, time.perf_counter_ns(), -1))


def ulysses_attention_forward(
    comm: AllToAll,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    trace: list | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Worker `comm.rank`'s Ulysses forward. q, k, v: (..., H, t, D), its tokens.

    Returns its output (..., H, t, D) and what its backward needs, kept in the head split:
    q, k, v, the output and the log-sum-exp of its H/N heads over the whole sequence (as a
    local attention kernel keeps its inputs for its backward).
    """
    qkv = torch.stack([q, k, v])  # one message per peer: the three tensors packed
    qh, kh, vh = _to_heads(comm, qkv, trace, "q,k,v to heads").unbind(0)
    start = time.perf_counter_ns()
    length = qh.shape[-2]
    mask = causal_mask(length, length, qh.device) if causal else None
    out_h, lse_h = block_attention_unchecked(qh, kh, vh, mask)
    _compute(trace, "F", f"heads of w{comm.rank}", start)
    out = _to_sequence(comm, out_h, trace, "out to tokens")
    return out, (qh, kh, vh, out_h, lse_h)


def ulysses_attention_backward(
    comm: AllToAll,
    saved: tuple[torch.Tensor, ...],
    dout: torch.Tensor,
    causal: bool = False,
    trace: list | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Worker `comm.rank`'s Ulysses backward: (dq, dk, dv) for its own tokens, (..., H, t, D).

    `saved` is what the forward returned beside the output. dO goes to the head split, the
    backward of the local attention gives dQ, dK, dV of its heads over the whole sequence
    (Dao et al. 2022, appendix B, with the whole sequence as one block), and one all-to-all
    returns them to the workers that own the tokens.
    """
    qh, kh, vh, out_h, lse_h = saved
    dout_h = _to_heads(comm, dout, trace, "dout to heads")
    start = time.perf_counter_ns()
    length = qh.shape[-2]
    mask = causal_mask(length, length, qh.device) if causal else None
    delta = (dout_h * out_h).sum(dim=-1)
    dq_h, dk_h, dv_h = block_attention_backward_unchecked(qh, kh, vh, dout_h, lse_h, delta, mask)
    _compute(trace, "B", f"heads of w{comm.rank}", start)
    back = _to_sequence(comm, torch.stack([dq_h, dk_h, dv_h]), trace, "dq,dk,dv to tokens")
    dq, dk, dv = back.unbind(0)
    return dq, dk, dv


# -- on threads -------------------------------------------------------------------------


@dataclass
class UlyssesResult:
    """One Ulysses run, put back in sequence order: `out` (and `dq`, `dk`, `dv` after a
    backward) are full-sequence tensors; bytes each worker sent in the forward's and the
    backward's all-to-alls (from the group's counters); a measured `timeline` (seconds)."""

    out: torch.Tensor
    dq: torch.Tensor | None
    dk: torch.Tensor | None
    dv: torch.Tensor | None
    bytes_forward: list[int]
    bytes_backward: list[int]
    heads_per_worker: int
    timeline: Timeline

    @property
    def compute_seconds(self) -> list[float]:
        """Measured compute time of each worker (forward and backward)."""
        return self.timeline.busy_per_device()


class UlyssesAttention(ThreadRunner):
    """Ulysses attention over `workers` threads, causal or not; (..., H, L, D) inputs with
    `workers` dividing H and L. Use as a context manager (or call `close()`):

        with UlyssesAttention(4, causal=True) as ulysses:
            result = ulysses.forward_backward(q, k, v, dout)   # q, k, v: (heads, seq, dim)
    """

    def __init__(self, workers: int, causal: bool = False, timeout: float = 60.0) -> None:
        validation.integer(workers, "workers", 1, MAX_WORKERS)
        check_timeout(timeout)
        self.workers, self.causal = workers, bool(causal)
        self._start_threads("ulysses", timeout, one_core=False)
        self._warm_up()

    def _warm_up(self) -> None:
        """One tiny float64 run, forward and backward, whose result is thrown away.

        As with `RingAttention`, the first run in a fresh process now and then came out
        less exact than every later one: 2.5e-10 from full attention in float64, where
        every other run was within 1.1e-15 (1 fresh process in about 35 here, torch 2.13,
        beside a busy core; a second run in the same process, on new threads, was exact).
        """
        n = self.workers
        q = torch.linspace(-1.0, 1.0, n * n * 2, dtype=torch.float64).reshape(n, n, 2)
        try:
            self.forward_backward(q, q.flip(0), q, q)
        except BaseException:
            self.close()
            raise

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> UlyssesResult:
        """The forward only (dq, dk, dv are None)."""
        return self._run(q, k, v, None)

    def forward_backward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor
    ) -> UlyssesResult:
        """Forward, then backward with dL/d(out) = `dout`."""
        return self._run(q, k, v, dout)

    def _check(self, tensors: dict[str, torch.Tensor]) -> None:
        check_matching_tensors(tensors)
        q = tensors["q"]
        if q.dim() < 3:
            raise CourseInputError(
                f"q, k, v must be (..., heads, seq, dim) for Ulysses, got shape {tuple(q.shape)}"
            )
        heads, seq = q.shape[-3], q.shape[-2]
        check_ulysses_degree(self.workers, heads)
        if seq % self.workers:
            raise CourseInputError(
                f"seq must be a positive multiple of workers = {self.workers}, got {seq}"
            )

    def _run(self, q, k, v, dout) -> UlyssesResult:
        tensors = {"q": q, "k": k, "v": v} | ({} if dout is None else {"dout": dout})
        self._check(tensors)
        n = self.workers
        split = {
            name: [c.contiguous() for c in t.detach().chunk(n, dim=-2)]
            for name, t in tensors.items()
        }
        self.group.reset_counters()
        sent = self.group.bytes_sent  # each worker only adds to its own entry

        def work(rank: int):
            def run():
                comm, trace, doing = self.group.comm(rank), [], "forward"
                try:
                    with torch.no_grad():
                        out, saved = ulysses_attention_forward(
                            comm, split["q"][rank], split["k"][rank], split["v"][rank],
                            self.causal, trace,
                        )  # fmt: skip
                        after_forward, grads = sent[rank], None
                        if dout is not None:
                            doing = "backward"
                            grads = ulysses_attention_backward(
                                comm, saved, split["dout"][rank], self.causal, trace
                            )
                except Aborted:
                    raise  # a peer failed first; the pool reports that one
                except Exception as exc:
                    last = f", after {trace[-1][1]}" if trace else ""
                    raise WorkerError(
                        f"device {rank} failed in the Ulysses {doing}{last}: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                return out, grads, after_forward, sent[rank] - after_forward, trace

            return run

        t0 = time.perf_counter_ns()
        results = self.run_jobs([work(r) for r in range(n)])
        backward = dout is not None

        def gather(i: int) -> torch.Tensor | None:
            if not backward:
                return None
            return torch.cat([r[1][i] for r in results], dim=-2)

        mask = "causal" if self.causal else "full"
        events = [
            Event(
                rank,
                Action(0, kind, None if owner < 0 else owner),
                (a - t0) / 1e9,
                (b - t0) / 1e9,
                label,
            )
            for rank, r in enumerate(results)
            for kind, label, a, b, owner in r[4]
        ]
        timeline = Timeline(
            events, n, name=f"Ulysses attention ({mask}), p={n}", source="measured", unit="s",
            meta={"causal": self.causal, "clock": "wall"},  # perf_counter timestamps
        )  # fmt: skip
        return UlyssesResult(
            out=torch.cat([r[0] for r in results], dim=-2),
            dq=gather(0),
            dk=gather(1),
            dv=gather(2),
            bytes_forward=[r[2] for r in results],
            bytes_backward=[r[3] for r in results],
            heads_per_worker=q.shape[-3] // n,
            timeline=timeline,
        )
