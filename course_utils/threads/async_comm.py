"""Non-blocking collectives for per-rank programs: `ctx.comm.all_reduce(t, async_op=True)`.

Overlapping communication with compute (data parallelism's gradient buckets, FSDP's
prefetch, ring attention) needs collectives that run while the rank computes. As in
`torch.distributed`, a collective called with `async_op=True` returns at once with a handle,
`Work`, and `work.wait()` blocks until it is done. Each rank has a communication stream, as a
GPU runs NCCL's kernels on a CUDA stream of their own: a second thread that runs the rank's
issued collectives one after the other, in the order issued, over a group of its own.

On the virtual clock (`threads.clock`) the stream has its own clock. Issuing is a zero-byte
message from the rank's compute stream to its communication stream, and `wait` one back: a
collective starts no earlier than it was issued (and than the one before it ended), and the
rank waits for it only at `wait`. So the Gantt chart shows the all-reduce on the lane under
a backward pass that goes on beside it.

Semantics, made deterministic: a non-blocking collective reads its tensors when it is
issued (a copy) and writes its result into them when `wait()` returns (and returns it). On a
GPU they are read and written at some moment in between, so a program that changes them
before `wait`, or reads the result without it, is wrong there; here it is wrong every time,
rather than some of the time.

The communication threads wait for their work in the run's `Mailboxes`, as devices of their
own ("rank 0's communication stream"), so a collective that a peer never joins is still a
deadlock proved at once, and they run in the run's pool: its time limit stops them too.
`ctx.comm` (`RankComm`) records every collective a rank calls, where and how big, for the
grader (`RankRun.collectives`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from course_utils import validation
from course_utils.actions import Action
from course_utils.threads import trace
from course_utils.threads.collectives import Communicator, ThreadGroup
from course_utils.threads.mailboxes import Deadlock, Mailboxes
from course_utils.threads.rank_run import RankError

if TYPE_CHECKING:
    from course_utils.threads.ranks import Rank

# How each collective is drawn (the kind of its bar) and named.
KINDS = {
    "all_reduce": ("ALL_REDUCE", "all-reduce"),
    "all_gather": ("ALL_GATHER", "all-gather"),
    "reduce_scatter": ("REDUCE_SCATTER", "reduce-scatter"),
    "all_to_all": ("ALL_TO_ALL", "all-to-all"),
}


def threads_for(world: int) -> int:
    """Communication threads a run of `world` ranks gets: one per rank, while the pool of
    2 x world threads stays within `validation.MAX_THREADS` (else collectives block)."""
    return world if 2 * world <= validation.MAX_THREADS else 0


def names(world: int) -> Callable[[int], str]:
    """How `Mailboxes` names device d: rank d, or rank d - world's communication stream."""
    return lambda d: f"rank {d}" if d < world else f"rank {d - world}'s communication stream"


def mailboxes(world: int, abort: threading.Event, where: Callable[[int], str]) -> Mailboxes:
    """A run's mailboxes: ranks 0..world-1 (`where(r)`: where rank r is) and their
    communication streams, world..2 world - 1."""
    progress = lambda d: f" ({where(d)})" if d < world else ""  # noqa: E731
    return Mailboxes(2 * world, abort, "rank", progress, names(world), helpers=world)


class _Channel:
    """The communication streams' view of the run's mailboxes: keys of their own, and their
    own devices (world + rank), so that a wait on either thread is seen as that thread's."""

    def __init__(self, mail: Mailboxes, world: int) -> None:
        self.mail, self.world = mail, world

    def put(self, key: tuple, value: Any) -> None:
        self.mail.put(("async", *key), value)

    def get(self, key: tuple, device: int, what: str) -> Any:
        return self.mail.get(("async", *key), device + self.world, what)


class _CountedGroup(ThreadGroup):
    """The streams' group; its bytes count as the run's (`RankRun.bytes_sent`)."""

    def __init__(self, world: int, abort: threading.Event, mail: Any, run: ThreadGroup) -> None:
        super().__init__(world, abort=abort, mail=mail)
        self.run = run

    def _count(self, rank: int, nbytes: int) -> None:
        self.run._count(rank, nbytes)

    def _count_received(self, rank: int, nbytes: int) -> None:
        self.run._count_received(rank, nbytes)


