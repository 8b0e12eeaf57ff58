"""A function of a worker file on real processes, started the way `torchrun` starts a script.

    run = run_worker("ring_worker.py", "ring_sum", world=2, rank_args=[(x0,), (x1,)])
    run.returned          # what ring_sum returned on each rank, rank 0 first

Each rank is a fresh `python` with torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR=127.0.0.1, MASTER_PORT), so the file's own `dist.init_process_group("gloo")` finds
the others; it imports the file, calls the function with its arguments and sends back what it
returned, and its arguments as they are after the call (a model trained in place), as
parameters and tensors. The same file runs unchanged under `torchrun --nproc-per-node=2`.
A function defined in a notebook cannot be pickled into another process: the worker is a file
(`%%writefile`). This process holds the rendezvous store, as torchrun's agent does
(`TORCHELASTIC_USE_AGENT_STORE`), so no port can be taken between choosing and binding it.

Every rank reports its `torch.distributed` calls as it makes them (`_trace`): which, with whom,
how many bytes, from which line of the file. That is what names a deadlock within seconds
(`STALL_S`): when no rank is computing, each one waits inside a call or has finished, and
nothing has moved for a while, nobody is left to move; the message says who waits in which
call for whom. A rank that raises stops the run with its error and line; the run's `timeout`
stops a rank that never ends. Nothing outlives a run: each rank is its own process group, killed
(SIGKILL) when the run ends however it ends (an interrupt, the grader's time limit), and dies
with this process (Linux's PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ast
import contextlib
import json
import linecache
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from course_utils.distributed.cluster import HOST, die_with_parent
from course_utils.distributed.scratch import scratch_folder
from course_utils.errors import CourseInputError, WorkerError

MAX_RANKS = 4
STALL_S = 3.0  # every rank waiting in a call, nothing moving: a deadlock
POLL_S = 0.05
BLOCKING = (
    "init_process_group", "send", "recv", "barrier", "all_reduce", "broadcast", "reduce",
    "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "all_to_all", "all_to_all_single", "gather", "scatter", "all_gather_object",
    "broadcast_object_list", "monitored_barrier",
)  # fmt: skip
POSTED = ("isend", "irecv")  # return at once; the wait is where they block
PEER = {"send": "dst", "isend": "dst", "recv": "src", "irecv": "src"}
POINT_TO_POINT = ("send", "isend", "recv", "irecv")
# What torch itself prints on a rank, not the learner: gloo's C++ greeting at every rendezvous.
NOISE = re.compile(r"^\[Gloo\] Rank \d+ is connected to")
CONNECTION = re.compile(r"Connection closed by peer|Connection reset|Broken pipe|ECONNRESET")
_BOOT = (
    "import sys\n"
    "from course_utils.distributed.workers import rank_main\n"
    "rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))\n"
)


@dataclass
class WorkerRun:
    """What a run did, rank by rank: plain data (tensors, dicts of parameters)."""

    world: int
    returned: list  # what the function returned on each rank (None where it did not return)
    arguments: list  # each rank's arguments after the call; a model as {name: parameter}
    calls: list[list[dict]]  # each rank's torch.distributed calls: {"op", "peer", "bytes", "line"}
    output: list[str]  # what each rank printed
    failure: dict | None = None  # {"kind", "rank", "message"}: raised, deadlock, timeout, ...
    seconds: float = 0.0
    pids: list[int] = field(default_factory=list)
    ready_s: list[float] = field(default_factory=list)  # from the start to each rank's first line

    def evidence(self) -> dict:
        """All but the output and the timings: what a check judges (`checks.wire` carries it)."""
        keys = ("world", "returned", "arguments", "calls", "failure")
        return {key: getattr(self, key) for key in keys}

    def show(self) -> None:
        """Print what each rank printed, each line after its rank, as torchrun's `--tee` does."""
        for rank, text in enumerate(self.output):
            for line in text.splitlines():
                print(f"[rank {rank}] {line}")


