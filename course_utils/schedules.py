"""Pipeline schedules as pure functions: who runs which forward and backward, in what order.

Every function returns a `Schedule`: one ordered action list per device. Stage s lives on
device s % p (looping placement), so with v chunks per device device d holds stages
d, d + p, d + 2p, ... The simulator (`course_utils.simulate`) turns a schedule into a
timeline; the thread executor runs the same lists on a real model.

    naive          model parallelism without micro-batches (the whole batch, stage by stage)
    gpipe          all forwards, then all backwards (Huang et al. 2019, arXiv 1811.06965)
    1f1b           PipeDream-Flush: warm-up, one forward one backward, cool-down
                   (Narayanan et al. 2021, arXiv 2006.09503)
    interleaved    Megatron-LM's interleaved 1F1B with v chunks per device
                   (Narayanan et al. 2021, arXiv 2104.04473)
    breadth-first  all micro-batches through one local stage before the next
                   (Lamy-Poirier 2022, arXiv 2211.05953)
    zb-h1          zero bubble ZB-H1: backward split into I and W, W delayed to fill bubbles
                   (Qi et al. 2023, arXiv 2401.10241)

Also here: simulated data-parallel and DP x PP step timelines (gradient all-reduce lanes),
and the `python -m course_utils schedule` command. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
from collections.abc import Sequence
from contextlib import contextmanager

from course_utils.actions import Action, Schedule
from course_utils.errors import CourseInputError
from course_utils.simulate import CostModel, ring_allreduce_time, simulate, simulate_arrays
from course_utils.timeline import Event, Timeline

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "breadth-first", "zb-h1")
USES_CHUNKS = ("interleaved", "breadth-first")


def _act(stage: int, kind: str, microbatch: int) -> Action:
    # Our schedules build 100k+ actions from values already known to be valid, so skip
    # Action's input checks (half the cost); the result equals Action(stage, kind, mb).
    action = object.__new__(Action)
    action.__dict__.update(stage=stage, kind=kind, microbatch=microbatch)
    return action


def _check(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CourseInputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _schedule(name: str, p: int, m: int, devices: list[list[Action]], v: int = 1, scale: int = 1):
    return Schedule(name, p * v, m, tuple(tuple(a) for a in devices), batch_scale=scale)


def naive(p: int, m: int) -> Schedule:
    """The whole batch through stage 0, 1, ..., then back: one device works at a time.

    The batch is not split, so each action processes all `m` micro-batches' worth of data
    (`batch_scale=m`) and uses micro-batch index 0.
    """
    _check("devices", p), _check("microbatches", m)
    devices = [[_act(d, "F", 0), _act(d, "B", 0)] for d in range(p)]
    return _schedule("naive", p, m, devices, scale=m)


def gpipe(p: int, m: int) -> Schedule:
    """Fill and drain: every device forwards all micro-batches, then backwards them all."""
    _check("devices", p), _check("microbatches", m)
    devices = [
        [_act(d, "F", i) for i in range(m)] + [_act(d, "B", i) for i in range(m)] for d in range(p)
    ]
    return _schedule("gpipe", p, m, devices)


def _one_f_one_b_order(p: int, d: int, m: int, backward: str = "B") -> list[Action]:
    # Device d can start backwards after p-1-d warm-up forwards: by then micro-batch 0 has
    # reached the last stage. From there each forward is followed by the oldest backward,
    # so device d never holds more than p-d micro-batches (GPipe holds all m).
    warmup = min(p - 1 - d, m)
    order = [_act(d, "F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [_act(d, "F", warmup + i), _act(d, backward, i)]
    order += [_act(d, backward, i) for i in range(m - warmup, m)]
    return order


def one_f_one_b(p: int, m: int) -> Schedule:
    """PipeDream-Flush (1F1B): warm-up forwards, then alternate one forward, one backward."""
    _check("devices", p), _check("microbatches", m)
    return _schedule("1f1b", p, m, [_one_f_one_b_order(p, d, m) for d in range(p)])


def interleaved(p: int, m: int, v: int) -> Schedule:
    """Megatron-LM interleaved 1F1B: v chunks per device, micro-batches in groups of p.

    Each device walks its chunks in rounds of p micro-batches (chunk 0 for micro-batches
    0..p-1, chunk 1 for the same, ..., then the next group), doing 1F1B over these
    "virtual" steps. The bubble shrinks v times: (p-1)/(v m) of the ideal time.
    """
    _check("devices", p), _check("microbatches", m), _check("chunks", v)
    if m % p:
        raise CourseInputError(
            f"interleaved needs microbatches to be a multiple of devices ({p}), got {m}"
        )
    units = v * m  # (chunk, micro-batch) pairs per device, in each direction

    def unit(k: int, d: int, kind: str) -> Action:
        group, within = divmod(k, p * v)
        chunk = within // p
        if kind == "B":
            chunk = v - 1 - chunk  # backward visits chunks last to first
        return _act(chunk * p + d, kind, group * p + within % p)

    devices = []
    for d in range(p):
        # Warm-up: enough forwards that the first backward of the last chunk has arrived
        # (Megatron's count: 2 per hop from the last device, plus (v-1) rounds of p).
        # With one chunk this is plain 1F1B, whose warm-up is 1 per hop.
        per_hop = 2 if v > 1 else 1
        warmup = min(per_hop * (p - 1 - d) + (v - 1) * p, units)
        order = [unit(k, d, "F") for k in range(warmup)]
        for k in range(units - warmup):
            order += [unit(warmup + k, d, "F"), unit(k, d, "B")]
        order += [unit(k, d, "B") for k in range(units - warmup, units)]
        devices.append(order)
    return _schedule("interleaved", p, m, devices, v)


def breadth_first(p: int, m: int, v: int) -> Schedule:
    """Breadth-first (looped BFS): all micro-batches through a local stage, then the next one.

    Forward visits the device's stages in ascending order, backward in descending order;
    like PyTorch's ScheduleLoopedBFS the backward takes micro-batches last-in first-out.
    Finishing a stage's backward for all micro-batches early lets its gradient reduction
    start while later backwards still run (see `dp_pp_timeline`).
    """
    _check("devices", p), _check("microbatches", m), _check("chunks", v)
    devices = []
    for d in range(p):
        local = [c * p + d for c in range(v)]
        order = [_act(s, "F", i) for s in local for i in range(m)]
        order += [_act(s, "B", i) for s in reversed(local) for i in reversed(range(m))]
        devices.append(order)
    return _schedule("breadth-first", p, m, devices, v)


def zb_h1(p: int, m: int) -> Schedule:
    """Zero bubble ZB-H1: 1F1B with the backward split into I and W, each W delayed.

    I (input gradient) is all the previous stage waits for, so it goes first; device d
    postpones each W by d micro-batches, and the cool-down, where 1F1B idles waiting for
    gradients, is filled with the postponed W's. Every device then holds at most p
    micro-batches (a micro-batch counts until its W is done), which is 1F1B's peak (on
    device 0), and the idle time per device drops from (p-1)(F+B) to (p-1)(F+I-W)
    (Qi et al. 2023, arXiv 2401.10241) while W <= I; with W longer than I the W's cannot
    fill more than the gaps they are given and the idle time stays at (p-1)F.
    """
    _check("devices", p), _check("microbatches", m)
    devices = []
    for d in range(p):
        order = _one_f_one_b_order(p, d, m, backward="I")
        # After I of micro-batch i comes W of micro-batch i - d; the last d W's close the step.
        with_w = []
        for a in order:
            with_w.append(a)
            if a.kind == "I" and a.microbatch >= d:
                with_w.append(_act(d, "W", a.microbatch - d))
        with_w += [_act(d, "W", i) for i in range(max(0, m - d), m)]
        devices.append(with_w)
    return _schedule("zb-h1", p, m, devices)


def make_schedule(name: str, devices: int, microbatches: int, chunks: int = 1) -> Schedule:
    """Build schedule `name` (one of SCHEDULES) for `devices` devices and `microbatches`."""
    _check("devices", devices), _check("microbatches", microbatches), _check("chunks", chunks)
    if name not in SCHEDULES:
        raise CourseInputError(f"schedule must be one of {', '.join(SCHEDULES)}; got {name!r}")
    if chunks > 1 and name not in USES_CHUNKS:
        raise CourseInputError(
            f"chunks > 1 works only with {' or '.join(USES_CHUNKS)}, not {name} (got {chunks})"
        )
    if name == "interleaved":
        return interleaved(devices, microbatches, chunks)
    if name == "breadth-first":
        return breadth_first(devices, microbatches, chunks)
    build = {"naive": naive, "gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1}[name]
    return build(devices, microbatches)


# --------------------------------------------------------------------------- data parallel


def data_parallel_timeline(
    workers: int,
    compute_forward: float,
    compute_backward: float,
    grad_bytes: float,
    bandwidth: float,
    buckets: int = 1,
    overlap: bool = False,
    latency: float = 0.0,
) -> Timeline:
    """One data-parallel step: forward, backward, gradient all-reduce on every replica.

    Gradients are reduced in `buckets` equal buckets with a ring all-reduce. The backward
    produces the buckets one by one (last layers first); with `overlap` each bucket's
    all-reduce starts as soon as its gradients exist, on a communication lane beside the
    compute (as PyTorch DDP does), otherwise all reductions wait for the whole backward.
    """
    _check("workers", workers), _check("buckets", buckets)
    if min(compute_forward, compute_backward, grad_bytes) < 0:
        raise CourseInputError("compute times and grad_bytes must be >= 0")
    per_bucket = ring_allreduce_time(grad_bytes / buckets, workers, bandwidth, latency)
    piece = compute_backward / buckets
    events: list[Event] = []
    comm_free = 0.0
    for k in range(buckets):
        ready = compute_forward + piece * (k + 1) if overlap else compute_forward + compute_backward
        start = max(ready, comm_free)
        comm_free = start + per_bucket
        for w in range(workers):
            events.append(
                Event(w, Action(0, "REDUCE_GRAD"), start, comm_free, f"all-reduce bucket {k + 1}")
            )
    for w in range(workers):
        events.append(Event(w, Action(0, "F", 0), 0.0, compute_forward))
        for k in range(buckets):
            start = compute_forward + piece * k
            label = f"backward bucket {k + 1}" if buckets > 1 else None
            events.append(Event(w, Action(0, "B", 0), start, start + piece, label))
    compute = compute_forward + compute_backward
    return Timeline(
        events=events,
        num_devices=workers,
        name=f"data parallel x{workers}, {buckets} bucket(s), overlap {'on' if overlap else 'off'}",
        source="simulated",
        unit="s",
        meta={
            "compute": compute,
            "allreduce_per_bucket": per_bucket,
            "allreduce_total": per_bucket * buckets,
            "exposed_communication": comm_free - compute,
        },
    )


def dp_pp_timeline(
    schedule_name: str,
    devices: int,
    microbatches: int,
    chunks: int,
    dp_workers: int,
    costs: CostModel | None = None,
    grad_bytes_per_stage: float | Sequence[float] = 1.0,
    bandwidth: float = 1.0,
    latency: float = 0.0,
) -> Timeline:
    """One pipeline replica of a DP x PP step, with each stage's gradient all-reduce.

    Every one of the `dp_workers` replicas runs the same pipeline schedule; a stage's
    gradients are all-reduced across replicas once that stage's last backward (B or W) is
    done, on the device's communication lane (one reduction at a time per device). The
    step ends when the last reduction ends. Breadth-first finishes each stage's backward
    early, so its reductions hide behind the remaining backward; depth-first interleaved
    finishes all stages near the end, so its reductions are exposed. Give `costs` in the
    time unit of `bytes / bandwidth` (e.g. seconds with bytes/s).
    """
    costs = costs or CostModel()
    sched = make_schedule(schedule_name, devices, microbatches, chunks)
    timeline = simulate(sched, costs)
    _check("dp_workers", dp_workers)
    stages = sched.stages
    if isinstance(grad_bytes_per_stage, int | float):
        grad_bytes = [float(grad_bytes_per_stage)] * stages
    else:
        grad_bytes = [float(x) for x in grad_bytes_per_stage]
        if len(grad_bytes) != stages:
            raise CourseInputError(
                f"grad_bytes_per_stage needs one value per stage ({stages}), got {len(grad_bytes)}"
            )
    done: dict[int, float] = {}
    for e in timeline.events:
        if e.action.is_backward:
            done[e.action.stage] = max(done.get(e.action.stage, 0.0), e.end)
    owner = sched.device_of_stage()
    lane_free = [0.0] * sched.num_devices
    comm = []
    for s in sorted(done, key=lambda s: (done[s], s)):
        d = owner[s]
        start = max(done[s], lane_free[d])
        lane_free[d] = start + ring_allreduce_time(grad_bytes[s], dp_workers, bandwidth, latency)
        comm.append(
            Event(d, Action(s, "REDUCE_GRAD"), start, lane_free[d], f"all-reduce stage {s}")
        )
    compute_end = timeline.makespan
    step_end = max([compute_end, *lane_free])
    return Timeline(
        events=timeline.events + comm,
        num_devices=sched.num_devices,
        name=f"{schedule_name} x DP{dp_workers}",
        source="simulated",
        unit=timeline.unit,
        peak_activations=timeline.peak_activations,
        meta={
            "compute_end": compute_end,
            "step_end": step_end,
            "exposed_reduction": step_end - compute_end,
            "reduction_start": {e.action.stage: e.start for e in comm},
        },
    )


# --------------------------------------------------------------------------- the CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help=f"schedule: {', '.join(SCHEDULES)}")
    parser.add_argument("--stages", type=int, required=True, help="pipeline devices P")
    parser.add_argument("--microbatches", type=int, required=True, help="micro-batches M")
    parser.add_argument(
        "--chunks", type=int, default=1, help="stages per device V (interleaved, breadth-first)"
    )
    parser.add_argument("--forward-cost", type=float, default=1.0, help="F per micro-batch")
    parser.add_argument("--backward-cost", type=float, default=2.0, help="B per micro-batch")
    parser.add_argument(
        "--weight-cost", type=float, default=None, help="W share of B for zb-h1 (default B/2)"
    )
    parser.add_argument("--p2p-cost", type=float, default=0.0, help="transfer between devices")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _costs_from_args(args) -> CostModel:
    for flag in ("forward_cost", "backward_cost", "weight_cost", "p2p_cost"):
        value = getattr(args, flag)
        if value is not None and not 0 <= value < math.inf:  # also rejects NaN
            raise CourseInputError(
                f"--{flag.replace('_', '-')} must be a finite number >= 0, got {value}"
            )
    backward = args.backward_cost
    weight = backward / 2 if args.weight_cost is None else args.weight_cost
    if weight > backward:
        raise CourseInputError(
            f"--weight-cost must be at most --backward-cost ({backward}), got {weight}"
        )
    fraction = weight / backward if backward > 0 else 0.5
    return CostModel(args.forward_cost, backward, fraction, args.p2p_cost)


def run(args) -> int:
    for flag in ("stages", "microbatches", "chunks"):
        value = getattr(args, flag)
        if value < 1:
            raise CourseInputError(f"--{flag} must be an integer >= 1, got {value}")
    costs = _costs_from_args(args)
    with _no_cyclic_gc():
        sched = make_schedule(args.name, args.stages, args.microbatches, args.chunks)
        result = simulate_arrays(sched, costs)
        _print(sched, result, as_json=args.json)
    return 0


@contextmanager
def _no_cyclic_gc():
    # Big schedules allocate 100k+ small objects and no cycles: the cyclic collector would
    # only rescan them again and again (a third of the run time for 131k actions).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _print(sched: Schedule, result: dict, as_json: bool) -> None:
    out = sys.stdout
    if as_json:
        names = [[f"{a.stage}{a.kind}{a.microbatch}" for a in acts] for acts in result["actions"]]
        # 100k+ events: formatting each as text is 3x faster than json.dumps on dicts.
        events = []  # device by device, each in its run order
        for d, (acts, st, en) in enumerate(
            zip(names, result["starts"], result["ends"], strict=True)
        ):
            events += [
                f'{{"device":{d},"action":"{a}","start":{s!r},"end":{e!r}}}'
                for a, s, e in zip(acts, st, en, strict=True)
            ]
        head = {"schedule": sched.name, "devices": names}
        tail = {k: result[k] for k in ("makespan", "bubble_fraction", "peak_activations")}
        text = json.dumps(head, separators=(",", ":"))[:-1]
        text += ',"events":[' + ",".join(events) + "],"
        text += json.dumps(tail, separators=(",", ":"))[1:]
        out.write(text + "\n")
        return
    p, v = sched.num_devices, sched.chunks
    out.write(
        f"{sched.name}: {p} devices x {v} chunk(s) = {sched.stages} stages, "
        f"{sched.microbatches} micro-batches"
        + (
            f" (unsplit: each action costs {sched.batch_scale} micro-batches)\n"
            if sched.batch_scale > 1
            else "\n"
        )
    )
    width = max(len(str(a)) for acts in result["actions"] for a in acts)
    for d, acts in enumerate(result["actions"]):
        out.write(f"device {d}: " + " ".join(f"{str(a):>{width}}" for a in acts) + "\n")
    makespan = result["makespan"]
    out.write(f"makespan: {makespan:g} units\n")
    out.write(f"bubble: {100 * result['bubble_fraction']:.1f}% of devices x makespan idle\n")
    out.write("device  busy      idle      peak activations\n")
    for d in range(p):
        busy = result["busy"][d]
        peak = result["peak_activations"][d]
        out.write(f"{d:>6}  {busy:<8g}  {makespan - busy:<8g}  {peak}\n")