class CommStreams:
    """The communication streams of one run: per rank a thread serving its issued work."""

    def __init__(
        self,
        world: int,
        abort: threading.Event,
        mail: Mailboxes,
        recorder: trace.Recorder,
        group: ThreadGroup,
    ) -> None:
        self.world, self.abort, self.mail, self.recorder = world, abort, mail, recorder
        self.threads = threads_for(world)
        self.group = _CountedGroup(world, abort, _Channel(mail, world), group)
        for rank in range(self.threads, world):  # no thread: nobody will wait there
            mail.finished(world + rank)

    def loops(self) -> list[Callable[[], None]]:
        """What the run's pool runs on its threads world..2 world - 1."""
        return [functools.partial(self._serve, rank) for rank in range(self.threads)]

    def stop(self, rank: int) -> None:
        """Rank `rank`'s program has ended: its stream serves what was issued, then ends."""
        if rank < self.threads:
            self.mail.put(("work", rank), None)

    def _serve(self, rank: int) -> None:
        stream, device = self.recorder.stream(rank, "communication"), self.world + rank
        comm = self.group.comm(rank)
        try:
            with trace.bound(stream):
                while True:
                    item = self.mail.get(("work", rank), device, "")  # idle: "" (unnamed)
                    if item is None:
                        return
                    number, action, label, run = item
                    stream.recv(("issue", rank, number))  # not before the rank issued it
                    with stream.span(action, label):
                        result = run(comm)
                    stream.send(("done", rank, number), rank, 0)
                    self.mail.put(("done", rank, number), result)
        except Deadlock as exc:
            raise RankError("deadlock", rank, f"deadlock: {exc.who}") from None
        except BaseException:
            self.abort.set()  # the rank waiting for this stream gives up
            raise
        finally:
            self.mail.finished(device)


_PENDING = object()


class Work:
    """The handle of a non-blocking collective (`torch.distributed`'s `Work`)."""

    def __init__(self, comm: RankComm, number: int, finish: Callable, record: dict) -> None:
        self._comm, self._number, self._finish, self._record = comm, number, finish, record
        self._done, self._result = False, None
        self._ready: Any = _PENDING  # the result, when the collective ran without a stream

    def is_completed(self) -> bool:
        return self._done

    def wait(self) -> Any:
        """Block until the collective is done; its result is then in the tensors given (and
        returned: the tensor, or for `all_gather` and the others, what they return)."""
        if self._done:
            return self._result
        ctx, number = self._comm.ctx, self._number
        if self._ready is _PENDING:
            what = f"its {self._record['op']} #{number} to finish"
            ctx.waiting = what
            try:
                done = self._comm.streams.mail.get(("done", ctx.rank, number), ctx.rank, what)
            except Deadlock as exc:
                raise RankError("deadlock", ctx.rank, f"deadlock: {exc.who}") from None
            ctx.waiting = None
            ctx.stream.recv(("done", ctx.rank, number))
        else:
            done = self._ready
        self._result, self._done = self._finish(done), True
        self._record["waited"] = True
        return self._result

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        return f"Work({self._record['op']} #{self._number} of rank {self._comm.rank}, {state})"


