"""Timing that survives a shared machine: interleaved repeats, best and spread, a budget.

Other programs only ever slow a measurement down, and they come and go. So when a lesson
compares variants (naive against GPipe, 1 worker against 2), it must not time all runs of
one and then all runs of the other: a burst of outside work would land on one variant only.
`compare` runs them in turns (A B C, A B C, ...), after untimed warm-up rounds, keeps every
sample, and reports the best (the least disturbed) and the spread. It stops early when the
time budget is spent, so a lesson stays under its time limit on a slow machine.

    timings = compare({"naive": run_naive, "gpipe": run_gpipe}, repeats=5, budget_s=20)
    timings["gpipe"].best, timings["gpipe"].spread

On the virtual clock a sample is the step's time on its timeline, not the call's wall time:
`compare(variants, time_of=step_time)`. There each variant's best is more than the best of
its runs: its runs' recordings are put together, every compute burst at the least CPU time
it took in any run (`threads.clock.fastest`), and replayed. A burst interrupted in one run
(by another program, or a neighbouring device thread on the same core) then costs what it
costs in the others, so one noisy moment shifts no figure; each burst keeps its own device,
so a straggler stays a straggler. `best_result` is that put-together run.

The emulated links are scaled to this machine's compute rate (`threads.links`), probed once
per process in a tenth of a second. On a shared host the core's speed drifts by 15-30% for
a few hundred milliseconds at a time, so that probe and the steps' fastest moments can be
two different speeds, and a figure that weighs communication against compute (16
data-parallel workers: 8.8x in one process, 10.2x in the next) moves with it. With
`rate_probe=True` the core's rate is probed after every timed call, on the devices' core,
and every variant's put-together run is replayed over links scaled to the best rate seen
then (`Links.at_rate`): the moments whose compute the figures keep.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar, cast

from course_utils.errors import CourseInputError
from course_utils.threads.devices import on_the_devices_core
from course_utils.threads.links import probe_flops

T = TypeVar("T")


@dataclass
class Timing:
    """Seconds of every timed run of one variant (warm-up excluded), and what it returned."""

    name: str
    samples: list[float] = field(default_factory=list)
    results: list[object] = field(default_factory=list, repr=False)
    # the runs put together, burst by burst (virtual clock, `steady`): its time and result
    steady: tuple[float, object] | None = field(default=None, repr=False)
    # FLOP/s of a device thread while the runs were timed (`rate_probe`), else None
    rate: float | None = None

    @property
    def best(self) -> float:
        if self.steady is not None:
            return self.steady[0]
        return min(self.samples)

    @property
    def median(self) -> float:
        ordered = sorted(self.samples)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

    @property
    def spread(self) -> float:
        """(slowest - best) / best: 0.05 means the runs varied by 5%."""
        return (max(self.samples) - self.best) / self.best if self.best > 0 else 0.0

    @property
    def best_result(self) -> object:
        """What the fastest run returned (e.g. its measured timeline); on the virtual clock,
        the runs put together (`steady`)."""
        if self.steady is not None:
            return self.steady[1]
        return self.results[self.samples.index(self.best)]

    def to_dict(self) -> dict:
        return {"name": self.name, "samples": self.samples, "best": self.best}


def step_time(result) -> float:
    """A run's time on its own timeline's clock (virtual or wall): its makespan."""
    return result.timeline.makespan


def steady(timing: Timing) -> tuple[float, object] | None:
    """`timing`'s runs on the virtual clock put together: each compute burst at its least CPU
    time over the runs, replayed (module docstring) over links scaled to `timing.rate` where
    it was probed; None where that cannot be done (wall clock, a run without its recording,
    runs that did not record the same operations)."""
    import dataclasses

    from course_utils.threads.clock import default_links, fastest

    results = timing.results
    traces = [getattr(r, "trace", None) for r in results]
    if not results or not _on_the_virtual_clock(results[0]) or None in traces:
        return None
    merged = fastest([t for t in traces if t is not None])
    if merged is None:
        return None
    if timing.rate is not None:  # no links of its own: the course's cluster (`timeline`)
        merged.links = (merged.links or default_links()).at_rate(timing.rate)
    best = results[timing.samples.index(min(timing.samples))]
    retimed = getattr(best, "retimed", None)
    if retimed is not None:
        result = retimed(merged)
    elif dataclasses.is_dataclass(best) and not isinstance(best, type):
        result = dataclasses.replace(best, timeline=merged.timeline("virtual"), trace=merged)
    else:
        return None
    return step_time(result), result


def least_disturbed(results: Sequence[T]) -> T:
    """Several runs of one program (a command's repeated steps) put together as `compare`
    does on the virtual clock: every compute burst at its least CPU time (`steady`).
    Elsewhere (the wall clock, runs that did not record the same operations) the run with the
    shortest timeline."""
    if not results:
        raise CourseInputError("results must hold at least one run")
    timing = Timing("runs", [_makespan(r) for r in results], list(results))
    timing.steady = steady(timing)
    return cast(T, timing.best_result)


def _on_the_virtual_clock(result) -> bool:
    timeline = getattr(result, "timeline", None)
    return timeline is not None and timeline.meta.get("clock") == "virtual"


def _makespan(result) -> float:
    timeline = getattr(result, "timeline", None)
    return timeline.makespan if timeline is not None else 0.0


def compare(
    variants: dict[str, Callable[[], object]],
    repeats: int = 5,
    warmup: int = 1,
    budget_s: float = 30.0,
    time_of: Callable[[object], float] | None = None,
    rate_probe: bool = False,
) -> dict[str, Timing]:
    """Time each variant `repeats` times, in turns, after `warmup` untimed rounds.

    Returns one `Timing` per variant. Every variant gets at least one timed run; after that
    no new round starts once `budget_s` seconds (wall) have passed since the first timed
    round. A sample is the wall time of the call, or `time_of(what it returned)`: with
    `time_of=step_time`, the step's time on the virtual clock. `rate_probe` (virtual clock):
    the links scaled to the compute rate of the moments timed (module docstring; about 10 ms
    a call); each put-together run's links say which rate (`best_result.trace.links`).
    """
    if not variants:
        raise CourseInputError("variants must name at least one function to time")
    if not isinstance(repeats, int) or repeats < 1:
        raise CourseInputError(f"repeats must be an integer >= 1, got {repeats!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise CourseInputError(f"warmup must be an integer >= 0, got {warmup!r}")
    if not budget_s > 0:
        raise CourseInputError(f"budget_s must be a number of seconds > 0, got {budget_s!r}")
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    timings = {name: Timing(name) for name in variants}
    rates: list[float] = []
    started = time.perf_counter()
    for round_ in range(repeats):
        if round_ and time.perf_counter() - started > budget_s:
            break
        for name, fn in variants.items():
            start = time.perf_counter()
            result = fn()
            took = time.perf_counter() - start if time_of is None else time_of(result)
            timings[name].samples.append(took)
            timings[name].results.append(result)
            if rate_probe and _on_the_virtual_clock(result):
                rates.append(on_the_devices_core(partial(probe_flops, 3)))
    if time_of is step_time:
        rate = max(rates, default=None)  # one rate for all variants: they are compared
        for timing in timings.values():
            timing.rate = rate
            timing.steady = steady(timing)
    return timings
