"""Pipeline schedules as pure functions, and the registry that says everything about each one.

Every builder returns a `Schedule`: one ordered action list per device. Stage s lives on
device s % p (looping placement), so with v chunks per device device d holds stages
d, d + p, d + 2p, ... The simulator (`course_utils.pipeline.simulate`) turns a schedule into a
timeline; the thread executor runs the same lists on a real model.

    naive          model parallelism without micro-batches (the whole batch, stage by stage)
    gpipe          all forwards, then all backwards (Huang et al. 2018, arXiv 1811.06965)
    1f1b           PipeDream-Flush: warm-up, one forward one backward, cool-down
                   (Narayanan et al. 2020, arXiv 2006.09503)
    interleaved    Megatron-LM's interleaved 1F1B with v chunks per device
                   (Narayanan et al. 2021, arXiv 2104.04473)
    breadth-first  all micro-batches through one local stage before the next
                   (Lamy-Poirier 2022, arXiv 2211.05953)
    zb-h1          zero bubble ZB-H1: backward split into I and W, W delayed to fill bubbles
                   (Qi et al. 2024, ICLR, arXiv 2401.10241)
    zb-v           zero bubble ZB-V: two chunks per device placed in a V (same paper)
    dualpipe-v     DualPipeV: a V with one micro-batch's forward beside another's backward
                   (DualPipe, DeepSeek-AI 2024, arXiv 2412.19437, cut in half onto a V:
                   Sea AI Lab 2025); both V builders are in vshape.py

`SCHEDULES` is the registry: per schedule its builder, the label learners read, whether it
takes chunks, its closed-form bubble and peak activation memory (each with the condition under
which the simulator agrees with it), and PyTorch's class for the same schedule. Every other
module (charts, explorer, planner, executor, the torch.distributed bridge, the commands) reads
it, so adding a schedule is one builder and one entry. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from course_utils import validation
from course_utils.actions import Action, Schedule
from course_utils.errors import CourseInputError
from course_utils.pipeline import vshape
from course_utils.validation import MAX_ACTIONS


def _act(stage: int, kind: str, microbatch: int) -> Action:
    # Our schedules build 100k+ actions from values already known to be valid, so skip
    # Action's input checks (half the cost); the result equals Action(stage, kind, mb).
    action = object.__new__(Action)
    action.__dict__.update(stage=stage, kind=kind, microbatch=microbatch)
    return action


def _sized(name: str, p: int, m: int, v: int = 1, max_actions: int = MAX_ACTIONS) -> None:
    """The builders' guard: the shape's numbers, then its size against `max_actions` (a
    schedule of millions of actions is refused in a millisecond, not built into a MemoryError)."""
    validation.integer(p, "devices")
    validation.integer(m, "microbatches")
    validation.integer(v, "chunks")
    validation.check_actions(count_actions(name, p, m, v), max_actions, what=f"{name} of {p} x {m}")


def _schedule(name: str, p: int, m: int, devices: list[list[Action]], v: int = 1, scale: int = 1):
    return Schedule(name, p * v, m, tuple(tuple(a) for a in devices), batch_scale=scale)


def naive(p: int, m: int, *, max_actions: int = MAX_ACTIONS) -> Schedule:
    """The whole batch through stage 0, 1, ..., then back: one device works at a time.

    The batch is not split, so each action processes all `m` micro-batches' worth of data
    (`batch_scale=m`) and uses micro-batch index 0.
    """
    _sized("naive", p, m, max_actions=max_actions)
    devices = [[_act(d, "F", 0), _act(d, "B", 0)] for d in range(p)]
    return _schedule("naive", p, m, devices, scale=m)


def gpipe(p: int, m: int, *, max_actions: int = MAX_ACTIONS) -> Schedule:
    """Fill and drain: every device forwards all micro-batches, then backwards them all."""
    _sized("gpipe", p, m, max_actions=max_actions)
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


def one_f_one_b(p: int, m: int, *, max_actions: int = MAX_ACTIONS) -> Schedule:
    """PipeDream-Flush (1F1B): warm-up forwards, then alternate one forward, one backward."""
    _sized("1f1b", p, m, max_actions=max_actions)
    return _schedule("1f1b", p, m, [_one_f_one_b_order(p, d, m) for d in range(p)])


def _interleaved_rule(p: int, m: int, v: int) -> str | None:
    # Megatron-LM's rule: micro-batches go through in rounds of p.
    return (
        f"interleaved needs microbatches to be a multiple of devices ({p}), got {m}"
        if m % p
        else None
    )


def interleaved(p: int, m: int, v: int, *, max_actions: int = MAX_ACTIONS) -> Schedule:
    """Megatron-LM interleaved 1F1B: v chunks per device, micro-batches in groups of p.

    Each device walks its chunks in rounds of p micro-batches (chunk 0 for micro-batches
    0..p-1, chunk 1 for the same, ..., then the next group), doing 1F1B over these
    "virtual" steps. The bubble shrinks v times: (p-1)/(v m) of the ideal time.
    """
    validation.integer(p, "devices")
    validation.integer(m, "microbatches")
    validation.integer(v, "chunks")
    if problem := _interleaved_rule(p, m, v):
        raise CourseInputError(problem)
    _sized("interleaved", p, m, v, max_actions)
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


def breadth_first(p: int, m: int, v: int, *, max_actions: int = MAX_ACTIONS) -> Schedule:
    """Breadth-first (looped BFS): all micro-batches through a local stage, then the next one.

    Forward visits the device's stages in ascending order, backward in descending order;
    like PyTorch's ScheduleLoopedBFS the backward takes micro-batches last-in first-out.
    Finishing a stage's backward for all micro-batches early lets its gradient reduction
    start while later backwards still run (see `course_utils.parallel.timelines.dp_pp_timeline`).
    """
    _sized("breadth-first", p, m, v, max_actions)
    devices = []
    for d in range(p):
        local = [c * p + d for c in range(v)]
        order = [_act(s, "F", i) for s in local for i in range(m)]
        order += [_act(s, "B", i) for s in reversed(local) for i in reversed(range(m))]
        devices.append(order)
    return _schedule("breadth-first", p, m, devices, v)


def zb_h1(p: int, m: int, *, max_actions: int = MAX_ACTIONS) -> Schedule:
    """Zero bubble ZB-H1: 1F1B with the backward split into I and W, each W delayed.

    I (input gradient) is all the previous stage waits for, so it goes first; device d
    postpones each W by d micro-batches, and the cool-down, where 1F1B idles waiting for
    gradients, is filled with the postponed W's. Every device then holds at most p
    micro-batches (a micro-batch counts until its W is done), which is 1F1B's peak (on
    device 0), and the idle time per device drops from (p-1)(F+B) to (p-1)(F+I-W)
    (Qi et al. 2024, arXiv 2401.10241) when W <= min(F, I) and m >= p. A W longer than F
    or I fills more than the gap it is given: the idle time is then (p-1)(F+I-min(F,I,W)),
    i.e. (p-1)I when F is the shorter and (p-1)F when I is (the registry's closed form,
    checked against the simulator in tests/test_registry.py).
    """
    _sized("zb-h1", p, m, max_actions=max_actions)
    devices = []
    for d in range(p):
        order = _one_f_one_b_order(p, d, m, backward="I")
        # After I of micro-batch i comes W of micro-batch i - d; the last d W's close the step.
        with_w = []
        for a in order:
            with_w.append(a)
            if a.kind == "I" and a.microbatch is not None and a.microbatch >= d:
                with_w.append(_act(d, "W", a.microbatch - d))
        with_w += [_act(d, "W", i) for i in range(max(0, m - d), m)]
        devices.append(with_w)
    return _schedule("zb-h1", p, m, devices)


# --------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Case:
    """The numbers a closed form reads: p devices, m micro-batches, v chunks per device, and
    per-micro-batch costs of one device's whole share: forward F, backward B = I + W (W is the
    weight-gradient part, used by zero-bubble schedules), transfer time between devices."""

    p: int
    m: int
    v: int = 1
    forward: float = 1.0
    backward: float = 2.0
    weight_fraction: float = 0.5
    p2p: float = 0.0

    @property
    def weight(self) -> float:
        return self.backward * self.weight_fraction

    @property
    def input_grad(self) -> float:
        return self.backward - self.weight


@dataclass(frozen=True)
class ClosedForm:
    """A formula the lessons derive, and exactly when the simulator agrees with it."""

    formula: str  # as a learner reads it
    holds_when: str  # the condition, in words
    value: Callable[[Case], float]
    holds: Callable[[Case], bool]

    def __call__(self, case: Case) -> float | None:
        """The formula's value, or None where it does not hold (then simulate instead)."""
        return self.value(case) if self.holds(case) else None


