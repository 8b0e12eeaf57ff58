"""Sharded data parallelism on CPU threads: ZeRO stages 1, 2 and 3 (= FSDP).

Plain data parallelism keeps a full copy of everything on every worker: parameters,
gradients and optimizer state, 16 bytes per parameter with Adam in fp32. ZeRO
(Rajbhandari et al. 2020, arXiv 1910.02054) notices that the copies are redundant and
cuts each of them into N shards, one per worker:

    stage 1 (P_os)       shard the optimizer state        params Psi + grads Psi + optim K Psi / N
    stage 2 (P_os+g)     ... and the gradients             params Psi + (grads + optim) / N
    stage 3 (P_os+g+p)   ... and the parameters too        everything / N

Stage 3 is what PyTorch calls Fully Sharded Data Parallel (Zhao et al. 2023,
arXiv 2304.11277; `torch.distributed.fsdp.fully_shard`, "FSDP2"). Here the model is a
list of layers and every layer is one FSDP unit. Each layer's parameters are flattened
into one vector, padded with zeros to a multiple of N (as FSDP2 pads its shards), and
worker w keeps only slice w of it. Then, per micro-batch, worker w:

    before layer l's forward:   all-gather the layer             (kind UNSHARD)
    after it:                   free the gathered copy           (kind RESHARD)
    before layer l's backward:  all-gather it again              (UNSHARD)
    after it:                   reduce-scatter its gradient      (REDUCE_GRAD, "reduce-scatter")
                                and free the gathered copy       (RESHARD)

and at the end of the step applies Adam to its shards only. Adam is element-wise, so N
workers each updating 1/N of the elements compute exactly what one worker updating all
of them would (that is why ZeRO can shard it; we use Adam rather than SGD with momentum
because its two states per parameter are what the memory formulas count). Every worker
runs its own shard of the batch, so it is still data parallelism: the reduce-scatter
sums the workers' gradients and leaves each worker the sum for its own slice.

Stages 1 and 2 keep full parameters. They reduce-scatter the gradients (each worker
only needs the sum for the slice its optimizer state covers), update their slice, and
all-gather the updated parameters after the step. Stage 1 keeps a full gradient buffer
(so with several micro-batches it accumulates locally and reduce-scatters once); stage 2
frees each layer's full gradient as soon as it is reduce-scattered, so it must
reduce-scatter after every micro-batch.

Overlap. Each worker has two threads: a compute thread (forward, backward, optimizer)
and a communication thread that runs the collectives in the order they were issued
(like a CUDA communication stream). With prefetch depth k the compute thread issues the
all-gathers of the next k layers before it computes the current one, so those gathers
run while it computes; the price is memory: up to k + 1 gathered layers at once.
Freeing a gathered layer uses the trick FSDP itself uses: the flat tensor (and the
views of it that autograd saved for the backward) stays, only its storage is resized to
zero bytes; before the backward it gets its storage back and is gathered into again.

What this module measures per worker: a `Timeline` of one step (real `perf_counter_ns`
readings), the bytes each collective sent (the `ThreadGroup` counters), and the bytes of
model-state tensors actually held (storage sizes, sampled whenever something is
allocated or freed). `simulate_fsdp` predicts the timeline from per-layer compute times
and gather times from bytes / bandwidth, running the very same per-worker program.
"""

from __future__ import annotations

import copy
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from course_utils import plan
from course_utils.actions import Action
from course_utils.errors import CourseInputError, WorkerError
from course_utils.models import loss_fn
from course_utils.parallel.data_parallel import shard_sizes, single_worker_steps
from course_utils.threads.collectives import ThreadGroup
from course_utils.threads.devices import Aborted, DeviceThreads
from course_utils.threads.ring import ring_bytes_per_rank
from course_utils.timeline import Event, Timeline

STAGES = (1, 2, 3)
MAX_WORKERS = 16
MAX_PREFETCH = 16
MAX_MICROBATCHES = 64
DTYPES = (torch.float32, torch.float64)
_POLL_S = 0.02  # how often a waiting thread looks at the abort event

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# -- one layer as a flat, padded vector ---------------------------------------------------


