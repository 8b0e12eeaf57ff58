"""The virtual clock: a recorded run replayed with one clock per device and emulated links.

This is how HPC studies a program for a thousand GPUs on a laptop (SimGrid's SMPI, online
simulation: Degomme et al. 2017, "Simulating MPI applications: the SMPI approach"): the real
program runs, its compute bursts are timed, the network is modelled. Here the real program
is the course's threads doing real torch work; `course_utils.threads.trace` recorded, per
thread and in program order, each compute burst's CPU time and each message. The replay:

- every stream (a device's compute, or its communication engine) has its own clock;
- a compute burst advances it by the burst's measured CPU time;
- a message leaves when the sender's clock says so and occupies the sender's send port
  and the receiver's receive port for `latency + bytes / bandwidth` (`Links`); a port
  serves one message at a time, so two messages through one port go one after the other;
- a receive waits until the message has arrived: the receiver's clock jumps to the arrival;
- a device's streams share its ports but not their clocks, so a communication engine
  moves bytes while the compute stream computes (FSDP's prefetch, ring attention).

Ports serve messages in the order of their virtual send times, never in the order the
threads happened to reach them in real time: the replay always advances the stream whose
clock is earliest, as SMPI runs its actors in virtual-time order. The program's behaviour
does not depend on timing (every receive names its message), so replaying the recorded
order is the same as running it on the virtual clock.

What could still make a virtual figure wrong, and what is done about it:
- first calls (allocating memory, choosing kernels) are slow: runners and lessons time
  steps after a warm-up step;
- Python's garbage collector could run inside some action and lengthen it: it is paused
  while a step is recorded (`Recorder` as a context manager);
- freeing and page faults are real CPU work inside an action (a new large tensor is
  faulted in page by page): a device pool makes the C allocator keep freed memory for the
  next step, as a GPU's caching allocator does (`devices.keep_freed_memory`), so a steady
  step faults nothing; a closed pool's threads give their memory back to the process;
- two threads computing at once on neighbouring cores slow each other (shared caches,
  memory bandwidth, hyper-threading units): each measured 20-35% more CPU time for the
  same work on the course's 2-vCPU machine, so a run on the virtual clock pins its device
  threads to one core, where they take turns (`DeviceThreads(one_core=True)`), the same
  core for every pool of the process, so that set-ups compared are timed on one core;
- caches and the CPU's clock frequency vary from run to run, and another program on the
  same core evicts caches: a variant's runs differ by a few percent, so variants are timed
  in turns, a few runs each, and their runs are put together burst by burst, each compute
  burst at the least CPU time it took in any run (`fastest`; `measure.timing.compare`),
  with the spread printed;
- the links are scaled to the core's compute rate (`links.machine_flops`), which drifts as
  the core's speed does: a comparison that weighs communication against compute probes it
  between its steps and replays over links scaled to the best rate seen then
  (`compare(rate_probe=True)`).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from course_utils.actions import Action
from course_utils.errors import WorkerError
from course_utils.threads.links import Links
from course_utils.threads.trace import BEGIN, CPU, END, RECV, SEND, Recorder, Stream, check_clock
from course_utils.timeline import Event, Timeline


@dataclass(frozen=True)
class Transfer:
    """One message on the emulated links: `src` -> `dst`, when it held their ports."""

    src: int
    dst: int
    nbytes: int
    start: float
    end: float


@dataclass
class Replay:
    """Virtual (start, end) of every recorded event, per stream; the transfers; the end."""

    times: list[list[tuple[float, float]]]
    transfers: list[Transfer]
    end: float


def replay(streams: list[Stream], links: Links) -> Replay:
    """Run the recorded streams on virtual clocks over `links` (see the module docstring)."""
    n = len(streams)
    clock = [0.0] * n
    pos = [0] * n
    times: list[list[list[float]]] = [[[0.0, 0.0] for _ in s.events] for s in streams]
    arrival: dict = {}  # message key -> virtual arrival time
    waiting: dict = {}  # message key -> the stream blocked on it
    send_free: dict[int, float] = defaultdict(float)  # device -> when its send port is free
    recv_free: dict[int, float] = defaultdict(float)
    transfers: list[tuple[int, int, int, float, float]] = []
    per_node, latency = links.gpus_per_node, links.latency
    intra, inter = links.intra_bandwidth, links.inter_bandwidth
    heap = [(0.0, i) for i in range(n) if streams[i].ops]
    heapq.heapify(heap)
    push, pop = heapq.heappush, heapq.heappop
    while heap:
        _, i = pop(heap)
        ops, device, t = streams[i].ops, streams[i].device, clock[i]
        k, end_of_ops = pos[i], len(streams[i].ops)
        while k < end_of_ops:
            op = ops[k]
            kind = op[0]
            if kind == CPU:
                t += op[1] * 1e-9
            elif kind == BEGIN:
                times[i][op[1]][0] = t
            elif kind == END:
                times[i][op[1]][1] = t
            elif kind == SEND:
                _, key, dst, nbytes, event = op
                if dst == device:  # stays on the device: no link involved
                    start = end = t
                else:
                    start = max(t, send_free[device], recv_free[dst])
                    bandwidth = intra if device // per_node == dst // per_node else inter
                    end = start + latency + nbytes / bandwidth
                    send_free[device] = recv_free[dst] = end
                    transfers.append((device, dst, nbytes, start, end))
                if event >= 0:
                    times[i][event] = [start, end]
                arrival[key] = end
                blocked = waiting.pop(key, None)
                if blocked is not None:
                    clock[blocked] = max(clock[blocked], end)
                    push(heap, (clock[blocked], blocked))
            else:  # RECV
                key = op[1]
                if key not in arrival:
                    waiting[key] = i  # woken by the SEND of `key`
                    break
                arrived = arrival.pop(key)
                if arrived > t:
                    t = arrived
            k += 1
            # Let an earlier stream go first: ports must see sends in virtual-time order.
            if (kind == CPU or kind == RECV) and heap and t > heap[0][0]:
                push(heap, (t, i))
                break
        pos[i], clock[i] = k, t
    stuck = [
        f"device {s.device} ({s.name}) waits for message {s.ops[pos[i]][1]!r}"
        for i, s in enumerate(streams)
        if pos[i] < len(s.ops)
    ]
    if stuck:
        raise WorkerError("virtual clock: a receive has no matching send: " + "; ".join(stuck))
    return Replay(
        times=[[(a, b) for a, b in per_stream] for per_stream in times],
        transfers=[Transfer(*x) for x in transfers],
        end=max([*clock, *(x[4] for x in transfers)], default=0.0),
    )


def replay_messages(log: list, links: Links) -> float:
    """When the messages of `log` (`Recorder.messages()`) are all delivered over `links`, if
    nothing but the messages took time: a collective's time on the links alone."""
    streams = []
    for index, (device, name, ops) in enumerate(log):
        stream = Stream(device, name, index)
        for op in ops:
            key = _hashable(op[1])
            stream.ops.append((SEND, key, op[2], op[3], -1) if op[0] == "send" else (RECV, key))
        streams.append(stream)
    return replay(streams, links).end


