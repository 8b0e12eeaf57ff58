"""Data parallelism on CPU threads: N model replicas, N shards of the batch, one all-reduce.

Every replica (one thread = one device) holds a full copy of the model and gets its own
slice of the mini-batch. All replicas run forward and backward at the same time; then the
gradients are summed with the hand-made all-reduce from `course_utils.threads.collectives`
(ring or naive), and every replica applies the same optimizer step to the same summed
gradient, so the replicas stay identical, step after step.

Why the result equals one worker training on the whole batch: the loss is a mean over
the B samples, so its gradient is sum_r (n_r / B) x (gradient of replica r's mean loss
over its n_r samples). Each replica scales its loss by n_r / B before backward and the
all-reduce sums. Shards may therefore be uneven (B not divisible by N is fine: the
first B % N replicas get one extra sample) and the result is still exact; with even
shards this is the usual "average the gradients".

With `microbatches=k` each replica cuts its shard into k micro-batches and accumulates their
gradients before the one all-reduce (what DDP's `no_sync` does for all but the last): the
work per sample stays that of a k-times smaller shard. `DataParallel(model, 1,
microbatches=N)` is therefore the fair single-device baseline for N workers: one device
doing exactly the N workers' forward and backward passes, one after another, as a single GPU
accumulating gradients would (an accelerator does the same work per sample either way; a
CPU thread does not: a batch N times larger misses its caches and costs more than N times).

`DataParallel.step` also records a measured `Timeline`: per replica a forward `0F{mb}` and
a backward `0B{mb}` per micro-batch, and the all-reduce `0REDUCE_GRAD` (labelled
"all-reduce"), drawn by `course_utils.charts.gantt.draw` like every other timeline. On the
virtual clock (the default) each replica computes for its own CPU time and the all-reduce's
messages cross the emulated links (`course_utils.threads.links`: replicas 0-7 share a
node, 8-15 the next); on the wall clock the timeline holds the real timestamps.

`dp_speedup_model` is the back-of-the-envelope model for the lesson: why adding workers
stops paying off once the all-reduce costs as much as the shrinking compute.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from course_utils import validation
from course_utils.actions import Action
from course_utils.errors import CourseInputError
from course_utils.models import loss_fn
from course_utils.parallel.costs import ring_allreduce_time
from course_utils.threads.collectives import check_options
from course_utils.threads.devices import ThreadRunner
from course_utils.threads.links import Links
from course_utils.threads.trace import Recorder, on
from course_utils.timeline import Timeline
from course_utils.validation import MAX_THREADS

MAX_WORKERS = MAX_THREADS  # threads: the `data-parallel` command's limit
MAX_MICROBATCHES = 64  # per replica: the fair baseline of 16 workers needs 16

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def sgd(lr: float = 0.1) -> OptimizerFactory:
    """An optimizer factory: every replica builds its own optimizer from it."""
    return lambda params: torch.optim.SGD(params, lr=lr)


def shard_sizes(batch: int, workers: int) -> list[int]:
    """Samples per replica: as even as possible, the first batch % workers get one more."""
    if batch < workers:
        raise CourseInputError(
            f"batch size must be >= workers so every replica gets a sample, "
            f"got batch {batch} for {workers} workers"
        )
    base, extra = divmod(batch, workers)
    return [base + (1 if r < extra else 0) for r in range(workers)]


@dataclass
class DPStepResult:
    """One data-parallel step: whole-batch loss, measured timeline, bytes each replica sent.

    `trace` is the recording behind the timeline: `trace.timeline("virtual", links)` draws a
    wall-clock step on the virtual clock too (a virtual-clock step's replicas take turns on one
    core, so its wall view shows them one after another).
    """

    loss: float
    timeline: Timeline
    bytes_sent: list[int]
    trace: Recorder | None = None

    @property
    def step_s(self) -> float:
        """The step's time on the timeline's clock."""
        return self.timeline.makespan


class DataParallel(ThreadRunner):
    """N replicas of `model` on N threads, trained in lock-step on shards of each batch.

    `model` is copied (deep copy) into every replica and is not modified itself.
    `optimizer` is a factory `params -> torch.optim.Optimizer` (default SGD, lr 0.1).
    `loss_fn(output, targets)` must be a mean over samples (default: cross-entropy).
    Use as a context manager, or call `close()`, to stop the threads.
    """

    def __init__(
        self,
        model: nn.Module,
        workers: int,
        algorithm: str = "ring",
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = loss_fn,
        optimizer: OptimizerFactory | None = None,
        timeout: float = 120.0,
        clock: str = "virtual",
        links: Links | None = None,
        microbatches: int = 1,
    ) -> None:
        self._keep_workers_and_clock(workers, MAX_WORKERS, clock, links)  # the command's limit
        check_options("sum", algorithm)
        validation.integer(microbatches, "microbatches", 1, MAX_MICROBATCHES)
        self.microbatches = microbatches
        self.algorithm = algorithm
        self.loss_fn = loss_fn
        self.replicas = [copy.deepcopy(model) for _ in range(workers)]
        factory = optimizer or sgd()
        self.optimizers = [factory(r.parameters()) for r in self.replicas]
        self._start_threads("replica", timeout, one_core=self.clock == "virtual")
        self.timeout = timeout

    @property
    def param_bytes(self) -> int:
        """Bytes of trainable parameters in one replica (= bytes of gradient to all-reduce)."""
        return sum(p.numel() * p.element_size() for p in _trainable(self.replicas[0]))

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> DPStepResult:
        """One training step on the mini-batch (inputs, targets), split over the replicas."""
        if inputs.shape[0] != targets.shape[0]:
            raise CourseInputError(
                f"inputs and targets must have the same batch size, got "
                f"{inputs.shape[0]} and {targets.shape[0]}"
            )
        batch = inputs.shape[0]
        sizes = shard_sizes(batch, self.workers)
        if sizes[-1] < self.microbatches:
            raise CourseInputError(
                f"each replica's shard ({sizes[-1]} samples) must hold at least one sample per "
                f"micro-batch ({self.microbatches})"
            )
        xs, ys = inputs.split(sizes), targets.split(sizes)
        self.group.reset_counters()
        trace = Recorder()

        def replica_step(rank: int) -> Callable[[], float]:
            stream = trace.stream(rank)

            def work() -> float:
                model, opt = self.replicas[rank], self.optimizers[rank]
                opt.zero_grad(set_to_none=False)
                total = 0.0
                parts = shard_sizes(sizes[rank], self.microbatches)
                pieces = zip(xs[rank].split(parts), ys[rank].split(parts), strict=True)
                with self.threads.turn():  # all of this replica's compute in one turn
                    for mb, (x, y) in enumerate(pieces):
                        with stream.compute(Action(0, "F", mb)):
                            # each piece's mean loss, weighted by its share of the batch
                            # (module doc); backward adds its gradient to those already there
                            loss = self.loss_fn(model(x), y) * (len(x) / batch)
                        with stream.compute(Action(0, "B", mb)):
                            loss.backward()
                        total += loss.item()
                grads = [_grad(p) for p in _trainable(model)]
                with stream.span(Action(0, "REDUCE_GRAD"), "all-reduce"):
                    self.group.comm(rank).all_reduce(grads, op="sum", algorithm=self.algorithm)
                opt.step()  # same summed gradient everywhere -> same update everywhere
                return total

            return on(stream, work)

        losses = self.run_jobs([replica_step(r) for r in range(self.workers)], trace)
        timeline = self._timeline(
            trace,
            name=f"data parallel, {self.workers} workers ({self.algorithm} all-reduce)",
            meta={"shard_sizes": sizes, "algorithm": self.algorithm},
        )
        return DPStepResult(sum(losses), timeline, list(self.group.bytes_sent), trace)

    def max_replica_diff(self) -> float:
        """Largest parameter difference between replica 0 and any other (0.0 when in sync)."""
        ref = list(_trainable(self.replicas[0]))
        worst = 0.0
        for replica in self.replicas[1:]:
            for a, b in zip(ref, _trainable(replica), strict=True):
                worst = max(worst, (a - b).abs().max().item())
        return worst


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _grad(p: nn.Parameter) -> torch.Tensor:
    # A parameter unused in this forward has no gradient yet; every replica must still
    # send the same buffer layout, so give it zeros.
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    return p.grad


def single_worker_steps(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = loss_fn,
    optimizer: OptimizerFactory | None = None,
) -> tuple[nn.Module, list[float]]:
    """The reference: a copy of `model` trained by plain gradient descent on whole batches."""
    model = copy.deepcopy(model)
    opt = (optimizer or sgd())(model.parameters())
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


def max_param_diff(a: nn.Module, b: nn.Module) -> float:
    """Largest absolute difference between corresponding parameters of two models."""
    return max(
        ((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True)),
        default=0.0,
    )


def simulated_step_s(result: DPStepResult, grad_bytes: int, links: Links | None = None) -> float:
    """The simulator's prediction of a measured step: the slowest replica's measured forward
    and backward, then the ring all-reduce of `grad_bytes` by its formula over the slowest
    link of the ring (`links`; None: links at their fastest, as on the wall clock)."""
    timeline = result.timeline
    n = timeline.num_devices
    compute = max(timeline.busy_per_device())
    if n == 1 or links is None or links.instant:
        return compute
    return compute + ring_allreduce_time(grad_bytes, n, links.ring_bandwidth(n), links.latency)


# -- the scaling model for the lesson -----------------------------------------------------


def dp_speedup_model(
    workers: int,
    compute_time: float,
    grad_bytes: float,
    bandwidth: float,
    latency: float = 0.0,
    overlap: float = 0.0,
) -> float:
    """Expected speed-up of N data-parallel workers over one, at the same global batch.

    One worker needs `compute_time` seconds for the whole global batch. N workers each
    compute 1/N of it, then all-reduce `grad_bytes` of gradients with the ring algorithm,
    which takes 2(N-1)/N x grad_bytes / bandwidth + 2(N-1) x latency seconds
    (Patarasuk & Yuan 2009). `overlap` (0..1) is the fraction of that communication
    hidden behind the backward pass (bucketed all-reduce as in PyTorch DDP; Li et al.
    2020, arXiv 2006.15704):

        speedup(N) = compute_time / (compute_time / N + (1 - overlap) x allreduce(N))

    Example: ResNet-50 has 25.6 M parameters, so 102.4 MB of fp32 gradients. Say one
    worker needs 4.0 s for a global batch of 4096 images, and the workers are linked by
    10 Gbit/s Ethernet (1.25e9 bytes/s, 50 us latency). With 16 workers each computes
    for 0.25 s, and the ring all-reduce takes 2 x 15/16 x 102.4e6 / 1.25e9 + 30 x 50e-6
    = 0.155 s, so a step takes 0.405 s: a speed-up of about 9.9x, not 16x.
    The bandwidth term hardly shrinks as N grows (2(N-1)/N -> 2) while the compute
    shrinks like 1/N, so communication takes a growing share of each step. Overlapping
    half the all-reduce with the backward pass gives 4.0 / (0.25 + 0.077) = 12.2x.
    """
    if not isinstance(workers, int) or workers < 1:
        raise CourseInputError(f"workers must be an integer >= 1, got {workers!r}")
    if compute_time <= 0:
        raise CourseInputError(f"compute_time must be > 0 seconds, got {compute_time!r}")
    if bandwidth <= 0:
        raise CourseInputError(f"bandwidth must be > 0 bytes/s, got {bandwidth!r}")
    if grad_bytes < 0 or latency < 0:
        raise CourseInputError("grad_bytes and latency must be >= 0")
    if not 0.0 <= overlap <= 1.0:
        raise CourseInputError(f"overlap must be between 0 and 1, got {overlap!r}")
    comm = ring_allreduce_time(grad_bytes, workers, bandwidth, latency)
    return compute_time / (compute_time / workers + (1.0 - overlap) * comm)
