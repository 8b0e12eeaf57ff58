"""What each device did, recorded while it ran: the trace that both clocks read.

A runner (the pipeline executor, data parallelism, FSDP, ...) gives every device thread a
`Stream` and records on it, in program order, what the thread does:

    with stream.compute(Action(1, "F", 3)):     # real torch work: its thread CPU time
        out = stage(x)
    stream.send(("act", 2, 3), to_device=2, nbytes=out.nbytes)   # a message leaves
    stream.recv(("grad", 1, 3))                                  # wait for a message
    with stream.span(Action(0, "REDUCE_GRAD"), "all-reduce"):    # a collective, drawn as
        ...                                                      # one bar; its adds are
        with stream.burst():                                     # compute bursts
            chunk += incoming

Each compute records the thread's own CPU time (`time.thread_time_ns`: other threads and
other programs taking the core do not count) and its wall-clock start and end
(`time.perf_counter_ns`). A message records its key, its destination and its size.

From one trace come two timelines (`course_utils.threads.clock.timeline`):
- wall clock: the timestamps as they happened on this machine, so only the parallelism its
  free cores allow can show;
- virtual clock: every device on its own clock; a compute lasts its CPU time; a message
  arrives when the emulated links (`course_utils.threads.links`) deliver it. This is what
  the run would look like with one core per device and a real network.

The `Communicator` of `course_utils.threads.collectives` records its sends and receives on
the stream bound to the calling thread (`bound`), so every collective built from sends is
traced without passing the stream around.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, TypeVar

from course_utils.actions import Action
from course_utils.errors import CourseInputError

if TYPE_CHECKING:
    from course_utils.threads.links import Links
    from course_utils.timeline import Timeline

CLOCKS = ("virtual", "wall")

# What a stream recorded, as small tuples in program order:
BEGIN, END, CPU, SEND, RECV = range(5)
#   (BEGIN, event)  (END, event)  (CPU, nanoseconds)
#   (SEND, key, to_device, nbytes, event or -1)  (RECV, key)

T = TypeVar("T")

# Set while `course_utils.measure.profiler.profiled` runs torch.profiler: makes the context
# manager that marks a compute bar or a span with its action's name on the profiler's rows
# (`torch.profiler.record_function`), so its trace and the course's timeline share the names.
marker: Callable[[str], AbstractContextManager] | None = None


def check_clock(clock: str, name: str = "clock") -> str:
    if clock not in CLOCKS:
        raise CourseInputError(f"{name} must be one of {', '.join(CLOCKS)}, got {clock!r}")
    return clock


class Stream:
    """One thread's record: operations in program order, and the events to draw.

    `device` is the device the thread stands for (its links); a device may have several
    streams (FSDP gives each worker a compute and a communication stream).

    A span (a collective) inside a compute block cuts the compute bar in two around it, as
    Megatron's all-reduce sits in the middle of a tensor-parallel forward; a message sent or
    awaited inside a compute block keeps the CPU time measured before it in its place.
    """

    def __init__(self, device: int, name: str, index: int) -> None:
        self.device, self.name, self.index = device, name, index
        self.ops: list[tuple] = []
        # per event: [action, label, wall start ns, wall end ns, is a transfer]
        self.events: list[list] = []
        self._computing: tuple[Action, str | None] | None = None  # the open compute bar
        self._event = -1  # its index in `events`
        self._cpu: int | None = None  # thread CPU time at the last flush, while computing

    def _begin(self, action: Action, label: str | None) -> int:
        index = len(self.events)
        self.events.append([action, label, time.perf_counter_ns(), 0, False])
        self.ops.append((BEGIN, index))
        return index

    def _end(self, index: int) -> None:
        self.events[index][3] = time.perf_counter_ns()
        self.ops.append((END, index))

    def _flush(self) -> None:
        """Record the CPU time spent since the last flush (inside compute or a burst)."""
        if self._cpu is not None:
            now = time.thread_time_ns()
            self.ops.append((CPU, now - self._cpu))
            self._cpu = now

    def compute(self, action: Action, label: str | None = None) -> _Compute:
        """The block is compute: one bar whose virtual length is the block's CPU time."""
        return _Compute(self, action, label)

    @contextmanager
    def span(self, action: Action, label: str | None = None) -> Iterator[None]:
        """One bar around what the block does (sends, receives, bursts): a collective."""
        paused = self._computing
        if paused is not None:  # cut the compute bar around this span
            self._flush()
            self._cpu, self._computing = None, None
            self._end(self._event)
        index = self._begin(action, label)
        with marker(str(action)) if marker is not None else nullcontext():
            yield
        self._end(index)
        if paused is not None:
            self._computing = paused
            self._event = self._begin(*paused)
            self._cpu = time.thread_time_ns()

    @contextmanager
    def burst(self) -> Iterator[None]:
        """Compute inside a span (a collective's additions): CPU time, no bar of its own."""
        if self._cpu is not None:  # already inside compute: counted there
            yield
            return
        self._cpu = time.thread_time_ns()
        try:
            yield
        finally:
            self._flush()
            self._cpu = None

    def send(
        self,
        key: Hashable,
        to_device: int,
        nbytes: int,
        action: Action | None = None,
        label: str | None = None,
    ) -> None:
        """A message leaves now; `action` (e.g. SEND_F) draws its transfer as a bar."""
        self._flush()
        event = -1
        if action is not None:
            event = len(self.events)
            now = time.perf_counter_ns()
            self.events.append([action, label, now, now, True])
        self.ops.append((SEND, key, to_device, nbytes, event))

    def recv(self, key: Hashable) -> None:
        """The thread needs message `key` before it goes on."""
        self._flush()
        self.ops.append((RECV, key))

    def __repr__(self) -> str:
        return f"Stream(device={self.device}, {self.name!r}, {len(self.ops)} ops)"


