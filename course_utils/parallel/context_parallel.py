"""Context parallelism on CPU threads: ring attention, with a plain or a zig-zag split.

A long sequence does not fit on one device, so split it: worker i holds the queries,
keys and values of its own tokens. Every layer except attention is token-wise and
needs nothing from the others. Attention needs every key and value, so the K/V blocks
travel around a ring: in each of N-1 steps every worker passes the block it holds to
its right neighbour and takes the next one from its left, and meanwhile computes its
queries against the block in hand (Liu, Zaharia & Abbeel 2023, "Ring Attention with
Blockwise Transformers", arXiv 2310.01889). Nothing of size seq x seq is ever built.

Why the blocks may arrive one at a time, in any order: softmax over all keys can be
assembled from softmaxes over blocks of keys. For a block, keep its partial output
o_b = softmax(s_b) v_b and its log-sum-exp l_b = log sum_j exp(s_j). Two blocks merge
exactly into

    l = log(exp(l_a) + exp(l_b)),     o = exp(l_a - l) o_a + exp(l_b - l) o_b
                                        = sigmoid(l_a - l_b) o_a + sigmoid(l_b - l_a) o_b,

(the online softmax of Milakov & Gimelshein 2018, arXiv 1805.02867; the same bookkeeping
as FlashAttention, Dao et al. 2022, arXiv 2205.14135). Both weights are <= 1, so nothing
overflows, and a block in which a query may see no key at all has l_b = -inf and weight 0.
(The sigmoid form, which ring-flash-attention also uses, depends only on l_a - l_b and so
keeps full precision when both log-sum-exps are large.)

The backward is a ring too. With the final output O and log-sum-exp L kept from the
forward, each block's probabilities are rebuilt as P = exp(S - L), and (Dao et al. 2022,
appendix B) with D_i = sum_d dO_id O_id:

    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - D),   dQ = dS K / sqrt(d),   dK = dS^T Q / sqrt(d).

dQ stays with the queries. dK and dV belong to the block's owner: they travel around the
ring right behind their K/V block, every worker adding its share, and one last hop brings
them home (the scheme of zhuzilin's ring-flash-attention). No worker ever touches
another worker's autograd graph: everything is sent as plain tensors.

Causal masking makes the plain (contiguous) split unfair: worker i's tokens may only
look at tokens before them, so it computes i+1 block products and skips the rest, and
the last worker is the straggler everyone waits for. The zig-zag split (the load-balanced
split of the Llama 3 report, Dubey et al. 2024, arXiv 2407.21783, section 3.3.2) cuts the
sequence into 2N chunks and gives worker i chunks i and 2N-1-i: an early, cheap chunk and
a late, expensive one, so every worker does 2N+1 chunk products. (Llama 3 itself
all-gathers K/V instead of passing them around a ring; the split is the same idea.)

Each thread is one device (`course_utils.threads.devices.DeviceThreads`); the K/V blocks are real
messages through `course_utils.threads.collectives.ThreadGroup`, whose byte counters give the
traffic. Every run records a measured `Timeline`: compute events `F`/`B` labelled like
"q0·kv3" (worker 0's queries against worker 3's K/V block; colour = whose block) and
transfers on the communication lane: K/V blocks as `SEND_F` (activations) and the
travelling dK/dV as `SEND_B` (gradients). `simulate_ring` predicts the same timeline
from a cost model, with or without overlapping transfers with compute.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from course_utils.actions import Action
from course_utils.errors import CourseInputError, WorkerError
from course_utils.threads.collectives import Communicator, ThreadGroup
from course_utils.threads.devices import Aborted, DeviceThreads
from course_utils.timeline import Event, Timeline

MAX_WORKERS = 16
FLASH_BACKWARD_FACTOR = 2.5  # backward / forward matmuls: 5 (S, dV, dP, dQ, dK) over 2 (S, PV)


# -- attention on one device, and the two pieces ring attention is made of ---------------


def _scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Scaled dot products q k^T / sqrt(d); where `mask` is False the score is -inf."""
    s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    return s if mask is None else s.masked_fill(~mask, float("-inf"))


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """`lse` with -inf (a row that sees no key) replaced by 0, so exp(s - lse) stays 0, not NaN."""
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)


