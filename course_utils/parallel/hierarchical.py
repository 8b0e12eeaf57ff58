"""A hierarchical all-reduce written per rank: the devices as nodes, each with a fast inside.

Real clusters have two kinds of link: fast ones between the GPUs of a node (NVLink) and
slower ones between nodes (InfiniBand, Ethernet). A flat ring over all the GPUs of two nodes
crosses between them, and every byte of the all-reduce passes through those crossings. The
hierarchical all-reduce (NCCL's tree and "2D" rings; Jia et al. 2018, arXiv 1807.11205,
section 4; Goyal et al. 2017, arXiv 1706.02677) sends only 1/G of the data across:

    1. reduce-scatter inside the node:   each of its G ranks holds 1/G of the node's sum
    2. all-reduce across the nodes,       between the ranks that hold the same 1/G
    3. all-gather inside the node:        every rank holds the whole sum

`run_hierarchical(program, tensors, nodes)` runs `program(ctx, tensor)` on every rank
(`threads.ranks.run_ranks`; rank r of N is local rank r mod G of node r // G, G = N / nodes)
with two communicators besides `ctx.comm` (all N ranks): `ctx.node`, the G ranks of its
node, and `ctx.cross`, the `nodes` ranks of the same local rank, one in each node. Each has
the collectives `reduce_scatter`, `all_reduce` and `all_gather` (`threads.collectives`,
ring algorithms) and `rank`, `world_size` within its group. Every collective called on
either is written down per rank in `run.extra["calls"]`: [group, collective, bytes sent to
each of the N ranks], what a grader reads, beside what the program returned
(`run.extra["results"]`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from course_utils.errors import CourseInputError
from course_utils.parallel.rank_programs import run_collective
from course_utils.threads.collectives import Communicator
from course_utils.threads.rank_run import RankRun
from course_utils.threads.ranks import Rank

COLLECTIVES = ("reduce_scatter", "all_reduce", "all_gather")


class GroupComm(Communicator):
    """The collectives of `Communicator` over a subset of the ranks (`ranks`, in order):
    local rank i is global rank ranks[i]; messages go through the whole group's mailboxes."""

    def __init__(self, inner: Communicator, ranks: Sequence[int], name: str, calls: list):
        self.inner, self.ranks, self.name, self.calls = inner, list(ranks), name, calls
        self.group = inner.group
        self.rank, self.world_size = self.ranks.index(inner.rank), len(self.ranks)
        self._sent: list[int] | None = None

    def __repr__(self) -> str:
        return f"GroupComm({self.name}: ranks {self.ranks}, this is {self.rank})"

    def send(self, dst: int, tensor: torch.Tensor, **kwargs) -> None:
        self._check_peer(dst, "dst")
        self.inner.send(self.ranks[dst], tensor, **kwargs)
        if self._sent is not None:
            self._sent[self.ranks[dst]] += tensor.numel() * tensor.element_size()

    def recv(self, src: int) -> torch.Tensor:
        self._check_peer(src, "src")
        return self.inner.recv(self.ranks[src])

    def _recorded(self, name: str, *args, **kwargs):
        self._sent = [0] * self.inner.world_size
        try:
            return getattr(Communicator, name)(self, *args, **kwargs)
        finally:
            self.calls.append([self.name, name, self._sent])
            self._sent = None

    def reduce_scatter(self, tensor, op="sum", dim=0, sizes=None):
        """This rank's chunk of the group's sum (or mean) of `tensor`."""
        return self._recorded("reduce_scatter", tensor, op=op, dim=dim, sizes=sizes)

    def all_reduce(self, tensor, op="sum", algorithm="ring"):
        """`tensor` summed (or averaged) over the group, in place."""
        return self._recorded("all_reduce", tensor, op=op, algorithm=algorithm)

    def all_gather(self, shard, dim=0, out=None):
        """Every group rank's `shard`, concatenated in the group's order."""
        return self._recorded("all_gather", shard, dim=dim, out=out)


def groups(world: int, nodes: int) -> tuple[list[list[int]], list[list[int]]]:
    """(the ranks of each node, the ranks of each local rank across the nodes)."""
    size = world // nodes
    inside = [list(range(n * size, (n + 1) * size)) for n in range(nodes)]
    across = [list(range(i, world, size)) for i in range(size)]
    return inside, across


def run_hierarchical(
    program: Callable[[Rank, torch.Tensor], torch.Tensor],
    tensors: Sequence[torch.Tensor],
    nodes: int = 2,
    timeout: float = 20.0,
    raise_failure: bool = True,
) -> RankRun:
    """Run `program(ctx, tensors[r])` on every rank r, grouped into `nodes` nodes (see the
    module docstring); `run.extra["calls"][r]` lists rank r's collectives."""
    world = len(tensors)
    if not isinstance(nodes, int) or nodes < 1 or world % nodes:
        raise CourseInputError(f"nodes must be a whole number >= 1 dividing {world}, got {nodes!r}")
    inside, across = groups(world, nodes)
    calls: list[list] = [[] for _ in range(world)]
    size = world // nodes

    def each(ctx: Rank, tensor: torch.Tensor):
        inner = ctx.comm.comm  # the rank's Communicator under ctx.comm
        r = ctx.rank
        ctx.node = GroupComm(inner, inside[r // size], "node", calls[r])  # type: ignore[attr-defined]
        ctx.cross = GroupComm(inner, across[r % size], "cross", calls[r])  # type: ignore[attr-defined]
        return program(ctx, tensor)

    run = run_collective(each, tensors, timeout=timeout, raise_failure=raise_failure)
    run.extra["calls"] = calls
    run.extra["nodes"] = nodes
    return run


def cross_bytes(calls: list, rank: int, world: int, nodes: int) -> int:
    """The bytes rank `rank` sent to ranks of other nodes, from its recorded `calls`."""
    size = world // nodes
    return sum(
        sent
        for _, _, per_rank in calls
        for dst, sent in enumerate(per_rank)
        if dst // size != rank // size
    )