class _Compute:
    """`Stream.compute`'s context manager (a class: cheaper than a generator per action)."""

    __slots__ = ("stream", "action", "label", "mark")

    def __init__(self, stream: Stream, action: Action, label: str | None) -> None:
        self.stream, self.action, self.label = stream, action, label
        self.mark: AbstractContextManager | None = None

    def __enter__(self) -> None:
        s = self.stream
        if s._computing is not None:
            raise RuntimeError(f"compute {self.action} inside compute {s._computing[0]}")
        s._computing = (self.action, self.label)
        s._event = s._begin(self.action, self.label)
        if marker is not None:  # inside the bar: the profiler's slice lies within it
            self.mark = marker(str(self.action))
            self.mark.__enter__()
        s._cpu = time.thread_time_ns()

    def __exit__(self, *exc_info) -> None:
        s = self.stream
        s._flush()
        if self.mark is not None:
            self.mark.__exit__(*exc_info)
            self.mark = None
        s._cpu, s._computing = None, None
        if exc_info[0] is None:
            s._end(s._event)


class Recorder:
    """The streams of one run (one training step). Create it just before the run.

    While it is used as a context manager, Python's garbage collector is paused, so a
    collection never lands inside (and lengthens) some device's compute.
    """

    def __init__(self) -> None:
        self.streams: list[Stream] = []
        self.t0 = time.perf_counter_ns()
        self._lock = threading.Lock()
        self._gc_was_enabled = False
        # what the run's first timeline was called and which links it used: the same step
        # drawn later on the other clock (`timeline("wall")`) keeps them
        self.fields: dict = {}
        self.links: Links | None = None

    def stream(self, device: int, name: str = "compute") -> Stream:
        with self._lock:
            stream = Stream(device, name, len(self.streams))
            self.streams.append(stream)
        return stream

    def messages(self) -> list[list]:
        """Every stream's messages in program order, without its compute: per stream
        [device, name, [["send", key, to_device, nbytes] | ["recv", key], ...]], plain data
        that `clock.replay_messages` replays (what a grader times a learner's collective by)."""
        log = []
        for s in self.streams:
            ops = [
                ["send", op[1], op[2], op[3]] if op[0] == SEND else ["recv", op[1]]
                for op in s.ops
                if op[0] in (SEND, RECV)
            ]
            log.append([s.device, s.name, ops])
        return log

    def timeline(self, clock: str, links: Links | None = None, **fields) -> Timeline:
        """The run on `clock` ("virtual": over `links`, default the course's cluster).

        `fields` (name, stages, meta, ...) and `links` are remembered for later calls, so
        `result.trace.timeline("wall")` draws the same step, named alike, on the wall clock.
        """
        from course_utils.threads.clock import timeline

        self.fields.update(fields)
        if links is not None:
            self.links = links
        return timeline(self, clock, self.links, **self.fields)

    def __enter__(self) -> Recorder:
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        self.t0 = time.perf_counter_ns()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._gc_was_enabled:
            gc.enable()


# -- which stream the calling thread records on ------------------------------------------------

_local = threading.local()


def current() -> Stream | None:
    """The stream bound to this thread, or None when nothing is being recorded."""
    return getattr(_local, "stream", None)


@contextmanager
def bound(stream: Stream | None) -> Iterator[None]:
    """Record this thread's sends and receives (`Communicator`) on `stream` in the block."""
    before = current()
    _local.stream = stream
    try:
        yield
    finally:
        _local.stream = before


def traced(action: Action, label: str | None = None) -> AbstractContextManager:
    """A span on the calling thread's stream when one is recording, else nothing: what
    a collective deep inside autograd (tensor parallelism's f and g) wraps itself in."""
    stream = current()
    return stream.span(action, label) if stream is not None else nullcontext()


def on(stream: Stream | None, fn: Callable[[], T]) -> Callable[[], T]:
    """`fn`, to run on a device thread with `stream` bound (what runners hand the pool)."""

    def run() -> T:
        with bound(stream):
            return fn()

    return run
