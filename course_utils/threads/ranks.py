"""Run a per-rank program on the course's devices: `run_ranks`.

A parallel step is one program that every rank runs, each choosing from its `rank` what to
do, as a `torch.distributed` program does under `torchrun`:

    def program(ctx):
        if ctx.rank == 0:
            with ctx.forward(0):                 # marks (and times) action 0F0
                out = ctx.stage(ctx.inputs[0])
            ctx.send(out, to=1)
            ...

    run = run_ranks(program, devices=2, stages=partition(model, 2), inputs=x, targets=y)

Each rank runs on a device thread (`DeviceThreads`, on the virtual clock) with its `ctx`:
`rank`, `world`, the `stages` it owns, the micro-batches' `inputs` and `targets`, `loss`,
`send`/`recv`, and the collectives of `ctx.comm` (a `Communicator`). `with ctx.forward(mb):`
(`backward`, `backward_input`, `backward_weight`) only marks the work inside as an action: it
times it and counts the activations autograd saves in it (`threads.saved`). The work, the
stage boundary included, is the program's own.

A message is a copy without its graph, as between two GPUs; messages between two ranks
arrive in the order they were sent, and a `recv` naming a `tag` must get a message sent with
that tag, so a receive out of order is caught, never silently swapped. What goes wrong is
one `RankError` naming the rank and the action: a rank that raises, a deadlock (who waits
for whom, proved at once by `Mailboxes`), messages nobody received, a send to itself or to
no rank, a tensor of the wrong tag or shape, a run past its `timeout`. A collective may be
non-blocking (`async_op=True`, on the rank's communication stream: `threads.async_comm`).
The result, `RankRun`, says per rank what ran; `evidence()` is that as plain data.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext

import torch
from torch import nn

from course_utils import validation
from course_utils.actions import Action
from course_utils.errors import CourseInputError, WorkerError
from course_utils.threads import async_comm, trace
from course_utils.threads.collectives import ThreadGroup
from course_utils.threads.devices import DeviceThreads
from course_utils.threads.mailboxes import Deadlock
from course_utils.threads.rank_run import RankError, RankRun, failure_of, unreceived
from course_utils.threads.saved import SavedActivations


class Rank:
    """One rank's handle on the run: the `ctx` its program gets."""

    def __init__(self, run: _Run, rank: int) -> None:
        self.rank, self.world, self._run = rank, run.world, run
        self.stage_ids = list(run.placement[rank])  # the global stage number of each chunk
        self.stages: list[nn.Module] = [run.stages[s] for s in self.stage_ids]
        self.stage = self.stages[0]
        self.inputs, self.targets = run.inputs, run.targets
        self.microbatches = len(run.inputs)
        self.comm = async_comm.RankComm(self, run.group.comm(rank), run.streams)  # collectives
        self.actions: list[Action] = []  # those finished, in order
        self.current: Action | None = None
        self.waiting: str | None = None  # what it waits for in `recv`, if it does
        self.stream = run.recorder.stream(rank)
        self.saved = SavedActivations(self.stages)
        self.sends: list[tuple] = []  # (to, tag, bytes, the action it followed), in order
        self._sent: dict[int, int] = defaultdict(int)  # messages sent so far, per receiver

    def where(self) -> str:
        if self.current is not None:
            return f"in {self.current}"
        return f"after {self.actions[-1]}" if self.actions else "before its first action"

    def fail(self, kind: str, what: str) -> RankError:
        return RankError(kind, self.rank, f"rank {self.rank} {what} ({self.where()})")

    def loss(self, out: torch.Tensor, mb: int) -> torch.Tensor:
        """Micro-batch `mb`'s loss over the number of micro-batches: their gradients then
        add up to the whole batch's (mean loss)."""
        loss = self._run.loss_fn(out, self.targets[mb])
        self._run.losses[mb] = float(loss.detach())
        return loss / self.microbatches

    def send(self, tensor: torch.Tensor, to: int, tag=None) -> None:
        """Send a copy of `tensor`, without its graph, to rank `to`; never waits."""
        if not isinstance(tensor, torch.Tensor):
            raise self.fail("not a tensor", f"sent {tensor!r:.40} to rank {to}, not a tensor")
        self._peer(to, "sent a message to")
        message = tensor.detach().clone()
        nbytes, number = message.numel() * message.element_size(), self._sent[to]
        self._sent[to] += 1
        self._run.group._count(self.rank, nbytes)
        last = self.actions[-1] if self.actions else None  # its transfer's bar in the Gantt
        kind = "SEND_B" if last is not None and last.is_backward else "SEND_F"
        bar = None if last is None else Action(last.stage, kind, last.microbatch)
        self.stream.send(("p2p", self.rank, to, number), to, nbytes, bar)
        self._run.mail.put(("p2p", self.rank, to), (tag, message, number, self.where()))
        self.sends.append((to, repr(tag), nbytes, None if last is None else str(last)))

    def recv(self, frm: int, tag=None, shape: Sequence[int] | None = None) -> torch.Tensor:
        """The next message from rank `frm`, waiting for it; with `tag` or `shape`, what it
        must be."""
        self._peer(frm, "waited for a message from")
        what = f"a message from rank {frm}" + ("" if tag is None else f" tagged {tag!r}")
        self.waiting = what
        try:
            got, message, number, sent = self._run.mail.get(
                ("p2p", frm, self.rank), self.rank, what
            )
        except Deadlock as exc:
            raise RankError("deadlock", self.rank, f"deadlock: {exc.who}") from None
        self.waiting = None
        self.stream.recv(("p2p", frm, self.rank, number))
        self._run.group._count_received(self.rank, message.numel() * message.element_size())
        if tag is not None and got != tag:
            raise self.fail(
                "tag",
                f"expected a message tagged {tag!r} from rank {frm}, but the next one is tagged "
                f"{got!r} (sent {sent}): receives must come in the order of the sends",
            )
        if shape is not None and tuple(message.shape) != tuple(shape):
            got_shape = tuple(message.shape)
            raise self.fail(
                "shape", f"expected shape {tuple(shape)} from rank {frm}, got {got_shape}"
            )
        return message

    def _peer(self, other: int, did: str) -> None:
        if other == self.rank or not (isinstance(other, int) and 0 <= other < self.world):
            others = ", ".join(str(r) for r in range(self.world) if r != self.rank)
            raise self.fail("peer", f"{did} rank {other!r}; the other ranks are {others}")

    def forward(self, mb: int, chunk: int = 0):
        """`with ctx.forward(mb):` marks the work inside as action F of `mb` (and `chunk`)."""
        return self._action("F", mb, chunk)

    def backward(self, mb: int, chunk: int = 0):
        return self._action("B", mb, chunk)

    def backward_input(self, mb: int, chunk: int = 0):
        return self._action("I", mb, chunk)

    def backward_weight(self, mb: int, chunk: int = 0):
        return self._action("W", mb, chunk)

    @contextmanager
    def _action(self, kind: str, mb: int, chunk: int) -> Iterator[None]:
        for name, value, count in (
            ("micro-batch", mb, self.microbatches),
            ("chunk", chunk, len(self.stages)),
        ):
            if not (isinstance(value, int) and 0 <= value < count):
                raise self.fail("call", f"named {name} {value!r}; it has {count}, 0..{count - 1}")
        action = Action(self.stage_ids[chunk], kind, mb)
        if self.current is not None:
            raise self.fail("call", f"started {action} inside another action")
        self.current = action
        saving = self.saved.counting((chunk, mb)) if kind == "F" else nullcontext()
        with self.stream.compute(action), saving:
            yield
        self.current = None
        self.actions.append(action)


