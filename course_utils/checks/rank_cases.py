"""The trials of the per-rank Builds of lessons 06-10: all-reduces (ring, hierarchical), DDP,
tensor and column parallelism, process groups, ZeRO, the zig-zag ring, the MoE dispatch with
capacity and the load-balancing bias, each run on the course's devices and judged in the
grader from the run's evidence.

As `programs.ProgramCase` does for lesson 01, each case is made of numbers only (so it can
be sent to a learner's kernel), builds its data from its seed the same way in every process
and runs the learner's program (`__course_call__`, `parallel.rank_programs`). What one device
computes for it, and what the known wrong programs compute, is the grader's alone
(`checks.rank_references`, which a graded kernel does not get); the verdicts and their hints
are the lessons' own (`checks.l06`, `checks.l07`).

This module imports torch only when a case is run or judged.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from course_utils.threads.links import Links

# The links a ring's messages are timed on in the grader: fixed numbers, so the verdict is
# the same on every machine (a planner-like latency, and a bandwidth at which a chunk of a
# few dozen floats costs about as much as the latency).
RING_LINKS = Links(8, 2e7, 2e6, 5e-6, name="grading")


def whole_numbers(case: Any, least: dict[str, int] | None = None) -> None:
    """Every field of the dataclass `case` a whole number >= 1, or >= `least[name]` where
    given (a case is numbers, so that it can cross to the kernel)."""
    for name, value in asdict(case).items():
        floor = (least or {}).get(name, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < floor:
            kind = type(case).__name__
            raise ValueError(f"{kind}.{name} must be a whole number >= {floor}, got {value!r}")


class _Case:
    """A case is made of whole numbers >= 1 (checked when it is made)."""

    def __post_init__(self) -> None:
        whole_numbers(self)


def close(got: Any, want: Any) -> bool:
    """`got` is a tensor equal to `want` within float32 rounding (sums in another order)."""
    import torch

    ok = isinstance(got, torch.Tensor) and got.shape == want.shape
    return ok and torch.allclose(got, want, rtol=1e-4, atol=1e-5)


def _generator(seed: int):
    import torch

    return torch.Generator().manual_seed(seed)


def seeded_mlp(seed: int, d_in: int, hidden: int, classes: int, depth: int, batch: int):
    """The course's MLP and a batch, made from `seed` whatever the caller's random state:
    the same numbers in every thread and process that makes them."""
    import torch

    from course_utils.models import MLP

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MLP(d_in, hidden, classes, depth)
    x, y = model.example_batch(batch, _generator(seed))
    return model, x, y


# --------------------------------------------------------------------------- the ring


@dataclass(frozen=True)
class RingCase(_Case):
    """`devices` ranks, each with `length` whole numbers (as float32) drawn from `seed`."""

    devices: int
    length: int
    seed: int

    def __repr__(self) -> str:
        return f"{self.devices} ranks, {self.length} numbers each, seed {self.seed}"

    def data(self) -> list:
        """Each rank's tensor: whole numbers, so every order of adding them is exact."""
        import torch

        gen = _generator(self.seed)
        return [
            torch.randint(-99, 100, (self.length,), generator=gen).float()
            for _ in range(self.devices)
        ]

    def __course_call__(self, program) -> dict:
        from course_utils.parallel.rank_programs import run_collective

        return run_collective(program, self.data(), raise_failure=False).evidence()

    def seconds(self, links: Links = RING_LINKS) -> float:
        """The ring's time on `links`: 2(N-1) steps, each a latency and the largest chunk
        (chunks differ by one number when N does not divide the length)."""
        n = self.devices
        largest = 4 * math.ceil(self.length / n)
        return 2 * (n - 1) * (links.latency + largest / links.ring_bandwidth(n))


@dataclass(frozen=True)
class HierarchyCase(_Case):
    """Exercise 6.5: `nodes` nodes of `per_node` ranks each, every rank with `length` whole
    numbers (as float32) drawn from `seed`."""

    nodes: int
    per_node: int
    length: int
    seed: int

    @property
    def devices(self) -> int:
        return self.nodes * self.per_node

    def __repr__(self) -> str:
        return (
            f"{self.nodes} nodes of {self.per_node} ranks, {self.length} numbers each, "
            f"seed {self.seed}"
        )

    def data(self) -> list:
        """Each rank's tensor, as `RingCase` makes them."""
        return RingCase(self.devices, self.length, self.seed).data()

    def __course_call__(self, program) -> dict:
        from course_utils.parallel.hierarchical import run_hierarchical

        run = run_hierarchical(program, self.data(), self.nodes, raise_failure=False)
        return run.evidence()


