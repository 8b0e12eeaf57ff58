"""The same model on real `torch.distributed` processes, checked against one process.

Up to lesson 08 every "device" is a thread. Here each device is an operating-system
process, as on a real cluster: processes find each other through a rendezvous address
(127.0.0.1 and a free TCP port), talk through the gloo backend (CPU collectives; a GPU
cluster would use NCCL), and run PyTorch's own parallel code:

- `run_ddp`       `DistributedDataParallel`: each rank takes its shard of the batch, and
                  the gradients are averaged with all-reduce during the backward pass.
- `run_pipeline`  `torch.distributed.pipelining`: `PipelineStage` + `ScheduleGPipe`,
                  `Schedule1F1B` or `ScheduleLoopedBFS`, or any course schedule exported
                  to PyTorch's CSV format (`course_utils.export`) and run on PyTorch's
                  `_PipelineScheduleRuntime`.

Both compare losses and gradients with a single-process full-batch computation of the
same model and batch (and, for pipelines, with the course's thread executor when it is
available), and return a measured `Timeline` built from each process's own timestamps
(`time.time_ns`, one clock for all processes on one machine), ready for
`course_utils.gantt.draw`.

Processes are started with `torch.multiprocessing` ("spawn"), so the worker functions
live here, importable by name. A `Cluster` keeps its processes for several runs, since
starting one costs seconds (each imports torch). Every wait is bounded, and children are
terminated (then killed) on any error or time-out, so nothing is left running.

CLI: `python -m course_utils distributed --workers N [--port P] [--json]` runs the DDP
comparison and prints workers, max_grad_diff and seconds (wall time of the whole run);
add `--pipeline gpipe|1f1b|breadth-first` to run the pipelining comparison instead, or
`--pipeline NAME --csv` to run any course schedule through the CSV export.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import queue as queue_module
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from course_utils.actions import Action, Schedule
from course_utils.errors import CourseInputError, WorkerError
from course_utils.timeline import Event, Timeline

HOST = "127.0.0.1"
MODELS = ("gpt", "mlp")
PIPELINES = ("gpipe", "1f1b", "breadth-first")
MAX_WORKERS = 8


# --------------------------------------------------------------------------- ports


def port_is_free(port: int) -> bool:
    """True if nothing on this machine holds `port` on 127.0.0.1 (we try to bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port the operating system says is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def resolve_port(port: int | None = None) -> int:
    """The rendezvous port: `port`, else $MASTER_PORT, else a free one. Busy -> clear error.

    We check before spawning: otherwise rank 0's TCP store fails inside a child process
    and the learner sees a long traceback about a socket instead of one line.
    """
    where = "port"
    if port is None and os.environ.get("MASTER_PORT"):
        where = "MASTER_PORT"
        try:
            port = int(os.environ["MASTER_PORT"])
        except ValueError:
            raise CourseInputError(
                f"MASTER_PORT must be a port number, got {os.environ['MASTER_PORT']!r}"
            ) from None
    if port is None:
        return free_port()
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise CourseInputError(f"{where} must be an integer from 1 to 65535, got {port!r}")
    if not port_is_free(port):
        raise CourseInputError(
            f"{where} {port} is already in use on {HOST}: choose another port, "
            "or leave it out and a free one is picked"
        )
    return port


# --------------------------------------------------------------------------- processes


def _child(rank: int, world: int, port: int, inbox, outbox, timeout: float) -> None:
    """Body of every spawned process: join the group once, then run jobs until told to stop."""
    torch.set_num_threads(1)  # one process = one device = one core's worth of work
    loopback = {"linux": "lo", "darwin": "lo0"}.get(sys.platform)
    if loopback:  # stay on loopback: a hostname resolving to a LAN address can hang gloo
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{HOST}:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout),
        )
        importlib.import_module("torch.distributed.pipelining")  # slow: pay it once, up front

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
        self.workers = _check_int("workers", workers, 1, MAX_WORKERS)
        if not isinstance(timeout, int | float) or not timeout > 0:
            raise CourseInputError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        self.timeout = float(timeout)
        self.port = resolve_port(port)
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
        ctx = mp.get_context("spawn")
        self._outbox = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(self.workers)]
        self._procs = [
            ctx.Process(
                target=_child,
                args=(r, self.workers, self.port, self._inboxes[r], self._outbox, self.timeout),
                daemon=True,  # if the notebook kernel dies, its ranks die with it
            )
            for r in range(self.workers)
        ]
        try:
            for p in self._procs:
                p.start()
            self._collect(-1, "start-up")
        except BaseException:
            self.close()
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
            self.close()
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

    def close(self) -> None:
        """Ask ranks to leave, then terminate and kill whatever is still there."""
        procs, self._procs = [p for p in self._procs if p.pid is not None], []
        for p, inbox in zip(procs, self._inboxes, strict=False):
            if p.is_alive():
                try:
                    inbox.put(None)
                except (ValueError, OSError):
                    pass
        for p in procs:
            p.join(timeout=2)
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

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

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