class Worker:
    """`function` of the worker file `path`, run on `world` processes each time it is called:

        ring = Worker("ring_worker.py", "ring_sum")
        ring(torch.ones(3))            # every rank gets the same arguments: what each returned
        ring.run(rank_args=[...])      # or each its own: the whole `WorkerRun`

    What a check is given: it runs the worker on its own cases (`checks.processes`)."""

    def __init__(self, path: str | os.PathLike, function: str = "main", world: int = 2) -> None:
        self.path, self.function = Path(path), _identifier(function)
        self.world = _ranks(world)
        self.__name__ = f"{self.path.name}:{self.function}"

    def run(self, *args, rank_args: Sequence[Sequence] | None = None, **options) -> WorkerRun:
        return run_worker(self.path, self.function, self.world, args, rank_args, **options)

    def __call__(self, *args: Any) -> list:
        return self.run(*args).returned

    def __repr__(self) -> str:
        return f"Worker({str(self.path)!r}, {self.function!r}, world={self.world})"


def _identifier(name: object) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise CourseInputError(f"function must be the name of a function in the file, got {name!r}")
    return name


def _ranks(world: object) -> int:
    if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= MAX_RANKS:
        raise CourseInputError(f"world must be an integer from 1 to {MAX_RANKS}, got {world!r}")
    return world


def run_worker(
    path: str | os.PathLike,
    function: str = "main",
    world: int = 2,
    args: Sequence = (),
    rank_args: Sequence[Sequence] | None = None,
    timeout: float = 60.0,
    echo: bool = True,
    raise_failure: bool = True,
) -> WorkerRun:
    """Run `function(*args)` of the file `path` on `world` fresh processes (rank r gets
    `rank_args[r]` instead, if given) and return the run (see the module docstring).

    `echo` prints what the ranks printed. A failure (a rank raised, a deadlock, past `timeout`
    seconds) raises WorkerError with its one line, or with `raise_failure=False` is the run's
    `failure`. A function still raising NotImplementedError (an exercise's stub) raises it."""
    path, function, world = Path(path), _identifier(function), _ranks(world)
    if not isinstance(timeout, int | float) or not timeout > 0:
        raise CourseInputError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    every = [tuple(args)] * world if rank_args is None else [tuple(a) for a in rank_args]
    if len(every) != world:
        raise CourseInputError(f"rank_args must hold a tuple per rank ({world}), got {len(every)}")
    start = time.monotonic()
    problem = _read_file(path, function)
    if problem is not None:
        run = WorkerRun(world, [None] * world, every, [[] for _ in every], [""] * world, problem)
    else:
        run = _launch(path.resolve(), function, every, timeout)
    run.seconds = time.monotonic() - start
    if echo:
        run.show()
    if run.failure is not None and run.failure["kind"] == "not answered":
        raise NotImplementedError()
    if run.failure is not None and raise_failure:
        raise WorkerError(run.failure["message"])
    return run


def _read_file(path: Path, function: str) -> dict | None:
    """Why the file cannot run `function`, found without starting a process: missing, a
    syntax error, no such function, or the function is still an exercise's stub."""
    if not path.is_file():
        return {
            "kind": "missing",
            "rank": None,
            "message": f"there is no file {str(path)!r}: run the cell that writes it (%%writefile)",
        }
    text = path.read_text(errors="replace")
    try:
        tree = ast.parse(text, str(path))
    except SyntaxError as exc:
        said = f"{path.name} line {exc.lineno}: SyntaxError: {exc.msg}"
        return {"kind": "raised", "rank": None, "message": said}
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    if not found and not re.search(rf"\b{function}\b", text):
        return {"kind": "missing", "rank": None, "message": f"{path.name} has no `{function}`"}
    stub = any(
        isinstance(s, ast.Raise) and "NotImplementedError" in ast.unparse(s.exc or s)
        for s in (found[-1].body if found else [])
    )
    return {"kind": "not answered", "rank": None, "message": ""} if stub else None