@dataclass(frozen=True)
class ScheduleInfo:
    """Everything the course knows about one schedule."""

    name: str  # what commands and code use: "1f1b"
    label: str  # what a learner reads: "1F1B"
    build: Callable[..., Schedule]  # (devices, microbatches, chunks, max_actions=...)
    uses_chunks: bool  # the learner chooses v (looping placement)
    bubble: ClosedForm  # idle share of devices x makespan
    peak: ClosedForm  # most micro-batches of activations one device holds (whole-stage units)
    microbatched: bool = True  # False: the batch goes through unsplit (naive)
    shape_rule: Callable[[int, int, int], str | None] = lambda p, m, v: None  # why not, or None
    chunks_per_device: int = 1  # for schedules that do not take v: 2 for the V schedules
    split_backward: bool = False  # backward runs as I (input gradient) and W (weight gradient)

    def chunks(self, v: int = 1) -> int:
        """Stages per device when the learner asks for `v` (V schedules always have 2)."""
        return v if self.uses_chunks else self.chunks_per_device

    pytorch: str | None = None  # the same schedule in torch.distributed.pipelining
    source: str = ""


def _free_and_equal(c: Case) -> bool:
    return c.p2p == 0


def _idle_fraction(c: Case, idle_per_device: float) -> float:
    """Idle time per device over the step: idle / (m (F + B) + idle)."""
    busy = c.m * (c.forward + c.backward)
    total = busy + idle_per_device
    return idle_per_device / total if total > 0 else 0.0