def _run_job(cluster, fn, workers: int, payload: dict, port, timeout: float) -> list:
    """On `cluster` if one is given (it must have `workers` ranks), else on a fresh one."""
    if cluster is None:
        return spawn(fn, workers, payload, port=port, timeout=timeout)
    if cluster.workers != workers:
        raise CourseInputError(
            f"workers must match the cluster's {cluster.workers} processes, got {workers}"
        )
    return cluster.run(fn, payload, timeout)


def _workers(workers: int | None, cluster) -> int:
    return workers if workers is not None else (cluster.workers if cluster else 2)


# --------------------------------------------------------------------------- model and data


@dataclass(frozen=True)
class Setup:
    """Everything every process needs to build the identical model and batch.

    "gpt" is the course's TinyGPT (course_utils.models), shrunk so a step on two
    processes takes milliseconds; "mlp" is the course's MLP on a fixed random task.
    """

    model: str = "gpt"
    batch: int = 8
    seed: int = 0
    block_size: int = 32
    d_model: int = 64
    n_layer: int = 4


def _models():
    """course_utils.models, or None if it cannot be imported (then only "mlp" works)."""
    try:
        from course_utils import models
    except ImportError:
        return None
    return models


def default_model() -> str:
    return "gpt" if _models() is not None else "mlp"


class _FallbackMLP(nn.Module):
    """Stand-in for course_utils.models.MLP when that module is missing."""

    def __init__(self, d_in: int = 32, d_hidden: int = 64, d_out: int = 10, depth: int = 4):
        super().__init__()
        widths = [d_in] + [d_hidden] * depth
        pairs = zip(widths, widths[1:], strict=False)
        blocks = [nn.Sequential(nn.Linear(a, b), nn.GELU()) for a, b in pairs]
        self.net = nn.Sequential(*blocks, nn.Linear(d_hidden, d_out))

    def layers(self) -> list[nn.Module]:
        return list(self.net)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@functools.lru_cache(maxsize=4)
def _dataset(block_size: int):
    """The course's character dataset (loaded once per process)."""
    return _models().CharDataset(block_size=block_size)


def build_model(setup: Setup) -> nn.Module:
    """The same weights on every call with the same setup (seeded)."""
    models = _models()
    torch.manual_seed(setup.seed)
    if setup.model == "gpt":
        if models is None:
            raise CourseInputError("model 'gpt' needs course_utils.models; use model='mlp'")
        vocab = _dataset(setup.block_size).vocab_size
        cfg = models.GPTConfig(
            vocab_size=vocab,
            block_size=setup.block_size,
            n_layer=setup.n_layer,
            n_head=4,
            d_model=setup.d_model,
        )
        return models.TinyGPT(cfg)
    return models.MLP() if models is not None else _FallbackMLP()


