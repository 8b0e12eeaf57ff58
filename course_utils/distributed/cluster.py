"""A group of real processes on this machine, joined in one gloo process group.

Up to lesson 12 every "device" is a thread. Here each device is an operating-system
process, as on a real cluster: processes find each other through a rendezvous address
(127.0.0.1 and a free TCP port) and talk through the gloo backend (CPU collectives; a GPU
cluster would use NCCL). Processes are started with `torch.multiprocessing` ("spawn"), so
job functions must be importable by name. A `Cluster` keeps its processes for several
jobs, since starting one costs seconds (each imports torch). Every wait is bounded, and
children are terminated (then killed) on any error or time-out, so nothing is left running.
"""

from __future__ import annotations

import contextlib
import os
import queue as queue_module
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from course_utils import validation
from course_utils.distributed.ports import HOST, free_port, port_is_free, resolve_port
from course_utils.errors import CourseInputError, WorkerError

__all__ = ["HOST", "MAX_WORKERS", "Cluster", "free_port", "port_is_free", "resolve_port", "spawn"]

MAX_WORKERS = validation.MAX_PROCESSES


# --------------------------------------------------------------------------- ports


def _hold_port(port: int, workers: int, timeout: float) -> dist.TCPStore:
    """The job's rendezvous store, served from this process on `port` (0: any free port).

    Binding is what reserves a port: two commands that both found port 47555 free would
    otherwise both spawn ranks, and the second's rank 0 would fail to listen seconds later.
    The parent binds it before spawning and holds it until the cluster closes; the ranks
    connect to it as clients.
    """
    try:
        return dist.TCPStore(
            HOST,
            port,
            world_size=workers,
            is_master=True,
            timeout=timedelta(seconds=timeout),
            wait_for_workers=False,
        )
    except RuntimeError as exc:  # DistNetworkError: EADDRINUSE, or no permission (port < 1024)
        reason = "is already in use" if "EADDRINUSE" in str(exc) else "cannot be opened"
        raise CourseInputError(
            f"port {port} {reason} on {HOST}: choose another port, "
            "or leave it out and a free one is picked"
        ) from None


# --------------------------------------------------------------------------- processes


def die_with_parent(parent: int) -> None:
    """Exit as soon as the process that started this one is gone.

    A parent killed with SIGKILL cannot tell its children anything, and a rank left behind
    would hold a core and a port for minutes. Linux can send us SIGKILL when the parent dies
    (PR_SET_PDEATHSIG); elsewhere, and in case the parent died before we asked, a thread
    watches the parent's pid.
    """
    if sys.platform == "linux":
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


