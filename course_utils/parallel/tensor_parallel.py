"""Tensor parallelism on CPU threads: the Megatron-LM split of a transformer MLP.

A transformer MLP computes Y = GeLU(X A) B. Megatron-LM (Shoeybi et al. 2019,
arXiv 1909.08053, section 3) splits it over N devices with only one all-reduce each way:

- A is split by columns: device i holds A_i (a slice of the hidden units) and computes
  Z_i = GeLU(X A_i) on its own. GeLU acts element-wise, so no communication is needed
  between the two layers (splitting A by rows would need a sum *before* the GeLU).
- B is split by rows to match: device i computes the partial output Z_i B_i, and
  Y = sum_i Z_i B_i is one all-reduce. The bias of B is added once, after the sum.

In PyTorch's `nn.Linear` (y = x W^T + b, W of shape [out, in]) "A by columns" means
rows of `linear1.weight`, and "B by rows" means columns of `linear2.weight`.

Megatron names the two communication points f and g:

- f, before the column-parallel layer: identity forward, all-reduce backward (each device
  only has its slice's share of dL/dX; the full input gradient is their sum);
- g, after the row-parallel layer: all-reduce forward, identity backward.

Both are `torch.autograd.Function`s here that call the hand-made all-reduce of
`course_utils.threads.collectives`, so autograd does the rest. Per forward and per backward,
every device all-reduces one tensor the size of the MLP's output (tokens x d_model).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.actions import Action
from course_utils.errors import CourseInputError
from course_utils.parallel.costs import ring_allreduce_time
from course_utils.threads.collectives import (
    Communicator,
    ThreadGroup,
    check_options,
    chunk_bounds,
    naive_bytes_per_rank,
    ring_bytes_per_rank,
)
from course_utils.threads.devices import ThreadRunner
from course_utils.threads.links import Links
from course_utils.threads.trace import Recorder, check_clock, on, traced
from course_utils.timeline import Timeline
from course_utils.validation import MAX_WORKERS  # the command's limit, 8 threads

# -- Megatron's f and g -------------------------------------------------------------------


def _all_reduce(comm: Communicator, tensor: torch.Tensor, algorithm: str, label: str):
    """Sum `tensor` over the group in place, drawn as one ALL_REDUCE bar when recorded."""
    with traced(Action(0, "ALL_REDUCE"), label):
        comm.all_reduce(tensor, op="sum", algorithm=algorithm)


class CopyToParallel(torch.autograd.Function):
    """f: the input goes to every device unchanged; its gradients are summed on the way back."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator, algorithm: str):
        ctx.comm, ctx.algorithm = comm, algorithm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        _all_reduce(ctx.comm, grad, ctx.algorithm, "all-reduce (f)")
        return grad, None, None


class ReduceFromParallel(torch.autograd.Function):
    """g: the partial outputs are summed over devices; the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator, algorithm: str):
        out = x.contiguous().clone()
        _all_reduce(comm, out, algorithm, "all-reduce (g)")
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None, None


# -- the two sharded layers ---------------------------------------------------------------


class _LinearShard(nn.Module):
    """One device's slice of a linear layer's weight and bias (copies), and the group it
    sums over; the two subclasses differ only in where the sum goes."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, comm: Communicator, algorithm: str
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        self.comm, self.algorithm = comm, algorithm


class ColumnParallelLinear(_LinearShard):
    """Device `comm.rank`'s slice of the output features of a linear layer (Megatron's A_i).

    Takes the full (replicated) input and returns this device's slice of the output.
    The f operator inside makes the input gradient complete on every device.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = CopyToParallel.apply(x, self.comm, self.algorithm)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(_LinearShard):
    """Device `comm.rank`'s slice of the input features of a linear layer (Megatron's B_i).

    Takes this device's slice of the input, computes a partial output, sums the partial
    outputs of all devices (the g operator), then adds the (replicated) bias once.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(x, self.weight)  # no bias here: it would be added N times
        out = ReduceFromParallel.apply(partial, self.comm, self.algorithm)
        return out if self.bias is None else out + self.bias


