"""Megatron sequence parallelism on CPU threads, for the MLP block of a transformer layer.

The block (pre-LayerNorm, as in GPT): Y = X + Dropout(GeLU(LN(X) A) B), with A: h -> f
and B: f -> h. Tensor parallelism (Shoeybi et al. 2019, arXiv 1909.08053;
`course_utils.parallel.tensor_parallel`) splits A by columns and B by rows over t devices, with
an all-reduce after B (Megatron's g) and one in the backward before A (f). But LayerNorm,
dropout and the residual add stay replicated: every device computes them on the whole
[s, b, h] activation and keeps their inputs for the backward pass.

Sequence parallelism (Korthikanti et al. 2022, arXiv 2205.05198, Section 4.2.2) notices
that those parts act on each token separately, so each device can do them for 1/t of the
sequence. The all-reduce after B becomes a reduce-scatter along the sequence (each
device keeps the sum for its own tokens) and an all-gather along the sequence brings the
whole sequence back before A:

    X_i -> LN -> [all-gather seq] -> A_i -> GeLU -> B_i -> [reduce-scatter seq]
        -> + bias -> Dropout -> + X_i
    (i: device i's slice of the sequence for LN, dropout and the residual; its slice of
    A's columns and of B's rows for the two linear layers)

In the backward the two swap roles (all-gather <-> reduce-scatter). A ring all-reduce is
a reduce-scatter followed by an all-gather, so this moves exactly the bytes tensor
parallelism moves, while the LayerNorm input, the dropout mask and (with the trick below)
the input of A shrink t-fold. Following Korthikanti (Section 4.2.2) and Megatron-LM's
linear layer, A's gathered input is not kept: only the device's sequence slice is saved
and the backward all-gathers it again (one more all-gather in the backward, for t times
less memory); `save_gathered_input=True` keeps it instead.

Tensors use Megatron's layout [sequence, batch, hidden], so a sequence slice is one
contiguous block of memory. Sequence lengths need not divide t: the first s % t devices
get one more token. The gradients of the parameters that act on sequence slices
(LayerNorm weight and bias, B's bias) are partial sums per device and are all-reduced
after the backward, as Megatron does for its "sequence parallel" parameters.

Dropout stays deterministic: the mask of the whole [s, b, h] activation is drawn from one
seed and each device keeps its own rows of it (a real implementation draws each device's
slice from its own random stream; drawing one mask lets us compare with the unsplit block
bit for bit). Activations kept for the backward are measured with
`torch.autograd.graph.saved_tensors_hooks`, counting each storage once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from course_utils import validation
from course_utils.actions import Action
from course_utils.errors import CourseInputError
from course_utils.parallel.tensor_parallel import shard_mlp
from course_utils.threads.collectives import (
    Communicator,
    chunk_bounds,
    chunk_sizes,
    ring_all_gather_bytes,
    ring_bytes_per_rank,
    ring_reduce_scatter_bytes,
)
from course_utils.threads.devices import ThreadRunner
from course_utils.threads.links import Links
from course_utils.threads.trace import Recorder, check_clock, on, traced
from course_utils.timeline import Timeline

MAX_WORKERS = 16
MAX_ELEMENTS = 2**22  # per activation tensor [s, b, h] or [s, b, f]
LN_EPS = 1e-5

R = TypeVar("R")


def _traced(kind: str, label: str, run: Callable[[], R]) -> R:
    """run(), drawn as one communication bar of `kind` on the calling thread's stream."""
    with traced(Action(0, kind), label):
        return run()


# -- the two sequence-parallel communication operators -------------------------------------------


class GatherSequence(torch.autograd.Function):
    """Megatron's g with sequence parallelism: all-gather the sequence forward,
    reduce-scatter it backward (each device keeps the summed gradient of its tokens)."""

    @staticmethod
    def forward(ctx, x_shard: torch.Tensor, comm: Communicator, sizes: list[int]):
        ctx.comm, ctx.sizes = comm, sizes
        return _traced("ALL_GATHER", "all-gather (g)", lambda: comm.all_gather(x_shard))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        comm, sizes = ctx.comm, ctx.sizes
        shard = _traced(
            "REDUCE_SCATTER",
            "reduce-scatter (g backward)",
            lambda: comm.reduce_scatter(grad.contiguous(), sizes=sizes),
        )
        return shard, None, None


