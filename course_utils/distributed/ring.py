"""Ring attention on real processes: the course's ring code with `torch.distributed` sends.

`course_utils.parallel.context_parallel` runs ring attention on threads, every K/V block a
message through a mailbox. Its per-worker functions (`ring_attention_forward` and
`ring_attention_backward`) only ever call `comm.send(dst, tensor)` and `comm.recv(src)`,
so here the same functions run on gloo processes with a communicator whose send is
`dist.isend` (it never blocks, like the mailbox) and whose recv is `dist.recv`. Every
message on the ring is a worker's K and V blocks stacked (or their dK and dV), so a
receiver knows what to expect. Output and gradients are compared with full attention on
one process and with the threads' ring.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from course_utils import validation
from course_utils.distributed.cluster import MAX_WORKERS, Cluster, run_job, worker_count
from course_utils.distributed.setup import largest
from course_utils.errors import CourseInputError

MAX_SEQ, MAX_DIM = 4096, 256


class GlooRing:
    """The `Communicator` interface ring attention needs (`rank`, `world_size`, `send`,
    `recv`) over the default process group."""

    def __init__(self, template: torch.Tensor) -> None:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.template = torch.stack((template, template))  # a message: K and V together
        self.pending: list[tuple] = []  # (work, tensor): the tensor must live until sent
        self.bytes_sent = 0

    def send(self, dst: int, tensor: torch.Tensor) -> None:
        message = tensor.detach().contiguous().clone()  # later changes must not travel
        self.pending.append((dist.isend(message, dst), message))
        self.bytes_sent += message.numel() * message.element_size()

    def recv(self, src: int) -> torch.Tensor:
        buffer = torch.empty_like(self.template)
        dist.recv(buffer, src)
        return buffer

    def finish(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()


def _inputs(payload: dict) -> dict[str, torch.Tensor]:
    """q, k, v and the output gradient, identical on every process (seeded)."""
    g = torch.Generator().manual_seed(payload["seed"])
    shape = (payload["heads"], payload["seq"], payload["dim"])
    return {name: torch.randn(shape, generator=g) for name in ("q", "k", "v", "dout")}


def _ring_worker(rank: int, world: int, payload: dict) -> dict:
    from course_utils.parallel.context_parallel import split_sequence
    from course_utils.parallel.context_parallel.ring import (
        ring_attention_backward,
        ring_attention_forward,
    )

    causal, zigzag = payload["causal"], payload["zigzag"]
    mine = {n: split_sequence(t, world, zigzag)[rank] for n, t in _inputs(payload).items()}
    comm = GlooRing(mine["k"])
    t0 = time.perf_counter()
    out, lse = ring_attention_forward(comm, mine["q"], mine["k"], mine["v"], causal, zigzag)
    forward_bytes = comm.bytes_sent
    dq, dk, dv = ring_attention_backward(
        comm, mine["q"], mine["k"], mine["v"], out, lse, mine["dout"], causal, zigzag
    )
    comm.finish()
    seconds = time.perf_counter() - t0
    return {
        "out": out,
        "dq": dq,
        "dk": dk,
        "dv": dv,
        "bytes_forward": forward_bytes,
        "bytes_backward": comm.bytes_sent - forward_bytes,
        "seconds": seconds,
    }


def run_ring_attention(
    workers: int | None = None,
    seq: int = 64,
    dim: int = 16,
    heads: int = 2,
    causal: bool = True,
    zigzag: bool = True,
    seed: int = 0,
    port: int | None = None,
    timeout: float = 60.0,
    cluster: Cluster | None = None,
) -> dict:
    """Ring attention forward and backward on `workers` gloo processes.

    Returns the largest differences of the output and of dq, dk, dv against full attention
    on one process (`max_diff_one_process`) and against the threads' `RingAttention`
    (`max_diff_threads`), and the bytes each process sent in each pass.
    """
    from course_utils.parallel.context_parallel import (
        RingAttention,
        attention,
        gather_sequence,
        sequence_chunks,
    )

    workers = validation.integer(worker_count(workers, cluster), "workers", 1, MAX_WORKERS)
    seq = validation.integer(seq, "seq", 1, MAX_SEQ)
    dim = validation.integer(dim, "dim", 1, MAX_DIM)
    heads = validation.integer(heads, "heads", 1, 16)
    chunks = sum(len(c) for c in sequence_chunks(workers, zigzag))
    if seq % chunks:
        raise CourseInputError(
            f"seq must be a multiple of {chunks} ({'2 x ' if zigzag else ''}workers), got {seq}"
        )
    payload = {"seq": seq, "dim": dim, "heads": heads, "causal": causal, "zigzag": zigzag}
    payload["seed"] = seed
    outs = run_job(cluster, _ring_worker, workers, payload, port, timeout)
    processes = {
        name: gather_sequence([o[name] for o in outs], zigzag) for name in ("out", "dq", "dk", "dv")
    }
    t = {n: x.clone().requires_grad_(n != "dout") for n, x in _inputs(payload).items()}
    full = attention(t["q"], t["k"], t["v"], causal=causal)
    full.backward(t["dout"])
    one = {"out": full.detach(), "dq": t["q"].grad, "dk": t["k"].grad, "dv": t["v"].grad}
    with RingAttention(workers, causal=causal, zigzag=zigzag) as ring:
        r = ring.forward_backward(*(t[n].detach() for n in ("q", "k", "v", "dout")))
    threads = {"out": r.out, "dq": r.dq, "dk": r.dk, "dv": r.dv}

    def difference(a: dict, b: dict) -> float:
        return largest((a[n] - b[n]).abs().max().item() for n in a)

    return {
        "workers": workers,
        "seq": seq,
        "causal": causal,
        "zigzag": zigzag,
        "max_diff_one_process": difference(processes, one),
        "max_diff_threads": difference(processes, threads),
        "bytes_forward": [o["bytes_forward"] for o in outs],
        "bytes_backward": [o["bytes_backward"] for o in outs],
        "threads_bytes_forward": list(r.bytes_forward),
        "seconds": max(o["seconds"] for o in outs),
    }