def causal_mask(q_len: int, k_len: int, device=None) -> torch.Tensor:
    """True where query i may look at key j (j <= i), for queries and keys both from position 0."""
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril()


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> torch.Tensor:
    """The single-device reference: softmax(q k^T / sqrt(d)) v, with a causal mask if asked.

    Shapes (..., seq, dim); differentiable with autograd. Builds the whole seq x seq matrix.
    """
    _check_same_shape({"q": q, "k": k, "v": v})
    mask = causal_mask(q.shape[-2], k.shape[-2], q.device) if causal else None
    return torch.softmax(_scores(q, k, mask), dim=-1) @ v


def _block_attention(q, k, v, mask):
    s = _scores(q, k, mask)
    lse = torch.logsumexp(s, dim=-1)  # -inf for a row whose keys are all masked (or none)
    p = torch.exp(s - _finite(lse).unsqueeze(-1))
    return p @ v, lse


def block_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of `q` to one block of keys: (partial output, log-sum-exp of the scores).

    `mask` (q_len x k_len, True = may look) is optional. A query that sees no key of this
    block gets output 0 and log-sum-exp -inf, which `merge_partials` gives weight 0.
    """
    _check_tensors({"q": q, "k": k, "v": v})
    if k.shape != v.shape or q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise CourseInputError(
            f"q, k, v must be (..., q_len, d), (..., k_len, d), (..., k_len, d), got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if mask is not None and (
        mask.dtype != torch.bool or tuple(mask.shape[-2:]) != (q.shape[-2], k.shape[-2])
    ):
        raise CourseInputError(
            f"mask must be a bool tensor of shape ({q.shape[-2]}, {k.shape[-2]}), "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )
    return _block_attention(q, k, v, mask)


def _merge(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    # e^(l_a - l) = e^l_a / (e^l_a + e^l_b) = sigmoid(l_a - l_b). Written with the difference
    # of the two log-sum-exps, the weights stay exact even when both are large (in float32,
    # l_a - l with l ~ 800 would keep only ~4 digits); a block that saw nothing (-inf)
    # gets weight sigmoid(-inf) = 0 exactly.
    nothing = torch.isneginf(lse)  # neither block had a key these queries may see
    diff = torch.where(nothing, torch.zeros_like(lse), lse_a - lse_b)
    weight_a = torch.sigmoid(diff).unsqueeze(-1)
    weight_b = torch.sigmoid(-diff).unsqueeze(-1)
    out = weight_a * out_a + weight_b * out_b
    return torch.where(nothing.unsqueeze(-1), torch.zeros_like(out), out), lse


def merge_partials(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two blocks' partial attention into the attention over both (exact).

    l = log(e^l_a + e^l_b) and o = e^(l_a - l) o_a + e^(l_b - l) o_b (online softmax,
    Milakov & Gimelshein 2018). The order of merging does not matter, up to rounding.
    """
    if out_a.shape != out_b.shape or lse_a.shape != lse_b.shape or out_a.shape[:-1] != lse_a.shape:
        raise CourseInputError(
            f"out_a, out_b must share a shape (..., q_len, d) and lse_a, lse_b be (..., q_len), "
            f"got {tuple(out_a.shape)}, {tuple(out_b.shape)}, {tuple(lse_a.shape)}, "
            f"{tuple(lse_b.shape)}"
        )
    for name, t in {"out_a": out_a, "out_b": out_b}.items():
        if not torch.isfinite(t).all():
            raise CourseInputError(f"{name} must be finite (no NaN or inf)")
    for name, t in {"lse_a": lse_a, "lse_b": lse_b}.items():
        if torch.isnan(t).any() or (t == float("inf")).any():
            raise CourseInputError(f"{name} must be finite or -inf (no NaN, no +inf)")
    return _merge(out_a, lse_a, out_b, lse_b)


def _block_backward(q, k, v, dout, lse, delta, mask):
    p = torch.exp(_scores(q, k, mask) - _finite(lse).unsqueeze(-1))  # the forward's P, rebuilt
    dv = p.transpose(-2, -1) @ dout
    dp = dout @ v.transpose(-2, -1)
    ds = p * (dp - delta.unsqueeze(-1))  # softmax backward, row by row
    scale = q.shape[-1] ** -0.5
    return (ds @ k) * scale, (ds.transpose(-2, -1) @ q) * scale, dv