# --------------------------------------------------------------------------- DDP


@dataclass(frozen=True)
class DDPCase(_Case):
    """`devices` replicas of the course's MLP (16 inputs, `depth` blocks of `hidden`, 10
    classes) from `seed`; a batch of `batch` rows, an equal shard per rank, cut into
    `microbatches`; buckets of at most `bucket_cap` numbers."""

    devices: int
    batch: int
    hidden: int
    depth: int
    microbatches: int
    bucket_cap: int
    seed: int

    def __repr__(self) -> str:
        return (
            f"{self.devices} ranks, MLP 16-{self.hidden}x{self.depth}-10, batch {self.batch} "
            f"({self.microbatches} micro-batch{'es' if self.microbatches > 1 else ''} per "
            f"rank), buckets of at most {self.bucket_cap} numbers, seed {self.seed}"
        )

    def build(self):
        """(model, inputs, targets), the same in every process."""
        return seeded_mlp(self.seed, 16, self.hidden, 10, self.depth, self.batch)

    def __course_call__(self, program) -> dict:
        from course_utils.parallel.rank_programs import run_data_parallel
        from course_utils.threads.clock import default_links

        model, x, y = self.build()
        run = run_data_parallel(
            program,
            model,
            x,
            y,
            self.devices,
            self.microbatches,
            raise_failure=False,
            bucket_cap=self.bucket_cap,
        )
        return run.evidence() | {"links": default_links().to_dict()}

    def bucket_sizes(self) -> list[int]:
        """The numbers each bucket holds, in the order their gradients are ready: the
        parameters from the last to the first, a new bucket whenever the next parameter
        would take the current one past `bucket_cap` (a bigger one gets a bucket alone)."""
        model, _, _ = self.build()
        sizes, current = [], 0
        for p in reversed(list(model.parameters())):
            if current and current + p.numel() > self.bucket_cap:
                sizes.append(current)
                current = 0
            current += p.numel()
        return [*sizes, current]


# --------------------------------------------------------------------------- the TP MLP


@dataclass(frozen=True)
class TPCase(_Case):
    """`devices` ranks share the MLP `d_model` -> `hidden` -> `d_model` (GeLU) from `seed`;
    the input has `tokens` rows, and a gradient `dy` arrives from above."""

    devices: int
    tokens: int
    d_model: int
    hidden: int
    seed: int

    def __repr__(self) -> str:
        return (
            f"{self.devices} ranks, MLP {self.d_model}-{self.hidden}-{self.d_model}, "
            f"{self.tokens} tokens, seed {self.seed}"
        )

    def build(self):
        """(linear1, linear2, x, dy), the same in every process."""
        import torch
        from torch import nn

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            linear1 = nn.Linear(self.d_model, self.hidden)
            linear2 = nn.Linear(self.hidden, self.d_model)
        gen = _generator(self.seed)
        x = torch.randn(self.tokens, self.d_model, generator=gen)
        dy = torch.randn(self.tokens, self.d_model, generator=gen)
        return linear1, linear2, x, dy

    def __course_call__(self, program) -> dict:
        from course_utils.parallel.rank_programs import mlp_shards, run_tensor_parallel

        linear1, linear2, x, dy = self.build()
        shards = mlp_shards(linear1, linear2, self.devices)
        run = run_tensor_parallel(program, shards, x, dy, raise_failure=False)
        return run.evidence()


# --------------------------------------------------------------------------- 7.1: columns


@dataclass(frozen=True)
class ColumnCase(_Case):
    """`devices` ranks share the columns of a layer Y = XA + b (`d_in` x `d_out`) from
    `seed`; the input has `tokens` rows, and a gradient `dy` arrives from above."""

    devices: int
    tokens: int
    d_in: int
    d_out: int
    seed: int

    def __repr__(self) -> str:
        return (
            f"{self.devices} ranks, A of {self.d_in} x {self.d_out}, {self.tokens} tokens, "
            f"seed {self.seed}"
        )

    def build(self):
        """(A, b, x, dy), the same in every process."""
        import torch

        gen = _generator(self.seed)
        a = torch.randn(self.d_in, self.d_out, generator=gen)
        b = torch.randn(self.d_out, generator=gen)
        x = torch.randn(self.tokens, self.d_in, generator=gen)
        return a, b, x, torch.randn(self.tokens, self.d_out, generator=gen)

    def __course_call__(self, program) -> dict:
        from course_utils.parallel.column_program import column_shards, run_column_parallel

        a, b, x, dy = self.build()
        run = run_column_parallel(program, column_shards(a, b, self.devices), x, dy, False)
        return run.evidence()


