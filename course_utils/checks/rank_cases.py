"""The trials of lessons 06 and 07's per-rank Builds: a ring all-reduce, DDP, a tensor-parallel
MLP, each run on the course's devices and judged in the grader from the run's evidence.

As `programs.ProgramCase` does for lesson 01, each case is made of numbers only (so it can
be sent to a learner's kernel), builds its data from its seed the same way in every process,
runs the learner's program (`__course_call__`, `parallel.rank_programs`) and says what one
device computes for it (`reference`), with what the known wrong programs compute, so that a
check can name the mistake it sees. The verdicts and their hints are the lessons' own
(`checks.l06`, `checks.l07`).

This module imports torch only when a case is run or judged.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Any

from course_utils.checks import Variant
from course_utils.threads.links import Links

# The links a ring's messages are timed on in the grader: fixed numbers, so the verdict is
# the same on every machine (a planner-like latency, and a bandwidth at which a chunk of a
# few dozen floats costs about as much as the latency).
RING_LINKS = Links(8, 2e7, 2e6, 5e-6, name="grading")


def draws(variant: Variant, key: str) -> random.Random:
    """Where a Build's further cases come from: in the grader its secret seed; in the
    notebook the learner's own name, so the same cases on every run."""
    if variant.cases_seed is None:
        return random.Random(f"{variant.student}/{key}")
    return variant.cases(key)


class _Case:
    """A case is made of whole numbers >= 1 (checked when it is made)."""

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():  # type: ignore[call-overload]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                kind = type(self).__name__
                raise ValueError(f"{kind}.{name} must be a whole number >= 1, got {value!r}")


def close(got: Any, want: Any) -> bool:
    """`got` is a tensor equal to `want` within float32 rounding (sums in another order)."""
    import torch

    ok = isinstance(got, torch.Tensor) and got.shape == want.shape
    return ok and torch.allclose(got, want, rtol=1e-4, atol=1e-5)


def _generator(seed: int):
    import torch

    return torch.Generator().manual_seed(seed)


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


def ring_result(data: list, rank: int, gather_from: int = 1, add_in_gather: bool = False):
    """What rank `rank` holds after a ring all-reduce of `data` (every rank's tensor) in which
    rank r first sends its chunk r, then passes on what it has just added into; the
    all-gather starts from chunk r + `gather_from` (1 is right: the one that is complete) and
    adds (`add_in_gather`, a mistake) or copies what arrives."""
    from course_utils.threads.collectives import chunk_bounds

    n = len(data)
    bufs = [t.clone() for t in data]
    bounds = chunk_bounds(len(bufs[0]), n)
    for phase, start in (("reduce-scatter", 0), ("all-gather", gather_from)):
        add = phase == "reduce-scatter" or add_in_gather
        for step in range(n - 1):
            chunks = [(r + start - step) % n for r in range(n)]
            sent = [bufs[r][slice(*bounds[chunks[r]])].clone() for r in range(n)]
            for r in range(n):
                a, b = bounds[chunks[(r - 1) % n]]
                bufs[r][a:b] = bufs[r][a:b] + sent[(r - 1) % n] if add else sent[(r - 1) % n]
    return bufs[rank]


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
        import torch

        from course_utils.models import MLP

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = MLP(16, self.hidden, 10, self.depth)
        x, y = model.example_batch(self.batch, _generator(self.seed))
        return model, x, y

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

    def reference(self) -> dict:
        """One worker on the whole batch: its gradients and its weights after the SGD step;
        and `early`, the gradients all ranks would agree on had the last micro-batch's
        contribution been left out (a bucket sent before its gradients were ready)."""
        import torch

        from course_utils.models import loss_fn
        from course_utils.parallel.rank_programs import LR

        model, x, y = self.build()
        loss_fn(model(x), y).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        early = {n: torch.zeros_like(g) for n, g in grads.items()}
        m, n_ranks = self.microbatches, self.devices
        for xs, ys in zip(x.chunk(n_ranks), y.chunk(n_ranks), strict=True):
            for xb, yb in list(zip(xs.chunk(m), ys.chunk(m), strict=True))[:-1]:
                model.zero_grad()
                (loss_fn(model(xb), yb) / m / n_ranks).backward()
                for name, p in model.named_parameters():
                    early[name] += p.grad
        weights = {n: p.detach() - LR * grads[n] for n, p in model.named_parameters()}
        return {"grads": grads, "weights": weights, "early": early}


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

    def reference(self) -> dict:
        """The unsplit MLP's output, input gradient and each rank's share of the weight
        gradients ("r.w1", ...); and the outputs of the known wrong programs, per rank:
        `swapped` (f all-reduces forward, g does not), `bias` (b2 added on every rank before
        the sum), `mean` (g averages)."""
        import torch
        import torch.nn.functional as F

        from course_utils.threads.collectives import chunk_bounds

        linear1, linear2, x, dy = self.build()
        x = x.clone().requires_grad_()
        y = linear2(F.gelu(linear1(x)))
        y.backward(dy)
        n, b2 = self.devices, linear2.bias.detach()
        grads, swapped = {}, []
        with torch.no_grad():
            for r, (lo, hi) in enumerate(chunk_bounds(self.hidden, n)):
                grads[f"{r}.w1"] = linear1.weight.grad[lo:hi]
                grads[f"{r}.b1"] = linear1.bias.grad[lo:hi]
                grads[f"{r}.w2"] = linear2.weight.grad[:, lo:hi]
                grads[f"{r}.b2"] = linear2.bias.grad
                h = F.gelu(F.linear(n * x, linear1.weight[lo:hi], linear1.bias[lo:hi]))
                swapped.append(F.linear(h, linear2.weight[:, lo:hi]) + b2)
            out = y.detach()
        return {
            "output": out,
            "input_grad": x.grad.detach(),
            "grads": grads,
            "swapped": swapped,
            "bias": out + (n - 1) * b2,
            "mean": (out - b2) / n + b2,
        }
