"""Predict when each action of a pipeline schedule runs, without running a model.

Give `simulate` a `Schedule` (per-device ordered actions) and a `CostModel` and it returns a
`Timeline`: every device runs its actions strictly in list order; an action starts once the
device is free and every action it depends on has finished (plus a point-to-point transfer
time when the producer sits on another device). The dependencies are those of backprop:

    F(s, m)        needs F(s-1, m)                      (the activations of the stage before)
    B or I(s, m)   needs F(s, m) and B/I(s+1, m)        (the last stage needs only its F)
    W(s, m)        needs I(s, m)                        (weight gradient after input gradient)

as `course_utils.actions.KINDS` states them (each kind's `produces` and `needs`).

`validate` checks a hand-written order and returns kind, precise messages instead of
raising, so exercises can grade a learner's schedule.

An output normally leaves its device the moment its action ends. A schedule with
`send_groups` (DualPipeV) sends the outputs of a group of consecutive actions together when
the group's last action ends, as DeepSeek's dualpipev.py sends both results of an F&B slot;
the device's own later actions still see each output at once.

The simulator is event-driven (a pointer per device, and devices blocked on an action are
woken when it finishes), so it handles 100k+ actions in well under a second.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from numbers import Real

from course_utils import validation
from course_utils.actions import KINDS, PIPELINE_KINDS, Action, Schedule
from course_utils.errors import CourseInputError, ScheduleError
from course_utils.timeline import Timeline

# Dependency "slots", one per product: B and I both deliver the input gradient the stage
# before waits for. A kind's slot and its needs as (stage offset, slot), from KINDS.
_PRODUCTS = tuple(dict.fromkeys(KINDS[k].produces for k in PIPELINE_KINDS))
_SLOTS = len(_PRODUCTS)
_SLOT = {k: _PRODUCTS.index(KINDS[k].produces) for k in PIPELINE_KINDS}
_NEEDS = {k: tuple((o, _PRODUCTS.index(p)) for o, p in KINDS[k].needs) for k in PIPELINE_KINDS}


MAX_COST = 1e9  # a cost per action; a step of a million actions then stays far from overflow


def _finite(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class CostModel:
    """How long things take, in arbitrary units.

    `forward` and `backward` are the time for one micro-batch through one device's share of
    the model (with v chunks per device each chunk costs 1/v of it). A zero-bubble schedule
    splits the backward into I (input gradient, `backward * (1 - weight_fraction)`) and W
    (weight gradient, `backward * weight_fraction`). `p2p` is added when an action waits for
    a producer on another device. `stage_forward` / `stage_backward` give one cost per stage
    (per micro-batch) instead, for unbalanced pipelines.
    """

    forward: float = 1.0
    backward: float = 2.0
    weight_fraction: float = 0.5
    p2p: float = 0.0
    stage_forward: Sequence[float] | None = None
    stage_backward: Sequence[float] | None = None

    def __post_init__(self) -> None:
        for name in ("forward", "backward", "p2p"):
            value: float = getattr(self, name)
            if not _finite(value) or not 0 <= value <= MAX_COST:  # True is not a cost
                raise CourseInputError(
                    f"{name} cost must be a finite number >= 0 and at most {MAX_COST:g}, "
                    f"got {value!r}"
                )
        if not _finite(self.weight_fraction) or not 0 <= self.weight_fraction <= 1:
            raise CourseInputError(
                f"weight_fraction must be a number between 0 and 1, got {self.weight_fraction!r}"
            )
        for name in ("stage_forward", "stage_backward"):
            values = getattr(self, name)
            if values is None:
                continue
            if isinstance(values, str | bytes) or not isinstance(values, Sequence):
                raise CourseInputError(f"{name} must be a list of numbers >= 0, got {values!r}")
            if any(not _finite(x) or not 0 <= x <= MAX_COST for x in values):
                raise CourseInputError(
                    f"{name} must be a list of numbers >= 0 and at most {MAX_COST:g}, "
                    f"got {values!r}"
                )

    @classmethod
    def from_times(
        cls,
        forward: float = 1.0,
        backward: float = 2.0,
        weight: float | None = None,
        p2p: float = 0.0,
        *,
        names: Mapping[str, str] | None = None,
    ) -> CostModel:
        """A cost model from times as a learner types them: W is a time (part of B), not a
        fraction; None means half of B. Every bad value is a one-line error; `names` says what
        to call each value in it (the commands pass their flags, e.g. "--forward-cost")."""
        name = {"forward": "forward cost", "backward": "backward cost", "p2p": "p2p cost"}
        name |= {"weight": "weight cost", **(names or {})}
        top = f" and at most {MAX_COST:g}"  # sums of such costs stay finite
        for key, value in (("forward", forward), ("backward", backward)):
            if not _finite(value) or not 0 < value <= MAX_COST:
                raise CourseInputError(
                    f"{name[key]} must be a finite number > 0{top}, got {value!r}"
                )
        if not _finite(p2p) or not 0 <= p2p <= MAX_COST:
            raise CourseInputError(f"{name['p2p']} must be a finite number >= 0{top}, got {p2p!r}")
        if weight is not None and (not _finite(weight) or not 0 <= weight <= backward):
            raise CourseInputError(
                f"{name['weight']} must be between 0 and {name['backward']} ({backward:g}), "
                f"got {weight!r}"
            )
        fraction = 0.5 if weight is None else weight / backward
        return cls(float(forward), float(backward), fraction, float(p2p))

    def per_stage(self, stages: int, chunks: int) -> tuple[list[float], list[float]]:
        """Forward and backward cost of one micro-batch on each stage."""
        forward = self._stage_list("stage_forward", self.stage_forward, stages)
        backward = self._stage_list("stage_backward", self.stage_backward, stages)
        return (
            forward or [self.forward / chunks] * stages,
            backward or [self.backward / chunks] * stages,
        )

    @staticmethod
    def _stage_list(name: str, values, stages: int) -> list[float] | None:
        if values is None:
            return None
        if len(values) != stages:
            raise CourseInputError(
                f"{name} needs one cost per stage ({stages}), got {len(values)} values"
            )
        return [float(x) for x in values]


# --------------------------------------------------------------------------- reading input


def _as_device_lists(devices_or_schedule) -> list[list[Action]]:
    if isinstance(devices_or_schedule, Schedule):
        return [list(actions) for actions in devices_or_schedule.devices]
    devices = devices_or_schedule
    if isinstance(devices, dict):
        devices = [devices[d] for d in sorted(devices)]
    if not isinstance(devices, list | tuple) or not all(
        isinstance(actions, list | tuple) for actions in devices
    ):
        raise CourseInputError(
            "the schedule must be a Schedule or one list of actions per device, like "
            f"[['0F0', '0B0'], ['1F0', '1B0']], got {type(devices).__name__}"
        )
    return [[Action.parse(a) for a in actions if a is not None] for actions in devices]


_CODE = {k: i for i, k in enumerate(PIPELINE_KINDS)}


def _structure_is_fine(devices: list[list[Action]], stages: int, microbatches: int) -> bool:
    """Fast check (big schedules): each action once, stages on one device, nothing missing."""
    seen = bytearray(stages * microbatches * 4)
    owner = [-1] * stages
    code = _CODE
    for d, actions in enumerate(devices):
        for a in actions:
            k = code.get(a.kind)
            if k is None:
                continue  # communication
            s, m = a.stage, a.microbatch
            if s >= stages or m is None or m >= microbatches:
                return False
            if owner[s] != d:
                if owner[s] != -1:
                    return False
                owner[s] = d
            i = (s * microbatches + m) * 4 + k
            if seen[i]:
                return False
            seen[i] = 1
    forward, full, inputs, weights = seen[0::4], seen[1::4], seen[2::4], seen[3::4]
    if 0 in forward or inputs != weights:
        return False
    return all(b ^ i for b, i in zip(full, inputs, strict=True))


def structure_problems(devices: list[list[Action]], stages: int, microbatches: int) -> list[str]:
    """Everything wrong with the set of actions, ignoring their order: each action once, each
    stage on one device, nothing missing. The executor checks schedules with it too."""
    if _structure_is_fine(devices, stages, microbatches):
        return []
    problems: list[str] = []
    where: dict[tuple[int, str, int], list[int]] = defaultdict(list)
    owners: dict[int, set[int]] = defaultdict(set)
    for d, actions in enumerate(devices):
        for a in actions:
            if not a.is_compute:
                continue  # communication is implied by the dependencies
            if a.stage >= stages:
                problems.append(
                    f"{a} on device {d}: there are only {stages} stages (0-{stages - 1})"
                )
                continue
            if a.microbatch is None or a.microbatch >= microbatches:
                problems.append(
                    f"{a} on device {d}: micro-batches are numbered 0-{microbatches - 1}"
                )
                continue
            where[(a.stage, a.kind, a.microbatch)].append(d)
            owners[a.stage].add(d)

    for s in sorted(owners):
        if len(owners[s]) > 1:
            names = sorted(owners[s])
            listed = ", ".join(map(str, names[:-1])) + f" and {names[-1]}"
            problems.append(f"stage {s} runs on devices {listed}: a stage lives on one device")

    for (s, kind, m), devs in sorted(where.items()):
        if len(devs) > 1:
            times = "twice" if len(devs) == 2 else f"{len(devs)} times"
            on = sorted(set(devs))
            place = f"device {on[0]}" if len(on) == 1 else "devices " + ", ".join(map(str, on))
            problems.append(f"{Action(s, kind, m)} appears {times} ({place})")

    for s in range(stages):
        for m in range(microbatches):
            has = {k for k in "FBIW" if (s, k, m) in where}
            if "F" not in has:
                problems.append(f"{s}F{m} is missing")
            if "B" in has and ("I" in has or "W" in has):
                problems.append(
                    f"{s}B{m} and {s}{'I' if 'I' in has else 'W'}{m} both appear: "
                    "use either B or the split I + W for a micro-batch, not both"
                )
            elif "I" in has and "W" not in has:
                problems.append(f"{s}W{m} is missing (it goes with {s}I{m})")
            elif "W" in has and "I" not in has:
                problems.append(f"{s}I{m} is missing (it goes with {s}W{m})")
            elif not has & {"B", "I", "W"}:
                problems.append(f"{s}B{m} is missing")
    return problems


# --------------------------------------------------------------------------- the event loop


def _run(
    devices: list[list[Action]],
    stages: int,
    microbatches: int,
    fwd_cost: list[float],
    bwd_cost: list[float],
    weight_fraction: float,
    p2p: float,
    scale: float,
    send_groups: tuple[tuple[int, ...], ...] | None = None,
) -> tuple[list[list[float]], list[list[float]], list[str]]:
    """Start and end time of every action, per device; or the stuck devices' descriptions.

    Returns (starts, ends, stuck). `stuck` is empty when every action ran. With
    `send_groups` an output reaches other devices only when its group ends (`sent`), while
    the producing device reads it at its own end time (`end`).
    """
    n = len(devices)
    last = stages - 1
    row = _SLOTS * microbatches  # key distance between neighbouring stages
    cost_of = {
        "F": [c * scale for c in fwd_cost],
        "B": [c * scale for c in bwd_cost],
        "I": [c * scale * (1 - weight_fraction) for c in bwd_cost],
        "W": [c * scale * weight_fraction for c in bwd_cost],
    }
    p2p *= scale
    slot_of, needs_of = _SLOT, _NEEDS
    plans = [[a for a in actions if a.kind in _SLOT] for actions in devices]
    # held[d][i]: the output of device d's i-th action waits for the end of its send group.
    held = [[False] * len(plan) for plan in plans]
    if send_groups is not None:
        for d, (actions, sizes) in enumerate(zip(devices, send_groups, strict=True)):
            last_of_group = [False] * len(actions)
            at = -1
            for size in sizes:
                at += size
                last_of_group[at] = True
            flags = [
                not last for a, last in zip(actions, last_of_group, strict=True) if a.kind in _SLOT
            ]
            held[d] = flags
    # A key numbers each (stage, micro-batch, slot) densely, so plain lists hold end times.
    end: list[float | None] = [None] * (stages * row)
    sent: list[float | None] = [None] * (stages * row)  # when other devices can have it
    made_on = [-1] * (stages * row)
    waiters: dict[int, list[int]] = defaultdict(list)
    free = [0.0] * n
    pointer = [0] * n
    starts: list[list[float]] = [[] for _ in range(n)]
    ends: list[list[float]] = [[] for _ in range(n)]
    ready = list(range(n))
    pending: list[list[int]] = [[] for _ in range(n)]  # outputs held until their group ends
    while ready:
        d = ready.pop()
        plan, i, t = plans[d], pointer[d], free[d]
        push_start, push_end = starts[d].append, ends[d].append
        holds = held[d]
        while i < len(plan):
            a = plan[i]
            kind, s, mb = a.kind, a.stage, a.microbatch
            assert mb is not None  # compute actions all have one (structure_problems checked)
            base = s * row + mb * _SLOTS
            key, start, blocked = base + slot_of[kind], t, False
            for offset, slot in needs_of[kind]:
                if not 0 <= s + offset <= last:
                    continue  # no stage there: nothing to wait for
                dep = base + offset * row + slot
                # Made here: read at its end; made elsewhere: once it was sent (plus p2p).
                done = end[dep] if made_on[dep] == d else sent[dep]
                if done is None:
                    waiters[dep].append(d)  # woken when dep is sent
                    blocked = True
                    break
                if p2p and made_on[dep] != d:
                    done += p2p
                if done > start:
                    start = done
            if blocked:
                break
            t = start + cost_of[kind][s]
            end[key] = t
            made_on[key] = d
            push_start(start)
            push_end(t)
            i += 1
            if holds[i - 1]:
                pending[d].append(key)
                continue
            for k in (*pending[d], key) if pending[d] else (key,):
                sent[k] = t
                if k in waiters:
                    ready.extend(waiters.pop(k))
            pending[d].clear()
        pointer[d], free[d] = i, t

    stuck = []
    for d, plan in enumerate(plans):
        if pointer[d] < len(plan):
            # What device d can read: its own outputs at their end, others' once sent.
            readable = [e if m == d else x for e, x, m in zip(end, sent, made_on, strict=True)]
            stuck.append(
                _describe_wait(d, plan[pointer[d]], plans, microbatches, readable, row, last)
            )
    return starts, ends, stuck


def _dependencies(a: Action, last: int) -> list[tuple[int, str, int]]:
    """What `a` waits for, as (stage, kinds that deliver it, micro-batch)."""
    s, m = a.stage, a.microbatch
    assert m is not None  # a compute action
    return [
        (s + offset, "".join(k for k in PIPELINE_KINDS if KINDS[k].produces == product), m)
        for offset, product in KINDS[a.kind].needs
        if 0 <= s + offset <= last
    ]


def _describe_wait(d: int, action: Action, plans, microbatches: int, readable, row, last) -> str:
    """'device 0 waits at 0B0 for 1B0' for a device stuck at `action`."""
    for s, kinds, m in _dependencies(action, last):
        if readable[s * row + m * _SLOTS + _SLOT[kinds[0]]] is None:
            break
    # Name the dependency as the schedule spells it (B or I), wherever it is.
    found = [a for p in plans for a in p if (a.stage, a.microbatch) == (s, m) and a.kind in kinds]
    needed = str(found[0]) if found else f"{s}{kinds[0]}{m}"
    text = f"device {d} waits at {action} for {needed}"
    if found and found[0] in plans[d]:
        text += f", which comes later on device {d}"
    return text


def _peaks(devices: list[list[Action]], scale: int) -> list[int]:
    """Most micro-batch chunks each device holds at once: +1 at F, -1 at B, or at W when the
    backward is split (I keeps what W still needs)."""
    step = {code: kind.holds for code, kind in KINDS.items()}
    peaks = []
    for actions in devices:
        held = peak = 0
        for a in actions:
            held += step[a.kind]
            if held > peak:
                peak = held
        peaks.append(peak * scale)
    return peaks


def _prepare(schedule: Schedule, costs: CostModel):
    if not isinstance(schedule, Schedule):
        raise CourseInputError(
            f"schedule must be a Schedule (from make_schedule), got {type(schedule).__name__}"
        )
    if not isinstance(costs, CostModel):
        raise CourseInputError(f"costs must be a CostModel, got {type(costs).__name__}")
    devices = _as_device_lists(schedule)
    microbatches = schedule.numbered  # naive: just one
    slots, present = schedule.stages * microbatches, sum(len(a) for a in devices)
    if slots > max(present, validation.MAX_ACTIONS):  # said at once, not listed one by one
        raise ScheduleError(
            f"{schedule.name}: {schedule.stages} stages x {microbatches} micro-batches need "
            f"{slots:,} forward actions, the schedule has {present:,} actions in all"
        )
    problems = structure_problems(devices, schedule.stages, microbatches)
    if problems:
        raise ScheduleError(f"{schedule.name}: " + "; ".join(problems))
    fwd, bwd = costs.per_stage(schedule.stages, schedule.chunks)
    return devices, microbatches, fwd, bwd


def simulate_arrays(schedule: Schedule, costs: CostModel | None = None) -> dict:
    """Like `simulate`, but plain lists (fast for huge schedules): per-device actions, start and
    end times, makespan, bubble fraction and peak activations."""
    costs = CostModel() if costs is None else costs
    devices, microbatches, fwd, bwd = _prepare(schedule, costs)
    starts, ends, stuck = _run(
        devices,
        schedule.stages,
        microbatches,
        fwd,
        bwd,
        costs.weight_fraction,
        costs.p2p,
        schedule.batch_scale,
        schedule.send_groups,
    )
    if stuck:
        raise ScheduleError(f"{schedule.name} cannot finish (deadlock): " + "; ".join(stuck))
    computed = [[a for a in actions if a.kind in _SLOT] for actions in devices]
    first = min((s[0] for s in starts if s), default=0.0)
    makespan = max((e[-1] for e in ends if e), default=0.0) - first
    busy = [
        sum(e - s for s, e in zip(st, en, strict=True)) for st, en in zip(starts, ends, strict=True)
    ]
    total = len(devices) * makespan
    return {
        "actions": computed,
        "starts": starts,
        "ends": ends,
        "makespan": makespan,
        "busy": busy,
        "bubble_fraction": (total - sum(busy)) / total if total > 0 else 0.0,
        "peak_activations": _peaks(devices, schedule.batch_scale),
    }


def simulate(schedule: Schedule, costs: CostModel | None = None) -> Timeline:
    """Simulated timeline of `schedule` under `costs` (raises ScheduleError if it cannot run)."""
    costs = CostModel() if costs is None else costs
    result = simulate_arrays(schedule, costs)
    return Timeline.from_lanes(
        list(zip(result["actions"], result["starts"], result["ends"], strict=True)),
        name=schedule.name,
        source="simulated",
        unit="units",
        peak_activations=result["peak_activations"],
        meta={"costs": asdict(costs)},
        stages=schedule.stages,
        microbatches=schedule.microbatches,
        chunks=schedule.chunks,
    )


def validate(
    devices_or_schedule,
    stages: int | None = None,
    microbatches: int | None = None,
) -> list[str]:
    """Problems with a hand-written schedule, as kind, precise sentences ([] if it is fine).

    `devices_or_schedule` is a `Schedule` or one list per device of actions ("0F1" or
    `Action`). Checks that every action appears exactly once, that each stage stays on one
    device, and that the order can finish (no device waits forever).
    """
    if isinstance(devices_or_schedule, Schedule):
        sched = devices_or_schedule
        stages = sched.stages if stages is None else stages
        if microbatches is None:
            microbatches = sched.numbered
    if stages is None or microbatches is None:
        raise CourseInputError("validate needs stages and microbatches for plain action lists")
    validation.integer(stages, "stages")
    validation.integer(microbatches, "microbatches")
    if stages * microbatches > validation.MAX_ACTIONS:  # a hand-written order is small
        raise CourseInputError(
            f"stages x microbatches must be at most {validation.MAX_ACTIONS:,}, got "
            f"{stages} x {microbatches}"
        )
    try:
        devices = _as_device_lists(devices_or_schedule)
    except CourseInputError as exc:
        return [str(exc)]
    problems = structure_problems(devices, stages, microbatches)
    if problems:
        return problems
    ones = [1.0] * stages
    _, _, stuck = _run(devices, stages, microbatches, ones, ones, 0.5, 0.0, 1)
    if stuck:
        return ["deadlock: " + ", ".join(stuck)]
    return []
