"""How far each rank's clock is from rank 0's, so every rank's timestamps fit one chart.

On a cluster every node has its own clock, and even synchronised ones (NTP, PTP) differ by
microseconds to milliseconds: as much as a whole action of our tiny model. Each rank asks
rank 0 for the time a few times (Cristian 1989, "Probabilistic clock synchronization"): it
notes its own clock before (t1) and after (t2) the answer T, and estimates
offset = (t1 + t2) / 2 - T; the round trip t2 - t1 bounds the error, so the fastest round
trip's estimate is kept.

Processes on one machine need no estimate: they read one clock (one Linux kernel: the same
boot id). There the estimate is only reported, never applied: on a single busy core a round
trip takes milliseconds, and correcting by an estimate that far off would draw a receive
before its send.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist


def clock_id() -> str:
    """Processes with equal ids read the same clock: one Linux kernel's boot id, else the
    host's name."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


def clock_offset(device: torch.device, rounds: int = 16) -> tuple[int, int, bool]:
    """(this rank's clock minus rank 0's, estimated; the round trip it was measured in, in
    ns; whether this rank reads rank 0's very clock, so that the true offset is 0).

    A collective call: every rank calls it at the same point. Rank 0 answers each other rank
    in turn, `rounds` round trips per rank.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    buf = torch.zeros(1, dtype=torch.int64, device=device)
    best_rtt, offset = None, 0
    if rank == 0:
        for other in range(1, world):
            for _ in range(rounds):
                dist.recv(buf, other)
                buf.fill_(time.time_ns())
                dist.send(buf, other)
    else:
        for _ in range(rounds):
            t1 = time.time_ns()
            dist.send(buf, 0)
            dist.recv(buf, 0)
            answer = int(buf.item())  # .item() waits for the receive on a GPU too
            t2 = time.time_ns()
            if best_rtt is None or t2 - t1 < best_rtt:
                best_rtt, offset = t2 - t1, (t1 + t2) // 2 - answer
    ids: list[str | None] = [clock_id() if rank == 0 else None]
    dist.broadcast_object_list(ids, src=0)
    return offset, int(best_rtt or 0), ids[0] == clock_id()
