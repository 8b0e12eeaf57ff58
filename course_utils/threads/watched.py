"""A rank's program watched by the harness: the buffers it was handed, the bytes it sent.

The Builds of lessons 08 to 10 (an FSDP step, ring attention, expert dispatch) are judged on
more than gradients: on the bytes each collective sent to each rank, the order of the K/V
blocks round the ring, and the memory a rank held. `Watch` sees one rank's program through
its `ctx` (`threads.ranks.Rank`): it stands between the program and its collectives
(`ctx.comm` becomes a `WatchedComm`, which writes down every call with the bytes it sent to
each rank) and its messages (`ctx.send`, `ctx.recv`).

Memory here is what the program holds of what the harness handed it: every tensor a
collective returns (a gathered layer, a reduce-scattered gradient, an all-to-all's chunks)
and every message received is held by a weak reference, never kept alive by the harness.
At every hand-out the storages still alive are written down (a snapshot), plus the rank's
fixed bytes (its shards); the most bytes held at once, and the names of what was held then
("layer 0's gathered parameters"), are read from the snapshots. Hand-outs are the only
moments these bytes can grow, so the snapshots see the peak. A tensor the program let go
is gone from the next snapshot; one that autograd still keeps for a backward is not (a
storage resized to zero bytes, FSDP's way of freeing, counts zero). This is not the
process's memory (RSS), which the course's threads share.

`run_watched(program, devices, setup)` runs `program` with `run_ranks`, a `Watch` per rank;
`setup(ctx, watch)` gives each ctx what a lesson's Build works on.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from course_utils.threads.rank_run import RankRun
from course_utils.threads.ranks import Rank, run_ranks


class Watch:
    """What one rank's program did with what the harness gave it (see the module docstring).

    `name_gather(tensor)` and `name_message(tensor)` may name what a gather of `tensor`
    returns and what a message carries (a lesson's setup knows: "layer 1", "kv2").
    """

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        # (kind, bytes sent to each rank, what it was given: dtype and shape but the first dim)
        self.collectives: list[tuple[str, list[int], str, list[int]]] = []
        self.messages: list[tuple[int, str, int]] = []  # ctx.send: (to, what it carried, bytes)
        self.buffers: list[tuple[str, int]] = []  # handed out: (what, bytes then)
        self.snapshots: list[list[tuple[int, int]]] = []  # at each hand-out: (buffer, bytes)
        self.fixed = 0  # bytes the rank holds throughout (its shards)
        self.result: Any = None  # what the program returned
        self.name_gather: Callable[[torch.Tensor], str | None] = lambda t: None
        self.name_message: Callable[[torch.Tensor], str | None] = lambda t: None
        self._alive: dict[int, tuple[int, weakref.ref]] = {}  # id(tensor) -> (buffer, ref)

    def attach(self, ctx: Rank) -> None:
        """Stand between `ctx`'s program and its collectives and messages."""
        self.ctx = ctx  # what the program left in it is read after the run
        ctx.comm = WatchedComm(ctx.comm, self)  # type: ignore[assignment]  # the same calls
        send, recv = ctx.send, ctx.recv

        def watched_send(tensor: torch.Tensor, to: int, tag=None) -> None:
            send(tensor, to, tag)
            what = self.name_message(tensor) or "a tensor"
            self.messages.append((to, what, tensor.numel() * tensor.element_size()))

        def watched_recv(frm: int, tag=None, shape: Sequence[int] | None = None) -> torch.Tensor:
            return self.hand_out(recv(frm, tag, shape), f"a message from rank {frm}")

        ctx.send, ctx.recv = watched_send, watched_recv  # type: ignore[method-assign]

    def hand_out(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """Give `tensor` to the program, holding it by a weak reference; take a snapshot."""
        known = self._alive.get(id(tensor))
        if known is None or known[1]() is not tensor:  # a new one (an `out=` comes back)
            nbytes = tensor.untyped_storage().nbytes()
            self.buffers.append((what, nbytes))
            self._alive[id(tensor)] = (len(self.buffers) - 1, weakref.ref(tensor))
        self.snapshot()
        return tensor

    def snapshot(self) -> None:
        """Write down the buffers alive now (each storage once), forgetting the dead."""
        held: dict[int, tuple[int, int]] = {}
        for key, (index, ref) in list(self._alive.items()):
            tensor = ref()
            if tensor is None:
                del self._alive[key]
                continue
            storage = tensor.untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in held:
                held[storage.data_ptr()] = (index, storage.nbytes())
        self.snapshots.append(sorted(held.values()))

    def evidence(self) -> dict:
        """All of it as plain data (`checks.wire.encode`)."""
        return {
            "collectives": [
                [kind, sent, dtype, shape] for kind, sent, dtype, shape in self.collectives
            ],
            "messages": [list(m) for m in self.messages],
            "buffers": [list(b) for b in self.buffers],
            "snapshots": [[list(h) for h in snap] for snap in self.snapshots],
            "fixed": self.fixed,
        }


class WatchedComm:
    """A rank's `Communicator` as the program sees it: the same collectives, each call
    written down with the bytes it sent to every rank, and what it returns handed out."""

    def __init__(self, comm, watch: Watch) -> None:
        self._comm, self._watch = comm, watch
        self.rank, self.world_size = comm.rank, comm.world_size
        self._sent: list[int] | None = None
        # ctx.comm is a RankComm over the Communicator whose collectives call its own send
        inner = getattr(comm, "comm", comm)
        send = inner.send

        def counted(dst: int, tensor: torch.Tensor, **kwargs) -> None:
            send(dst, tensor, **kwargs)
            if self._sent is not None:
                self._sent[dst] += tensor.numel() * tensor.element_size()

        inner.send = counted  # the collectives call self.send: each of their messages

    def _call(self, kind: str, collective: Callable, given, *args, **kwargs):
        self._sent = [0] * self.world_size
        first = given[0] if isinstance(given, list | tuple) and given else given
        dtype, shape = "", []
        if isinstance(first, torch.Tensor):
            dtype, shape = str(first.dtype).removeprefix("torch."), list(first.shape[1:])
        try:
            return collective(given, *args, **kwargs)
        finally:
            self._watch.collectives.append((kind, self._sent, dtype, shape))
            self._sent = None

    def all_gather(self, shard: torch.Tensor, dim: int = 0, out: torch.Tensor | None = None):
        got = self._call("all_gather", self._comm.all_gather, shard, dim=dim, out=out)
        what = self._watch.name_gather(shard)
        return self._watch.hand_out(got, f"{what}'s gathered parameters" if what else "a gather")

    def reduce_scatter(self, tensor: torch.Tensor, op: str = "sum", dim: int = 0, sizes=None):
        got = self._call(
            "reduce_scatter", self._comm.reduce_scatter, tensor, op=op, dim=dim, sizes=sizes
        )
        return self._watch.hand_out(got, "a reduce-scattered tensor")

    def all_reduce(self, tensor, op: str = "sum", algorithm: str = "ring"):
        # in place: what it returns is the program's own tensor, not a new buffer
        return self._call("all_reduce", self._comm.all_reduce, tensor, op=op, algorithm=algorithm)

    def all_to_all(self, chunks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        got = self._call("all_to_all", self._comm.all_to_all, chunks)
        return [
            self._watch.hand_out(t, f"an all-to-all chunk from rank {s}") for s, t in enumerate(got)
        ]

    def barrier(self) -> None:
        self._call("barrier", lambda _: self._comm.barrier(), None)

    @property
    def calls(self) -> list[dict]:
        """Every collective the rank called, as the unwatched communicator recorded them (the
        run's evidence reads these for every program)."""
        return self._comm.calls

    def __getattr__(self, name: str):
        raise AttributeError(
            f"ctx.comm has no {name!r}: it has the collectives all_gather, reduce_scatter, "
            "all_reduce, all_to_all and barrier; a message goes by ctx.send and ctx.recv"
        )

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, world_size={self.world_size})"


@dataclass
class WatchedRun:
    """A watched run: the ranks' `RankRun` and each rank's `Watch`."""

    run: RankRun
    watches: list[Watch]

    @property
    def failure(self):
        return self.run.failure

    @property
    def results(self) -> list:
        """What each rank's program returned."""
        return [w.result for w in self.watches]

    def bytes_sent(self, kind: str | None = None) -> list[int]:
        """Bytes each rank sent in collectives of `kind` ("all_gather", ...), all calls; with
        no kind, all it sent (collectives and messages)."""
        if kind is None:
            return list(self.run.bytes_sent)
        return [sum(sum(c[1]) for c in w.collectives if c[0] == kind) for w in self.watches]

    def peak_bytes(self) -> list[int]:
        """Each rank's most bytes held at once: its fixed bytes and the buffers alive."""
        return [w.fixed + held_peak(w.snapshots)[0] for w in self.watches]

    def evidence(self) -> dict:
        """The run's evidence (`RankRun.evidence`) and, per rank, its watch's."""
        data = self.run.evidence()
        data["watched"] = [w.evidence() for w in self.watches]
        return data


def held_peak(snapshots: Sequence[Sequence[Sequence[int]]]) -> tuple[int, int]:
    """(most bytes alive in one snapshot, that snapshot's index; -1 if there is none)."""
    best, where = 0, -1
    for i, snap in enumerate(snapshots):
        total = sum(nbytes for _, nbytes in snap)
        if total > best:
            best, where = total, i
    return best, where


def run_watched(
    program: Callable[[Rank], Any],
    devices: int,
    setup: Callable[[Rank, Watch], None],
    inputs: torch.Tensor | None = None,
    targets: torch.Tensor | None = None,
    timeout: float = 20.0,
    raise_failure: bool = True,
) -> WatchedRun:
    """Run `program(ctx)` on `devices` ranks, each watched (`Watch`), after `setup(ctx, watch)`.

    With `inputs` and `targets`, rank r's slice of the batch is `ctx.inputs[r]` (the batch
    cut into `devices` micro-batches) and `ctx.loss(out, r)` its share of the mean loss;
    without, the ctx has no batch (and no stages: the lesson's setup gives what it works on).
    A failure raises its `RankError` (with `raise_failure=False` it is the run's `failure`);
    a stub raises NotImplementedError."""
    watches = [Watch(rank, devices) for rank in range(devices)]

    def watched(ctx: Rank) -> None:
        watch = watches[ctx.rank]
        watch.attach(ctx)
        if inputs is None:
            del ctx.stage, ctx.stages, ctx.inputs, ctx.targets
        setup(ctx, watch)
        watch.result = program(ctx)

    batch = inputs if inputs is not None else torch.zeros(devices, 1)
    labels = targets if targets is not None else torch.zeros(devices, dtype=torch.long)
    stages = [nn.Identity() for _ in range(devices)]  # the Builds hold no pipeline stage
    run = run_ranks(
        watched,
        devices,
        stages,
        batch,
        labels,
        devices,
        timeout=timeout,
        raise_failure=raise_failure,
    )
    return WatchedRun(run, watches)