class _Run:
    """One run's shared state: the ranks, their messages and the trace."""

    def __init__(self, program, world, stages, placement, xs, ys, loss_fn, abort) -> None:
        self.program, self.world, self.stages, self.placement = program, world, stages, placement
        self.inputs, self.targets, self.loss_fn, self.abort = xs, ys, loss_fn, abort
        self.losses: dict[int, float] = {}
        self.recorder = trace.Recorder()
        self.mail = async_comm.mailboxes(world, abort, lambda r: self.ranks[r].where())
        self.group = ThreadGroup(world, abort=abort, mail=self.mail)
        self.streams = async_comm.CommStreams(world, abort, self.mail, self.recorder, self.group)
        self.ranks = [Rank(self, r) for r in range(world)]

    def main(self, ctx: Rank) -> None:
        try:
            with trace.bound(ctx.stream):
                self.program(ctx)
        except BaseException:
            self.abort.set()  # peers give up, rather than take this rank's end for a deadlock
            raise
        finally:  # its stream serves what was issued, then ends (told before it may look idle)
            self.streams.stop(ctx.rank)
            self.mail.finished(ctx.rank)


def run_ranks(
    program: Callable[[Rank], None],
    devices: int,
    stages: Sequence[nn.Module],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    microbatches: int = 1,
    placement: Sequence[Sequence[int]] | None = None,
    loss_fn: Callable | None = None,
    timeout: float = 20.0,
    raise_failure: bool = True,
) -> RankRun:
    """Run `program(ctx)` on `devices` ranks (see the module docstring). `stages`: the model
    cut in order (`models.partition`); rank r owns stages `placement[r]` (by default those
    with s % devices == r: the looping placement); the batch is cut into `microbatches`.
    Gradients start at None. A failure raises its `RankError` (with `raise_failure=False`,
    it is `RankRun.failure`); a program that still raises NotImplementedError raises it."""
    validation.integer(devices, "devices", 1, validation.MAX_THREADS)
    validation.integer(microbatches, "microbatches", 1, 10_000)
    stages = list(stages)
    if not stages or not all(isinstance(s, nn.Module) for s in stages):
        raise CourseInputError("stages must be a non-empty list of modules (partition(model, n))")
    if placement is None:
        placement = [range(r, len(stages), devices) for r in range(devices)]
    placement = [list(owned) for owned in placement]
    dealt = sorted(s for owned in placement for s in owned)
    if len(placement) != devices or not all(placement) or dealt != list(range(len(stages))):
        raise CourseInputError(
            f"placement must give each of the {devices} ranks some of the stages "
            f"0..{len(stages) - 1}, each stage to one rank; got {placement}"
        )
    if len(inputs) != len(targets) or len(inputs) % microbatches:
        raise CourseInputError(
            "inputs and targets must have one batch size, a multiple of microbatches "
            f"({microbatches})"
        )
    if loss_fn is None:
        from course_utils.models import loss_fn
    for p in (p for stage in stages for p in stage.parameters()):
        p.grad = None
    size = len(inputs) // microbatches
    pool = DeviceThreads(devices + async_comm.threads_for(devices), name="rank", one_core=True)
    xs, ys = list(inputs.split(size)), list(targets.split(size))
    run = _Run(program, devices, stages, placement, xs, ys, loss_fn, pool.abort)
    failure: RankError | None = None
    try:
        with run.recorder:
            mains = [functools.partial(run.main, ctx) for ctx in run.ranks]
            pool.run(mains + run.streams.loops(), timeout=timeout)
        failure = unreceived(run.mail.left())
    except WorkerError as err:
        failure = failure_of(err, run.ranks)
    finally:
        pool.close()  # every run on fresh threads: nothing of a stopped run is left behind
    if failure is not None and raise_failure:
        raise failure
    return RankRun.of(run, failure)
