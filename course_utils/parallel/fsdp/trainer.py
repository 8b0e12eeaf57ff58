"""ZeRO stages 1, 2, 3 executed: N worker threads, each with a communication thread.

`ShardedDataParallel(model, workers, stage, prefetch).step(batches)` trains with the
per-worker program of `program.py`, records a measured timeline, the bytes each
collective sent and the memory held; `single_device_steps` is the reference it must equal.
"""

from __future__ import annotations

import copy
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from course_utils import validation
from course_utils.actions import Action
from course_utils.errors import CourseInputError, WorkerError
from course_utils.models import loss_fn
from course_utils.parallel.data_parallel import shard_sizes, single_worker_steps
from course_utils.parallel.fsdp.memory import (
    MemoryMeter,
    MemoryReport,
    allocate_storage,
    free_storage,
)
from course_utils.parallel.fsdp.program import (
    MAX_MICROBATCHES,
    MAX_PREFETCH,
    MAX_WORKERS,
    STAGES,
    check_one_of,
    fsdp_program,
)
from course_utils.parallel.fsdp.shards import FlatLayout, adam, adam_update
from course_utils.threads.devices import Aborted, ThreadRunner
from course_utils.threads.links import Links
from course_utils.threads.trace import Recorder, Stream, on
from course_utils.timeline import Timeline

DTYPES = (torch.float32, torch.float64)
_POLL_S = 0.02  # how often a waiting thread looks at the abort event

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


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
                free_storage(full)  # not gathered until a forward needs it
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
    """One step: whole-batch loss, measured timeline, per-worker bytes sent and memory.

    `step_time_s` is the step on the timeline's clock (virtual: CPU time and emulated
    links; wall: real seconds); `trace` draws the same step on the other clock.
    """

    loss: float
    timeline: Timeline
    bytes_all_gather: list[int]
    bytes_reduce_scatter: list[int]
    memory: list[MemoryReport]
    step_time_s: float
    trace: Recorder | None = None
    wall_time_s: float = 0.0

    def retimed(self, trace: Recorder) -> FSDPStepResult:
        """This step on the virtual clock from another recording of it (`measure.timing`
        puts several runs together)."""
        timeline = trace.timeline("virtual")
        return replace(self, timeline=timeline, trace=trace, step_time_s=timeline.makespan)

    @property
    def bytes_sent(self) -> list[int]:
        return [
            a + b for a, b in zip(self.bytes_all_gather, self.bytes_reduce_scatter, strict=True)
        ]