def shard_mlp(
    linear1: nn.Linear,
    linear2: nn.Linear,
    workers: int,
    group: ThreadGroup | None = None,
    algorithm: str = "ring",
) -> list[tuple[ColumnParallelLinear, RowParallelLinear]]:
    """Split an unsplit MLP (linear1 -> activation -> linear2) into per-device shards.

    Device i gets hidden units bounds[i] (as even as possible): those rows of
    `linear1.weight` and `linear1.bias`, and those columns of `linear2.weight`, plus a
    copy of `linear2.bias`. The shards talk over `group` (a new `ThreadGroup` if None).
    """
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise CourseInputError(f"workers must be an integer >= 1, got {workers!r}")
    check_options("sum", algorithm)
    hidden = linear1.out_features
    if linear2.in_features != hidden:
        raise CourseInputError(
            f"linear2.in_features must equal linear1.out_features ({hidden}), "
            f"got {linear2.in_features}"
        )
    if hidden < workers:
        raise CourseInputError(
            f"workers must be <= the hidden size {hidden} so every device gets a hidden unit, "
            f"got {workers}"
        )
    group = group or ThreadGroup(workers)
    if group.world_size != workers:
        raise CourseInputError(f"group must have {workers} ranks, got {group.world_size}")
    shards = []
    for rank, (lo, hi) in enumerate(chunk_bounds(hidden, workers)):
        comm = group.comm(rank)
        b1 = None if linear1.bias is None else linear1.bias[lo:hi]
        col = ColumnParallelLinear(linear1.weight[lo:hi], b1, comm, algorithm)
        row = RowParallelLinear(linear2.weight[:, lo:hi], linear2.bias, comm, algorithm)
        shards.append((col, row))
    return shards


# -- the whole MLP on threads -------------------------------------------------------------


@dataclass
class TPResult:
    """One forward + backward: outputs and input gradients per device, gathered weight grads.

    `grads` uses the unsplit layer's names: "linear1.weight", "linear1.bias",
    "linear2.weight", "linear2.bias". `bytes_forward[r]` / `bytes_backward[r]` are the
    bytes device r sent during the forward / backward pass. `timeline` is measured:
    per device, compute (`0F0`, `0B0`) and the two all-reduces (`0REDUCE_GRAD`, labelled
    "all-reduce (g)" in the forward and "all-reduce (f)" in the backward).
    """

    outputs: list[torch.Tensor]
    input_grads: list[torch.Tensor]
    grads: dict[str, torch.Tensor]
    bytes_forward: list[int]
    bytes_backward: list[int]
    timeline: Timeline | None = None
    trace: Recorder | None = None  # draws the same run on the other clock

    @property
    def output(self) -> torch.Tensor:
        return self.outputs[0]

    @property
    def input_grad(self) -> torch.Tensor:
        return self.input_grads[0]