@contextlib.contextmanager
def _starting_ranks() -> Iterator[None]:
    """Start processes that ignore SIGINT from their first instruction, and hold a SIGTERM
    back until every one of them has started.

    Ctrl-C in a terminal reaches the whole process group: the parent stops the ranks
    (Cluster.close), so a rank must not print a traceback of its own, not even while it is
    still importing torch. An ignored signal stays ignored across exec, and Python installs
    its KeyboardInterrupt handler only where SIGINT was left at the default.

    A SIGTERM (kill, a job scheduler) reaches the parent only. Acted on in the middle of
    starting a rank, it stopped the parent before it had written the rank its instructions:
    the rank printed "EOFError: Ran out of input" and was not among the ranks to stop. Held
    to the end of the starts, it stops the parent with every rank started, and close() stops
    them all. (A handler, unlike an ignored signal, is reset to the default across exec: the
    ranks still end on SIGTERM.)
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    previous_term = signal.signal(signal.SIGTERM, lambda signum, _: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if previous_term is not None:  # None: a handler Python did not install
            signal.signal(signal.SIGTERM, previous_term)
        if held:
            signal.raise_signal(signal.SIGTERM)


def _child(rank: int, world: int, port: int, inbox, outbox, timeout: float, parent: int) -> None:
    """Body of every spawned process: join the group once, then run jobs until told to stop."""
    die_with_parent(parent)
    # A rank's stdout is the parent's, where `distributed --json` writes its result: send
    # what a rank prints to stderr (gloo in torch 2.10 prints "[Gloo] Rank 0 is connected
    # to 1 peer ranks" from C++ on every rendezvous).
    os.dup2(2, 1)
    torch.set_num_threads(1)  # one process = one device = one core's worth of work
    loopback = {"linux": "lo", "darwin": "lo0"}.get(sys.platform)
    if loopback:  # stay on loopback: a hostname resolving to a LAN address can hang gloo
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
    try:
        wait = timedelta(seconds=timeout)
        store = dist.TCPStore(HOST, port, world, is_master=False, timeout=wait)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=wait)
        # (torch.distributed.pipelining is imported by the pipeline jobs that use it: about
        # 70 MB a rank that DDP, FSDP and ring attention do without.)

        outbox.put((rank, -1, "ok", None))  # "ready"
    except BaseException as exc:
        outbox.put((rank, -1, "error", _describe(exc)))
        return
    try:
        while (job := inbox.get()) is not None:
            job_id, fn, payload = job
            try:
                outbox.put((rank, job_id, "ok", fn(rank, world, payload)))
            except BaseException as exc:  # report everything: the parent decides what to raise
                outbox.put((rank, job_id, "error", _describe(exc)))
    finally:
        dist.destroy_process_group()


def _describe(exc: BaseException) -> tuple[str, str]:
    return f"{type(exc).__name__}: {exc}".splitlines()[0], traceback.format_exc()


class Cluster:
    """`workers` processes on this machine, joined in one gloo process group, reused for jobs.

    Starting a process costs seconds (a fresh interpreter imports torch), so a cluster
    is started once and runs many jobs, like the long-lived ranks of a real training job:

        with Cluster(2) as cluster:
            ddp = run_ddp(cluster=cluster)
            pipe = run_pipeline("1f1b", cluster=cluster)

    A job is a module-level function `fn(rank, world, payload)` run on every rank at once.
    Any failure or time-out tears the whole cluster down (a rank stuck in a collective
    cannot be rescued) and raises WorkerError; `close()` always leaves no process behind.
    """

    def __init__(self, workers: int = 2, port: int | None = None, timeout: float = 60.0):
        self.workers = validation.integer(workers, "workers", 1, MAX_WORKERS)
        if not isinstance(timeout, int | float) or not timeout > 0:
            raise CourseInputError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        self.timeout = float(timeout)
        self.port = resolve_port(port)
        self._asked_port = port is not None or bool(os.environ.get("MASTER_PORT"))
        self._store: dist.TCPStore | None = None
        self._procs: list = []
        self._jobs = 0

    @property
    def pids(self) -> list[int]:
        """Operating-system process ids of the ranks, rank 0 first."""
        return [p.pid for p in self._procs]

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def start(self) -> Cluster:
        """Spawn the processes and wait (bounded) until every rank has joined the group."""
        if self._procs:
            return self
        # Hold the port from here to close(): the learner's port, or any free one.
        self._store = _hold_port(self.port if self._asked_port else 0, self.workers, self.timeout)
        self.port = self._store.port
        ctx = mp.get_context("spawn")
        self._outbox = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(self.workers)]
        self._procs = [
            ctx.Process(
                target=_child,
                args=(
                    r,
                    self.workers,
                    self.port,
                    self._inboxes[r],
                    self._outbox,
                    self.timeout,
                    os.getpid(),
                ),
                daemon=True,  # if the notebook kernel dies, its ranks die with it
            )
            for r in range(self.workers)
        ]
        try:
            with _starting_ranks():
                for p in self._procs:
                    p.start()
            self._collect(-1, "start-up")
        except BaseException:
            self.close(now=True)
            raise
        return self

    def run(self, fn, payload: dict, timeout: float | None = None) -> list:
        """Run `fn(rank, world, payload)` on every rank; return the results by rank."""
        if not self._procs:
            self.start()
        if not self.alive:
            self.close()
            raise WorkerError("the cluster's processes are gone: start a new Cluster")
        self._jobs += 1
        try:
            for inbox in self._inboxes:
                inbox.put((self._jobs, fn, payload))
            return self._collect(self._jobs, fn.__name__, timeout)
        except BaseException:
            self.close(now=True)
            raise

    def _collect(self, job_id: int, what: str, timeout: float | None = None) -> list:
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        out: dict[int, object] = {}
        while len(out) < self.workers:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError(
                    f"{what} timed out after {timeout:g} s (ranks done: {sorted(out)})"
                )
            try:
                rank, jid, status, value = self._outbox.get(timeout=min(left, 0.5))
            except queue_module.Empty:
                for r, p in enumerate(self._procs):
                    if r not in out and p.exitcode is not None:
                        raise WorkerError(f"rank {r} exited with code {p.exitcode}") from None
                continue
            if jid != job_id:
                continue  # a late answer to an earlier job: ignore it
            if status == "error":
                last, tb = value
                message = f"rank {rank} failed: {last}"
                if os.environ.get("COURSE_DEBUG"):
                    message += "\n" + tb
                raise WorkerError(message)
            out[rank] = value
        return [out[r] for r in range(self.workers)]

    def close(self, now: bool = False) -> None:
        """Ask ranks to leave, then terminate and kill whatever is still there.

        `now`: terminate at once (after a failure or Ctrl-C a rank may be stuck in a
        collective and would never read the request to leave).
        """
        procs, self._procs = [p for p in self._procs if p.pid is not None], []
        for p, inbox in zip(procs, self._inboxes, strict=False):
            if p.is_alive() and not now:
                try:
                    inbox.put(None)
                except (ValueError, OSError):
                    pass
        for p in procs:
            p.join(timeout=0 if now else 2)
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=3)
            if p.is_alive():
                p.kill()
                p.join(timeout=3)
        for q in [*getattr(self, "_inboxes", []), getattr(self, "_outbox", None)]:
            if q is not None:
                q.close()
                q.cancel_join_thread()  # never block on undelivered messages to dead ranks
        self._store = None  # frees the port

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close(now=exc[0] is not None)

    def __del__(self) -> None:
        # A notebook cell re-run drops the old cluster: its processes must go with it.
        try:
            if getattr(self, "_procs", None):
                self.close()
        except Exception:
            pass  # interpreter shut-down: the daemon children are being reaped anyway


def spawn(fn, world: int, payload: dict, port: int | None = None, timeout: float = 60.0) -> list:
    """Run `fn(rank, world, payload)` once on a fresh cluster of `world` processes."""
    with Cluster(world, port, timeout) as cluster:
        return cluster.run(fn, payload)


def run_job(
    cluster: Cluster | None,
    fn: Callable[[int, int, dict], Any],
    workers: int,
    payload: dict,
    port: int | None,
    timeout: float,
) -> list:
    """On `cluster` if one is given (it must have `workers` ranks), else on a fresh one."""
    if cluster is None:
        return spawn(fn, workers, payload, port=port, timeout=timeout)
    if cluster.workers != workers:
        raise CourseInputError(
            f"workers must match the cluster's {cluster.workers} processes, got {workers}"
        )
    return cluster.run(fn, payload, timeout)


def worker_count(workers: int | None, cluster: Cluster | None) -> int:
    """`workers` if given, else the cluster's processes, else 2."""
    return workers if workers is not None else (cluster.workers if cluster else 2)