# --------------------------------------------------------------------------- this process


def _launch(path: Path, function: str, every: list[tuple], timeout: float) -> WorkerRun:
    world = len(every)
    job = scratch_folder("worker")  # removed below; a killed run's, by the next run
    store = dist.TCPStore(HOST, 0, world, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout))  # fmt: skip
    env = {
        **os.environ,
        "MASTER_ADDR": HOST,
        "MASTER_PORT": str(store.port),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "TORCHELASTIC_USE_AGENT_STORE": "True",  # the store is this process's, as torchrun's
        "PYTHONUNBUFFERED": "1",  # a rank stopped in a deadlock has printed all it printed
        "OMP_NUM_THREADS": "1",
        "COURSE_WORKER_FILE": str(path),
        "COURSE_WORKER_FUNCTION": function,
    }
    loopback = {"linux": "lo", "darwin": "lo0"}.get(sys.platform)
    if loopback:  # stay on loopback: a host name may have no address (a sandbox has none)
        env["GLOO_SOCKET_IFNAME"] = loopback
    torch.save(every, job / "inputs.pt")
    procs: list[subprocess.Popen] = []
    watch = _Watch(job, world, path)
    watch.launched = time.time()  # the ranks' clock (one clock on one machine)
    try:
        for rank in range(world):
            with open(job / f"rank{rank}.out", "wb") as out:  # its own process group (0):
                procs.append(subprocess.Popen(  # stopped with whatever it started
                    [sys.executable, "-c", _BOOT, str(job), str(rank), str(os.getpid())],
                    env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}, stdout=out,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, process_group=0,
                ))  # fmt: skip
        failure = watch.until_done(procs, timeout)
        _stop(procs)
        return watch.collect(procs, failure)
    finally:  # also when interrupted (Ctrl-C, the grader's time limit): none may be left
        _stop(procs)
        del store
        shutil.rmtree(job, ignore_errors=True)  # a rank it never heard of sees it gone, exits


def _stop(procs: list[subprocess.Popen]) -> None:
    """Kill every rank's process group and reap it: nothing of the run is left. An interrupt
    in the middle (an alarm, Ctrl-C) is raised once every rank is gone."""
    interrupted: BaseException | None = None
    for _ in range(1000):
        try:
            _kill(procs)
            break
        except BaseException as exc:  # finish the job first, then raise it
            interrupted = interrupted or exc
    if interrupted is not None:
        raise interrupted


def _kill(procs: list[subprocess.Popen]) -> None:
    left = [p for p in procs if not getattr(p, "course_stopped", False)]
    for p in left:  # its group: the rank, and whatever it started, even once it has ended
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
    for p in left:
        p.wait()
        p.course_stopped = True  # type: ignore[attr-defined]  # its group id may be reused now


