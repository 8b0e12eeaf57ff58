"""FSDP's forward with prefetch, written as the program every rank runs (Exercise 8.4).

With prefetch depth k a rank starts the all-gather of layer i + k (non-blocking,
`threads.async_comm`) before it computes layer i, so the gather runs on its communication
stream while the layer computes; it pays with memory: up to k + 1 gathered layers at once
(the k in flight and the one computing). A learner writes it:

    def fsdp_forward(ctx):
        works = {j: ctx.comm.all_gather(ctx.shards[j], async_op=True) for j in range(ctx.prefetch)}
        x = ctx.inputs[ctx.rank]
        for i in range(len(ctx.shards)):
            ...                                   # issue layer i + k's gather, wait for layer i's
            x = ctx.layer(i, full, x)
        return x

Each rank's ctx holds `ctx.shards[i]` (its shard of layer i, `FlatLayout`), `ctx.prefetch`
(k), `ctx.inputs[ctx.rank]` and `ctx.layer(i, full, x)` (layer i from its whole flat vector,
drawn as a compute bar on the virtual clock). `ctx.comm` is the rank's communicator, watched
here (`GatherLog`): every all-gather issued (which layer, blocking or not), every wait, and at
every `ctx.layer` call the gathered layers the rank still held then: gathers issued and not
yet waited for (their buffer is taken when they are issued, as on a GPU) and gathered
tensors still alive (held by weak references: a tensor the program let go is gone).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from course_utils.actions import Action
from course_utils.parallel.fsdp.rank_program import _layer_function, cut_in_shards
from course_utils.parallel.fsdp.shards import FlatLayout
from course_utils.parallel.fsdp.trainer import _as_layers
from course_utils.threads.ranks import Rank, run_ranks


class _Buffer:
    """One gather's buffer: held while its handle is pending or its tensor is alive."""

    def __init__(self, layer: int) -> None:
        self.layer = layer
        self.pending: weakref.ref | None = None  # the handle, until it is waited for
        self.tensor: weakref.ref | None = None

    def held(self) -> bool:
        if self.pending is not None and self.pending() is not None:
            return True
        tensor = None if self.tensor is None else self.tensor()
        return tensor is not None and tensor.untyped_storage().nbytes() > 0


class _Handle:
    """What `all_gather(..., async_op=True)` returns: `wait()` gives the gathered layer."""

    def __init__(self, work: Any, log: GatherLog, buffer: _Buffer) -> None:
        self._work, self._log, self._buffer = work, log, buffer

    def is_completed(self) -> bool:
        return bool(self._work.is_completed())

    def wait(self) -> Any:
        first = not self._work.is_completed()
        result = self._work.wait()
        if first:
            self._log.waited(self._buffer, result)
        return result

    def __repr__(self) -> str:
        return repr(self._work)


class GatherLog:
    """`ctx.comm` as a prefetching program sees it, writing down what it does (see above).

    `events`: ["gather", layer, async (0/1)], ["wait", layer], ["compute", layer, held
    layers (sorted)], in order; a layer is -1 when the gathered tensor is not one of the
    rank's shards."""

    def __init__(self, comm: Any, shards: list[torch.Tensor]) -> None:
        self._comm, self._shards = comm, shards
        self.rank, self.world_size = comm.rank, comm.world_size
        self.events: list[list[Any]] = []
        self.buffers: list[_Buffer] = []

    def _layer(self, shard: Any) -> int:
        for i, s in enumerate(self._shards):
            if isinstance(shard, torch.Tensor) and shard.data_ptr() == s.data_ptr():
                return i
        return -1

    def all_gather(self, shard, dim: int = 0, out=None, async_op: bool = False):
        layer = self._layer(shard)
        got = self._comm.all_gather(shard, dim=dim, out=out, async_op=async_op)
        buffer = _Buffer(layer)
        self.buffers.append(buffer)
        self.events.append(["gather", layer, int(bool(async_op))])
        if not async_op:
            self.waited(buffer, got)
            return got
        handle = _Handle(got, self, buffer)
        buffer.pending = weakref.ref(handle)
        return handle

    def waited(self, buffer: _Buffer, result: Any) -> None:
        buffer.pending = None
        if isinstance(result, torch.Tensor):
            buffer.tensor = weakref.ref(result)
        self.events.append(["wait", buffer.layer])

    def computing(self, layer: int) -> None:
        held = sorted(b.layer for b in self.buffers if b.held())
        self.events.append(["compute", layer, held])

    @property
    def calls(self) -> list[dict]:  # what the run's evidence reads
        return self._comm.calls

    def __getattr__(self, name: str):
        return getattr(self._comm, name)

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, world_size={self.world_size})"