class ShardedDataParallel(ThreadRunner):
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
        clock: str = "virtual",
        links: Links | None = None,
    ) -> None:
        self._keep_workers_and_clock(workers, MAX_WORKERS, clock, links)
        check_one_of(stage, "stage", STAGES)
        validation.integer(prefetch, "prefetch", 0, MAX_PREFETCH)
        validation.integer(microbatches, "microbatches", 1, MAX_MICROBATCHES)
        if not (isinstance(betas, tuple | list) and len(betas) == 2):
            raise CourseInputError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        for value, name in ((lr, "lr"), (eps, "eps"), *((b, "betas") for b in betas)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise CourseInputError(f"{name} must be a finite number >= 0, got {value!r}")
        if not all(0 <= b < 1 for b in betas):
            raise CourseInputError(f"betas must both be in [0, 1), got {betas!r}")
        layers = _as_layers(model)
        self.dtype = _common_dtype(layers)
        self.stage, self.prefetch = stage, prefetch
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
        self._start_threads("fsdp", timeout, one_core=self.clock == "virtual", threads=2 * workers)
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
        self.steps_done += 1
        trace = Recorder()
        # each worker is one device with two streams: compute, and communication beside it
        computing = [trace.stream(w, "compute") for w in range(self.workers)]
        talking = [trace.stream(w, "communication") for w in range(self.workers)]

        def compute(w: int):
            return lambda: self._compute(
                w, pieces[w], weights[w], streams[w], computing[w], talking[w], sent
            )

        start = time.perf_counter_ns()
        try:
            results = self.run_jobs(
                [compute(w) for w in range(self.workers)]
                + [on(talking[w], streams[w].serve) for w in range(self.workers)],
                trace,
            )
        except Exception:
            # run_jobs dropped the half-delivered messages; drop the gathered copies too. The
            # shards may be half updated: after a failed step, start again from a new
            # ShardedDataParallel.
            self.steps_done -= 1
            for state in self.states:
                if self.stage == 3:
                    for full in state.full:
                        free_storage(full)
                state.meter.transient.clear()
            raise
        wall = (time.perf_counter_ns() - start) / 1e9
        timeline = self._timeline(
            trace,
            name=f"ZeRO-{self.stage}, {self.workers} workers, prefetch {self.prefetch}",
            meta={"microbatches": self.microbatches, "chunks": 1, "stage": self.stage},
        )
        memory = [
            MemoryReport(persistent=_persistent(s.meter.now()), peak=dict(s.meter.peak))
            for s in self.states
        ]
        return FSDPStepResult(
            loss=sum(results[: self.workers]),
            timeline=timeline,
            bytes_all_gather=sent["UNSHARD"],
            bytes_reduce_scatter=sent["REDUCE_GRAD"],
            memory=memory,
            step_time_s=timeline.makespan if self.clock == "virtual" else wall,
            trace=trace,
            wall_time_s=wall,
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

    def _compute(self, w, pieces, weights, stream, computing: Stream, talking: Stream, sent):
        """Worker w's compute thread: run the program; return its weighted loss.

        `computing` records this thread; `talking` the communication thread, which runs the
        closures `collective` makes (the issue and done tokens order the two streams).
        """
        state, layouts, last = self.states[w], self.layouts, len(self.layouts) - 1
        comm = self.group.comm(w)
        inputs: dict[tuple[int, int], torch.Tensor] = {}  # (layer, mb) -> layer input
        outputs: dict[tuple[int, int], torch.Tensor] = {}  # (layer, mb) -> output (or loss)
        input_grads: dict[tuple[int, int], torch.Tensor] = {}
        pending_grad: dict[int, torch.Tensor] = {}  # layer -> full gradient to reduce-scatter
        loss_total = 0.0

        def collective(index: int) -> Callable[[], None]:
            """The closure the communication thread runs for comms[index]."""
            op = self.comms[index]
            layout, full = layouts[op.layer], state.full[op.layer]
            if op.kind == "REDUCE_GRAD":  # stage 1 reduces the buffer it keeps
                grad = state.grad_full[op.layer] if self.stage == 1 else pending_grad.pop(op.layer)
                key = ("grad", op.layer, op.microbatch)

            def run() -> None:
                before = self.group.bytes_sent[w]
                talking.recv(("issue", w, index))  # not before the compute stream issued it
                try:
                    with talking.span(Action(op.layer, op.kind, op.microbatch), op.label):
                        if op.kind == "UNSHARD" and self.stage == 3:
                            allocate_storage(full)  # the gathered layer comes back to life
                            state.meter.sample()
                            comm.all_gather(state.param_shards[op.layer], out=full.data)
                        elif op.kind == "UNSHARD":  # stage 1/2: spread the updated slices
                            comm.all_gather(state.param_shards[op.layer], out=full.data)
                        else:
                            sizes = [layout.shard] * self.workers
                            reduced = comm.reduce_scatter(grad, sizes=sizes)
                            with talking.burst():
                                if self.stage == 1:
                                    state.grad_shards[op.layer].copy_(reduced)
                                else:  # accumulate micro-batches
                                    state.grad_shards[op.layer].add_(reduced)
                            if self.stage != 1:
                                state.meter.release(key)
                except (Aborted, WorkerError):
                    raise
                except Exception as exc:
                    raise WorkerError(f"worker {w}: {op.label} failed: {exc}") from exc
                talking.send(("done", w, index), w, 0)
                sent[op.kind][w] += self.group.bytes_sent[w] - before

            return run

        try:
            for instr in self.program:
                # issue/wait name a collective, F/B/free a layer (fsdp_program builds them so)
                layer, mb, c = instr.layer or 0, instr.microbatch or 0, instr.comm or 0
                if instr.op == "issue":
                    computing.send(("issue", w, c), w, 0)
                    stream.issue(c, collective(c))
                elif instr.op == "wait":
                    stream.wait(c, self.comms[c].label)
                    computing.recv(("done", w, c))
                elif instr.op == "F":
                    with computing.compute(Action(layer, "F", mb), f"L{layer}"):
                        x, y = pieces[mb]
                        x_in = (
                            x
                            if layer == 0
                            else outputs[(layer - 1, mb)].detach().requires_grad_(True)
                        )
                        views = layouts[layer].views(state.full[layer])
                        out = functional_call(state.skeletons[layer], views, (x_in,))
                        if layer == last:
                            out = self.loss_fn(out, y) * weights[mb]
                            loss_total += out.item()
                        inputs[(layer, mb)], outputs[(layer, mb)] = x_in, out
                elif instr.op == "B":
                    with computing.compute(Action(layer, "B", mb), f"L{layer}"):
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
                elif instr.op == "free":
                    with computing.span(Action(layer, "RESHARD", mb), f"free L{layer}"):
                        free_storage(state.full[layer])
                        state.meter.sample()
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
        return loss_total

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