def _zb_h1_idle(c: Case) -> float:
    f, i, w = c.forward, c.input_grad, c.weight
    return (c.p - 1) * (f + i - min(f, i, w))


def _interleaved_peak(c: Case) -> float:
    # Korthikanti et al. 2022 (arXiv 2205.05198, Section 4.2.3): p (1 + (p - 1) / (p v)).
    return min(float(c.m), c.p + (c.p - 1) / c.v) if c.v > 1 else float(min(c.p, c.m))


_EQUAL = "equal stages, free transfers"
_FILL_DRAIN = ClosedForm(
    "(p-1)/(m+p-1)", _EQUAL, lambda c: (c.p - 1) / (c.m + c.p - 1), _free_and_equal
)
_ONE_F_ONE_B_PEAK = ClosedForm(
    "min(p, m)", "always", lambda c: float(min(c.p, c.m)), lambda c: True
)
_ALL_M = ClosedForm("m", "always", lambda c: float(c.m), lambda c: True)


def _looped_bubble(when: str, holds: Callable[[Case], bool]) -> ClosedForm:
    """Fill and drain cut into v chunks per device: interleaved 1F1B and breadth-first share
    the formula and differ in when the simulator agrees with it."""
    return ClosedForm("(p-1)/(v·m+p-1)", when, lambda c: (c.p - 1) / (c.v * c.m + c.p - 1), holds)


def _v_case(c: Case) -> tuple[float, float, float]:
    """Per-chunk F, I, W of a V schedule: each of the 2 chunks holds half a device's share."""
    return c.forward / 2, c.input_grad / 2, c.weight / 2


def _v_bubble(
    idle: Callable[..., float], holds: Callable[..., bool], text: str, when: str
) -> ClosedForm:
    return ClosedForm(
        text,
        f"{_EQUAL}, {when}",
        lambda c: _idle_fraction(c, idle(c.p, *_v_case(c))),
        lambda c: _free_and_equal(c) and holds(c.p, c.m, *_v_case(c)),
    )


