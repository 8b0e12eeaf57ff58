"""How much parallel compute this machine gives us right now: the capacity probe.

Every timing in the course runs threads that stand for devices, and a speed-up can never be
larger than what the machine offers at that moment: about 2x on an idle 2-core laptop, about
1x on Binder's single core, anything in between while a browser or another program uses a
core. So before a lesson times anything it calls `probe()`: the same independent torch work
is run on one thread, then on two threads at once (each with one intra-op thread, like the
course's devices), interleaved a few times, and the best ratio is kept.

    capacity = probe()
    print(capacity.sentence())   # "2 threads ran 1.93x as fast as 1 on this machine just now"

The lessons compare their measured speed-ups with `capacity.speedup`, never with a fixed
number, and `conclusions` turns both into the sentences a learner reads.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

IDLE_TWO_CORES = 1.6  # at or above: the two threads really had two cores
ONE_CORE = 1.15  # at or below: the threads took turns (one core, or a fully busy other core)


@dataclass(frozen=True)
class Capacity:
    """The probe's answer: `speedup` = time of the work on 1 thread twice / on 2 threads."""

    speedup: float
    cores: int  # cores this process may use (containers and taskset can limit it)
    one_thread_s: float
    two_threads_s: float

    @property
    def regime(self) -> str:
        """'two free cores', 'shared cores' or 'one core' (what the threads really got)."""
        if self.cores < 2 or self.speedup <= ONE_CORE:
            return "one core"
        if self.speedup >= IDLE_TWO_CORES:
            return "two free cores"
        return "shared cores"

    def sentence(self) -> str:
        """One line a lesson prints before its timings."""
        text = (
            f"2 threads ran {self.speedup:.2f}x as fast as 1 on this machine just now "
            f"({self.cores} core{'s' if self.cores != 1 else ''} available"
        )
        if self.regime == "two free cores":
            return text + "): two free cores, so thread speed-ups can show."
        if self.regime == "one core":
            return text + "): the threads took turns, so no speed-up can show here."
        return text + "): another program is using a core, so speed-ups will be smaller."

    def to_dict(self) -> dict:
        return {
            "speedup": self.speedup,
            "cores": self.cores,
            "one_thread_s": self.one_thread_s,
            "two_threads_s": self.two_threads_s,
            "regime": self.regime,
        }


def available_cores() -> int:
    """Cores this process may run on (respects taskset and container limits)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def probe(size: int = 192, repeats: int = 40, rounds: int = 3) -> Capacity:
    """Measure how much faster two device threads compute than one, right now.

    The work is `repeats` independent size x size matrix products per thread (a few
    milliseconds); one thread does it twice, two threads do it once each, `rounds` times,
    alternating, and the best of each is kept (other programs only ever slow things down).
    """
    import torch

    from course_utils.threads.devices import DeviceThreads

    def work() -> None:
        a = torch.ones(size, size)
        for _ in range(repeats):
            a @ a

    def twice() -> None:
        work()
        work()

    best_one = best_two = float("inf")
    with DeviceThreads(2, name="probe") as threads:
        threads.run([work, work])  # warm-up: thread start, first-call costs
        for _ in range(rounds):
            start = time.perf_counter()
            threads.run([twice, lambda: None])
            best_one = min(best_one, time.perf_counter() - start)
            start = time.perf_counter()
            threads.run([work, work])
            best_two = min(best_two, time.perf_counter() - start)
    return Capacity(best_one / best_two, available_cores(), best_one, best_two)
