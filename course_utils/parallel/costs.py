"""How long collectives take: the communication cost model of the course.

Bandwidth and latency only (the "alpha-beta" model): a message of S bytes over a link of
bandwidth beta bytes/s takes S / beta + alpha seconds. The formulas count the bytes each
worker sends in the ring algorithms that `course_utils.threads.collectives` writes out with
sends and receives, so a learner can check them against the measured byte counters.

Nothing here imports torch: the planner, the simulated timelines and the checks use it.
"""

from __future__ import annotations

import math

from course_utils.errors import CourseInputError


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# The all-reduce algorithms `course_utils.threads.collectives` writes out.
ALGORITHMS = ("ring", "naive")


def ring_allreduce_time(
    nbytes: float, workers: int, bandwidth_bytes_per_s: float, latency_s: float = 0.0
) -> float:
    """Time of a ring all-reduce: 2(N-1)/N * bytes/bandwidth + 2(N-1) * latency.

    Reduce-scatter then all-gather, each N-1 steps moving 1/N of the data
    (Patarasuk and Yuan, 2009, "Bandwidth optimal all-reduce algorithms").
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise CourseInputError(f"workers must be an integer >= 1, got {workers!r}")
    if not _finite(bandwidth_bytes_per_s) or bandwidth_bytes_per_s <= 0:
        raise CourseInputError(
            f"bandwidth must be a finite number > 0 bytes/s, got {bandwidth_bytes_per_s!r}"
        )
    for name, value in (("nbytes", nbytes), ("latency_s", latency_s)):
        if not _finite(value) or value < 0:
            raise CourseInputError(f"{name} must be a finite number >= 0, got {value!r}")
    steps = 2 * (workers - 1)
    return steps / workers * nbytes / bandwidth_bytes_per_s + steps * latency_s