class TensorParallelMLP(ThreadRunner):
    """Y = act(X A) B with A split by columns and B by rows over `workers` threads.

    Built from an unsplit `linear1` and `linear2` (copied, not modified). Use as a
    context manager, or call `close()`, to stop the threads.
    """

    def __init__(
        self,
        linear1: nn.Linear,
        linear2: nn.Linear,
        workers: int,
        activation: Callable[[torch.Tensor], torch.Tensor] = F.gelu,
        algorithm: str = "ring",
        timeout: float = 60.0,
        clock: str = "virtual",
        links: Links | None = None,
    ) -> None:
        self._keep_workers_and_clock(workers, MAX_WORKERS, clock, links)  # the command's limit
        check_options("sum", algorithm)
        self.activation = activation
        self._start_threads("tp", timeout, one_core=self.clock == "virtual")
        try:
            self.shards = shard_mlp(linear1, linear2, workers, self.group, algorithm)
        except CourseInputError:
            self.threads.close()
            raise

    def _forward_on(self, rank: int, x: torch.Tensor) -> torch.Tensor:
        col, row = self.shards[rank]
        return row(self.activation(col(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The output only (no gradients), computed on all threads."""

        def work(rank: int):
            def run() -> torch.Tensor:
                with torch.no_grad():
                    return self._forward_on(rank, x)

            return run

        return self.run_jobs([work(r) for r in range(self.workers)])[0]

    __call__ = forward

    def forward_backward(
        self, x: torch.Tensor, grad_output: torch.Tensor | None = None
    ) -> TPResult:
        """Forward, then backward with dL/dY = `grad_output` (ones if None), on all threads."""
        for col, row in self.shards:
            for p in (*col.parameters(), *row.parameters()):
                p.grad = None
        sent = self.group.bytes_sent  # each rank only ever adds to its own entry
        trace = Recorder()

        def work(rank: int):
            stream = trace.stream(rank)

            def run():
                x_local = x.detach().clone().requires_grad_(True)  # X is replicated
                before = sent[rank]
                with stream.compute(Action(0, "F", 0)):  # cut around the all-reduce (g)
                    y = self._forward_on(rank, x_local)
                middle = sent[rank]
                with stream.compute(Action(0, "B", 0)):  # ... and around (f)
                    y.backward(torch.ones_like(y) if grad_output is None else grad_output)
                return y.detach(), x_local.grad, middle - before, sent[rank] - middle

            return on(stream, run)

        results = self.run_jobs([work(r) for r in range(self.workers)], trace)
        timeline = self._timeline(
            trace,
            name=f"tensor-parallel MLP on {self.workers} threads",
        )
        return TPResult(
            timeline=timeline,
            outputs=[r[0] for r in results],
            input_grads=[r[1] for r in results],
            grads=self.gathered_grads(),
            bytes_forward=[r[2] for r in results],
            bytes_backward=[r[3] for r in results],
            trace=trace,
        )

    def gathered_grads(self) -> dict[str, torch.Tensor]:
        """Every shard's weight gradients put back together in the unsplit layers' shapes."""
        cols = [c for c, _ in self.shards]
        rows = [r for _, r in self.shards]
        grads = {
            "linear1.weight": torch.cat([_grad(c.weight) for c in cols], dim=0),
            "linear2.weight": torch.cat([_grad(r.weight) for r in rows], dim=1),
        }
        if cols[0].bias is not None:
            grads["linear1.bias"] = torch.cat([_grad(c.bias) for c in cols], dim=0)
        if rows[0].bias is not None:
            grads["linear2.bias"] = _grad(rows[0].bias)  # replicated: the same on every device
        return grads


def unsplit_forward_backward(
    linear1: nn.Linear,
    linear2: nn.Linear,
    x: torch.Tensor,
    grad_output: torch.Tensor | None = None,
    activation: Callable[[torch.Tensor], torch.Tensor] = F.gelu,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The reference on one device: (output, input gradient, weight gradients by name)."""
    x = x.detach().clone().requires_grad_(True)
    params = {
        "linear1.weight": linear1.weight,
        "linear1.bias": linear1.bias,
        "linear2.weight": linear2.weight,
        "linear2.bias": linear2.bias,
    }
    params = {k: p for k, p in params.items() if p is not None}
    y = linear2(activation(linear1(x)))
    grads = torch.autograd.grad(
        y, [x, *params.values()], torch.ones_like(y) if grad_output is None else grad_output
    )
    return y.detach(), grads[0], dict(zip(params, grads[1:], strict=True))


def tp_mlp_comm_bytes(
    tokens: int, d_model: int, workers: int, algorithm: str = "ring", element_size: int = 4
) -> dict[str, list[int]]:
    """Bytes each device sends per forward and per backward of one tensor-parallel MLP.

    One all-reduce of a (tokens x d_model) tensor each way (Shoeybi et al. 2019): with the
    ring that is 2(N-1)/N x tokens x d_model x element_size bytes per device per pass.
    """
    check_options("sum", algorithm)
    per_pass = ring_bytes_per_rank if algorithm == "ring" else naive_bytes_per_rank
    sent = per_pass(tokens * d_model, workers, element_size)
    return {"forward": sent, "backward": list(sent)}


def simulated_step_s(result: TPResult, links: Links | None = None) -> float:
    """The simulator's prediction of a measured forward + backward: the slowest device's
    measured compute, plus two ring all-reduces of the output (forward g, backward f) by
    the formula over the ring's slowest link (`links`; None: links at their fastest)."""
    assert result.timeline is not None  # forward_backward always records one
    n = result.timeline.num_devices
    compute = max(result.timeline.busy_per_device())
    if n == 1 or links is None or links.instant:
        return compute
    out = result.outputs[0]
    nbytes = out.numel() * out.element_size()
    return compute + 2 * ring_allreduce_time(nbytes, n, links.ring_bandwidth(n), links.latency)


def unsplit_step_s(
    linear1: nn.Linear,
    linear2: nn.Linear,
    x: torch.Tensor,
    grad_output: torch.Tensor | None = None,
    repeats: int = 3,
    clock: str = "virtual",
) -> float:
    """Best-of-`repeats` seconds of the unsplit forward + backward on one thread: CPU time
    on the virtual clock (what one device computes), wall time on the wall clock."""
    from course_utils.models import single_thread

    now = time.thread_time if check_clock(clock) == "virtual" else time.perf_counter
    best = float("inf")
    with single_thread():
        for i in range(repeats + 1):  # the first run is a warm-up
            start = now()
            unsplit_forward_backward(linear1, linear2, x, grad_output)
            if i:
                best = min(best, now() - start)
    return best


def _grad(param: torch.Tensor | None) -> torch.Tensor:
    """The gradient forward_backward left on a shard's weight or bias."""
    assert param is not None and param.grad is not None
    return param.grad


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0
