"""Benchmark: one update of the schedule explorer (simulate + paint + PNG) stays under 100 ms.

The explorer redraws on every slider move, so an update must feel instant. This times
`explorer_update` at the largest settings its sliders allow (p=16 devices, m=64
micro-batches, v=4 chunks where the schedule uses chunks) for every schedule, and at a
typical lesson size. Each figure is the median of several updates after one warm-up
(the first update loads the font), with the schedule cache cleared so every update builds
its schedule afresh. CPU time is printed beside wall time: on a busy machine wall time
grows while CPU time does not. Exits 1 if any median wall time reaches 100 ms.

    .venv/bin/python benchmarks/bench_explorer.py
"""

from __future__ import annotations

import statistics
import sys
import time

from course_utils.charts import explorer
from course_utils.charts.explorer import Settings, explorer_update
from course_utils.pipeline.schedules import SCHEDULES

TARGET_MS = 100.0
REPEATS = 7


def median_ms(settings: Settings) -> tuple[float, float, int]:
    """Median wall and CPU milliseconds of an update that builds its schedule afresh."""
    explorer_update(settings)  # warm-up
    walls, cpus = [], []
    for _ in range(REPEATS):
        explorer._schedule.cache_clear()  # time the worst case: a schedule not seen yet
        start, cpu = time.perf_counter(), time.process_time()
        view = explorer_update(settings)
        walls.append(1000 * (time.perf_counter() - start))
        cpus.append(1000 * (time.process_time() - cpu))
    return statistics.median(walls), statistics.median(cpus), len(view.png)


def main() -> int:
    cases = [Settings("gpipe", 4, 8)]
    for name in ("naive", "gpipe", "1f1b", "interleaved", "breadth-first", "zb-h1"):
        cases.append(Settings(name, 16, 64, chunks=4 if SCHEDULES[name].uses_chunks else 1))
    cases.append(Settings("interleaved", 16, 64, chunks=4, comm_cost=0.5))
    worst = 0.0
    for settings in cases:
        ms, cpu_ms, size = median_ms(settings)
        worst = max(worst, ms)
        v = f", v={settings.chunks}" if SCHEDULES[settings.schedule].uses_chunks else ""
        comm = f", transfer {settings.comm_cost:g}" if settings.comm_cost else ""
        label = f"{settings.schedule} p={settings.devices} m={settings.microbatches}{v}{comm}"
        print(
            f"{label:<42} {ms:6.1f} ms per update (CPU {cpu_ms:5.1f} ms, PNG {size / 1000:.0f} kB)"
        )
    ok = worst < TARGET_MS
    print(f"slowest update {worst:.1f} ms: {'OK' if ok else 'FAIL'} (target < {TARGET_MS:.0f} ms)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