class ReduceScatterSequence(torch.autograd.Function):
    """Megatron's g-bar: reduce-scatter the partial outputs along the sequence forward,
    all-gather the gradient backward. Replaces tensor parallelism's all-reduce."""

    @staticmethod
    def forward(ctx, partial: torch.Tensor, comm: Communicator, sizes: list[int]):
        ctx.comm = comm
        return _traced(
            "REDUCE_SCATTER",
            "reduce-scatter (g-bar)",
            lambda: comm.reduce_scatter(partial.contiguous(), sizes=sizes),
        )

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        comm = ctx.comm
        full = _traced("ALL_GATHER", "all-gather (g-bar backward)", lambda: comm.all_gather(grad))
        return full, None, None


class GatherThenLinear(torch.autograd.Function):
    """All-gather the sequence, then the column-parallel linear, keeping only the shard.

    Forward: Z_i = all_gather(X_shard) A_i^T + a_i. The gathered input is needed again
    for the weight gradient, but instead of keeping it (t times larger than the shard)
    the backward gathers it once more (Korthikanti et al. 2022, Section 4.2.2).
    Backward: dA_i = dZ_i^T X, da_i = sum dZ_i, and dX = dZ_i A_i is a partial sum over
    devices that is reduce-scattered back to sequence shards.
    """

    @staticmethod
    def forward(ctx, x_shard, weight, bias, comm: Communicator, sizes: list[int]):
        ctx.save_for_backward(x_shard, weight)
        ctx.comm, ctx.sizes, ctx.has_bias = comm, sizes, bias is not None
        x = _traced("ALL_GATHER", "all-gather (g)", lambda: comm.all_gather(x_shard))
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_z: torch.Tensor):
        x_shard, weight = ctx.saved_tensors
        comm = ctx.comm
        x = _traced("ALL_GATHER", "all-gather again (for dA)", lambda: comm.all_gather(x_shard))
        grad_partial = grad_z @ weight  # [s, b, h]: this device's share of dX
        grad_weight = grad_z.reshape(-1, grad_z.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        grad_bias = grad_z.sum(dim=(0, 1)) if ctx.has_bias else None
        grad_shard = _traced(
            "REDUCE_SCATTER",
            "reduce-scatter (g backward)",
            lambda: comm.reduce_scatter(grad_partial.contiguous(), sizes=ctx.sizes),
        )
        return grad_shard, grad_weight, grad_bias, None, None


# -- the block, unsplit (the reference) ----------------------------------------------------------


@dataclass
class MLPBlock:
    """The unsplit block's parameters: LayerNorm(h), Linear(h, f), Linear(f, h), dropout p."""

    ln: nn.LayerNorm
    linear1: nn.Linear
    linear2: nn.Linear
    dropout: float = 0.0

    @classmethod
    def random(
        cls, hidden: int, ffn_hidden: int, dropout: float = 0.0, dtype=torch.float32, seed=0
    ) -> MLPBlock:
        for value, name in ((hidden, "hidden"), (ffn_hidden, "ffn_hidden")):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
                raise CourseInputError(f"{name} must be an integer in 1..4096, got {value!r}")
        with torch.random.fork_rng(devices=[]):  # seeded, without touching the global RNG
            torch.manual_seed(seed)
            ln = nn.LayerNorm(hidden, eps=LN_EPS).to(dtype)
            with torch.no_grad():  # not the identity, so that its gradients are interesting
                ln.weight.uniform_(0.5, 1.5)
                ln.bias.uniform_(-0.1, 0.1)
            linear1 = nn.Linear(hidden, ffn_hidden).to(dtype)
            linear2 = nn.Linear(ffn_hidden, hidden).to(dtype)
        return cls(ln, linear1, linear2, dropout)

    @property
    def hidden(self) -> int:
        return self.linear1.in_features

    @property
    def ffn_hidden(self) -> int:
        return self.linear1.out_features

    def named_parameters(self) -> dict[str, torch.Tensor]:
        return {
            "ln.weight": self.ln.weight,
            "ln.bias": self.ln.bias,
            "linear1.weight": self.linear1.weight,
            "linear1.bias": self.linear1.bias,
            "linear2.weight": self.linear2.weight,
            "linear2.bias": self.linear2.bias,
        }


def dropout_mask(shape, p: float, seed: int) -> torch.Tensor | None:
    """Which elements dropout zeroes (True = dropped), drawn from `seed`; None if p == 0."""
    validation.number(p, "p", 0.0, 0.999)
    validation.seed(seed)
    if p == 0:
        return None
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=gen) < p


def _dropout(x: torch.Tensor, dropped: torch.Tensor | None, p: float) -> torch.Tensor:
    # masked_fill keeps the 1-byte mask for the backward, as Korthikanti counts it
    return x if dropped is None else x.masked_fill(dropped, 0.0) * (1.0 / (1.0 - p))


