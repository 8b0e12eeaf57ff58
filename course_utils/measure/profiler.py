"""torch.profiler on a course run: what each device thread really ran, operator by operator,
read beside the course's own timeline of the same step.

`profile_step(run, path)` calls `run()` (one training step of a course runner) under
`torch.profiler.profile` on the CPU, for every thread (the device threads were started
before the profiler, so `profile_all_threads` is needed), with each of the course's actions
marked with its name (`record_function("2F0")`, through `course_utils.threads.trace.marker`),
and exports the profiler's Chrome trace to `path`. `read_profile(path)` reads that trace back
as plain rows: per profiler thread, the actions (user annotations) and the operators
(`aten::mm`, `AddmmBackward0`, ...) with their wall-clock start and length in microseconds.

The profiler's clock is the wall clock: compare it with the course's wall-clock timeline of
the same run (`result.trace.timeline("wall")`), not with the virtual clock's.

On real processes (lesson 13), `python -m course_utils.distributed.train --profile DIR` has
every rank profile its last step into DIR/rank{R}.json; `read_rank_profiles(DIR)` reads them
and `ranks_timeline` puts them side by side, one row per rank, from PyTorch's own marks.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from course_utils.actions import Action
from course_utils.errors import CourseInputError

if TYPE_CHECKING:
    from course_utils.timeline import Timeline

T = TypeVar("T")


@dataclass(frozen=True)
class Slice:
    """One slice of the profiler's trace: `name` ran on thread `tid` from `ts` for `dur` us."""

    name: str
    tid: int
    ts: float
    dur: float

    @property
    def end(self) -> float:
        return self.ts + self.dur

    def holds(self, other: Slice) -> bool:
        return self.tid == other.tid and self.ts <= other.ts and other.end <= self.end


@dataclass
class Profile:
    """The profiler's trace as rows: `actions` (the course's action names, one slice per action
    a thread ran) and `operators` (every torch operator the profiler saw, nested ones too)."""

    actions: list[Slice]
    operators: list[Slice]

    def threads(self) -> list[int]:
        """The threads that ran an action of the course, by their first action's start."""
        first: dict[int, float] = {}
        for a in sorted(self.actions, key=lambda s: s.ts):
            first.setdefault(a.tid, a.ts)
        return sorted(first, key=first.__getitem__)

    def action(self, name: str) -> Slice:
        """The slice of action `name` ("1B0"); a one-line error if the step has none."""
        found = [a for a in self.actions if a.name == str(Action.parse(name))]
        if not found:
            raise CourseInputError(f"the profiled step has no action {name!r}")
        return found[0]

    def operators_in(self, name: str) -> Counter[str]:
        """How many times each operator ran inside action `name`, on its thread."""
        action = self.action(name)
        return Counter(op.name for op in self.operators if action.holds(op))

    def busy_us(self, tid: int) -> float:
        """Microseconds thread `tid` spent inside the course's compute actions."""
        return sum(a.dur for a in self.actions if a.tid == tid and Action.parse(a.name).is_compute)

    def devices(self, timeline: Timeline) -> dict[int, int]:
        """{profiler thread: the course's device that ran the same actions}, read off the
        course's timeline of the same step; a one-line error if a thread's actions belong
        to several devices (then the rows would not match)."""
        owner = {str(e.action): e.device for e in timeline.events if e.action.is_compute}
        found: dict[int, int] = {}
        for a in self.actions:
            device = owner.get(a.name)
            if device is None:
                continue
            if found.setdefault(a.tid, device) != device:
                raise CourseInputError(
                    f"profiler thread {a.tid} ran actions of devices {found[a.tid]} and {device}"
                )
        return found

    def as_timeline(self, devices: dict[int, int], name: str = "torch.profiler") -> Timeline:
        """The profiler's actions as a course timeline (wall clock, seconds from the first
        action), one row per device: drawn with the Gantt painter beside the course's."""
        from course_utils.timeline import Event, Timeline

        mine = [a for a in self.actions if a.tid in devices]
        t0 = min((a.ts for a in mine), default=0.0)
        events = [
            Event(devices[a.tid], Action.parse(a.name), (a.ts - t0) / 1e6, (a.end - t0) / 1e6)
            for a in mine
        ]
        return Timeline(
            events, 1 + max(devices.values(), default=0), name=name, source="measured",
            unit="s", meta={"clock": "wall"},
        )  # fmt: skip

    def self_us(self, tid: int | None = None) -> dict[str, float]:
        """Per operator, its self time (its length minus the operators it called), in us,
        on thread `tid` or on every thread."""
        ops = sorted(
            (op for op in self.operators if tid is None or op.tid == tid),
            key=lambda s: (s.tid, s.ts, -s.dur),
        )
        total: dict[str, float] = defaultdict(float)
        open_: list[Slice] = []  # the operators the current one is nested in
        for op in ops:
            while open_ and not open_[-1].holds(op):
                open_.pop()
            total[op.name] += op.dur
            if open_:
                total[open_[-1].name] -= op.dur
            open_.append(op)
        return dict(total)

    def most_self_time(self, tid: int, n: int = 3) -> list[tuple[str, float]]:
        """The `n` operators with the most self time on thread `tid`: (name, us)."""
        return sorted(self.self_us(tid).items(), key=lambda item: -item[1])[:n]