def make_batch(setup: Setup, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets for training step `step` (deterministic from seed and step)."""
    g = torch.Generator().manual_seed(1000 * setup.seed + step)
    if setup.model == "gpt":
        return _dataset(setup.block_size).batch(setup.batch, generator=g)
    x = torch.randn(setup.batch, 32, generator=g)
    return x, torch.randint(10, (setup.batch,), generator=g)


def loss_fn(setup: Setup):
    """Mean cross-entropy over every token (or row): the course's loss_fn."""
    models = _models()
    return models.loss_fn if models is not None else _cross_entropy


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def split_stages(model: nn.Module, setup: Setup, num_stages: int) -> list[nn.Module]:
    """The model cut into `num_stages` consecutive stages (course_utils.models.partition)."""
    models = _models()
    if models is not None:
        return list(models.partition(model, num_stages))
    layers = model.layers()
    if num_stages > len(layers):
        raise CourseInputError(
            f"stages must be at most {len(layers)} for model {setup.model!r}, got {num_stages}"
        )
    bounds = [round(i * len(layers) / num_stages) for i in range(num_stages + 1)]
    pairs = zip(bounds, bounds[1:], strict=False)
    return [nn.Sequential(*layers[a:b]) for a, b in pairs]


def _grads(module: nn.Module) -> dict:
    return {n: p.grad.detach().clone().numpy() for n, p in module.named_parameters()}


def _max_diff(a: dict, b: dict) -> float:
    if a.keys() != b.keys():
        raise WorkerError(f"parameter names differ: {sorted(a)[:3]} vs {sorted(b)[:3]}")
    return max((float(abs(a[k] - b[k]).max()) for k in a), default=0.0)


def _timeline(per_rank: list[list[tuple]], name: str, meta: dict) -> Timeline:
    """Turn each rank's (action, label, start_ns, end_ns) records into one measured Timeline."""
    t0 = min((rec[2] for recs in per_rank for rec in recs), default=0)
    events = [
        Event(rank, Action.parse(action), (s - t0) / 1e9, (e - t0) / 1e9, label)
        for rank, recs in enumerate(per_rank)
        for action, label, s, e in recs
    ]
    return Timeline(events, len(per_rank), name=name, source="measured", unit="s", meta=meta)


# --------------------------------------------------------------------------- DDP


@dataclass
class DistributedResult:
    """What a distributed run measured, next to its single-process reference."""

    workers: int
    losses: list[float]  # per step, averaged over ranks (equal shards -> full-batch loss)
    reference_losses: list[float]
    max_grad_diff: float  # largest |grad_distributed - grad_reference| over all steps/params
    seconds: float  # wall time of the whole run: spawning, rendezvous, work, shutdown
    timeline: Timeline
    extra: dict = field(default_factory=dict)

    @property
    def max_loss_diff(self) -> float:
        return max(abs(a - b) for a, b in zip(self.losses, self.reference_losses, strict=True))

    def to_dict(self) -> dict:
        return {
            "workers": self.workers,
            "max_grad_diff": self.max_grad_diff,
            "seconds": self.seconds,
        }


def _ddp_worker(rank: int, world: int, payload: dict) -> dict:
    """One DDP rank: shard of the batch, forward, backward with all-reduce, SGD step."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    setup, steps = payload["setup"], payload["steps"]
    model = build_model(setup)
    records: list[tuple] = []
    # Small buckets so several all-reduces happen during one backward pass (as in real
    # DDP on a big model), which the timeline then shows overlapping the backward.
    ddp = DDP(model, bucket_cap_mb=payload["bucket_mb"])

    def timed_allreduce(state, bucket):
        start = time.time_ns()
        buf = bucket.buffer().div_(world)
        fut = dist.all_reduce(buf, async_op=True).get_future()

        def done(f):
            records.append(("0REDUCE_GRAD", f"all-reduce {bucket.index()}", start, time.time_ns()))
            return f.value()[0]

        return fut.then(done)

    ddp.register_comm_hook(None, timed_allreduce)
    opt = torch.optim.SGD(ddp.parameters(), lr=payload["lr"])
    criterion = loss_fn(setup)
    shard = setup.batch // world
    losses, grads = [], []
    for step in range(steps):
        x, y = make_batch(setup, step)
        x, y = x[rank * shard : (rank + 1) * shard], y[rank * shard : (rank + 1) * shard]
        opt.zero_grad(set_to_none=True)
        t0 = time.time_ns()
        loss = criterion(ddp(x), y)
        t1 = time.time_ns()
        loss.backward()  # DDP's hooks all-reduce gradient buckets while this runs
        t2 = time.time_ns()
        records += [(f"0F{step}", None, t0, t1), (f"0B{step}", None, t1, t2)]
        losses.append(loss.item())
        grads.append(_grads(model))
        opt.step()
    return {"losses": losses, "grads": grads, "records": records}


def reference_ddp(setup: Setup, steps: int = 1, lr: float = 0.1) -> tuple[list[float], list[dict]]:
    """The same training on one process with the full batch: losses and grads per step."""
    model = build_model(setup)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    criterion = loss_fn(setup)
    losses, grads = [], []
    for step in range(steps):
        x, y = make_batch(setup, step)
        opt.zero_grad(set_to_none=True)
        loss = criterion(model(x), y)
        loss.backward()
        losses.append(loss.item())
        grads.append(_grads(model))
        opt.step()
    return losses, grads


def threads_ddp(setup: Setup, workers: int, steps: int = 1, lr: float = 0.1):
    """The course's thread data parallelism on the same model and batches (None if absent).

    Returns (losses, grads per step, timeline of the last step).
    """
    try:
        from course_utils.data_parallel import DataParallel, sgd
    except ImportError:
        return None
    losses, grads = [], []
    with DataParallel(build_model(setup), workers, loss_fn=loss_fn(setup), optimizer=sgd(lr)) as dp:
        for step in range(steps):
            result = dp.step(*make_batch(setup, step))
            losses.append(float(result.loss))
            grads.append(_grads(dp.replicas[0]))  # .grad holds the all-reduced gradient
    return losses, grads, result.timeline


def run_ddp(
    workers: int | None = None,
    steps: int = 1,
    batch: int = 8,
    model: str | None = None,
    seed: int = 0,
    lr: float = 0.1,
    bucket_mb: float = 0.05,
    port: int | None = None,
    timeout: float = 60.0,
    cluster: Cluster | None = None,
    compare_threads: bool = True,
) -> DistributedResult:
    """Train `steps` SGD steps with DistributedDataParallel on `workers` processes.

    Each rank holds a full copy of the model and `batch / workers` samples; DDP averages
    the gradients with all-reduce, so every rank must end up with exactly the gradient of
    the full batch on one process (Li et al., 2020, arXiv:2006.15704). We check that.
    With `compare_threads`, the course's thread `DataParallel` runs the same steps too.
    Pass a started `Cluster` to reuse its processes; otherwise a fresh one is spawned.
    """
    workers = _check_int("workers", _workers(workers, cluster), 1, MAX_WORKERS)
    steps = _check_int("steps", steps, 1, 100)
    batch = _check_int("batch", batch, 1, 4096)
    if batch % workers:
        raise CourseInputError(f"batch must be a multiple of workers ({workers}), got {batch}")
    setup = Setup(_check_model(model), batch, seed)
    payload = {"setup": setup, "steps": steps, "lr": lr, "bucket_mb": bucket_mb}
    start = time.perf_counter()
    outs = _run_job(cluster, _ddp_worker, workers, payload, port, timeout)
    seconds = time.perf_counter() - start
    ref_losses, ref_grads = reference_ddp(setup, steps, lr)
    max_grad_diff = max(
        _max_diff(out["grads"][s], ref_grads[s]) for out in outs for s in range(steps)
    )
    losses = [sum(out["losses"][s] for out in outs) / workers for s in range(steps)]
    timeline = _timeline(
        [out["records"] for out in outs], f"DDP on {workers} processes", {"model": setup.model}
    )
    extra: dict = {}
    if compare_threads and (threads := threads_ddp(setup, workers, steps, lr)) is not None:
        th_losses, th_grads, th_timeline = threads
        extra["threads_losses"] = th_losses
        extra["threads_max_grad_diff"] = max(
            _max_diff(out["grads"][s], th_grads[s]) for out in outs for s in range(steps)
        )
        extra["threads_timeline"] = th_timeline
    return DistributedResult(workers, losses, ref_losses, max_grad_diff, seconds, timeline, extra)


# --------------------------------------------------------------------------- pipelining


def _timed_stage(stage, records: list) -> None:
    """Wrap one PipelineStage's compute calls so each records (action, start, end)."""
    fwd, bwd, wgt = (
        stage.forward_one_chunk,
        stage.backward_one_chunk,
        stage.backward_weight_one_chunk,
    )
    s = stage.stage_index

    def forward_one_chunk(chunk, *args, **kwargs):
        t0 = time.time_ns()
        out = fwd(chunk, *args, **kwargs)
        records.append((f"{s}F{chunk}", None, t0, time.time_ns()))
        return out

    def backward_one_chunk(chunk, *args, **kwargs):
        t0 = time.time_ns()
        out = bwd(chunk, *args, **kwargs)
        kind = "B" if kwargs.get("full_backward", True) else "I"
        records.append((f"{s}{kind}{chunk}", None, t0, time.time_ns()))
        return out

    def backward_weight_one_chunk(chunk, *args, **kwargs):
        t0 = time.time_ns()
        out = wgt(chunk, *args, **kwargs)
        records.append((f"{s}W{chunk}", None, t0, time.time_ns()))
        return out

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk


def _pipeline_worker(rank: int, world: int, payload: dict) -> dict:
    """One pipeline rank: build the stages it owns (stage s on rank s % world), run a step."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.distributed.pipelining.schedules import ScheduleLoopedBFS, _PipelineScheduleRuntime

    setup, kind, m, num_stages = payload["setup"], payload["kind"], payload["m"], payload["stages"]
    pieces = split_stages(build_model(setup), setup, num_stages)
    mine = list(range(rank, num_stages, world))  # looping placement, as in the course
    records: list[tuple] = []
    stages = []
    for s in mine:
        stage = PipelineStage(pieces[s], s, num_stages, torch.device("cpu"))
        _timed_stage(stage, records)
        stages.append(stage)
    criterion = loss_fn(setup)
    if kind == "gpipe":
        sched = ScheduleGPipe(stages[0], n_microbatches=m, loss_fn=criterion)
    elif kind == "1f1b":
        sched = Schedule1F1B(stages[0], n_microbatches=m, loss_fn=criterion)
    elif kind == "breadth-first":
        sched = ScheduleLoopedBFS(stages, n_microbatches=m, loss_fn=criterion)
    else:  # a course schedule, exported to PyTorch's CSV format
        sched = _PipelineScheduleRuntime(stages, n_microbatches=m, loss_fn=criterion)
        sched._load_csv(payload["csv"], format="compute_only")
    x, y = make_batch(setup)
    losses: list = []
    kwargs = {}
    if 0 in mine:
        args = (x,)
    else:
        args = ()
    if num_stages - 1 in mine:
        kwargs = {"target": y, "losses": losses}
    sched.step(*args, **kwargs)
    return {
        "records": records,
        "losses": [float(v.detach()) for v in losses],
        "grads": {s: _grads(pieces[s]) for s in mine},
    }


def reference_pipeline(setup: Setup, num_stages: int) -> tuple[float, dict]:
    """Full batch on one process: the loss and each stage's gradients."""
    pieces = split_stages(build_model(setup), setup, num_stages)
    x, y = make_batch(setup)
    h = x
    for piece in pieces:
        h = piece(h)
    loss = loss_fn(setup)(h, y)
    loss.backward()
    return loss.item(), {s: _grads(p) for s, p in enumerate(pieces)}


def executor_pipeline(setup: Setup, schedule: Schedule) -> tuple[float, dict, Timeline] | None:
    """The course's thread executor on the same model, batch and schedule (None if absent)."""
    try:
        from course_utils.executor import PipelineExecutor
    except ImportError:
        return None
    pieces = split_stages(build_model(setup), setup, schedule.stages)
    x, y = make_batch(setup)
    with PipelineExecutor(pieces, schedule.num_devices, loss_fn=loss_fn(setup)) as ex:
        result = ex.step(schedule, x, y)
    loss = float(result.loss)
    return loss, {s: _grads(p) for s, p in enumerate(pieces)}, result.timeline


def course_schedule(name: str, workers: int, microbatches: int) -> Schedule | None:
    """The course's own schedule for a PyTorch schedule name (None if schedules is absent)."""
    try:
        from course_utils.schedules import make_schedule
    except ImportError:
        return None
    chunks = 2 if name in ("interleaved", "breadth-first") else 1
    return make_schedule(name, workers, microbatches, chunks)


def run_pipeline(
    schedule: str | Schedule = "gpipe",
    workers: int | None = None,
    microbatches: int = 4,
    batch: int = 8,
    model: str | None = None,
    seed: int = 0,
    port: int | None = None,
    timeout: float = 60.0,
    compare_executor: bool = True,
    cluster: Cluster | None = None,
) -> DistributedResult:
    """One training step of a pipeline on `workers` processes with PyTorch's pipelining.

    `schedule` is "gpipe" (`ScheduleGPipe`), "1f1b" (`Schedule1F1B`), "breadth-first"
    (`ScheduleLoopedBFS`, 2 stages per rank), or a course `Schedule`: that one is written
    to PyTorch's CSV format and run by `_PipelineScheduleRuntime._load_csv`. Losses and
    gradients are compared with one process on the full batch, and with the course's
    thread executor running the matching course schedule (when available).
    Pass a started `Cluster` to reuse its processes; otherwise a fresh one is spawned.
    """
    workers = _check_int("workers", _workers(workers, cluster), 2, MAX_WORKERS)
    batch = _check_int("batch", batch, 1, 4096)
    setup = Setup(_check_model(model), batch, seed)
    payload: dict = {"setup": setup}
    csv_file = None
    if isinstance(schedule, Schedule):
        if schedule.num_devices != workers:
            raise CourseInputError(
                f"workers must equal the schedule's devices ({schedule.num_devices}), got {workers}"
            )
        from course_utils.export import pytorch_microbatches, to_pytorch_csv

        csv_file = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
        csv_file.close()
        to_pytorch_csv(schedule, csv_file.name)
        payload.update(kind="csv", csv=csv_file.name, stages=schedule.stages)
        microbatches = pytorch_microbatches(schedule)
        course = schedule
        name = f"{schedule.name} (CSV) on {workers} processes"
    elif schedule in PIPELINES:
        stages = workers * (2 if schedule == "breadth-first" else 1)
        payload.update(kind=schedule, stages=stages)
        course = None
        name = f"PyTorch {schedule} on {workers} processes"
    else:
        raise CourseInputError(
            f"schedule must be one of {', '.join(PIPELINES)} or a course Schedule, got {schedule!r}"
        )
    microbatches = _check_int("microbatches", microbatches, 1, 64)
    if batch % microbatches:
        raise CourseInputError(
            f"batch must be a multiple of microbatches ({microbatches}), got {batch}"
        )
    payload["m"] = microbatches
    try:
        start = time.perf_counter()
        outs = _run_job(cluster, _pipeline_worker, workers, payload, port, timeout)
        seconds = time.perf_counter() - start
    finally:
        if csv_file is not None:
            os.unlink(csv_file.name)
    mb_losses = [v for out in outs for v in out["losses"]]
    loss = sum(mb_losses) / len(mb_losses)
    grads = {s: g for out in outs for s, g in out["grads"].items()}
    ref_loss, ref_grads = reference_pipeline(setup, payload["stages"])
    max_grad_diff = max(_max_diff(grads[s], ref_grads[s]) for s in ref_grads)
    extra: dict = {"schedule": schedule if isinstance(schedule, str) else schedule.name}
    if compare_executor:
        if course is None:
            course = course_schedule(schedule, workers, microbatches)
        ran = executor_pipeline(setup, course) if course is not None else None
        if ran is not None:
            ex_loss, ex_grads, ex_timeline = ran
            extra["executor_loss"] = ex_loss
            extra["executor_max_grad_diff"] = max(
                _max_diff(grads[s], ex_grads[s]) for s in ex_grads
            )
            extra["executor_timeline"] = ex_timeline
    timeline = _timeline([out["records"] for out in outs], name, {"model": setup.model})
    return DistributedResult(
        workers, [loss], [ref_loss], max_grad_diff, seconds, timeline, extra=extra
    )


# --------------------------------------------------------------------------- checks and CLI


def _check_int(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CourseInputError(f"{name} must be an integer from {low} to {high}, got {value!r}")
    return value


def _check_model(model: str | None) -> str:
    model = default_model() if model is None else model
    if model not in MODELS:
        raise CourseInputError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
    return model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=2, help="number of processes (default 2)")
    parser.add_argument(
        "--port", type=int, default=None, help="rendezvous port on 127.0.0.1 (default: a free one)"
    )
    parser.add_argument(
        "--pipeline",
        default=None,
        help=f"run a pipelining step instead of DDP: one of {', '.join(PIPELINES)}",
    )
    parser.add_argument(
        "--csv",
        action="store_true",
        help="with --pipeline: run the course's own schedule of that name (any course "
        "schedule, e.g. zb-h1 or interleaved) exported to PyTorch's CSV format",
    )
    parser.add_argument("--steps", type=int, default=1, help="DDP training steps (default 1)")
    parser.add_argument("--microbatches", type=int, default=4, help="pipeline micro-batches")
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        help="global batch size (default: 4 per worker for DDP, 2 per micro-batch for pipelines)",
    )
    parser.add_argument("--model", default=None, help=f"one of {', '.join(MODELS)}")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before giving up")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _run_from_args(args: argparse.Namespace) -> tuple[DistributedResult, str]:
    """Pick and run the comparison the command-line arguments ask for."""
    if args.pipeline is None:
        if args.csv:
            raise CourseInputError("csv needs --pipeline (one of " + ", ".join(PIPELINES) + ")")
        batch = args.batch if args.batch is not None else 4 * args.workers
        result = run_ddp(
            args.workers, args.steps, batch, args.model, port=args.port, timeout=args.timeout
        )
        what = "DDP"
    else:
        schedule: str | Schedule = args.pipeline
        if args.csv:
            try:
                from course_utils.schedules import SCHEDULES
            except ImportError:
                raise CourseInputError("csv needs course_utils.schedules (not available)") from None
            if args.pipeline not in SCHEDULES:
                raise CourseInputError(
                    f"pipeline must be one of {', '.join(SCHEDULES)} with --csv, "
                    f"got {args.pipeline!r}"
                )
            schedule = course_schedule(args.pipeline, args.workers, args.microbatches)
        elif args.pipeline not in PIPELINES:
            raise CourseInputError(
                f"pipeline must be one of {', '.join(PIPELINES)} "
                f"(or any course schedule with --csv), got {args.pipeline!r}"
            )
        result = run_pipeline(
            schedule,
            args.workers,
            args.microbatches,
            args.batch if args.batch is not None else 2 * args.microbatches,
            args.model,
            port=args.port,
            timeout=args.timeout,
        )
        what = f"pipeline {args.pipeline}" + (" (CSV)" if args.csv else "")
    return result, what