def _dualpipe_v_rule(p: int, m: int, v: int) -> str | None:
    if m < 2 * p:
        return (
            f"microbatches must be >= 2 x devices = {2 * p} for dualpipe-v "
            f"(its warm-up puts 2p micro-batches in flight), got {m}"
        )
    return None


def _build_one_chunk(builder: Callable[..., Schedule]):
    def build(p: int, m: int, v: int = 1, max_actions: int = MAX_ACTIONS) -> Schedule:
        return builder(p, m, max_actions=max_actions)

    return build


SCHEDULES: dict[str, ScheduleInfo] = {
    info.name: info
    for info in (
        ScheduleInfo(
            "naive",
            "Naive (no micro-batches)",
            _build_one_chunk(naive),
            uses_chunks=False,
            bubble=ClosedForm("(p-1)/p", _EQUAL, lambda c: (c.p - 1) / c.p, _free_and_equal),
            peak=ClosedForm("m (the whole batch)", "always", lambda c: float(c.m), lambda c: True),
            microbatched=False,
            source="layer-wise model parallelism",
        ),
        ScheduleInfo(
            "gpipe",
            "GPipe",
            _build_one_chunk(gpipe),
            uses_chunks=False,
            bubble=_FILL_DRAIN,
            peak=_ALL_M,
            pytorch="ScheduleGPipe",
            source="Huang et al. 2018, arXiv 1811.06965",
        ),
        ScheduleInfo(
            "1f1b",
            "1F1B",
            _build_one_chunk(one_f_one_b),
            uses_chunks=False,
            bubble=_FILL_DRAIN,
            peak=_ONE_F_ONE_B_PEAK,
            pytorch="Schedule1F1B",
            source="Narayanan et al. 2020, arXiv 2006.09503",
        ),
        ScheduleInfo(
            "interleaved",
            "Interleaved 1F1B",
            interleaved,
            uses_chunks=True,
            bubble=_looped_bubble(_EQUAL + " (m a multiple of p)", _free_and_equal),
            peak=ClosedForm(
                "min(m, p + (p-1)/v) for v >= 2 (1F1B's min(p, m) at v = 1)",
                "always",
                _interleaved_peak,
                lambda c: True,
            ),
            shape_rule=_interleaved_rule,
            pytorch="ScheduleInterleaved1F1B",
            source="Narayanan et al. 2021, arXiv 2104.04473",
        ),
        ScheduleInfo(
            "breadth-first",
            "Breadth-first",
            breadth_first,
            uses_chunks=True,
            bubble=_looped_bubble(_EQUAL + ", m >= p", lambda c: _free_and_equal(c) and c.m >= c.p),
            peak=_ALL_M,
            pytorch="ScheduleLoopedBFS",
            source="Lamy-Poirier 2022, arXiv 2211.05953",
        ),
        ScheduleInfo(
            "zb-h1",
            "ZB-H1",
            _build_one_chunk(zb_h1),
            uses_chunks=False,
            split_backward=True,
            bubble=ClosedForm(
                "(p-1)(F+I-W) / (m(F+B) + (p-1)(F+I-W))",
                _EQUAL + ", m >= p; a W longer than F or I counts as min(F, I, W)",
                lambda c: _idle_fraction(c, _zb_h1_idle(c)),
                lambda c: _free_and_equal(c) and c.m >= c.p,
            ),
            peak=_ONE_F_ONE_B_PEAK,
            pytorch=None,  # PyTorch's zero-bubble schedules need 2+ stages per rank
            source="Qi et al. 2024, arXiv 2401.10241",
        ),
        ScheduleInfo(
            "zb-v",
            "ZB-V",
            _build_one_chunk(vshape.zb_v),
            uses_chunks=False,
            split_backward=True,
            chunks_per_device=2,
            bubble=_v_bubble(
                vshape.zb_v_idle,
                vshape.zb_v_formula_holds,
                "(p-1)I / (2m(F+B) + (p-1)I), with F, I, W and B = I+W per chunk",
                "m >= 2p-1, F <= I <= 2W and W <= I (for p >= 3)",
            ),
            peak=ClosedForm(
                "min(2p, 2m, m+p) chunks = min(p, m, (m+p)/2) micro-batches",
                "always",
                lambda c: min(2 * c.p, 2 * c.m, c.m + c.p) / 2,
                lambda c: True,
            ),
            pytorch="ScheduleZBVZeroBubble",
            source="Qi et al. 2024, arXiv 2401.10241",
        ),
        ScheduleInfo(
            "dualpipe-v",
            "DualPipeV",
            _build_one_chunk(vshape.dualpipe_v),
            uses_chunks=False,
            split_backward=True,
            chunks_per_device=2,
            shape_rule=_dualpipe_v_rule,
            bubble=_v_bubble(
                vshape.dualpipe_v_idle,
                vshape.dualpipe_v_formula_holds,
                "(p-1)(F+2I-W) / (2m(F+B) + (p-1)(F+2I-W)), with F, I, W and B = I+W per "
                "chunk: DeepSeek's (PP/2-1)(F&B+B-3W) idle, an F&B slot sending when it ends",
                "m >= 2p, F = I and W <= I",
            ),
            peak=ClosedForm(
                "2p+1 chunks = p + 1/2 micro-batches",
                "m >= 2p",
                lambda c: c.p + 0.5,
                lambda c: True,
            ),
            pytorch="ScheduleDualPipeV",
            source="Sea AI Lab 2025 (cut-in-half); DualPipe: DeepSeek-AI 2024, arXiv 2412.19437",
        ),
    )
}