class RankComm:
    """`ctx.comm`: the `Communicator`'s collectives, blocking or, with `async_op=True`, not.

    Every call is recorded in `calls` (what the grader reads): the collective, the numbers
    and bytes it reduces or gathers, `reduce` ("sum"/"mean"), `async`, the action it was
    called in (`in`) or after (`after`), and whether it was waited for.
    """

    def __init__(self, ctx: Rank, comm: Communicator, streams: CommStreams) -> None:
        self.ctx, self.comm, self.streams = ctx, comm, streams
        self.rank, self.world_size = comm.rank, comm.world_size
        self.calls: list[dict] = []

    def __getattr__(self, name: str) -> Any:  # barrier, and the Communicator's own send/recv
        if name == "comm":  # not set yet (a copy being made): not the Communicator's either
            raise AttributeError(name)
        return getattr(self.comm, name)

    def __repr__(self) -> str:
        return f"RankComm(rank={self.rank}, world_size={self.world_size})"

    def all_reduce(
        self,
        tensor: torch.Tensor | Sequence[torch.Tensor],
        op: str = "sum",
        algorithm: str = "ring",
        async_op: bool = False,
    ):
        """Sum (or average) `tensor` (or a list of tensors) over the ranks, in place."""
        tensors = self._tensors(tensor, "all_reduce")
        flat = torch.cat([t.detach().reshape(-1) for t in tensors]) if tensors else None

        def run(comm: Communicator):
            return flat if flat is None else comm.all_reduce(flat, op=op, algorithm=algorithm)

        def finish(result):
            offset = 0
            with torch.no_grad():
                for t in tensors:
                    t.copy_(result[offset : offset + t.numel()].view_as(t))
                    offset += t.numel()
            return tensor

        return self._call("all_reduce", tensors, op, run, finish, async_op)

    def all_gather(self, shard, dim: int = 0, out=None, async_op: bool = False):
        """Every rank's `shard` concatenated along `dim` (into `out` if given)."""
        copy = self._tensors(shard, "all_gather", one=True)[0].detach().clone()

        def finish(result):
            if out is None:
                return result
            with torch.no_grad():
                out.copy_(result)
            return out

        return self._call(
            "all_gather", [copy], None, lambda c: c.all_gather(copy, dim=dim), finish, async_op
        )

    def reduce_scatter(self, tensor, op: str = "sum", dim: int = 0, sizes=None, async_op=False):
        """This rank's chunk of the sum (or mean) of `tensor` over the ranks."""
        copy = self._tensors(tensor, "reduce_scatter", one=True)[0].detach().clone()

        def run(c: Communicator):
            return c.reduce_scatter(copy, op=op, dim=dim, sizes=sizes)

        return self._call("reduce_scatter", [copy], op, run, lambda r: r, async_op)

    def all_to_all(self, chunks, async_op: bool = False):
        """`chunks[d]` to rank d; returns what each rank addressed to this one."""
        if isinstance(chunks, torch.Tensor):
            raise self.ctx.fail("call", "passed one tensor to all_to_all, not one per rank")
        copies = [c.detach().clone() for c in self._tensors(list(chunks), "all_to_all")]
        run = functools.partial(Communicator.all_to_all, chunks=copies)
        return self._call("all_to_all", copies, None, run, lambda r: r, async_op)

    def _tensors(self, value, name: str, one: bool = False) -> list[torch.Tensor]:
        """`value` (one tensor, or with `one` False a list) as a list of tensors, or the
        rank's error naming what is not a tensor."""
        values = list(value) if not one and isinstance(value, list | tuple) else [value]
        for v in values:
            if not isinstance(v, torch.Tensor):
                raise self.ctx.fail(
                    "not a tensor",
                    f"passed {v!r:.40} to {name}, not a tensor (a gradient that autograd has "
                    "not computed yet is None)",
                )
        return values

    def _call(self, name, tensors, reduce, run, finish, async_op: bool):
        ctx = self.ctx
        numel = sum(t.numel() for t in tensors)
        record = {
            "op": name,
            "numel": numel,
            "bytes": sum(t.numel() * t.element_size() for t in tensors),
            "reduce": reduce,
            "async": bool(async_op),
            "in": None if ctx.current is None else str(ctx.current),
            "after": str(ctx.actions[-1]) if ctx.actions else None,
            "waited": not async_op,
        }
        self.calls.append(record)
        near = ctx.current or (ctx.actions[-1] if ctx.actions else None)
        kind, label = KINDS[name]
        stage, mb = (ctx.stage_ids[0], None) if near is None else (near.stage, near.microbatch)
        action = Action(stage, kind, mb)
        number = len(self.calls) - 1
        if not async_op:
            with ctx.stream.span(action, label):
                return finish(run(self.comm))
        work = Work(self, number, finish, record)
        streams = self.streams
        if ctx.rank >= streams.threads:  # no stream of its own: it runs now, in the open
            with ctx.stream.span(action, label):
                work._ready = run(self.comm)
            return work
        ctx.stream.send(("issue", ctx.rank, number), ctx.rank, 0)
        streams.mail.put(("work", ctx.rank), (number, action, label, run))
        return work
