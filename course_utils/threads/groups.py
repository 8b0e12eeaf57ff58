"""Process groups for per-rank programs: `ctx.new_group(ranks)`, as `torch.distributed.new_group`.

A 2D or 3D layout runs each collective over a group of the ranks, not all of them: tensor
parallelism's all-reduces over the ranks of one tensor-parallel group, data parallelism's
over the replicas of one shard (lesson 07, section 4). `Groups` makes them for a run of
`threads.ranks`: `groups.new_group(ctx, ranks)` gives rank `ctx.rank` its handle on the group
of `ranks` (numbered within the group in the order of their global ranks, as torch does), or
None when it is not a member. Every rank that names the same ranks gets the same group.

A group's messages go through the run's `Mailboxes` under keys of their own, and a rank's
waits are its own (its global rank), so a collective that a member never joins, or that two
ranks call over different groups, is a deadlock proved at once, naming who waits for whom.
Every call is written down per rank (`calls`): the collective, the group's ranks, the
reduction: the evidence of which ranks each all-reduce joined.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from course_utils.errors import CourseInputError
from course_utils.threads.collectives import ThreadGroup


class _GroupMail:
    """A group's view of the run's mailboxes: its keys and its ranks, global."""

    def __init__(self, mail: Any, members: tuple[int, ...]) -> None:
        self.mail, self.members = mail, members

    def _key(self, key: tuple) -> tuple:
        _, src, dst = key  # ("comm", src, dst), numbered within the group
        return ("group", self.members, self.members[src], self.members[dst])

    def put(self, key: tuple, value: Any) -> None:
        self.mail.put(self._key(key), value)

    def get(self, key: tuple, device: int, what: str) -> Any:
        src = self.members[key[1]]
        what = f"rank {src}'s part of a collective in the group {list(self.members)}"
        return self.mail.get(self._key(key), self.members[device], what)


class _SubGroup(ThreadGroup):
    """The ranks `members` of a run; its bytes count as theirs (`RankRun.bytes_sent`)."""

    def __init__(self, members: tuple[int, ...], run: ThreadGroup) -> None:
        mail = _GroupMail(run.mail, members)
        super().__init__(len(members), abort=run.abort, mail=mail, devices=members)  # type: ignore[arg-type]
        self.members, self.run = members, run

    def _count(self, rank: int, nbytes: int) -> None:
        self.run._count(self.members[rank], nbytes)

    def _count_received(self, rank: int, nbytes: int) -> None:
        self.run._count_received(self.members[rank], nbytes)


class Group:
    """One rank's handle on a process group: `ranks` (global), its `rank` and `size` in it."""

    def __init__(self, members: tuple[int, ...], group: _SubGroup, rank: int, calls: list) -> None:
        self.ranks, self.size = list(members), len(members)
        self.rank = members.index(rank)
        self._comm, self._calls = group.comm(self.rank), calls

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Sum (or average) `tensor` over the group's ranks, in place; returns it."""
        self._calls.append({"op": "all_reduce", "ranks": list(self.ranks), "reduce": op})
        return self._comm.all_reduce(tensor, op=op)  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"Group(ranks={self.ranks})"


class Groups:
    """The process groups of one run of `world` ranks, made as the ranks ask for them."""

    def __init__(self, world: int) -> None:
        self.world = world
        self._made: dict[tuple[int, ...], _SubGroup] = {}
        self._lock = threading.Lock()
        self.calls: list[list[dict]] = [[] for _ in range(world)]  # per rank, in order

    def new_group(self, ctx: Any, ranks: Sequence[int]) -> Group | None:
        """Rank `ctx.rank`'s handle on the group of `ranks`, or None if it is not in it."""
        ok = isinstance(ranks, Sequence) and not isinstance(ranks, str) and len(ranks) > 0
        ok = ok and all(isinstance(r, int) and 0 <= r < self.world for r in ranks)
        if not ok or len(set(ranks)) != len(ranks):
            raise CourseInputError(
                f"new_group: ranks must be a list of different ranks in 0..{self.world - 1}, "
                f"got {ranks!r}"
            )
        members = tuple(sorted(ranks))
        with self._lock:
            if members not in self._made:
                self._made[members] = _SubGroup(members, ctx.comm.comm.group)
            group = self._made[members]
        if ctx.rank not in members:
            return None
        return Group(members, group, ctx.rank, self.calls[ctx.rank])
