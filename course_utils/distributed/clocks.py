"""How far each rank's clock is from rank 0's, so every rank's timestamps fit one chart.

On one machine all processes read the same clock. On a cluster every node has its own,
and even synchronised ones (NTP, PTP) differ by microseconds to milliseconds: as much as a
whole action of our tiny model. Each rank asks rank 0 for the time a few times (Cristian
1989, "Probabilistic clock synchronization"): it notes its own clock before (t1) and after
(t2) the answer T, and estimates offset = (t1 + t2) / 2 - T; the round trip t2 - t1 bounds
the error, so the fastest round trip's estimate is kept.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def clock_offset(device: torch.device, rounds: int = 8) -> tuple[int, int]:
    """(this rank's clock minus rank 0's, the round trip it was measured in), in ns.

    A collective-like call: every rank calls it at the same point. Rank 0 answers each
    other rank in turn, so it costs `rounds` round trips per rank.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    buf = torch.zeros(1, dtype=torch.int64, device=device)
    if rank == 0:
        for other in range(1, world):
            for _ in range(rounds):
                dist.recv(buf, other)
                buf.fill_(time.time_ns())
                dist.send(buf, other)
        return 0, 0
    best_rtt, offset = None, 0
    for _ in range(rounds):
        t1 = time.time_ns()
        dist.send(buf, 0)
        dist.recv(buf, 0)
        answer = int(buf.item())  # .item() waits for the receive on a GPU too
        t2 = time.time_ns()
        if best_rtt is None or t2 - t1 < best_rtt:
            best_rtt, offset = t2 - t1, (t1 + t2) // 2 - answer
    return offset, int(best_rtt or 0)
