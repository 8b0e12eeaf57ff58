"""The set-up check of the welcome notebook: versions, cores, and real thread concurrency.

The whole course rests on one fact: two Python threads running torch code compute at
the same time (torch releases the GIL inside its kernels). This module measures it.
"""

from __future__ import annotations

import os
import platform
import threading
import time


def available_cores() -> int:
    """Cores this process may run on (respects container and affinity limits)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _work(size: int, repeats: int) -> None:
    import torch

    torch.set_num_threads(1)  # one core per thread, like one device per thread
    a = torch.randn(size, size)
    for _ in range(repeats):
        a = torch.tanh(a @ a / size)


def concurrency_speedup(size: int = 192, repeats: int = 60) -> float:
    """Time the same torch work twice in one thread, then once in each of two threads.

    Returns sequential time / parallel time: about 2 when two threads really compute at
    once, about 1 when they take turns.
    """
    _work(size, 2)  # warm-up
    start = time.perf_counter()
    _work(size, repeats)
    _work(size, repeats)
    sequential = time.perf_counter() - start

    threads = [threading.Thread(target=_work, args=(size, repeats)) for _ in range(2)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    parallel = time.perf_counter() - start
    return sequential / parallel


def check_setup(min_speedup: float = 1.3, attempts: int = 3) -> dict:
    """Print Python, torch and core count, and verify two torch threads compute at once."""
    import torch

    cores = available_cores()
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cores": cores,
    }
    print(f"Python {info['python']}, torch {info['torch']}, {cores} core(s) available")
    if cores < 2:
        print(
            "Only one core: threads will take turns, so pipelines cannot run faster here. "
            "Every chart still shows what happened honestly; on 2+ cores you will see speed-ups."
        )
        info["speedup"] = None
        return info
    best = 0.0
    for _ in range(attempts):
        best = max(best, concurrency_speedup())
        if best >= min_speedup:
            break
    info["speedup"] = best
    if best < min_speedup:
        raise RuntimeError(
            f"two torch threads ran only {best:.2f}x faster than one (expected >= {min_speedup}); "
            "is another program using the cores? Close it and run this cell again."
        )
    print(f"Two torch threads computed at the same time: {best:.2f}x faster than one thread. ✅")
    return info