class _Watch:
    """Reads what each rank reports as it goes (a file of JSON lines per rank)."""

    def __init__(self, job: Path, world: int, worker: Path) -> None:
        self.job, self.world, self.worker = job, world, str(worker)
        self.events: list[list[dict]] = [[] for _ in range(world)]
        self._read = [0] * world
        self.moved = time.monotonic()  # when a rank last reported anything
        self.launched = time.time()

    def _poll(self) -> None:
        for rank in range(self.world):
            path = self.job / f"rank{rank}.events"
            try:
                with open(path, "rb") as f:
                    f.seek(self._read[rank])
                    data = f.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1  # a line still being written is read next time
            if end:
                self._read[rank] += end
                self.events[rank] += [json.loads(x) for x in data[:end].splitlines()]
                self.moved = time.monotonic()

    def waiting(self, rank: int) -> dict | None:
        """The call rank `rank` is blocked in, if it is in one."""
        inside = None
        for e in self.events[rank]:
            if e["event"] == "call":
                inside = e
            elif e["event"] == "return":
                inside = None
        return inside

    def until_done(self, procs: list[subprocess.Popen], timeout: float) -> dict | None:
        """Wait until every rank has finished; the failure that ended the run early, if any."""
        start = time.monotonic()
        while True:
            time.sleep(POLL_S)
            self._poll()
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                time.sleep(0.2)  # a peer's error may come with it: let both be read
                self._poll()
                return self._failed([p.poll() for p in procs])
            if all(c == 0 for c in codes):
                return None
            exits = [c == 0 for c in codes]
            blocked = [exits[r] or self.waiting(r) is not None for r in range(self.world)]
            if all(blocked) and time.monotonic() - self.moved > STALL_S:
                return self._deadlock(exits)
            if time.monotonic() - start > timeout:
                return self._timeout(procs, exits, timeout)

    def _failed(self, codes: list[int | None]) -> dict:
        """The cause, in this order: a rank's own error (the first); a rank that died without
        one; a rank whose peer had finished, so nobody was left to answer; a lost connection."""
        errors = [
            (r, e) for r in range(self.world) for e in self.events[r] if e["event"] == "error"
        ]
        own = sorted((e["t"], r, e) for r, e in errors if not CONNECTION.search(e["message"]))
        if own:
            _, rank, e = own[0]
            if e["type"] == "NotImplementedError":
                return {"kind": "not answered", "rank": rank, "message": ""}
            said = f"{e['type']}: {e['message']}" if e["message"] else e["type"]
            return {"kind": "raised", "rank": rank,
                    "message": f"rank {rank} raised {said}{_where(e)}"}  # fmt: skip
        erred = {r for r, _ in errors}
        died = [r for r, c in enumerate(codes) if c not in (None, 0) and r not in erred]
        if died:
            code = codes[died[0]]
            assert code is not None
            why = f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"
            return {"kind": "exited", "rank": died[0],
                    "message": f"rank {died[0]} exited with {why}"}  # fmt: skip
        done = [r for r in range(self.world) if any(e["event"] == "done" for e in self.events[r])]
        if done:  # a peer that left early closed its connections under a rank that waited
            return self._deadlock([r in done for r in range(self.world)], self._last_call)
        rank, e = errors[0]
        said = f"{e['type']}: {e['message']}"
        return {"kind": "raised", "rank": rank, "message": f"rank {rank} raised {said}{_where(e)}"}

    def _last_call(self, rank: int) -> dict | None:
        calls = [e for e in self.events[rank] if e["event"] == "call"]
        return calls[-1] if calls else None

    def _deadlock(self, exits: list[bool], inside=None) -> dict:
        inside = inside or self.waiting
        parts = []
        for r in range(self.world):
            if exits[r]:
                parts.append(f"rank {r} has finished")
            else:
                parts.append(f"rank {r} waits in {_describe(inside(r))}")
        first = next(r for r in range(self.world) if not exits[r])
        return {"kind": "deadlock", "rank": first, "message": "deadlock: " + "; ".join(parts)}

    def _timeout(self, procs: list[subprocess.Popen], exits: list[bool], timeout: float) -> dict:
        running = [r for r in range(self.world) if not exits[r] and self.waiting(r) is None]
        for r in running:  # each dumps its stack (faulthandler, `rank_main`): where it is
            with contextlib.suppress(ProcessLookupError):
                os.kill(procs[r].pid, signal.SIGUSR1)
        time.sleep(0.5 if running else 0)
        parts = []
        for r in range(self.world):
            inside = self.waiting(r)
            if exits[r]:
                parts.append(f"rank {r} had finished")
            elif inside is not None:
                parts.append(f"rank {r} was waiting in {_describe(inside)}")
            else:
                at = self._running_at(r)
                if not self.events[r]:
                    parts.append(f"rank {r} was still starting (a fresh Python importing torch)")
                else:
                    parts.append(f"rank {r} was running{f' {path_line(at)}' if at else ''}")
        said = f"the ranks ran past {timeout:g} s and were stopped: " + "; ".join(parts)
        return {"kind": "timeout", "rank": next(r for r in range(self.world) if not exits[r]),
                "message": said}  # fmt: skip

    def _running_at(self, rank: int) -> dict | None:
        """Where rank `rank` is in the worker file, from the stack it dumped (innermost first)."""
        try:
            text = (self.job / f"rank{rank}.stack").read_text(errors="replace")
        except OSError:
            return None
        for file, line in re.findall(r'File "(.+)", line (\d+) in ', text):
            if file == self.worker:
                return {"file": file, "line": int(line)}
        return None

    def collect(self, procs: list[subprocess.Popen], failure: dict | None) -> WorkerRun:
        self._poll()
        returned, arguments, output = [], [], []
        for rank in range(self.world):
            saved = self.job / f"rank{rank}.pt"
            result = torch.load(saved, weights_only=False) if saved.exists() and not failure else {}
            returned.append(result.get("returned"))
            arguments.append(result.get("arguments"))
            text = (self.job / f"rank{rank}.out").read_text(errors="replace")
            output.append("".join(ln for ln in text.splitlines(True) if not NOISE.match(ln)))
        calls = [
            [{k: e.get(k) for k in ("op", "peer", "bytes", "line")} for e in events
             if e["event"] == "call" and not e["op"].startswith("wait")]
            for events in self.events
        ]  # fmt: skip
        ready = [events[0]["t"] - self.launched for events in self.events if events]
        return WorkerRun(self.world, returned, arguments, calls, output, failure,
                         pids=[p.pid for p in procs], ready_s=ready)  # fmt: skip


