"""A pool of persistent CPU threads, one per simulated device.

Every parallel demo in the course (pipeline, data and tensor parallelism) pretends that
each CPU thread is one accelerator. `DeviceThreads` starts those threads once and
reuses them for every step, because starting threads per step would cost more than the
tiny models' compute. Each thread calls `torch.set_num_threads(1)` first so that one
"device" really uses one core and the devices do not fight over intra-op threads.

With `one_core=True` (every run on the virtual clock) the threads take turns on one core:
a thread's CPU time for some work grows when another thread computes at the same moment
on a core that shares its caches, memory bus or (hyper-threading) execution units,
by 20-35% on the course's 2-core machine. Taking turns, each device's CPU time is what it
would be alone, as on its own accelerator; the virtual clock needs no real parallelism.

`run(fns)` runs `fns[d]` on device `d` concurrently and returns the results. When one
function raises, the pool sets `abort` (a `threading.Event`) so peers blocked on a
message that will never come can give up, waits for everybody, and raises a
`WorkerError` in the caller that says which device failed and chains the original.

When the caller gives up instead (its `timeout`, Ctrl-C, or the grader's time limit, which
lands in the waiting caller as an exception), the pool sets `abort` and waits a moment; a
thread that ignores it (a learner's loop in pure Python never looks) is then stopped with
an exception raised inside it (`Stopped`, through `PyThreadState_SetAsyncExc`), and the
pool is closed, so no thread of the run is left behind and the next run needs a new pool.
A thread blocked inside one long C call (a `time.sleep`) only stops when that call returns.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import queue
import signal
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Self, TypeVar

from course_utils import validation
from course_utils.errors import CourseInputError, ScheduleError, WorkerError
from course_utils.threads.trace import Recorder, check_clock

if TYPE_CHECKING:
    from course_utils.threads.collectives import ThreadGroup
    from course_utils.threads.links import Links
    from course_utils.timeline import Timeline

T = TypeVar("T")

# How long `run` waits for workers to notice `abort` after an error, timeout or Ctrl-C,
# and how long it then keeps stopping by force the ones that ignore it.
ABORT_GRACE_S = 5.0
COOPERATE_S = 1.0  # after a timeout or Ctrl-C: how long before threads are stopped by force
_POLL_S = 0.05  # wake-up interval while waiting, so Ctrl-C in the caller is seen quickly


class Aborted(Exception):
    """Raised by a worker that gave up because `abort` was set (a peer failed first)."""


class Stopped(BaseException):
    """Raised inside a worker thread that ignored `abort` (see the module docstring); a
    BaseException, so that a learner's `except Exception:` does not swallow it."""


class _Job:
    """One call of `run`: results, errors and a count of devices still running."""

    def __init__(self, n: int) -> None:
        self.results: list = [None] * n
        self.errors: list[tuple[int, int, BaseException]] = []  # (order, device, exc)
        self.running = set(range(n))
        self.cond = threading.Condition()
        self._order = 0

    def finish(self, device: int, result=None, error: BaseException | None = None) -> None:
        with self.cond:
            if error is None:
                self.results[device] = result
            else:
                self.errors.append((self._order, device, error))
                self._order += 1
            self.running.discard(device)
            self.cond.notify_all()


_STOP = object()


def _worker_loop(tasks: queue.SimpleQueue, device: int, cpus: set[int] | None) -> None:
    # Must not reference the pool object, so a forgotten pool can be garbage collected
    # (its finalizer then stops this loop).
    import torch

    torch.set_num_threads(1)
    if cpus is not None:  # on Linux, pid 0 is the calling thread: only this one moves
        os.sched_setaffinity(0, cpus)
    item = None
    while item is not _STOP:
        try:
            item = tasks.get()
            if item is not _STOP:
                fn, job = item  # put there by run()
                _run_one(fn, job, device)
                # keep no reference to the task (and the pool behind it) while idle
                item = fn = job = None
        except Stopped:  # meant for a task that had just ended: the pool is closing anyway
            pass


def _run_one(fn: Callable, job: _Job, device: int) -> None:
    try:
        result = fn()
    except BaseException as exc:  # noqa: BLE001 - reported to the caller, never lost
        exc.__worker_traceback__ = traceback.format_exc()  # type: ignore[attr-defined]
        job.finish(device, error=exc)
    else:
        job.finish(device, result=result)