# --------------------------------------------------------------------------- 8.2: ZeRO-2


@dataclass(frozen=True)
class ZeroCase(_Case):
    """`devices` ranks train the course's MLP (16 inputs, one block of `hidden`, 10 classes)
    from `seed` with ZeRO-2 for `steps` steps of SGD with momentum; a batch of `batch` rows,
    an equal share per rank."""

    devices: int
    batch: int
    hidden: int
    seed: int
    steps: int = 2

    def __repr__(self) -> str:
        return (
            f"{self.devices} ranks, MLP 16-{self.hidden}-10, batch {self.batch}, "
            f"{self.steps} steps, seed {self.seed}"
        )

    def build(self):
        """(model, inputs, targets), the same in every process."""
        return seeded_mlp(self.seed, 16, self.hidden, 10, 1, self.batch)

    def __course_call__(self, program) -> dict:
        from course_utils.parallel.fsdp import zero_program as zero

        model, x, y = self.build()
        run = zero.run_zero_program(program, model, self.devices, x, y, self.steps, False)
        return run.evidence() | {"flats": zero.flats(run), "state": zero.state_numels(run)}


# --------------------------------------------------------------------------- 7.5: groups


@dataclass(frozen=True)
class GroupsCase(_Case):
    """A grid of `tp` x `dp` ranks (tensor parallelism innermost), each holding a tensor of
    whole numbers drawn from `seed`."""

    tp: int
    dp: int
    seed: int

    @property
    def devices(self) -> int:
        return self.tp * self.dp

    def __repr__(self) -> str:
        return f"tp = {self.tp}, dp = {self.dp}, seed {self.seed}"

    def values(self) -> list:
        """Each rank's tensor: whole numbers, so every order of adding them is exact."""
        import torch

        gen = _generator(self.seed)
        return [torch.randint(-99, 100, (3,), generator=gen).float() for _ in range(self.devices)]

    def __course_call__(self, program) -> dict:
        from course_utils.parallel.grid_program import run_grid_program

        run = run_grid_program(program, self.tp, self.dp, self.values(), raise_failure=False)
        return run.evidence()


# --------------------------------------------------------------------------- 9.4: zig-zag


@dataclass(frozen=True)
class ZigzagCase(_Case):
    """Causal ring attention on the zig-zag split: `devices` ranks, 2 x `devices` chunks of
    `chunk` tokens of dimension `dim`, made from `seed`."""

    devices: int
    chunk: int
    dim: int
    seed: int

    def __repr__(self) -> str:
        return (
            f"{self.devices} ranks, {2 * self.devices} chunks of {self.chunk} tokens of dim "
            f"{self.dim}, causal, seed {self.seed}"
        )

    def build(self):
        """(q, k, v), each (2 x devices x chunk, dim)."""
        import torch

        gen = _generator(self.seed)
        shape = (2 * self.devices * self.chunk, self.dim)
        q, k, v = (torch.randn(shape, generator=gen) for _ in range(3))
        return q, k, v

    def __course_call__(self, program) -> dict:
        import torch

        from course_utils.parallel.context_parallel.zigzag_program import run_zigzag_program

        q, k, v = self.build()
        run = run_zigzag_program(program, q, k, v, self.devices, raise_failure=False)
        outputs = [
            r.detach().clone() if isinstance(r, torch.Tensor) else f"a {type(r).__name__}"
            for r in run.results
        ]
        return run.evidence() | {"outputs": outputs}  # its `products` with it


# --------------------------------------------------------------------------- MoE capacity


@dataclass(frozen=True)
class CapacityCase(_Case):
    """Exercise 10.2: a top-1 MoE block of `experts` experts (`d_model`, hidden 2 d_model, a
    router leaning hard to expert 0) from `seed`, over `devices` ranks of `tokens` tokens
    each, with a capacity factor of `percent` / 100 applied to each rank's group."""

    devices: int
    experts: int
    d_model: int
    tokens: int
    percent: int
    seed: int

    def __repr__(self) -> str:
        return (
            f"{self.devices} ranks, {self.experts} experts, top-1, d_model {self.d_model}, "
            f"{self.tokens} tokens per rank, capacity factor {self.percent / 100:g}, "
            f"seed {self.seed}"
        )

    def build(self):
        """(moe, x): the block, with its capacity factor, and every rank's tokens."""
        import torch

        from course_utils.parallel.moe import MoE

        factor = self.percent / 100
        with torch.random.fork_rng(devices=[]):  # as the notebook makes it: torch.manual_seed
            torch.manual_seed(self.seed)
            moe = MoE(self.d_model, 2 * self.d_model, self.experts, 1, factor, skew=0.5)
            return moe, torch.randn(self.devices * self.tokens, self.d_model)

    def run(self, program, raise_failure: bool = True):
        """The watched run of `program` on this case (`moe.rank_program.run_moe_program`)."""
        from course_utils.parallel.moe.rank_program import run_moe_program

        moe, x = self.build()
        return run_moe_program(
            program,
            moe,
            x,
            self.devices,
            raise_failure=raise_failure,
            capacity_factor=moe.capacity_factor,
        )

    def __course_call__(self, program) -> dict:
        run = self.run(program, raise_failure=False)
        pairs = [_output_and_dropped(r) for r in run.results]
        return run.evidence() | {"outputs": [o for o, _ in pairs], "dropped": [d for _, d in pairs]}