def path_line(e: dict) -> str:
    """'ring_worker.py line 9 (`dist.send(x, right)`)' for a reported event."""
    text = linecache.getline(e["file"], e["line"]).strip() if e.get("file") else ""
    code = f" (`{text}`)" if text and len(text) <= 80 else ""
    return f"{Path(e['file']).name} line {e['line']}{code}"


def _where(e: dict) -> str:
    return f", at {path_line(e)}" if e.get("line") else ""


def _describe(e: dict | None) -> str:
    """'send to rank 1, at ring_worker.py line 9 (...)' for the call a rank waits in."""
    if e is None:
        return "nothing"
    op = e["op"].removeprefix("wait ")
    if op in POINT_TO_POINT:
        peer = e.get("peer")
        whom = "any rank" if peer is None else f"rank {peer}"
        what = f"{op} {'to' if op in ('send', 'isend') else 'from'} {whom}"
        what = f"the wait for its {what}" if e["op"].startswith("wait") else what
    elif op == "init_process_group":
        what = "init_process_group (waiting for every rank to join)"
    else:
        what = f"{op} (a collective: every rank must call it)"
    return f"{what}{_where(e)}"


# --------------------------------------------------------------------------- each rank


class _Report:
    """This rank's account of itself: one JSON line per event, appended as it happens."""

    def __init__(self, path: Path, worker: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.worker = worker
        self.local = threading.local()

    def __call__(self, event: str, **data) -> None:
        line = json.dumps({"event": event, "t": time.time(), **data}, default=str) + "\n"
        os.write(self.fd, line.encode())

    def line(self) -> int | None:
        """The line of the worker file that is running now (the innermost one)."""
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_filename == self.worker:
                return frame.f_lineno
            frame = frame.f_back
        return None


class _Posted:
    """An `isend`/`irecv`'s request (or an `async_op=True` collective's): its wait is traced."""

    def __init__(self, work, report: _Report, op: str, peer: int | None) -> None:
        self._work, self._report, self._op, self._peer = work, report, op, peer

    def wait(self, *args, **kwargs):
        r = self._report
        r("call", op=f"wait {self._op}", peer=self._peer, file=r.worker, line=r.line())
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            r("return")

    def __getattr__(self, name: str):
        return getattr(self._work, name)


def _trace(report: _Report) -> None:
    """Wrap the calls of `torch.distributed` a worker makes, so each is reported (its own
    calls only: a call torch makes inside another is not)."""
    import inspect

    def wrap(name: str, fn):
        signature = inspect.signature(fn)

        def traced(*args, **kwargs):
            if getattr(report.local, "inside", False):
                return fn(*args, **kwargs)
            try:
                bound = signature.bind_partial(*args, **kwargs).arguments
            except TypeError:
                bound = {}
            peer = bound.get(PEER.get(name, ""))
            tensor = next((v for v in bound.values() if isinstance(v, torch.Tensor)), None)
            size = tensor.numel() * tensor.element_size() if tensor is not None else None
            line, async_op = report.line(), bool(bound.get("async_op")) or name in POSTED
            report("call", op=name, peer=peer, bytes=size, file=report.worker, line=line)
            report.local.inside = True
            try:
                work = fn(*args, **kwargs)
            finally:
                report.local.inside = False
                report("return")
            if async_op and work is not None and hasattr(work, "wait"):
                return _Posted(work, report, name, peer)
            return work

        traced.__name__ = traced.__qualname__ = name
        traced.__doc__ = fn.__doc__
        return traced

    for name in (*BLOCKING, *POSTED):
        original = getattr(dist, name, None)
        if original is not None:
            setattr(dist, name, wrap(name, original))


def _plain(value: Any) -> Any:
    """What a rank sends back: a model as its parameters by name, tensors detached."""
    if isinstance(value, torch.nn.Module):
        inner = getattr(value, "module", value)  # DistributedDataParallel wraps the model
        return {n: p.detach().clone() for n, p in inner.named_parameters()}
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _leave_with(folder: Path) -> None:
    """Exit as soon as the run's folder is gone: the launcher has ended the run (a rank it
    could not record, interrupted while it started it, does not outlive it)."""
    while folder.is_dir():
        time.sleep(0.5)
    os._exit(1)


def rank_main(job: str, rank: int, parent: int) -> None:
    """A rank's life: report, load its arguments, import the worker file, call the function,
    send back what it returned and its arguments; an error is reported with its line."""
    import faulthandler
    import importlib.util
    import traceback

    die_with_parent(parent)
    torch.set_num_threads(1)  # one process = one device = one core's worth of work
    folder = Path(job)
    threading.Thread(target=_leave_with, args=(folder,), name="watch-job", daemon=True).start()
    worker, function = os.environ["COURSE_WORKER_FILE"], os.environ["COURSE_WORKER_FUNCTION"]
    report = _Report(folder / f"rank{rank}.events", worker)
    report("start")
    stack = open(folder / f"rank{rank}.stack", "w")  # noqa: SIM115 - open for the whole life
    faulthandler.register(signal.SIGUSR1, file=stack, all_threads=False)  # where it is, asked
    _trace(report)
    try:
        args = torch.load(folder / "inputs.pt", weights_only=False)[rank]
        name = Path(worker).stem if Path(worker).stem.isidentifier() else "worker"
        spec = importlib.util.spec_from_file_location(name, worker)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # what the file defines can be pickled by name
        spec.loader.exec_module(module)
        fn = getattr(module, function, None)
        if not callable(fn):
            raise AttributeError(f"{Path(worker).name} has no function `{function}`")
        returned = fn(*args)
        if dist.is_initialized():  # the file forgot to leave the group: leave it for it
            dist.destroy_process_group()
        torch.save({"returned": _plain(returned), "arguments": _plain(args)},
                   folder / f"rank{rank}.pt")  # fmt: skip
        report("done")
    except BaseException as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == worker]
        line = frames[-1].lineno if frames else None
        message = (str(exc).splitlines() or [""])[0][:300]
        report("error", type=type(exc).__name__, message=message, file=worker, line=line)
        sys.stdout.flush()
        os._exit(1)  # no interpreter shut-down that could wait on a stuck peer
    sys.stdout.flush()
    os._exit(0)