# Where code must pick a schedule: GPipe is the one lessons start from; 1F1B has its bubble
# with less activation memory, so the planner and the commands default to it.
BASELINE = "gpipe"
RECOMMENDED = "1f1b"


def schedule_info(name: str) -> ScheduleInfo:
    """The registry entry for `name`, or a one-line error listing the schedules."""
    if not isinstance(name, str) or name not in SCHEDULES:
        raise CourseInputError(f"schedule must be one of {', '.join(SCHEDULES)}; got {name!r}")
    return SCHEDULES[name]


def label(name: str) -> str:
    """What a learner reads for schedule `name` ("1F1B"); any other name is returned as is."""
    info = SCHEDULES.get(name.lower())
    return info.label if info else name


def count_actions(name: str, devices: int, microbatches: int, chunks: int = 1) -> int:
    """How many compute actions schedule `name` has (F and B, or F, I and W, per stage and
    micro-batch; the unsplit naive schedule has two per stage), without building it."""
    info = schedule_info(name)
    return validation.schedule_actions(
        devices * info.chunks(chunks),
        microbatches,
        kinds=3 if info.split_backward else 2,
        unsplit=not info.microbatched,
    )


def check_shape(
    name: str, devices: int, microbatches: int, chunks: int = 1, max_actions: int = MAX_ACTIONS
) -> ScheduleInfo:
    """Raise the one-line error `make_schedule` would, without building anything."""
    info = schedule_info(name)
    validation.integer(devices, "devices")
    validation.integer(microbatches, "microbatches")
    validation.integer(chunks, "chunks")
    if chunks > 1 and not info.uses_chunks:
        with_chunks = " or ".join(n for n, i in SCHEDULES.items() if i.uses_chunks)
        raise CourseInputError(
            f"chunks > 1 works only with {with_chunks}, not {name} (got {chunks})"
        )
    if problem := info.shape_rule(devices, microbatches, chunks):
        raise CourseInputError(problem)
    validation.check_actions(
        count_actions(name, devices, microbatches, chunks),
        max_actions,
        what=f"{name} of {devices} x {microbatches}" + (f" x {chunks}" if chunks > 1 else ""),
    )
    return info


def make_schedule(
    name: str, devices: int, microbatches: int, chunks: int = 1, max_actions: int = MAX_ACTIONS
) -> Schedule:
    """Build schedule `name` (a key of SCHEDULES) for `devices` devices and `microbatches`.

    Refused in a millisecond: a shape the schedule cannot take, and more than `max_actions`
    compute actions (`validation.MAX_ACTIONS` by default, the `schedule` command's limit; a
    higher value holds while the schedule is predicted to fit in memory)."""
    info = check_shape(name, devices, microbatches, chunks, max_actions)
    return info.build(devices, microbatches, chunks, max_actions=max_actions)
