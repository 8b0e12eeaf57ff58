"""The set-up check of the welcome notebook: versions, cores, and real thread concurrency.

The whole course rests on one fact: two Python threads running torch code compute at
the same time. That needs two things, checked separately so a busy laptop is not
mistaken for a broken set-up:

1. at least two cores this process may use (containers and `taskset` can limit it);
2. torch releases Python's global interpreter lock (GIL) inside its kernels, so while
   one thread multiplies matrices, another can run. Tested directly: the main thread
   keeps counting while a worker thread is inside one long matrix multiply. If torch
   kept the lock, the count would stop for the whole multiply, however idle the machine.

The speed-up of two threads over one is measured too, with the capacity probe every lesson
uses (`course_utils.measure.capacity`). It depends on what else runs on the machine, so a
low one is reported as a warning, not an error.
"""

from __future__ import annotations

import os
import platform
import threading
import time

from course_utils.measure.capacity import available_cores, probe
from course_utils.versions import support_note

# BinderHub sets these in every session it starts (and nothing else does).
BINDER_VARIABLES = ("BINDER_REPO_URL", "BINDER_LAUNCH_HOST")


def on_binder() -> bool:
    """True inside a Binder session (its work is lost when the session ends)."""
    return any(os.environ.get(name) for name in BINDER_VARIABLES)


def _long_op() -> None:
    """One torch call long enough to watch (~0.1 s on one core)."""
    import torch

    torch.set_num_threads(1)
    a = torch.randn(1024, 1024)
    torch.mm(a, a)


def python_runs_during_torch() -> int:
    """How many times the main thread looped while a worker was inside `_long_op`.

    Thousands when torch releases the GIL (even on a busy machine), 0 when it does not.
    """
    import torch

    torch.randn(8, 8) @ torch.randn(8, 8)  # load torch's kernels before timing
    window: list[float] = []

    def worker() -> None:
        window.append(time.perf_counter())
        _long_op()
        window.append(time.perf_counter())

    ticks: list[float] = []
    thread = threading.Thread(target=worker)
    thread.start()
    while thread.is_alive():
        ticks.append(time.perf_counter())
    thread.join()
    start, end = window
    margin = 0.05 * (end - start)  # ignore the loop's last steps before and after the call
    return sum(1 for t in ticks if start + margin < t < end - margin)


def concurrency_speedup() -> float:
    """How much faster two device threads compute than one right now (the capacity probe)."""
    return probe().speedup


def check_setup(min_speedup: float = 1.3, attempts: int = 3) -> dict:
    """Print Python, torch and core count, and verify two torch threads compute at once.

    Raises RuntimeError when torch holds the GIL; prints a warning when two threads are
    less than `min_speedup` times faster than one (another program is using the cores).
    """
    import torch

    cores = available_cores()
    info = {"python": platform.python_version(), "torch": torch.__version__, "cores": cores}
    print(f"Python {info['python']}, torch {info['torch']}, {cores} core(s) available")
    note = support_note(torch.__version__)
    if note:
        print(note)
    if on_binder():
        print(
            "You are on Binder: nothing is kept after this session ends. To keep a notebook, "
            "use File > Download (or right-click it in the file browser > Download)."
        )
    runs = max(python_runs_during_torch() for _ in range(2))
    info["python_runs_during_torch"] = runs
    if runs == 0:
        raise RuntimeError(
            "torch kept Python's lock (GIL) during a matrix multiply: threads would take "
            "turns. Reinstall the pinned torch (`make lab` does) and run this cell again."
        )
    if cores < 2:
        print(
            "Only one core: threads will take turns, so pipelines cannot run faster here. "
            "Every chart still shows what happened honestly; on 2+ cores you will see speed-ups."
        )
        info["speedup"] = None
        return info
    best = 0.0
    for attempt in range(attempts):
        if attempt:
            time.sleep(0.3)  # let a burst of other work (a browser redrawing) pass
        best = max(best, concurrency_speedup())
        if best >= min_speedup:
            break
    info["speedup"] = best
    if best < min_speedup:
        print(
            f"Two torch threads can compute at the same time, but ran only {best:.2f}x "
            "faster than one (an idle 2-core machine gives about 1.8x): another program is "
            "using the cores. The lessons still work; their timings will be noisier. ⚠️"
        )
    else:
        print(
            f"Two torch threads computed at the same time: {best:.2f}x faster than one thread. ✅"
        )
    return info