def _output_and_dropped(value: Any) -> tuple[Any, Any]:
    """A rank's `(y, dropped)` as data: y a tensor, dropped a list of whole numbers; what
    else either was, by its type's name."""
    import torch

    def named(v: Any) -> str:
        return f"a {type(v).__name__}"

    if not isinstance(value, tuple | list) or len(value) != 2:
        return named(value), f"only {named(value)}"  # not the pair (y, dropped)
    y, dropped = value
    y = y.detach().clone() if isinstance(y, torch.Tensor) else named(y)
    if isinstance(dropped, torch.Tensor) and not dropped.is_floating_point():
        dropped = dropped.flatten().tolist()
    if isinstance(dropped, list | tuple) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in dropped
    ):
        return y, [int(t) for t in dropped]
    return y, named(dropped)


# --------------------------------------------------------------------------- bias balancing


@dataclass(frozen=True)
class BiasCase(_Case):
    """Exercise 10.9: `devices` ranks of `tokens` tokens each, scored against `experts` experts
    (a softmax leaning to expert 0) from `seed`; a bias of a few steps of gamma = `milli` /
    1000 per expert."""

    devices: int
    experts: int
    tokens: int
    milli: int
    seed: int

    def __repr__(self) -> str:
        return (
            f"{self.devices} ranks, {self.tokens} tokens each, {self.experts} experts, gamma "
            f"{self.milli / 1000:g}, seed {self.seed}"
        )

    def build(self):
        """(scores, bias, gamma): the whole batch's scores (devices x tokens, experts)."""
        import torch

        gen = _generator(self.seed)
        logits = torch.randn(self.devices * self.tokens, self.experts, generator=gen)
        logits[:, 0] += 0.8
        steps = torch.randint(-2, 3, (self.experts,), generator=gen).float()
        gamma = self.milli / 1000
        return torch.softmax(logits, dim=-1), gamma * steps, gamma

    def __course_call__(self, program) -> dict:
        from course_utils.parallel.moe.bias_program import run_bias_program

        scores, bias, gamma = self.build()
        run = run_bias_program(program, scores, bias, gamma, self.devices, raise_failure=False)
        return run.evidence()


# --------------------------------------------------------------------------- 9.1: Megatron SP


@dataclass(frozen=True)
class SequenceCase(TPCase):
    """`devices` ranks run the block x + W2 GeLU(W1 LN(x) + b1) + b2 (TPCase's MLP after a
    LayerNorm, with the residual) with sequence parallelism on `tokens` tokens."""

    def __repr__(self) -> str:
        return (
            f"{self.devices} ranks, {self.tokens} tokens of width {self.d_model}, "
            f"{self.hidden} hidden units, seed {self.seed}"
        )

    def build(self):
        """(norm, linear1, linear2, x, dy), the same in every process."""
        import torch

        linear1, linear2, x, dy = super().build()
        gen, norm = _generator(self.seed + 1), torch.nn.LayerNorm(self.d_model)
        with torch.no_grad():  # not the identity: a LayerNorm's gradients worth judging
            norm.weight.copy_(1 + 0.3 * torch.randn(self.d_model, generator=gen))
            norm.bias.copy_(0.3 * torch.randn(self.d_model, generator=gen))
        return norm, linear1, linear2, x, dy

    def __course_call__(self, program) -> dict:
        from course_utils.parallel.sp_program import run_sequence_parallel, sp_shards

        norm, linear1, linear2, x, dy = self.build()
        shards = sp_shards(norm, linear1, linear2, self.devices, self.tokens)
        run = run_sequence_parallel(program, shards, x, dy, raise_failure=False)
        return run.evidence()