def _hashable(key):
    return tuple(_hashable(k) for k in key) if isinstance(key, list | tuple) else key


def timeline(recorder: Recorder, clock: str, links: Links | None = None, **fields) -> Timeline:
    """The recorded run as a `Timeline` in seconds, on the virtual or the wall clock.

    Events come from every stream's recorded events, drawn on their stream's device.
    `fields` are passed on to `Timeline` (name, stages, meta, ...); `meta` gains "clock" and,
    on the virtual clock, "links" (the line that says what was modelled).
    """
    check_clock(clock)
    meta = dict(fields.pop("meta", None) or {})
    meta["clock"] = clock
    streams = recorder.streams
    events: list[Event] = []
    if clock == "wall":
        t0 = recorder.t0
        for s in streams:  # a transfer has no wall-clock length of its own: not drawn
            for action, label, start, end, transfer in s.events:
                if not transfer:
                    events.append(
                        Event(s.device, action, (start - t0) / 1e9, (end - t0) / 1e9, label)
                    )
    else:
        links = links if links is not None else default_links()
        result = replay(streams, links)
        for s, times in zip(streams, result.times, strict=True):
            for (action, label, *_), (start, end) in zip(s.events, times, strict=True):
                events.append(Event(s.device, action, start, end, label))
        meta["links"] = links.describe()
        meta["transfers"] = len(result.transfers)
    events.sort(key=lambda e: (e.start, e.device))
    num_devices = fields.pop("num_devices", None)
    if num_devices is None:
        num_devices = 1 + max((s.device for s in streams), default=0)
    return Timeline(events, num_devices, source="measured", unit="s", meta=meta, **fields)


def fastest(recorders: Sequence[Recorder]) -> Recorder | None:
    """One run put together from several runs of the same program: every compute burst at
    the least CPU time it took in any of them (None when they did not record the same ops).

    A burst that another program (or a neighbouring device thread on the same core)
    interrupted took longer: its caches were refilled, its core was slower for a moment. Such
    noise only ever adds time, so the least of a few runs is each burst's own cost. Bursts
    are never pooled: each keeps its place on its own device, so a device that really is
    slower (a straggler, a longer shard) stays slower.
    """
    first = recorders[0] if recorders else None
    if first is None:
        return None
    shape = [(s.device, s.name, [op[0] for op in s.ops]) for s in first.streams]
    for other in recorders[1:]:
        if [(s.device, s.name, [op[0] for op in s.ops]) for s in other.streams] != shape:
            return None
    merged = Recorder()
    merged.t0, merged.fields, merged.links = first.t0, dict(first.fields), first.links
    for i, stream in enumerate(first.streams):
        copy = merged.stream(stream.device, stream.name)
        copy.events = stream.events
        copy.ops = [
            (CPU, min(r.streams[i].ops[k][1] for r in recorders)) if op[0] == CPU else op
            for k, op in enumerate(stream.ops)
        ]
    return merged


def default_links() -> Links:
    """The course's cluster: the planner's default GPU preset, scaled to this machine."""
    from course_utils.threads.links import cluster_links

    return cluster_links()


def compute_seconds(recorder: Recorder, kinds: tuple[str, ...] | None = None) -> list[float]:
    """Per device, the CPU seconds its compute events took (optionally only some kinds)."""
    devices = 1 + max((s.device for s in recorder.streams), default=0)
    busy = [0.0] * devices
    for s in recorder.streams:
        index_action = {i: ev[0] for i, ev in enumerate(s.events)}
        current: Action | None = None
        for op in s.ops:
            if op[0] == BEGIN:
                current = index_action[op[1]]
            elif op[0] == END:
                current = None
            elif op[0] == CPU and current is not None:
                if kinds is None or current.kind in kinds:
                    busy[s.device] += op[1] / 1e9
    return busy