def _stop_threads(
    queues: list[queue.SimpleQueue], threads: list[threading.Thread], abort: threading.Event
) -> None:
    abort.set()  # a worker still blocked in a task should give up
    for q in queues:
        q.put(_STOP)
    for t in threads:
        if t is not threading.current_thread():
            t.join(timeout=ABORT_GRACE_S)
    release_memory()


def release_memory() -> None:
    """Give the memory malloc keeps for reuse back to the system (glibc's malloc_trim).

    Freed tensors stay with the allocator, ready for the next step of the same size; a
    closed pool's next step never comes, so closing a pool returns its share. (Calling it
    between steps would cost the next step its page faults again.)
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# glibc's mallopt parameter numbers (malloc.h), and the largest mmap threshold it accepts
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_MMAP_MAX = 32 * 2**20


def _mallopt(param: int, value: int) -> bool:
    """glibc's mallopt; False where the C library has none (macOS, Windows) or refuses."""
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(param, value))
    except (OSError, AttributeError):
        return False


@functools.cache
def _few_malloc_arenas() -> None:
    """Let all device threads share two malloc arenas (what MALLOC_ARENA_MAX=2 does).

    glibc gives each new thread its own arena, and each arena keeps memory it has freed:
    16 device threads training on a large batch held about 1.5x the memory they needed.
    Only arenas made after the call are affected, so it runs before the first pool's
    threads start. Elsewhere than glibc on Linux this does nothing.
    """
    _mallopt(_M_ARENA_MAX, 2)


@functools.cache
def keep_freed_memory() -> bool:
    """Make the C allocator keep what a step frees for the next step, as a GPU's caching
    allocator does (PyTorch's CUDA allocator keeps its blocks between steps).

    By default glibc hands an arena's freed top back to the system and maps blocks over
    128 KB afresh, so each step of the device threads faulted its activations in again,
    page by page, inside the devices' measured compute: 4,000-9,000 page faults per step of
    8 data-parallel workers, against none for one thread reusing its memory. Kept (never
    trimmed while the pool runs; blocks up to 32 MB from the arenas), a steady step faults
    nothing; a closed pool still gives its memory back (`release_memory`). Once per process;
    False where it cannot be done (no glibc).
    """
    return _mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) and _mallopt(_M_MMAP_THRESHOLD, _MMAP_MAX)


_process_core: int | None = None  # the core this process's turn-taking devices share


def _one_cpu() -> set[int] | None:
    """The core this process's threads that take turns run on (None where the system cannot
    pin a thread: they then run wherever it puts them).

    Chosen by the process's first such pool, as the core the calling thread runs on then:
    two processes running at the same moment run on two different cores, so two graders'
    kernels (`grade -j 2`) or two lessons do not pile their devices onto one core while the
    other idles (as always taking the lowest did). Every later pool of the process takes the
    same core: set-ups compared with each other (one worker against eight) must be timed on
    one core, and a new pool's threads push the caller onto the other core, so "the core it
    runs on now" put a command's baseline and its workers on two cores every time, whose
    speeds differ by up to 15% from second to second on a shared host.
    """
    global _process_core
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    if _process_core not in allowed:
        here = _current_cpu()
        _process_core = here if here in allowed else min(allowed)
    return {_process_core}


def _forget_process_core() -> None:
    """A forked child is another process: it chooses its own core."""
    global _process_core
    _process_core = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_process_core)


def on_the_devices_core(fn: Callable[[], T]) -> T:
    """`fn()` on the calling thread, moved for the call onto the core this process's
    turn-taking devices share (`_one_cpu`), and back: to measure that core, not the other."""
    cpus = _one_cpu()
    if cpus is None:
        return fn()
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        return fn()
    finally:
        os.sched_setaffinity(0, before)


def _current_cpu() -> int:
    """The core the calling thread runs on (glibc's sched_getcpu), or -1 where unknown."""
    try:
        return int(ctypes.CDLL(None).sched_getcpu())
    except (OSError, AttributeError, TypeError):
        return -1