def unsplit_block(
    block: MLPBlock, x: torch.Tensor, grad_output: torch.Tensor, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The reference on one device: (output, input gradient, parameter gradients by name)."""
    x = x.detach().clone().requires_grad_(True)
    dropped = dropout_mask(x.shape, block.dropout, seed)
    z = F.gelu(block.linear1(block.ln(x)))
    y = x + _dropout(block.linear2(z), dropped, block.dropout)
    params = block.named_parameters()
    grads = torch.autograd.grad(y, [x, *params.values()], grad_output)
    return y.detach(), grads[0], dict(zip(params, grads[1:], strict=True))


# -- the block on t threads ----------------------------------------------------------------------


@dataclass
class SPResult:
    """One forward + backward on t devices, put back together for comparison.

    `output` and `input_grad` are whole [s, b, h] tensors (joined from the sequence
    shards with sequence parallelism; device 0's copy without). `grads` uses the
    unsplit names of `MLPBlock.named_parameters`. Per device: `activation_bytes[r]` kept
    for the backward (unique storages, parameters excluded), `bytes_forward[r]` and
    `bytes_backward[r]` sent by the activation collectives, `bytes_param_grads[r]` sent
    by the all-reduce of the sequence-parallel parameters' gradients.
    """

    output: torch.Tensor
    input_grad: torch.Tensor
    grads: dict[str, torch.Tensor]
    activation_bytes: list[int]
    bytes_forward: list[int]
    bytes_backward: list[int]
    bytes_param_grads: list[int]
    timeline: Timeline
    trace: Recorder | None = None  # draws the same run on the other clock


class SequenceParallelMLP(ThreadRunner):
    """The MLP block split over `workers` threads, with or without sequence parallelism.

    `sequence_parallel=False` is plain Megatron tensor parallelism (the all-reduces of
    `course_utils.parallel.tensor_parallel`), for comparison. Use as a context manager, or
    `close()`.
    """

    def __init__(
        self,
        block: MLPBlock,
        workers: int,
        sequence_parallel: bool = True,
        save_gathered_input: bool = False,
        timeout: float = 60.0,
        clock: str = "virtual",
        links: Links | None = None,
    ) -> None:
        self.clock, self.links = check_clock(clock), links
        if (
            isinstance(workers, bool)
            or not isinstance(workers, int)
            or not 1 <= workers <= MAX_WORKERS
        ):
            raise CourseInputError(
                f"workers must be an integer in 1..{MAX_WORKERS}, got {workers!r}"
            )
        if not 0.0 <= block.dropout < 1.0:
            raise CourseInputError(f"dropout must be in [0, 1), got {block.dropout!r}")
        self.block, self.workers = block, workers
        self.sequence_parallel, self.save_gathered_input = sequence_parallel, save_gathered_input
        name = "sp" if sequence_parallel else "tp"
        self._start_threads(name, timeout, one_core=self.clock == "virtual")
        try:
            # A by columns, B by rows: exactly tensor parallelism's split (reused)
            self.shards = shard_mlp(block.linear1, block.linear2, workers, self.group)
        except CourseInputError:
            self.threads.close()
            raise
        # LayerNorm's parameters are replicated: every device gets its own copy
        self.norms = [_copy_norm(block.ln) for _ in range(workers)]

    def forward_backward(
        self, x: torch.Tensor, grad_output: torch.Tensor, seed: int = 0
    ) -> SPResult:
        """Forward on [s, b, h] input `x`, backward with dL/dY = `grad_output`, on all threads."""
        s = self._check_input(x, grad_output)
        dropped = dropout_mask(x.shape, self.block.dropout, seed)
        sizes = chunk_sizes(s, self.workers)
        rows = chunk_bounds(s, self.workers)
        for col, row in self.shards:
            for p in (*col.parameters(), *row.parameters()):
                p.grad = None
        for norm in self.norms:
            norm.weight.grad = norm.bias.grad = None
        sent = self.group.bytes_sent
        trace = Recorder()

        def work(rank: int):
            stream = trace.stream(rank)

            def run():
                lo, hi = rows[rank] if self.sequence_parallel else (0, s)
                # every device holds its own copy of its input, mask and output gradient
                x_local = x[lo:hi].detach().clone().requires_grad_(True)
                mask = None if dropped is None else dropped[lo:hi].clone()
                dy = grad_output[lo:hi].detach().clone()
                before = sent[rank]
                saved: dict[int, int] = {}
                params = self._param_storages(rank)

                def pack(t: torch.Tensor) -> torch.Tensor:
                    storage = t.untyped_storage()
                    if storage.data_ptr() not in params:
                        saved[storage.data_ptr()] = storage.nbytes()
                    return t

                # compute bars, cut around the collectives inside them
                with stream.compute(Action(0, "F", 0)):
                    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                        y = self._forward_on(rank, x_local, mask, sizes)
                middle = sent[rank]
                with stream.compute(Action(0, "B", 0)):
                    y.backward(dy)
                after = sent[rank]
                param_bytes = 0
                if self.sequence_parallel:  # each device saw only its tokens: sum their grads
                    param_bytes = self._all_reduce_sequence_grads(rank)
                return (
                    y.detach(),
                    x_local.grad,
                    sum(saved.values()),
                    middle - before,
                    after - middle,
                    param_bytes,
                )

            return on(stream, run)

        results = self.run_jobs([work(r) for r in range(self.workers)], trace)
        if self.sequence_parallel:
            output = torch.cat([r[0] for r in results])
            input_grad = torch.cat([r[1] for r in results])
        else:
            output, input_grad = results[0][0], results[0][1]
        mode = "sequence" if self.sequence_parallel else "tensor"
        return SPResult(
            output=output,
            input_grad=input_grad,
            grads=self.gathered_grads(),
            activation_bytes=[r[2] for r in results],
            bytes_forward=[r[3] for r in results],
            bytes_backward=[r[4] for r in results],
            bytes_param_grads=[r[5] for r in results],
            timeline=self._timeline(
                trace,
                name=f"MLP block, {mode} parallel on {self.workers} threads",
                meta={"microbatches": 1, "chunks": 1},
            ),
            trace=trace,
        )

    def _forward_on(self, rank, x, dropped, sizes) -> torch.Tensor:
        col, row = self.shards[rank]
        comm, norm, p = self.group.comm(rank), self.norms[rank], self.block.dropout
        h = norm(x)
        if not self.sequence_parallel:  # Megatron tensor parallelism: f ... g
            return x + _dropout(row(F.gelu(col(h))), dropped, p)
        if self.save_gathered_input:
            z = F.linear(GatherSequence.apply(h, comm, sizes), col.weight, col.bias)
        else:
            z = GatherThenLinear.apply(h, col.weight, col.bias, comm, sizes)
        partial = F.linear(F.gelu(z), row.weight)  # no bias yet: it would be added t times
        out = ReduceScatterSequence.apply(partial, comm, sizes) + row.bias
        return x + _dropout(out, dropped, p)

    def _all_reduce_sequence_grads(self, rank: int) -> int:
        norm, (_, row) = self.norms[rank], self.shards[rank]
        grads = [_grad(norm.weight), _grad(norm.bias), _grad(row.bias)]
        before = self.group.bytes_sent[rank]
        _traced(
            "REDUCE_GRAD",
            "all-reduce LN + bias grads",
            lambda: self.group.comm(rank).all_reduce(grads),
        )
        return self.group.bytes_sent[rank] - before

    def _param_storages(self, rank: int) -> set[int]:
        col, row = self.shards[rank]
        tensors = [*col.parameters(), *row.parameters(), *self.norms[rank].parameters()]
        return {t.untyped_storage().data_ptr() for t in tensors}

    def _check_input(self, x, grad_output) -> int:
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise CourseInputError("x must be a tensor of shape [sequence, batch, hidden]")
        s, b, h = x.shape
        if h != self.block.hidden:
            raise CourseInputError(
                f"x's last dimension must be the hidden size {self.block.hidden}, got {h}"
            )
        if not isinstance(grad_output, torch.Tensor) or grad_output.shape != x.shape:
            raise CourseInputError(f"grad_output must have x's shape {tuple(x.shape)}")
        if s < self.workers and self.sequence_parallel:
            raise CourseInputError(
                f"sequence length must be >= workers ({self.workers}) so every device gets "
                f"a token, got {s}"
            )
        if max(x.numel(), s * b * self.block.ffn_hidden) > MAX_ELEMENTS:
            raise CourseInputError(
                f"activations must stay under {MAX_ELEMENTS} elements per tensor"
            )
        if not (torch.isfinite(x).all() and torch.isfinite(grad_output).all()):
            raise CourseInputError("x and grad_output must be finite (no NaN or inf)")
        return s

    def gathered_grads(self) -> dict[str, torch.Tensor]:
        """Every device's parameter gradients in the unsplit block's shapes and names."""
        cols = [c for c, _ in self.shards]
        rows = [r for _, r in self.shards]
        return {
            "ln.weight": _grad(self.norms[0].weight),  # the same on every device (all-reduced)
            "ln.bias": _grad(self.norms[0].bias),
            "linear1.weight": torch.cat([_grad(c.weight) for c in cols], dim=0),
            "linear1.bias": torch.cat([_grad(c.bias) for c in cols], dim=0),
            "linear2.weight": torch.cat([_grad(r.weight) for r in rows], dim=1),
            "linear2.bias": _grad(rows[0].bias),
        }


def _copy_norm(ln: nn.LayerNorm) -> nn.LayerNorm:
    norm = nn.LayerNorm(ln.normalized_shape, eps=ln.eps).to(ln.weight.dtype)
    norm.load_state_dict(ln.state_dict())
    return norm


# -- formulas: activation memory (Korthikanti et al. 2022) and bytes moved -----------------------


def _sizes(**values: object) -> None:
    """The block's sizes, each an integer in its range (one line naming it), before counting."""
    for name, value in values.items():
        high = {"workers": MAX_WORKERS, "bytes_per_value": 16}.get(name, 10**9)
        validation.integer(value, name, 1, high)


def korthikanti_mlp_block_bytes(
    seq: int,
    batch: int,
    hidden: int,
    ffn_hidden: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    bytes_per_value: int = 4,
    dropout: bool = True,
    save_gathered_input: bool = False,
) -> dict[str, float]:
    """Bytes one device keeps for the backward of this block, term by term.

    Korthikanti et al. 2022 (arXiv 2205.05198, Section 4.1), with e bytes per value: the
    LayerNorm input e sbh, the first linear's input e sbh, the GeLU input e sbf, the second
    linear's input e sbf and the dropout mask 1 sbh. With 16-bit values and f = 4h that is
    2 + 2 + 8 + 8 + 1 = 21 sbh: the paper's LayerNorm 2 sbh plus MLP 19 sbh. Tensor
    parallelism divides the f-sized terms by t; sequence parallelism also the other three
    (the first linear's input only if its gathered copy is not kept).
    """
    _sizes(seq=seq, batch=batch, hidden=hidden, ffn_hidden=ffn_hidden, tp=tp,
           bytes_per_value=bytes_per_value)  # fmt: skip
    s, b, h, f, t, e = seq, batch, hidden, ffn_hidden, tp, bytes_per_value
    sp = t if sequence_parallel else 1
    return {
        "layernorm input": e * s * b * h / sp,
        "linear1 input": e * s * b * h / (1 if save_gathered_input else sp),
        "gelu input": e * s * b * f / t,
        "linear2 input": e * s * b * f / t,
        "dropout mask": (s * b * h / sp) if dropout else 0.0,
    }


def layernorm_statistics_bytes(
    seq: int, batch: int, tp: int = 1, sequence_parallel: bool = False, bytes_per_value: int = 4
) -> float:
    """LayerNorm also keeps a mean and 1/std per token, 2 e sb bytes; Korthikanti leaves
    them out of the count (they are h times smaller than its input)."""
    _sizes(seq=seq, batch=batch, tp=tp, bytes_per_value=bytes_per_value)
    return 2 * bytes_per_value * seq * batch / (tp if sequence_parallel else 1)


def sp_comm_bytes(
    seq: int,
    batch: int,
    hidden: int,
    workers: int,
    element_size: int = 4,
    save_gathered_input: bool = False,
) -> dict[str, list[int]]:
    """Bytes each device sends per pass with sequence parallelism (ring collectives).

    Forward: one all-gather and one reduce-scatter of an [s, b, h] tensor cut along the
    sequence, (N-1)/N x sbh x e each. Backward: the same pair, swapped, plus one more
    all-gather when the gathered input of A is not kept. Then an all-reduce of the 3h
    gradients of LayerNorm and B's bias (`param_grads`).
    """
    _sizes(seq=seq, batch=batch, hidden=hidden, workers=workers, bytes_per_value=element_size)
    per_rank = [rows * batch * hidden for rows in chunk_sizes(seq, workers)]
    gather = ring_all_gather_bytes(per_rank, element_size)
    scatter = ring_reduce_scatter_bytes(per_rank, element_size)
    pair = [a + c for a, c in zip(gather, scatter, strict=True)]
    backward = pair if save_gathered_input else [p + a for p, a in zip(pair, gather, strict=True)]
    return {
        "forward": pair,
        "backward": list(backward),
        "param_grads": ring_bytes_per_rank(3 * hidden, workers, element_size),
    }


def _grad(t: torch.Tensor | None) -> torch.Tensor:
    """t's gradient, which a backward has filled (a missing one is a bug, said so)."""
    if t is None or t.grad is None:
        raise RuntimeError("a parameter has no gradient: run backward first")
    return t.grad