# PyTorch's pipelining schedules mark their actions too: "PP:1F0" (the runtime of CSV and
# multi-stage schedules), "Forward 3" and "Backward 3" (the single-stage GPipe and 1F1B,
# whose rank holds stage RANK).
_PYTORCH_MARK = re.compile(r"(Forward|Backward) (\d+)")


def _action_name(name: str, rank: int | None) -> str | None:
    """The course's name of an action mark ("2F0"), or None for any other annotation."""
    name = name.removeprefix("PP:")
    single = _PYTORCH_MARK.fullmatch(name)
    if single and rank is not None:
        name = f"{rank}{single[1][0]}{single[2]}"
    try:
        return str(Action.parse(name))
    except CourseInputError:
        return None


def read_profile(path: str | Path, rank: int | None = None) -> Profile:
    """The profiler's Chrome trace (`profile_step`'s file, or one rank's of `train
    --profile`: `rank` names its stage in PyTorch's "Forward 3" marks) as a `Profile`."""
    events = json.loads(Path(path).read_text(encoding="utf-8"))["traceEvents"]
    actions, operators = [], []
    for e in events:
        if e.get("ph") != "X" or not isinstance(e.get("tid"), int):
            continue
        piece = Slice(e["name"], e["tid"], float(e["ts"]), float(e.get("dur", 0.0)))
        if e.get("cat") == "user_annotation":
            name = _action_name(e["name"], rank)
            if name is not None:
                actions.append(replace(piece, name=name))
        elif e.get("cat") == "cpu_op":
            operators.append(piece)
    return Profile(actions, operators)


def read_rank_profiles(folder: str | Path) -> dict[int, Profile]:
    """{rank: its Profile} from the rank{R}.json traces that `train --profile DIR` wrote."""
    found = {}
    for path in sorted(Path(folder).glob("rank*.json")):
        number = re.fullmatch(r"rank(\d+)\.json", path.name)
        if number:
            found[int(number[1])] = read_profile(path, rank=int(number[1]))
    if not found:
        raise CourseInputError(f"{str(folder)!r} holds no rank*.json trace")
    return dict(sorted(found.items()))


def ranks_timeline(
    profiles: dict[int, Profile], name: str = "torch.profiler, per rank"
) -> Timeline:
    """Every rank's trace side by side: one row per rank, its pipeline actions as the
    profiler marked them, in seconds from the first. The processes of one machine share its
    wall clock; across machines the profilers' clocks differ by their offset
    (`course_utils.distributed.clocks`), so there put the rows side by side, not in step."""
    from course_utils.timeline import Event, Timeline

    marks = [(rank, a) for rank, profile in profiles.items() for a in profile.actions]
    if not marks:
        raise CourseInputError("the ranks' traces mark no pipeline action")
    t0 = min(a.ts for _, a in marks)
    events = [
        Event(rank, Action.parse(a.name), (a.ts - t0) / 1e6, (a.end - t0) / 1e6)
        for rank, a in marks
    ]
    return Timeline(events, 1 + max(profiles), name=name, source="measured", unit="s",
                    meta={"clock": "wall"})  # fmt: skip


def profile_step(run: Callable[[], T], path: str | Path, memory: bool = True) -> T:
    """`run()` under torch.profiler (CPU, every thread, allocations if `memory`), each course
    action marked with its name; the profiler's Chrome trace is written to `path`."""
    import torch
    from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile, record_function

    from course_utils.threads import trace

    config = _ExperimentalConfig(profile_all_threads=True)
    trace.marker = record_function
    try:
        with (
            _without_kineto_notices(),
            profile(
                activities=[ProfilerActivity.CPU],
                profile_memory=memory,
                experimental_config=config,
            ) as prof,
        ):
            result = run()
    finally:
        trace.marker = None
    prof.export_chrome_trace(str(path))
    torch.set_num_threads(torch.get_num_threads())  # unchanged: the profiler leaves it so
    return result


# What PyTorch's profiler library (kineto) writes to the process's stderr as it starts and
# stops ("USDT:... SyncActivityProfilerHandler.cpp:52] profiler_start"): a notice, not an
# error, which a notebook would show in red.
_KINETO_NOTICE = re.compile(
    r"^USDT:.*SyncActivityProfilerHandler\.cpp:\d+\] profiler_(start|stop)$"
)


@contextmanager
def _without_kineto_notices() -> Iterator[None]:
    """The process's stderr (file descriptor 2) held while the profiler runs; what was
    written to it is passed on afterwards, but for kineto's start and stop notices."""
    import os
    import sys
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode(errors="replace")
            kept = [ln for ln in text.splitlines() if not _KINETO_NOTICE.match(ln)]
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")