def run(args: argparse.Namespace) -> int:
    try:
        result, what = _run_from_args(args)
    except WorkerError as exc:
        # A failure inside a worker process: one line (COURSE_DEBUG=1 adds the traceback).
        print(f"python -m course_utils distributed: failed: {exc}", file=sys.stderr)
        return 1
    out = result.to_dict()
    if args.pipeline is not None:
        out["schedule"] = args.pipeline
        out["max_loss_diff"] = result.max_loss_diff
        if "executor_max_grad_diff" in result.extra:
            out["executor_max_grad_diff"] = result.extra["executor_max_grad_diff"]
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{what} on {result.workers} processes (gloo, {HOST}): {result.seconds:.2f} s")
        print(f"  loss {result.losses[-1]:.6f}  vs one process {result.reference_losses[-1]:.6f}")
        print(f"  largest gradient difference vs one process: {result.max_grad_diff:.2e}")
        if "threads_max_grad_diff" in result.extra:
            diff = result.extra["threads_max_grad_diff"]
            print(f"  largest gradient difference vs thread data parallelism: {diff:.2e}")
        if "executor_max_grad_diff" in out:
            diff = out["executor_max_grad_diff"]
            print(f"  largest gradient difference vs thread executor: {diff:.2e}")
        print("  " + result.timeline.summary())
    return 0
