"""What a per-rank run (`threads.ranks.run_ranks`) gives back: its result, or its one error.

`RankRun` says, per rank, what the program did: its gradients, the bytes it sent and
received, its messages, the collectives it called, the actions it ran in order, the peak of
the activations it saved, the losses, and the trace its timeline comes from. `evidence()` is
all of that as plain data (what `checks.wire` carries from a learner's kernel to the grader,
who judges it).

`RankError` is a failure in one message that names the rank and where it was (in an action,
after one, or before the first), never a stack from inside the course: IPython shows the
message alone (`_render_traceback_`), with the program's own line where one raised.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from course_utils.actions import Action
from course_utils.errors import WorkerError
from course_utils.threads import trace
from course_utils.threads.mailboxes import Deadlock

if TYPE_CHECKING:
    from course_utils.threads.ranks import Rank, _Run


class RankError(WorkerError):
    """A per-rank program's failure, `kind` ("raised", "deadlock", "unreceived", "tag",
    "shape", "peer", "not a tensor", "call", "timeout"), on `rank`, in one message."""

    def __init__(self, kind: str, rank: int, message: str) -> None:
        super().__init__(message)
        self.kind, self.rank = kind, rank

    def _render_traceback_(self) -> list[str]:  # IPython: the message, not the course's stack
        return [f"RankError: {self}"]


@dataclass
class RankRun:
    """What each rank did (lists indexed by rank); `failure` when the run failed."""

    world: int
    actions: list[list[Action]]
    grads: list[dict[str, torch.Tensor | None]]  # "stage.parameter" -> its gradient
    bytes_sent: list[int]
    bytes_received: list[int]
    sends: list[list[tuple]]  # (to, tag, bytes, the action the send followed or None), in order
    collectives: list[list[dict]]  # per call: op, numel, bytes, reduce, async, in, after, waited
    saved_bytes: list[int]  # the peak of saved activations
    saved_microbatches: list[int]  # the most (chunk, micro-batch)s holding some at once
    losses: list[float | None]  # per micro-batch, as `ctx.loss` computed it
    recorder: trace.Recorder
    failure: RankError | None = None
    extra: dict = field(default_factory=dict)  # what a harness around run_ranks adds (results)

    @classmethod
    def of(cls, run: _Run, failure: RankError | None) -> RankRun:
        grads = [
            {f"{s}.{name}": p.grad for s in owned for name, p in run.stages[s].named_parameters()}
            for owned in run.placement
        ]
        ranks = run.ranks
        return cls(
            world=run.world,
            actions=[ctx.actions for ctx in ranks],
            grads=[{k: None if g is None else g.clone() for k, g in d.items()} for d in grads],
            bytes_sent=list(run.group.bytes_sent),
            bytes_received=list(run.group.bytes_received),
            sends=[ctx.sends for ctx in ranks],
            collectives=[ctx.comm.calls for ctx in ranks],
            saved_bytes=[ctx.saved.peak_bytes for ctx in ranks],
            saved_microbatches=[ctx.saved.peak_held for ctx in ranks],
            losses=[run.losses.get(mb) for mb in range(len(run.inputs))],
            recorder=run.recorder,
            failure=failure,
        )

    @property
    def timeline(self):
        """The run on the virtual clock (a `Timeline`, what `gantt.draw` draws)."""
        return self.recorder.timeline("virtual", num_devices=self.world, name="per-rank program")

    def evidence(self) -> dict:
        """All of it as plain data (`checks.wire.encode`): what a grader judges."""
        failure, events = self.failure, []
        if failure is None:  # a failed run's messages may not add up to a timeline
            events = [[e.device, e.action, e.start, e.end] for e in self.timeline.events]
        fields = ("world", "actions", "grads", "bytes_sent", "bytes_received", "sends")
        data = {name: getattr(self, name) for name in fields}
        data |= {"collectives": self.collectives, "messages": self.recorder.messages()}
        data |= {"saved_bytes": self.saved_bytes, "saved_microbatches": self.saved_microbatches}
        data |= {"losses": self.losses, "timeline": events, "failure": None} | self.extra
        if failure is not None:
            data["failure"] = {"kind": failure.kind, "rank": failure.rank, "message": str(failure)}
        return data


def failure_of(err: WorkerError, ranks: list[Rank]) -> RankError:
    """The run's one error, from the pool's (which chains the first real failure)."""
    # threads world.. are the ranks' communication streams (`threads.async_comm`)
    exc, rank = err.__cause__, getattr(err, "device", 0) % len(ranks)
    if isinstance(exc, RankError):
        return exc
    if isinstance(exc, NotImplementedError):  # an exercise's stub: not answered yet
        raise NotImplementedError() from None
    if isinstance(exc, Deadlock):  # inside a collective
        return RankError("deadlock", rank, f"deadlock: {exc.who}")
    if exc is None:  # the run's time limit
        return _timed_out(err, rank, ranks)
    line = (str(exc).splitlines() or [""])[0]
    return ranks[rank].fail("raised", f"raised {type(exc).__name__}: {line}{_their_line(exc)}")


def _timed_out(err: WorkerError, rank: int, ranks: list[Rank]) -> RankError:
    """The time limit's error: the ranks still running (the pool names its threads; threads
    world.. are the ranks' communication streams) and what each rank was doing."""
    world, text = len(ranks), str(err)
    found = re.search(r"with \S+ ([\d, ]+) still running", text)
    threads = {int(t) for t in found[1].split(",")} if found else set(range(world))
    if found:
        running = ", ".join(str(r) for r in sorted({t % world for t in threads}))
        text = text.replace(found[0], f"with rank {running} still running")

    def doing(c: Rank) -> str:
        if c.rank not in threads:
            return "had finished"
        return f"was waiting for {c.waiting}" if c.waiting else "was running"

    state = "; ".join(f"rank {c.rank} {doing(c)} ({c.where()})" for c in ranks)
    return RankError("timeout", rank, f"{text} and were stopped: {state}")


def unreceived(left: dict) -> RankError | None:
    """The error for messages nobody received (`Mailboxes.left()` after a run), if any."""
    for key, messages in left.items():
        if key[0] != "p2p":  # a collective's leftovers (or a result never waited for)
            continue
        _, src, dst = key
        said = ", ".join(f"tagged {tag!r}, sent {when}" for tag, _, _, when in messages)
        what = f"{len(messages)} message(s) to rank {dst} that nobody received ({said})"
        return RankError("unreceived", src, f"rank {src} ended with {what}")
    return None


def _their_line(exc: BaseException) -> str:
    """'; line 7 of the program: out.backward()': the last line of the program's own that ran."""
    ours = ("/course_utils/", "-packages/", "/lib/python")
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if not any(part in f.filename for part in ours)]
    return f"; line {mine[-1].lineno} of the program: {mine[-1].line}" if mine else ""