def run_prefetch_program(
    program: Callable[[Rank], object],
    model: nn.Module | Sequence[nn.Module],
    workers: int,
    inputs: torch.Tensor,
    prefetch: int,
    timeout: float = 20.0,
) -> dict:
    """Run `program(ctx)` on `workers` ranks (see the module docstring); the run's evidence:
    `failure`, per rank its `events` and `output`, and `makespan`, the step on the virtual
    clock (compute bars: CPU time; gathers: the emulated links). `model` is not changed."""
    layers = _as_layers(model)
    layouts = [FlatLayout.of(layer, workers) for layer in layers]
    cut = cut_in_shards(layers, workers)
    logs: list[GatherLog | None] = [None] * workers
    outputs: list[Any] = [None] * workers

    def watched(ctx: Rank) -> None:
        shards = [s.clone() for s in cut[ctx.rank]]
        log = logs[ctx.rank] = GatherLog(ctx.comm, shards)
        ctx.comm = log  # type: ignore[assignment]  # the same collectives, written down
        compute = _layer_function(layouts, [copy.deepcopy(layer) for layer in layers])

        def layer(i: int, full: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            log.computing(i if isinstance(i, int) else -1)
            with torch.no_grad(), ctx.stream.compute(Action(ctx.rank, "F", 0), f"layer {i}"):
                return compute(i, full, x)

        ctx.shards, ctx.prefetch, ctx.layer = shards, prefetch, layer  # type: ignore[attr-defined]
        del ctx.stage, ctx.stages, ctx.targets
        out = program(ctx)
        outputs[ctx.rank] = out.detach().clone() if isinstance(out, torch.Tensor) else out

    stages = [nn.Identity() for _ in range(workers)]
    labels = torch.zeros(inputs.shape[0], dtype=torch.long)
    run = run_ranks(watched, workers, stages, inputs, labels, workers, timeout=timeout,
                    raise_failure=False)  # fmt: skip
    data = run.evidence()
    ends = [float(e[3]) for e in data["timeline"]]
    return {
        "world": workers,
        "failure": data["failure"],
        "events": [[] if log is None else log.events for log in logs],
        "outputs": outputs,
        "makespan": max(ends, default=0.0),
        "layer_bytes": [lay.padded * 4 for lay in layouts],
    }


def print_depths(
    program: Callable[[Rank], object],
    model: nn.Module | Sequence[nn.Module],
    workers: int,
    inputs: torch.Tensor,
    depths: Sequence[int],
) -> None:
    """Run `program` at each prefetch depth and print, per depth, what rank 0 held at most
    (gathered layers, their bytes) and the forward's time on the virtual clock. A first run,
    not printed, warms up (its first layers would be timed with the allocator's first use)."""
    run_prefetch_program(program, model, workers, inputs, depths[0])
    print("depth k | most gathered layers held (rank 0) | their bytes | forward, virtual clock")
    for k in depths:
        run = run_prefetch_program(program, model, workers, inputs, k)
        if run["failure"] is not None:
            print(f"{k:7} | stopped: {run['failure']['message']}")
            continue
        sizes = run["layer_bytes"]
        held: list[list[int]] = [e[2] for e in run["events"][0] if e[0] == "compute"]
        most: list[int] = max(held, key=lambda h: sum(sizes[j] for j in h), default=[])
        nbytes = sum(sizes[j] for j in most)
        print(f"{k:7} | {max(map(len, held), default=0):35} | {nbytes:11,} | "
              f"{run['makespan'] * 1e3:.2f} ms")  # fmt: skip