def _raise_in(thread: threading.Thread, exc: type[BaseException]) -> None:
    """Raise `exc` inside `thread` at its next Python instruction (CPython's only way to
    stop a thread from outside; C code it is in finishes first)."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(exc)
        )


@contextlib.contextmanager
def _signals_held():
    """While the caller stops a run, its own alarm (the grader's time limit fires every 50 ms
    until the call returns) and Ctrl-C are ignored: they would interrupt the stopping. Only
    the main thread has signal handlers; elsewhere this does nothing."""
    held = {}
    if threading.current_thread() is threading.main_thread():
        for name in ("SIGALRM", "SIGINT"):
            number = getattr(signal, name, None)
            if number is not None and signal.getsignal(number) is not None:
                held[number] = signal.signal(number, lambda *_: None)
    try:
        yield
    finally:
        for number, handler in held.items():
            signal.signal(number, handler)


class DeviceThreads:
    """`num_devices` persistent worker threads; `run(fns)` runs fns[d] on thread d."""

    def __init__(self, num_devices: int, name: str = "device", one_core: bool = False) -> None:
        # at most MAX_THREADS (16): the most any command runs; thousands would not even start
        validation.integer(num_devices, "num_devices", 1, validation.MAX_THREADS)
        _few_malloc_arenas()
        self.num_devices = num_devices
        self.name = name
        self.abort = threading.Event()
        self.cpus = _one_cpu() if one_core else None
        self._core = threading.Lock() if one_core else None  # whose turn it is (`turn`)
        keep_freed_memory()
        self._queues: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(num_devices)]
        self._threads = [
            # daemon only as a last resort: close() and the finalizer join them properly
            threading.Thread(
                target=_worker_loop,
                args=(self._queues[d], d, self.cpus),
                name=f"{name}-{d}",
                daemon=True,
            )
            for d in range(num_devices)
        ]
        for t in self._threads:
            t.start()
        self._job: _Job | None = None
        self._closed = False
        # Closes the pool when it is garbage collected or at interpreter exit (atexit).
        self._finalizer = weakref.finalize(
            self, _stop_threads, self._queues, self._threads, self.abort
        )

    def turn(self) -> contextlib.AbstractContextManager:
        """Hold the core for one device's run of compute with no communication inside it
        (a data-parallel worker's forwards and backwards): no other device of the pool
        computes meanwhile, so the operating system does not switch to another device halfway
        and the run finds its own data in the caches, as on its own accelerator. Taking
        turns at the operating system's pace (every few milliseconds) cost 8 data-parallel
        workers about 5% more CPU time each than one device doing the same micro-batches in
        a row. Only on a pool whose devices share one core; elsewhere it does nothing. Never
        wait for another device inside it: that device may be waiting for the core."""
        return self._core if self._core is not None else contextlib.nullcontext()

    # -- running -------------------------------------------------------------------------

    def run(self, fns: Sequence[Callable[[], T]], timeout: float | None = None) -> list[T]:
        """Run `fns[d]` on device `d` for all d at once; return their results in order.

        Raises `WorkerError` (chaining the first real exception) if any function raised,
        or if `timeout` seconds pass with devices still running.
        """
        if self._closed:
            raise WorkerError(f"{self.name} threads are closed; create a new DeviceThreads")
        fns = list(fns)
        if not 1 <= len(fns) <= self.num_devices:
            raise CourseInputError(
                f"fns must hold 1 to {self.num_devices} callables (one per device), got {len(fns)}"
            )
        if timeout is not None and timeout <= 0:
            raise CourseInputError(f"timeout must be > 0 seconds or None, got {timeout!r}")
        self._wait_previous()
        self.abort.clear()
        job = _Job(len(fns))
        self._job = job
        for d, fn in enumerate(fns):
            self._queues[d].put((fn, job))

        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            timed_out = self._wait(job, deadline)
        except BaseException:  # Ctrl-C, or the grader's time limit, in the waiting caller
            self.stop(job)
            raise
        if timed_out:
            with job.cond:
                stuck = sorted(job.running)
            still = self.stop(job)
            where = ", ".join(str(d) for d in stuck)
            msg = f"timed out after {timeout:g} s with {self.name} {where} still running"
            if still:
                msg += f" ({', '.join(map(str, still))} did not stop after abort)"
            raise WorkerError(msg)
        if job.errors:
            raise _error_for(job.errors)
        return job.results

    def _wait(self, job: _Job, deadline: float | None) -> bool:
        """Wait until every device finished; True if `deadline` passed first.

        On the first error, set `abort` so blocked peers give up instead of hanging.
        """
        with job.cond:
            while job.running:
                if job.errors and not self.abort.is_set():
                    self.abort.set()
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return True
                wait = _POLL_S if deadline is None else min(_POLL_S, deadline - now)
                job.cond.wait(wait)
        return False

    def stop(self, job: _Job) -> list[int]:
        """Stop a run the caller gave up on: set `abort`, wait `COOPERATE_S` for the threads
        to notice; then raise `Stopped` inside those that ignore it, again every poll for
        `ABORT_GRACE_S`, and close the pool (a stop may still be on its way to one of them).
        Returns the devices still running after all that (stuck inside a long C call)."""
        self.abort.set()
        with _signals_held():
            if not self._wait(job, time.monotonic() + COOPERATE_S):
                return []
            deadline = time.monotonic() + ABORT_GRACE_S
            while True:
                with job.cond:
                    running = sorted(job.running)
                if not running or time.monotonic() >= deadline:
                    break
                for d in running:
                    _raise_in(self._threads[d], Stopped)
                self._wait(job, min(deadline, time.monotonic() + _POLL_S))
            self.close()
        return running

    def _wait_previous(self) -> None:
        """A previous run that timed out may still occupy threads: wait, or refuse."""
        job = self._job
        if job is None:
            return
        self.abort.set()
        if self._wait(job, time.monotonic() + ABORT_GRACE_S):
            with job.cond:
                busy = ", ".join(map(str, sorted(job.running)))
            raise WorkerError(
                f"{self.name} {busy} still busy with an earlier task that ignores abort; "
                "close this pool and create a new one"
            )
        self._job = None

    # -- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        """Stop and join the threads. Safe to call twice."""
        if not self._closed:
            self._closed = True
            self._finalizer()

    def __enter__(self) -> DeviceThreads:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running"
        return f"DeviceThreads({self.num_devices}, name={self.name!r}, {state})"


def _error_for(errors: list[tuple[int, int, BaseException]]) -> WorkerError:
    """The caller-side error for a failed run: the first real failure, not the give-ups."""
    real = [e for e in errors if not isinstance(e[2], Aborted)] or errors
    _, device, exc = min(real, key=lambda e: e[0])
    if isinstance(exc, WorkerError | ScheduleError) and f"device {device}" in str(exc):
        # Already says where it happened (the executor adds action and stage); keep it.
        err = WorkerError(str(exc))
    else:
        err = WorkerError(f"device {device} failed: {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    err.device = device  # type: ignore[attr-defined]
    return err


class ThreadRunner:
    """A runner of one parallelism that owns a `DeviceThreads` pool (`self.threads`):
    `close()` stops its threads, and `with Runner(...) as r:` closes it on the way out.
    Runners whose threads talk through a `ThreadGroup` (`self.group`) run a step with
    `run_jobs`."""

    threads: DeviceThreads
    group: ThreadGroup
    workers: int
    clock: str
    links: Links | None

    def _keep_workers_and_clock(
        self, workers: int, most: int, clock: str, links: Links | None
    ) -> None:
        """Check and keep what every runner of `workers` threads is built with: 1..`most`
        workers and the clock its timelines use (with the `links` it charges messages to)."""
        self.clock, self.links = check_clock(clock), links
        self.workers = validation.integer(workers, "workers", 1, most)

    def _start_threads(
        self, name: str, timeout: float, one_core: bool, threads: int | None = None
    ) -> None:
        """Start one thread per worker (`threads` of them if a worker needs more) and the
        group the workers talk through; a failed worker aborts the group's waits. On the
        virtual clock (`one_core`) the threads take turns on one core (see the module)."""
        from course_utils.threads.collectives import ThreadGroup  # it imports this module

        self.threads = DeviceThreads(threads or self.workers, name=name, one_core=one_core)
        self.group = ThreadGroup(self.workers, abort=self.threads.abort, timeout=timeout)

    def _timeline(self, trace: Recorder, **fields) -> Timeline:
        """The step `trace` recorded, one row per worker, on the runner's clock and links
        (`fields`: its name, meta, ...)."""
        return trace.timeline(self.clock, self.links, num_devices=self.workers, **fields)

    def run_jobs(
        self,
        jobs: Sequence[Callable[[], T]],
        recording: contextlib.AbstractContextManager | None = None,
    ) -> list[T]:
        """Run one job per thread (inside `recording`, a trace Recorder, if given). A failed
        run drops the messages it half delivered, so that the next call starts clean."""
        try:
            with recording if recording is not None else contextlib.nullcontext():
                return self.threads.run(jobs)
        except Exception:
            self.group.reset()
            raise

    def close(self) -> None:
        self.threads.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