@dataclass(frozen=True)
class FlatLayout:
    """Where each parameter of one layer lives in the layer's flat vector.

    `numel` is the layer's real parameter count; the vector is padded to
    `padded = workers x shard` elements so that every worker's shard is the same size.
    """

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    offsets: tuple[int, ...]
    numel: int
    shard: int  # elements per worker: ceil(numel / workers)
    workers: int

    @property
    def padded(self) -> int:
        return self.shard * self.workers

    @classmethod
    def of(cls, layer: nn.Module, workers: int) -> FlatLayout:
        names, shapes, offsets, offset = [], [], [], 0
        for name, p in layer.named_parameters():
            names.append(name)
            shapes.append(p.shape)
            offsets.append(offset)
            offset += p.numel()
        return cls(
            tuple(names), tuple(shapes), tuple(offsets), offset, -(-offset // workers), workers
        )

    def flatten(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """The layer's parameters as one padded vector (a copy)."""
        flat = torch.zeros(self.padded, dtype=dtype)
        for p, offset in zip(layer.parameters(), self.offsets, strict=True):
            flat[offset : offset + p.numel()] = p.detach().reshape(-1)
        return flat

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """name -> view of `flat` in the parameter's shape (autograd flows back to `flat`)."""
        return {
            name: flat[offset : offset + shape.numel()].view(shape)
            for name, shape, offset in zip(self.names, self.shapes, self.offsets, strict=True)
        }

    def shard_slice(self, rank: int) -> slice:
        return slice(rank * self.shard, (rank + 1) * self.shard)


def padded_shard_numels(layer_numels: Sequence[int], workers: int) -> list[int]:
    """Elements per worker of each layer's shard: ceil(numel / workers) (zero padding)."""
    return [-(-n // workers) for n in layer_numels]


# -- Adam, written on the shards ------------------------------------------------------------


def adam_update(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: int,
    lr: float,
    betas: tuple[float, float],
    eps: float,
) -> None:
    """One Adam step in place (Kingma & Ba 2014, arXiv 1412.6980; as `torch.optim.Adam`).

    m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2,
    p = p - lr / (1 - b1^t) x m / (sqrt(v) / sqrt(1 - b2^t) + eps).
    Every line is element-wise, so it can run on any slice of the vectors.
    """
    beta1, beta2 = betas
    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1**step))


def adam(lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
    """The one-device reference optimizer with the same settings (for `single_worker_steps`)."""
    return lambda params: torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, foreach=False)


# -- the per-worker program: shared by the threads and by the simulator ----------------------


@dataclass(frozen=True)
class CommOp:
    """One collective a worker's communication thread runs: an all-gather or a reduce-scatter."""

    kind: str  # "UNSHARD" (all-gather of a layer) or "REDUCE_GRAD" (reduce-scatter of its grads)
    layer: int
    microbatch: int | None
    label: str


@dataclass(frozen=True)
class Instr:
    """One instruction of a worker's compute thread.

    op: "issue" (hand `comm` to the communication thread and go on), "wait" (until `comm`
    is done), "F" / "B" (forward / backward of `layer` on `microbatch`), "free" (reshard:
    drop the gathered copy of `layer`) or "optimizer" (Adam on this worker's shards).
    """

    op: str
    layer: int | None = None
    microbatch: int | None = None
    comm: int | None = None  # index into the program's list of CommOps


def fsdp_program(
    num_layers: int, stage: int, prefetch: int, microbatches: int = 1
) -> tuple[list[Instr], list[CommOp]]:
    """What every worker's compute thread does in one step, in order, and its collectives.

    All workers run the same program, so they issue the same collectives in the same order
    (as they must: a ring only completes when every rank takes part).

    Stage 3: every use of a layer (its forward, then its backward, per micro-batch) needs
    the layer gathered. Gathers are issued in order of use, up to `prefetch` uses ahead of
    the one being computed, but never for a layer whose previous gathered copy is still
    held (at the turn from forward to backward the last layer is freed and gathered
    again, as ZeRO-3 describes; FSDP2 by default does not reshard its root module after
    the forward, for this reason).
    """
    _check_int(num_layers, "num_layers", 1, 10**6)
    _check_choice(stage, "stage", STAGES)
    _check_int(prefetch, "prefetch", 0, MAX_PREFETCH)
    _check_int(microbatches, "microbatches", 1, MAX_MICROBATCHES)
    program: list[Instr] = []
    comms: list[CommOp] = []
    last = num_layers - 1

    def issue(op: CommOp) -> int:
        comms.append(op)
        program.append(Instr("issue", op.layer, op.microbatch, len(comms) - 1))
        return len(comms) - 1

    reduce_scatters = []
    if stage == 3:
        uses = [
            (mb, kind, layer)
            for mb in range(microbatches)
            for kind, order in (("F", range(num_layers)), ("B", range(last, -1, -1)))
            for layer in order
        ]
        gather_of: dict[int, int] = {}  # use index -> comm index
        held: set[int] = set()  # layers gathered (or being gathered) and not yet freed
        next_use = 0

        def issue_gathers(up_to: int) -> None:
            nonlocal next_use
            while next_use <= min(up_to, len(uses) - 1) and uses[next_use][2] not in held:
                mb, kind, layer = uses[next_use]
                phase = "" if kind == "F" else " (bwd)"
                gather_of[next_use] = issue(
                    CommOp("UNSHARD", layer, mb, f"all-gather L{layer}{phase}")
                )
                held.add(layer)
                next_use += 1

        for i, (mb, kind, layer) in enumerate(uses):
            issue_gathers(i + prefetch)
            program.append(Instr("wait", layer, mb, gather_of[i]))
            program.append(Instr(kind, layer, mb))
            if kind == "B":
                op = CommOp("REDUCE_GRAD", layer, mb, f"reduce-scatter L{layer}")
                reduce_scatters.append(issue(op))
            program.append(Instr("free", layer, mb))
            held.discard(layer)
    else:
        for mb in range(microbatches):
            program += [Instr("F", layer, mb) for layer in range(num_layers)]
            for layer in range(last, -1, -1):
                program.append(Instr("B", layer, mb))
                # stage 1 keeps the full gradient and accumulates it over the micro-batches;
                # stage 2 frees it, so it reduce-scatters after every micro-batch
                if stage == 2 or mb == microbatches - 1:
                    op = CommOp("REDUCE_GRAD", layer, mb, f"reduce-scatter L{layer}")
                    reduce_scatters.append(issue(op))
    program += [Instr("wait", comms[c].layer, comms[c].microbatch, c) for c in reduce_scatters]
    program.append(Instr("optimizer"))
    if stage in (1, 2):  # everybody needs everybody's updated slice of the parameters
        gathers = [
            issue(CommOp("UNSHARD", layer, None, f"all-gather L{layer} params"))
            for layer in range(num_layers)
        ]
        program += [Instr("wait", comms[c].layer, None, c) for c in gathers]
    return program, comms


# -- the communication thread ----------------------------------------------------------------


class _CommStream:
    """A worker's communication thread: runs the issued collectives one after the other."""

    def __init__(self, abort: threading.Event, timeout: float, rank: int) -> None:
        self.abort, self.timeout, self.rank = abort, timeout, rank
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._done: set[int] = set()
        self._cond = threading.Condition()

    def issue(self, index: int, run: Callable[[], None]) -> None:
        self._queue.put((index, run))

    def stop(self) -> None:
        self._queue.put(None)

    def serve(self) -> None:
        """The communication thread's loop, until `stop` (or abort, or a long silence)."""
        while True:
            deadline = time.monotonic() + self.timeout
            while True:
                try:
                    item = self._queue.get(timeout=_POLL_S)
                    break
                except queue.Empty:
                    self._give_up_if_needed(deadline, "the next collective")
            if item is None:
                return
            index, run = item
            run()
            with self._cond:
                self._done.add(index)
                self._cond.notify_all()

    def wait(self, index: int, what: str) -> None:
        """Block the compute thread until collective `index` is done (bounded, abort-aware)."""
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while index not in self._done:
                self._give_up_if_needed(deadline, what)
                self._cond.wait(_POLL_S)

    def _give_up_if_needed(self, deadline: float, what: str) -> None:
        if self.abort.is_set():
            raise Aborted(f"worker {self.rank}: gave up waiting for {what} (aborted)")
        if time.monotonic() > deadline:
            raise WorkerError(f"worker {self.rank}: waited {self.timeout:g} s for {what} in vain")


# -- memory: bytes of tensors actually held ---------------------------------------------------


def _storage_bytes(tensors, seen: set[int]) -> int:
    """Bytes of the distinct storages behind `tensors` (views of one buffer count once)."""
    total = 0
    for t in tensors:
        storage = t.untyped_storage()
        if storage.nbytes() and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


class MemoryMeter:
    """Samples the bytes a worker holds, by category, and remembers the peak.

    `categories` maps a name to a function listing that category's tensors right now.
    Transient tensors (a layer's full gradient waiting for its reduce-scatter) are
    registered with `hold` and dropped with `release`, from either of the worker's threads.
    """

    def __init__(self, categories: dict[str, Callable[[], list[torch.Tensor]]]) -> None:
        self.categories = categories
        self.transient: dict[tuple, torch.Tensor] = {}
        self.lock = threading.Lock()
        self.peak_total = 0
        self.peak: dict[str, int] = {}

    def now(self) -> dict[str, int]:
        seen: set[int] = set()
        held = {
            name: _storage_bytes(list_now(), seen) for name, list_now in self.categories.items()
        }
        held["layer gradients"] = _storage_bytes(list(self.transient.values()), seen)
        return held

    def sample(self) -> None:
        with self.lock:
            held = self.now()
            total = sum(held.values())
            if total > self.peak_total:
                self.peak_total, self.peak = total, held

    def hold(self, key: tuple, tensor: torch.Tensor) -> None:
        with self.lock:
            self.transient[key] = tensor
        self.sample()

    def release(self, key: tuple) -> None:
        with self.lock:
            self.transient.pop(key, None)

    def reset_peak(self) -> None:
        with self.lock:
            self.peak_total, self.peak = 0, {}


@dataclass
class MemoryReport:
    """One worker's model-state bytes: after the step (`persistent`) and at its peak.

    Categories: "parameters", "gradients", "optimizer" (the three ZeRO shards or copies),
    "gathered" (stage 3: all-gathered layers alive at that moment) and "layer gradients"
    (a layer's full gradient between its backward and its reduce-scatter).
    """

    persistent: dict[str, int]
    peak: dict[str, int]

    @property
    def persistent_total(self) -> int:
        return sum(self.persistent.values())

    @property
    def peak_total(self) -> int:
        return sum(self.peak.values())


# -- one worker's state ----------------------------------------------------------------------


def _free_storage(t: torch.Tensor) -> None:
    if t.untyped_storage().nbytes():
        t.untyped_storage().resize_(0)


def _alloc_storage(t: torch.Tensor) -> None:
    nbytes = t.numel() * t.element_size()
    if t.untyped_storage().nbytes() != nbytes:
        t.untyped_storage().resize_(nbytes)


class _Worker:
    """What worker `rank` keeps: its shards, (stage 1/2) full parameters, Adam states."""

    def __init__(
        self, rank: int, layers: list[nn.Module], layouts: list[FlatLayout], stage: int, dtype
    ) -> None:
        self.rank, self.stage = rank, stage
        # Modules on the meta device: the code of each layer without its weights (those are
        # passed in from the flat vectors by functional_call). One copy per worker because
        # functional_call swaps parameters on the module it is given.
        self.skeletons = [copy.deepcopy(layer).to("meta") for layer in layers]
        self.full: list[torch.Tensor] = []  # per layer: the flat (gathered) parameters
        self.param_shards: list[torch.Tensor] = []
        self.grad_shards: list[torch.Tensor] = []
        self.grad_full: list[torch.Tensor] = []  # stage 1 only: full gradient buffers
        self.exp_avg: list[torch.Tensor] = []
        self.exp_avg_sq: list[torch.Tensor] = []
        for layer, layout in zip(layers, layouts, strict=True):
            flat = layout.flatten(layer, dtype)
            mine = layout.shard_slice(rank)
            full = torch.zeros(layout.padded, dtype=dtype).requires_grad_(True)
            if stage == 3:
                self.param_shards.append(flat[mine].clone())
                _free_storage(full)  # not gathered until a forward needs it
            else:
                full.data.copy_(flat)
                self.param_shards.append(full.data[mine])  # a view: the optimizer updates it
            self.full.append(full)
            if stage == 1:
                grads = torch.zeros(layout.padded, dtype=dtype)
                self.grad_full.append(grads)
                self.grad_shards.append(grads[mine])  # the reduced slice lands in place
            else:
                self.grad_shards.append(torch.zeros(layout.shard, dtype=dtype))
            self.exp_avg.append(torch.zeros(layout.shard, dtype=dtype))
            self.exp_avg_sq.append(torch.zeros(layout.shard, dtype=dtype))
        self.meter = MemoryMeter(
            {
                "parameters": lambda: self.param_shards if stage == 3 else self.full,
                "gradients": lambda: self.grad_full if stage == 1 else self.grad_shards,
                "optimizer": lambda: self.exp_avg + self.exp_avg_sq,
                "gathered": lambda: self.full if stage == 3 else [],
            }
        )


# -- the trainer -------------------------------------------------------------------------------


@dataclass
class FSDPStepResult:
    """One step: whole-batch loss, measured timeline, per-worker bytes sent and memory."""

    loss: float
    timeline: Timeline
    bytes_all_gather: list[int]
    bytes_reduce_scatter: list[int]
    memory: list[MemoryReport]
    step_time_s: float

    @property
    def bytes_sent(self) -> list[int]:
        return [
            a + b for a, b in zip(self.bytes_all_gather, self.bytes_reduce_scatter, strict=True)
        ]


class ShardedDataParallel:
    """ZeRO stage 1, 2 or 3 of a list of layers on `workers` threads, trained with Adam.

    `model` is a list of layers (or a module with a `layers()` method, such as
    `course_utils.models.MLP`); it is copied, not modified. The output of the last layer
    goes to `loss_fn(output, targets)`, which must be a mean over samples. Each batch is
    cut into `microbatches` and each micro-batch into `workers` shards; gradients add up
    over all of them (gradient accumulation). Use as a context manager, or call `close()`.
    """

    def __init__(
        self,
        model: nn.Module | Sequence[nn.Module],
        workers: int,
        stage: int = 3,
        prefetch: int = 1,
        microbatches: int = 1,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        loss_fn: LossFn = loss_fn,
        timeout: float = 60.0,
    ) -> None:
        _check_int(workers, "workers", 1, MAX_WORKERS)
        _check_choice(stage, "stage", STAGES)
        _check_int(prefetch, "prefetch", 0, MAX_PREFETCH)
        _check_int(microbatches, "microbatches", 1, MAX_MICROBATCHES)
        if not (isinstance(betas, tuple | list) and len(betas) == 2):
            raise CourseInputError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        for value, name in ((lr, "lr"), (eps, "eps"), *((b, "betas") for b in betas)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise CourseInputError(f"{name} must be a finite number >= 0, got {value!r}")
        if not all(0 <= b < 1 for b in betas):
            raise CourseInputError(f"betas must both be in [0, 1), got {betas!r}")
        layers = _as_layers(model)
        self.dtype = _common_dtype(layers)
        self.workers, self.stage, self.prefetch = workers, stage, prefetch
        self.microbatches, self.loss_fn = microbatches, loss_fn
        self.lr, self.eps = float(lr), float(eps)
        self.betas = (float(betas[0]), float(betas[1]))
        # the layers' code and shapes without their weights (for `to_model`)
        self.skeletons = [copy.deepcopy(layer).to("meta") for layer in layers]
        self.layouts = [FlatLayout.of(layer, workers) for layer in layers]
        self.states = [_Worker(w, layers, self.layouts, stage, self.dtype) for w in range(workers)]
        self.program, self.comms = fsdp_program(len(layers), stage, prefetch, microbatches)
        self.steps_done = 0
        # threads 0..N-1 compute, threads N..2N-1 communicate (worker w's are w and N + w)
        self.threads = DeviceThreads(2 * workers, name="fsdp")
        self.group = ThreadGroup(workers, abort=self.threads.abort, timeout=timeout)
        self.timeout = timeout
        for state in self.states:
            state.meter.sample()

    # -- facts about the model --

    @property
    def layer_numels(self) -> list[int]:
        return [layout.numel for layout in self.layouts]

    @property
    def num_params(self) -> int:
        return sum(self.layer_numels)

    @property
    def element_size(self) -> int:
        return torch.tensor([], dtype=self.dtype).element_size()

    # -- one training step --

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> FSDPStepResult:
        """One optimizer step on (inputs, targets), split over micro-batches and workers."""
        pieces, weights = self._split(inputs, targets)
        self.group.reset_counters()
        for state in self.states:
            state.meter.reset_peak()
            state.meter.sample()
        streams = [_CommStream(self.threads.abort, self.timeout, w) for w in range(self.workers)]
        sent = {"UNSHARD": [0] * self.workers, "REDUCE_GRAD": [0] * self.workers}
        comm_events: list[list[Event]] = [[] for _ in range(self.workers)]
        self.steps_done += 1
        t0 = time.perf_counter_ns()

        def compute(w: int):
            return lambda: self._compute(
                w, pieces[w], weights[w], streams[w], comm_events[w], sent, t0
            )

        def communicate(w: int):
            return streams[w].serve

        try:
            results = self.threads.run(
                [compute(w) for w in range(self.workers)]
                + [communicate(w) for w in range(self.workers)]
            )
        except Exception:
            # Drop half-delivered messages and gathered copies. The shards may be half
            # updated: after a failed step, start again from a new ShardedDataParallel.
            self.steps_done -= 1
            self.group.reset()
            for state in self.states:
                if self.stage == 3:
                    for full in state.full:
                        _free_storage(full)
                state.meter.transient.clear()
            raise
        step_time = (time.perf_counter_ns() - t0) / 1e9
        events = [e for w in range(self.workers) for e in results[w][1] + comm_events[w]]
        timeline = Timeline(
            events,
            self.workers,
            name=f"ZeRO-{self.stage}, {self.workers} workers, prefetch {self.prefetch}",
            source="measured",
            unit="s",
            meta={"microbatches": self.microbatches, "chunks": 1, "stage": self.stage},
        )
        memory = [
            MemoryReport(persistent=_persistent(s.meter.now()), peak=dict(s.meter.peak))
            for s in self.states
        ]
        return FSDPStepResult(
            loss=sum(r[0] for r in results[: self.workers]),
            timeline=timeline,
            bytes_all_gather=sent["UNSHARD"],
            bytes_reduce_scatter=sent["REDUCE_GRAD"],
            memory=memory,
            step_time_s=step_time,
        )

    def _split(self, inputs, targets):
        """pieces[w][mb] = (x, y) of worker w in micro-batch mb; weights[w][mb] = its share."""
        if not isinstance(inputs, torch.Tensor) or not isinstance(targets, torch.Tensor):
            raise CourseInputError("inputs and targets must be torch tensors")
        if inputs.dim() == 0 or targets.dim() == 0 or inputs.shape[0] != targets.shape[0]:
            raise CourseInputError(
                f"inputs and targets must have the same batch size, got shapes "
                f"{tuple(inputs.shape)} and {tuple(targets.shape)}"
            )
        if inputs.is_floating_point() and not torch.isfinite(inputs).all():
            raise CourseInputError("inputs must be finite (no NaN or inf)")
        batch, m, n = inputs.shape[0], self.microbatches, self.workers
        if batch < m * n:
            raise CourseInputError(
                f"batch size must be >= microbatches x workers = {m * n}, got {batch}"
            )
        if inputs.is_floating_point():
            inputs = inputs.to(self.dtype)
        pieces = [[None] * m for _ in range(n)]
        weights = [[0.0] * m for _ in range(n)]
        micro_sizes = shard_sizes(batch, m)
        micro = zip(inputs.split(micro_sizes), targets.split(micro_sizes), strict=True)
        for mb, (x, y) in enumerate(micro):
            sizes = shard_sizes(x.shape[0], n)
            for w, (xs, ys) in enumerate(zip(x.split(sizes), y.split(sizes), strict=True)):
                pieces[w][mb] = (xs, ys)
                weights[w][mb] = sizes[w] / batch  # mean loss of the shard x its share
        return pieces, weights

    def _compute(self, w, pieces, weights, stream, comm_events, sent, t0):
        """Worker w's compute thread: run the program; return (weighted loss, events)."""
        state, layouts, last = self.states[w], self.layouts, len(self.layouts) - 1
        comm = self.group.comm(w)
        events: list[Event] = []
        inputs: dict[tuple[int, int], torch.Tensor] = {}  # (layer, mb) -> layer input
        outputs: dict[tuple[int, int], torch.Tensor] = {}  # (layer, mb) -> output (or loss)
        input_grads: dict[tuple[int, int], torch.Tensor] = {}
        pending_grad: dict[int, torch.Tensor] = {}  # layer -> full gradient to reduce-scatter
        loss_total = 0.0

        def stamp(action: Action, start: int, end: int, label=None) -> Event:
            return Event(w, action, (start - t0) / 1e9, (end - t0) / 1e9, label)

        def collective(index: int) -> Callable[[], None]:
            """The closure the communication thread runs for comms[index]."""
            op = self.comms[index]
            layout, full = layouts[op.layer], state.full[op.layer]
            if op.kind == "REDUCE_GRAD":  # stage 1 reduces the buffer it keeps
                grad = state.grad_full[op.layer] if self.stage == 1 else pending_grad.pop(op.layer)
                key = ("grad", op.layer, op.microbatch)

            def run() -> None:
                before, start = self.group.bytes_sent[w], time.perf_counter_ns()
                try:
                    if op.kind == "UNSHARD" and self.stage == 3:
                        _alloc_storage(full)  # the gathered layer comes back to life
                        state.meter.sample()
                        comm.all_gather(state.param_shards[op.layer], out=full.data)
                    elif op.kind == "UNSHARD":  # stage 1/2: spread the updated slices
                        comm.all_gather(state.param_shards[op.layer], out=full.data)
                    else:
                        reduced = comm.reduce_scatter(grad, sizes=[layout.shard] * self.workers)
                        if self.stage == 1:
                            state.grad_shards[op.layer].copy_(reduced)
                        else:
                            state.grad_shards[op.layer].add_(reduced)  # accumulate micro-batches
                            state.meter.release(key)
                except (Aborted, WorkerError):
                    raise
                except Exception as exc:
                    raise WorkerError(f"worker {w}: {op.label} failed: {exc}") from exc
                end = time.perf_counter_ns()
                sent[op.kind][w] += self.group.bytes_sent[w] - before
                comm_events.append(
                    stamp(Action(op.layer, op.kind, op.microbatch), start, end, op.label)
                )

            return run

        try:
            for instr in self.program:
                layer, mb = instr.layer, instr.microbatch
                if instr.op == "issue":
                    stream.issue(instr.comm, collective(instr.comm))
                elif instr.op == "wait":
                    stream.wait(instr.comm, self.comms[instr.comm].label)
                elif instr.op == "F":
                    start = time.perf_counter_ns()
                    x, y = pieces[mb]
                    x_in = (
                        x if layer == 0 else outputs[(layer - 1, mb)].detach().requires_grad_(True)
                    )
                    out = functional_call(
                        state.skeletons[layer], layouts[layer].views(state.full[layer]), (x_in,)
                    )
                    if layer == last:
                        out = self.loss_fn(out, y) * weights[mb]
                        loss_total += out.item()
                    inputs[(layer, mb)], outputs[(layer, mb)] = x_in, out
                    events.append(
                        stamp(Action(layer, "F", mb), start, time.perf_counter_ns(), f"L{layer}")
                    )
                elif instr.op == "B":
                    start = time.perf_counter_ns()
                    out, x_in = outputs.pop((layer, mb)), inputs.pop((layer, mb))
                    wrt = [state.full[layer]] + ([x_in] if layer > 0 else [])
                    grad_out = None if layer == last else input_grads.pop((layer + 1, mb))
                    grads = torch.autograd.grad(
                        out, wrt, grad_out, allow_unused=True, materialize_grads=True
                    )
                    if layer > 0:
                        input_grads[(layer, mb)] = grads[1]
                    del out, x_in, grad_out
                    if self.stage == 1:  # accumulate into the full gradient buffer we keep
                        state.meter.hold(("grad", layer, mb), grads[0])
                        state.grad_full[layer].add_(grads[0])
                        state.meter.release(("grad", layer, mb))
                    else:  # kept only until its reduce-scatter is done
                        pending_grad[layer] = grads[0]
                        state.meter.hold(("grad", layer, mb), grads[0])
                    del grads
                    events.append(
                        stamp(Action(layer, "B", mb), start, time.perf_counter_ns(), f"L{layer}")
                    )
                elif instr.op == "free":
                    now = time.perf_counter_ns()
                    _free_storage(state.full[layer])
                    state.meter.sample()
                    events.append(stamp(Action(layer, "RESHARD", mb), now, now, f"free L{layer}"))
                elif instr.op == "optimizer":
                    self._optimizer_step(state)
        except (Aborted, WorkerError):
            raise
        except Exception as exc:
            raise WorkerError(
                f"worker {w}: {instr.op} of layer {instr.layer} failed: {exc}"
            ) from exc
        finally:
            stream.stop()
        return loss_total, events

    def _optimizer_step(self, state: _Worker) -> None:
        with torch.no_grad():
            for i in range(len(self.layouts)):
                adam_update(
                    state.param_shards[i],
                    state.grad_shards[i],
                    state.exp_avg[i],
                    state.exp_avg_sq[i],
                    self.steps_done,
                    self.lr,
                    self.betas,
                    self.eps,
                )
            for grads in state.grad_full if self.stage == 1 else state.grad_shards:
                grads.zero_()

    # -- looking at the result --

    def full_parameters(self) -> list[torch.Tensor]:
        """Each layer's flat parameters (unpadded), put together from the workers' shards."""
        result = []
        for i, layout in enumerate(self.layouts):
            shards = [s.param_shards[i] for s in self.states]
            result.append(torch.cat(shards)[: layout.numel].clone())
        return result

    def to_model(self) -> nn.Sequential:
        """A one-device copy of the trained model (layers in an nn.Sequential)."""
        model = nn.Sequential(*copy.deepcopy(self.skeletons)).to_empty(device="cpu")
        with torch.no_grad():
            for layer, layout, flat in zip(
                model, self.layouts, self.full_parameters(), strict=True
            ):
                for p, offset in zip(layer.parameters(), layout.offsets, strict=True):
                    p.copy_(flat[offset : offset + p.numel()].view_as(p))
        return model

    def close(self) -> None:
        self.threads.close()

    def __enter__(self) -> ShardedDataParallel:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


FSDP = ShardedDataParallel  # what PyTorch calls stage 3


def _persistent(held: dict[str, int]) -> dict[str, int]:
    """What stays between steps: the three model states (nothing gathered, no layer grads)."""
    return {k: held[k] for k in ("parameters", "gradients", "optimizer")}


def _as_layers(model) -> list[nn.Module]:
    if isinstance(model, nn.Module) and hasattr(model, "layers"):
        found: Any = model.layers  # the course's models: a method; others: a ModuleList
        layers = list(found if isinstance(found, nn.ModuleList | nn.Sequential) else found())
    elif isinstance(model, nn.Sequential):
        layers = list(model)
    elif isinstance(model, Sequence) and not isinstance(model, str):
        layers = list(model)
    else:
        raise CourseInputError(
            "model must be a list of layers, an nn.Sequential or a module with .layers()"
        )
    if not layers or not all(isinstance(layer, nn.Module) for layer in layers):
        raise CourseInputError("model must hold at least one layer, each an nn.Module")
    for i, layer in enumerate(layers):
        if any(True for _ in layer.buffers()):
            raise CourseInputError(
                f"layer {i} has buffers (e.g. BatchNorm statistics); only parameters can be sharded"
            )
    return layers


def _common_dtype(layers: list[nn.Module]) -> torch.dtype:
    dtypes = {p.dtype for layer in layers for p in layer.parameters()}
    if not dtypes:
        raise CourseInputError("model must have at least one parameter")
    if len(dtypes) > 1 or next(iter(dtypes)) not in DTYPES:
        raise CourseInputError(
            f"parameters must all be float32 or all float64, got {sorted(map(str, dtypes))}"
        )
    return next(iter(dtypes))


def _check_int(value, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CourseInputError(f"{name} must be an integer in {low}..{high}, got {value!r}")
    return value


def _check_choice(value, name: str, allowed: Sequence) -> None:
    if isinstance(value, bool) or value not in allowed:
        raise CourseInputError(
            f"{name} must be one of {', '.join(map(str, allowed))}, got {value!r}"
        )


# -- the single-device reference -------------------------------------------------------------


def single_device_steps(
    model: nn.Module | Sequence[nn.Module],
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    loss_fn: LossFn = loss_fn,
) -> tuple[nn.Module, list[float]]:
    """The same layers trained on one device with `torch.optim.Adam` on the whole batches."""
    sequential = nn.Sequential(*_as_layers(model))
    return single_worker_steps(sequential, batches, loss_fn, adam(lr, betas, eps))


# -- formulas: traffic and memory per worker ---------------------------------------------------


def fsdp_traffic_bytes(
    layer_numels: Sequence[int],
    workers: int,
    stage: int,
    microbatches: int = 1,
    element_size: int = 4,
) -> dict[str, int]:
    """Bytes every worker sends in one step (ring collectives on padded shards).

    One ring all-gather or reduce-scatter of a layer sends (N-1) x shard bytes per worker,
    shard = ceil(numel / N) elements. ZeRO (arXiv 1910.02054, Section 7): stages 1 and 2
    reduce-scatter the gradients and all-gather the updated parameters, 2 Psi in all, the
    same as the all-reduce of plain data parallelism; stage 3 all-gathers the parameters
    twice (forward and backward) and reduce-scatters once: 3 Psi, 1.5x. With m
    micro-batches, stage 3 repeats all three per micro-batch and stage 2 its
    reduce-scatter; stage 1 (full gradients kept) and plain data parallelism accumulate
    locally and communicate once.
    """
    _check_choice(stage, "stage", STAGES)
    _check_int(workers, "workers", 1, 10**6)
    _check_int(microbatches, "microbatches", 1, 10**6)
    per_pass = sum(
        (workers - 1) * s * element_size for s in padded_shard_numels(layer_numels, workers)
    )
    gathers = {1: 1, 2: 1, 3: 2 * microbatches}[stage]
    reduce_scatters = {1: 1, 2: microbatches, 3: microbatches}[stage]
    return {
        "all_gather": gathers * per_pass,
        "reduce_scatter": reduce_scatters * per_pass,
        "total": (gathers + reduce_scatters) * per_pass,
    }


def dp_traffic_bytes(layer_numels: Sequence[int], workers: int, element_size: int = 4) -> list[int]:
    """Bytes each worker sends per step in plain data parallelism: one ring all-reduce of
    all gradients (`course_utils.parallel.data_parallel`), 2 (N-1)/N x Psi x element_size."""
    return ring_bytes_per_rank(sum(layer_numels), workers, element_size)


def precision_for(element_size: int) -> plan.Precision:
    """The planner's byte counts for Adam at this width: fp32 is 4 + 4 + 8, fp64 8 + 8 + 16."""
    if element_size == 4:
        return plan.get_precision("fp32")
    return plan.Precision(
        "fp64", element_size, element_size, 2 * element_size, element_size, "fp32"
    )


def zero_memory_bytes(
    layer_numels: Sequence[int],
    workers: int,
    stage: int,
    element_size: int = 4,
    padded: bool = False,
) -> dict[str, float]:
    """`plan.model_state_bytes` for these layers: parameters, gradients, Adam state per worker.

    With `padded=True` every layer counts its zero padding too (numel rounded up to a
    multiple of N), which is what the threads really hold.
    """
    numels = layer_numels
    if padded:
        numels = [s * workers for s in padded_shard_numels(layer_numels, workers)]
    return plan.model_state_bytes(sum(numels), precision_for(element_size), zero=stage, dp=workers)


def gathered_bytes_bound(
    layer_numels: Sequence[int], workers: int, prefetch: int, element_size: int = 4
) -> int:
    """Most bytes of gathered layers a stage-3 worker can hold at once: the k + 1 largest
    padded layers (the one computing plus k prefetched). The price of prefetching."""
    sizes = sorted(
        (s * workers * element_size for s in padded_shard_numels(layer_numels, workers)),
        reverse=True,
    )
    return sum(sizes[: prefetch + 1])


# -- the simulator ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FSDPCosts:
    """Seconds per layer per micro-batch shard (`forward[l]`, `backward[l]`), and the link.

    A ring collective of a layer takes (N-1) x (shard bytes / bandwidth + latency):
    N-1 steps, each moving one shard over one link.
    """

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    layer_numels: tuple[int, ...]
    bandwidth: float  # bytes per second per link
    latency: float = 0.0  # seconds per ring step
    element_size: int = 4
    optimizer: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.layer_numels)
        if n < 1 or len(self.forward) != n or len(self.backward) != n:
            raise CourseInputError("forward, backward and layer_numels need one entry per layer")
        values = [*self.forward, *self.backward, self.latency, self.optimizer]
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise CourseInputError("compute times and latency must be finite and >= 0 seconds")
        if not self.bandwidth > 0:
            raise CourseInputError(f"bandwidth must be > 0 bytes/s, got {self.bandwidth!r}")

    def collective_time(self, layer: int, workers: int) -> float:
        shard = padded_shard_numels([self.layer_numels[layer]], workers)[0]
        return (workers - 1) * (shard * self.element_size / self.bandwidth + self.latency)


def simulate_fsdp(
    costs: FSDPCosts, workers: int, stage: int = 3, prefetch: int = 1, microbatches: int = 1
) -> Timeline:
    """Predict one step's timeline: the workers' program on a compute and a comm stream.

    The compute stream runs F, B and the optimizer; a "wait" holds it until the collective
    is done. The communication stream runs collectives one at a time in issue order, each
    starting when it is issued or when the previous one ends, whichever is later. All
    workers are alike, so every row of the timeline is the same.
    """
    _check_int(workers, "workers", 1, 10**6)
    program, comms = fsdp_program(len(costs.layer_numels), stage, prefetch, microbatches)
    clock, comm_free = 0.0, 0.0
    done_at: dict[int, float] = {}
    events: list[tuple[Action, float, float, str | None]] = []
    for instr in program:
        # issue/wait name a collective, F/B/free a layer (fsdp_program builds them so)
        layer, mb, c = instr.layer or 0, instr.microbatch, instr.comm or 0
        if instr.op == "issue":
            op = comms[c]
            start = max(clock, comm_free)
            comm_free = done_at[c] = start + costs.collective_time(op.layer, workers)
            events.append((Action(op.layer, op.kind, op.microbatch), start, comm_free, op.label))
        elif instr.op == "wait":
            clock = max(clock, done_at[c])
        elif instr.op in ("F", "B"):
            cost = (costs.forward if instr.op == "F" else costs.backward)[layer]
            events.append((Action(layer, instr.op, mb), clock, clock + cost, f"L{layer}"))
            clock += cost
        elif instr.op == "free":
            events.append((Action(layer, "RESHARD", mb), clock, clock, f"free L{layer}"))
        else:
            clock += costs.optimizer
    return Timeline(
        [Event(d, a, s, e, label) for d in range(workers) for a, s, e, label in events],
        workers,
        name=f"ZeRO-{stage}, {workers} workers, prefetch {prefetch}",
        source="simulated",
        unit="s",
        meta={"microbatches": microbatches, "chunks": 1, "stage": stage},
    )


def costs_from_timeline(
    timeline: Timeline, layer_numels: Sequence[int], workers: int, element_size: int = 4
) -> FSDPCosts:
    """Per-layer compute times and an effective bandwidth read off a measured timeline.

    Forward and backward costs are the mean duration of each layer's F and B events. The
    bandwidth is the collectives' bytes per worker divided by their time (which includes
    waiting for the slowest peer, so it is an effective bandwidth, not the link's).
    """
    n = len(layer_numels)
    durations: dict[tuple[str, int], list[float]] = {}
    comm_bytes, comm_time = 0.0, 0.0
    shards = padded_shard_numels(layer_numels, workers)
    for e in timeline.events:
        kind, layer = e.action.kind, e.action.stage
        if kind in ("F", "B"):
            durations.setdefault((kind, layer), []).append(e.duration)
        elif kind in ("UNSHARD", "REDUCE_GRAD"):
            comm_bytes += (workers - 1) * shards[layer] * element_size
            comm_time += e.duration

    def mean(kind: str, layer: int) -> float:
        values = durations.get((kind, layer), [])
        return sum(values) / len(values) if values else 0.0

    bandwidth = comm_bytes / comm_time if comm_bytes > 0 and comm_time > 0 else float("inf")
    return FSDPCosts(
        forward=tuple(mean("F", i) for i in range(n)),
        backward=tuple(mean("B", i) for i in range(n)),
        layer_numels=tuple(layer_numels),
        bandwidth=bandwidth,
        element_size=element_size,
    )