def block_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One key block's share of (dq, dk, dv), given the *final* output and log-sum-exp.

    `out` and `lse` are those of the whole attention (all key blocks merged), `dout` the
    gradient of the loss with respect to `out`. Summing the dq shares over all key blocks
    gives the full dq; dk and dv of this block are complete once every query has been
    through it (Dao et al. 2022, appendix B).
    """
    _check_tensors({"q": q, "k": k, "v": v, "out": out, "dout": dout})
    if out.shape != q.shape or dout.shape != q.shape or lse.shape != q.shape[:-1]:
        raise CourseInputError(
            f"out and dout must have q's shape {tuple(q.shape)} and lse {tuple(q.shape[:-1])}"
        )
    delta = (dout * out).sum(dim=-1)
    return _block_backward(q, k, v, dout, lse, delta, mask)


# -- who holds which tokens ---------------------------------------------------------------


def sequence_chunks(workers: int, zigzag: bool = False) -> list[list[int]]:
    """The chunks of the sequence each worker holds, in the order it stores them.

    Plain: N chunks, worker i holds [i]. Zig-zag: 2N chunks, worker i holds [i, 2N-1-i].
    """
    _check_workers(workers)
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
    return _gather(parts, sequence_chunks(len(parts), zigzag), dim)


def _gather(parts, layout, dim):
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


# -- the ring, as run by one worker -------------------------------------------------------


class Record(NamedTuple):
    """One thing a worker did: compute ("F", "B") or a send ("SEND_F" K/V, "SEND_B" dK/dV)."""

    kind: str
    owner: int  # whose K/V block
    label: str
    start_ns: int
    end_ns: int
    products: int = 0
    elements: int = 0


def _send(comm: Communicator, dst: int, tensors, kind: str, owner: int, label: str, trace):
    start = time.perf_counter_ns()
    for t in tensors:
        comm.send(dst, t)
    if trace is not None:
        trace.append(Record(kind, owner, label, start, time.perf_counter_ns()))


def ring_attention_forward(
    comm: Communicator,
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
    right, left = (rank + 1) % n, (rank - 1) % n
    chunk = q.shape[-2] // len(sequence_chunks(n, zigzag)[rank])
    diagonal_mask = causal_mask(chunk, chunk, q.device)
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    for step in range(n):
        owner = (rank - step) % n
        if step < n - 1:
            _send(comm, right, (k, v), "SEND_F", owner, f"kv{owner}→{right}", trace)
        start = time.perf_counter_ns()
        products = block_products(rank, owner, n, zigzag, causal, chunk)
        for p in products:
            mask = diagonal_mask if p.diagonal else None
            block_out, block_lse = _block_attention(
                q[..., p.q_rows, :], k[..., p.kv_rows, :], v[..., p.kv_rows, :], mask
            )
            out[..., p.q_rows, :], lse[..., p.q_rows] = _merge(
                out[..., p.q_rows, :], lse[..., p.q_rows], block_out, block_lse
            )
        if trace is not None and products:
            elements = sum(p.elements() for p in products)
            label = f"q{rank}·kv{owner}"
            trace.append(
                Record("F", owner, label, start, time.perf_counter_ns(), len(products), elements)
            )
        if step < n - 1:
            k, v = comm.recv(left), comm.recv(left)
    return out, lse


def ring_attention_backward(
    comm: Communicator,
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
        owner = (rank - step) % n
        if step < n - 1:
            _send(comm, right, (k, v), "SEND_F", owner, f"kv{owner}→{right}", trace)
        start = time.perf_counter_ns()
        dk_part, dv_part = torch.zeros_like(k), torch.zeros_like(v)
        products = block_products(rank, owner, n, zigzag, causal, chunk)
        for p in products:
            qr, kr = p.q_rows, p.kv_rows
            dq_p, dk_p, dv_p = _block_backward(
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
        if trace is not None and products:
            elements = sum(p.elements() for p in products)
            label = f"q{rank}·kv{owner}"
            trace.append(
                Record("B", owner, label, start, time.perf_counter_ns(), len(products), elements)
            )
        if step == 0:
            dk_acc, dv_acc = dk_part, dv_part  # our own block: we are the first to add to it
        else:
            dk_acc, dv_acc = comm.recv(left), comm.recv(left)
            dk_acc += dk_part
            dv_acc += dv_part
        if n > 1:
            _send(comm, right, (dk_acc, dv_acc), "SEND_B", owner, f"dkv{owner}→{right}", trace)
        if step < n - 1:
            k, v = comm.recv(left), comm.recv(left)
    if n == 1:
        return dq, dk_acc, dv_acc
    return dq, comm.recv(left), comm.recv(left)  # our own block's dK, dV, complete


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

    @property
    def compute_seconds(self) -> list[float]:
        """Measured compute time of each worker (forward and backward)."""
        return self.timeline.busy_per_device()


class RingAttention:
    """Ring attention over `workers` threads; plain or zig-zag split; causal or not.

    Use as a context manager (or call `close()`) to stop the threads:

        with RingAttention(4, causal=True, zigzag=True) as ring:
            result = ring.forward_backward(q, k, v, dout)   # q, k, v: (..., seq, d)
    """

    def __init__(
        self, workers: int, causal: bool = False, zigzag: bool = False, timeout: float = 60.0
    ) -> None:
        _check_workers(workers)
        if not isinstance(timeout, int | float) or not 0 < timeout < math.inf:
            raise CourseInputError(
                f"timeout must be a finite number of seconds > 0, got {timeout!r}"
            )
        self.workers, self.causal, self.zigzag = workers, bool(causal), bool(zigzag)
        self.threads = DeviceThreads(workers, name="cp")
        self.group = ThreadGroup(workers, abort=self.threads.abort, timeout=timeout)

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

        def work(rank: int):
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

            return run

        t0 = time.perf_counter_ns()
        try:
            results = self.threads.run([work(r) for r in range(self.workers)])
        except Exception:
            self.group.reset()  # drop half-delivered messages so the next run starts clean
            raise
        return self._result(results, t0, dout is not None)

    def _result(self, results, t0: int, backward: bool) -> RingResult:
        layout = sequence_chunks(self.workers, self.zigzag)

        def gather(i: int, j: int | None = None, dim: int = -2):
            return _gather([r[i] if j is None else r[i][j] for r in results], layout, dim)

        traces = [r[5] for r in results]

        def count(kind: str, field: str) -> list[int]:
            return [sum(getattr(x, field) for x in t if x.kind == kind) for t in traces]

        split = "zig-zag" if self.zigzag else "plain"
        mask = "causal" if self.causal else "full"
        timeline = Timeline(
            [_event(rank, rec, t0) for rank, t in enumerate(traces) for rec in t],
            self.workers,
            name=f"ring attention ({split} split, {mask}), p={self.workers}",
            source="measured",
            unit="s",
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
        )

    def close(self) -> None:
        self.threads.close()

    def __enter__(self) -> RingAttention:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _event(rank: int, rec: Record, t0: int) -> Event:
    action = Action(0, rec.kind, rec.owner)  # "micro-batch" = whose K/V block: its colour
    return Event(rank, action, (rec.start_ns - t0) / 1e9, (rec.end_ns - t0) / 1e9, rec.label)


# -- closed forms: work, bytes, memory ----------------------------------------------------


def causal_work(workers: int, zigzag: bool) -> list[int]:
    """Block products each worker computes in a causal ring pass (forward; backward the same).

    Plain split: worker i computes i+1 (its own diagonal block and the i blocks before
    it); the last worker does N, the first 1. Zig-zag: every worker computes 2N+1 chunk
    products (its early chunk i sees chunks 0..i: i+1; its late chunk 2N-1-i sees chunks
    0..2N-1-i: 2N-i). The chunks of the zig-zag split are half as long, so a zig-zag
    product is a quarter of a plain one; see `score_elements` for work in one unit.
    """
    _check_workers(workers)
    if zigzag:
        return [2 * workers + 1] * workers
    return [i + 1 for i in range(workers)]


def score_elements(seq: int, workers: int, zigzag: bool = False, causal: bool = True) -> list[int]:
    """Attention scores (query-key pairs, per head) each worker computes in one ring pass.

    Without a mask every worker computes (L/N) x L. Causal, plain: (i+1)(L/N)^2, since a
    diagonal block is computed whole and masked. Causal, zig-zag: (2N+1)(L/2N)^2 each,
    = L^2/(2N) + (L/2N)^2: the causal half of the work plus one chunk product, evenly.
    """
    _check_seq(seq, workers, zigzag)
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
    _check_seq(seq, workers, False)
    for name, value in {
        "heads": heads,
        "dim": dim,
        "element_size": element_size,
        "batch": batch,
    }.items():
        _check_positive_int(name, value)
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
        _check_positive_int(name, value)
    _check_positive_int("element_size", element_size)
    _check_positive_int("batch", batch)
    t = -(-seq // workers)
    return element_size * batch * heads * (6 * t * dim + t + 2 * t * t)


# -- predicting the timeline --------------------------------------------------------------


def _step_cost(rank: int, owner: int, workers: int, zigzag: bool, causal: bool) -> float:
    """Compute of one ring step, in full (L/N) x (L/N) blocks (diagonal blocks count whole)."""
    per_worker = len(sequence_chunks(workers, zigzag)[rank])
    products = block_products(rank, owner, workers, zigzag, causal, chunk=1)
    return sum(p.elements() for p in products) / per_worker**2


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
    """
    _check_workers(workers)
    for name, value in {
        "block_time": block_time,
        "transfer_time": transfer_time,
        "backward_factor": backward_factor,
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
                cost = factor * block_time * _step_cost(rank, owner, n, zigzag, causal)
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


def measured_costs(result: RingResult, seq: int) -> dict[str, float]:
    """The cost model `simulate_ring` needs, read off a measured run (in seconds).

    block_time: forward compute per full (L/N) x (L/N) block, from all workers' F time;
    backward_factor: backward time per score over forward time per score;
    transfer_time: the mean time of one K/V send (on threads: the copy into the mailbox).
    """
    workers = len(result.bytes_forward)
    block = (seq // workers) ** 2
    busy = {"F": 0.0, "B": 0.0}
    sends = []
    for e in result.timeline.events:
        if e.action.kind in busy:
            busy[e.action.kind] += e.duration
        elif e.action.kind == "SEND_F":
            sends.append(e.duration)
    forward_per_score = busy["F"] / max(1, sum(result.elements_forward))
    backward_scores = sum(result.elements_backward)
    return {
        "block_time": forward_per_score * block,
        "backward_factor": (
            busy["B"] / backward_scores / forward_per_score
            if backward_scores and forward_per_score > 0
            else FLASH_BACKWARD_FACTOR
        ),
        "transfer_time": sum(sends) / len(sends) if sends else 0.0,
    }


# -- input checks -------------------------------------------------------------------------


def _check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CourseInputError(f"{name} must be an integer >= 1, got {value!r}")


def _check_workers(workers) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise CourseInputError(
            f"workers must be an integer from 1 to {MAX_WORKERS}, got {workers!r}"
        )


def _check_seq(seq, workers, zigzag: bool) -> None:
    _check_workers(workers)
    chunks = 2 * workers if zigzag else workers
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < chunks or seq % chunks:
        split = f"2 x workers = {chunks} (zig-zag split)" if zigzag else f"workers = {chunks}"
        raise CourseInputError(f"seq must be a positive multiple of {split}, got {seq!r}")


def _check_tensors(tensors: dict[str, torch.Tensor]) -> None:
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() < 2:
            raise CourseInputError(f"{name} must be a floating-point tensor (..., seq, dim)")
        if not torch.isfinite(t).all():
            raise CourseInputError(f"{name} must be finite (no NaN or inf)")


def _check_same_shape(tensors: dict[str, torch.Tensor]) -> None:
    _check_tensors(tensors)
    first_name, first = next(iter(tensors.items()))
    for name, t in tensors.items():
        if t.shape != first.shape or t.dtype != first.dtype:
            raise CourseInputError(
                f"{name} must have {first_name}'s shape {tuple(first.shape)} and dtype "
                f"{first.dtype}, got {tuple(t.shape)} {t.dtype}"
            )


def check_ring_inputs(tensors: dict[str, torch.Tensor], workers: int, zigzag: bool) -> None:
    """q, k, v (and dout): finite float tensors of one shape (..., seq, d), seq splittable."""
    _check_same_shape(tensors)
    _check_seq(next(iter(tensors.values())).shape[-2], workers, zigzag)
