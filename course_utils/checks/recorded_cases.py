"""The cases of two per-rank Builds whose runners record their own evidence, as a learner's
kernel runs them: Exercise 8.4 (the FSDP forward with prefetching: `PrefetchCase`, run by
`parallel.fsdp.prefetch_program`) and 9.7 (Ulysses attention: `UlyssesCase`, run by
`parallel.context_parallel.ulysses_program`).

Each case is made of numbers only, so it crosses to the kernel (`wire.CASES`), builds its
data from its seed the same way in every process and runs the learner's program on the
course's devices; the verdicts are the grader's (`prefetch_build`, `ulysses_build`), never
here. This module imports torch only when a case is built or run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from course_utils.checks.rank_cases import whole_numbers


@dataclass(frozen=True)
class PrefetchCase:
    """`devices` ranks run the forward of the course's MLP (16 inputs, `depth` blocks of
    `hidden`, 10 classes: depth + 1 layers, each an FSDP unit) made from `seed`, prefetching
    `prefetch` layers ahead; `batch` rows, an equal share per rank."""

    devices: int
    depth: int
    hidden: int
    prefetch: int
    seed: int
    batch: int

    def __post_init__(self) -> None:
        whole_numbers(self, {"prefetch": 0})

    @property
    def layers(self) -> int:
        return self.depth + 1

    def __repr__(self) -> str:
        return (
            f"{self.devices} ranks, MLP 16-{self.hidden}x{self.depth}-10 ({self.layers} layers), "
            f"prefetch {self.prefetch}, batch {self.batch}, seed {self.seed}"
        )

    def build(self):
        """(model, inputs, targets), the same in every process."""
        from course_utils.checks.rank_cases import seeded_mlp

        return seeded_mlp(self.seed, 16, self.hidden, 10, self.depth, self.batch)

    def __course_call__(self, program: Callable) -> dict:
        from course_utils.parallel.fsdp.prefetch_program import run_prefetch_program

        model, x, _ = self.build()
        return run_prefetch_program(program, model, self.devices, x, self.prefetch)


@dataclass(frozen=True)
class UlyssesCase:
    """Exercise 9.7: `devices` ranks of `tokens` tokens each, `heads` heads of dimension
    `dim`, causal (1) or not (0), made from `seed`; `devices` must divide `heads`."""

    devices: int
    tokens: int
    heads: int
    dim: int
    causal: int
    seed: int

    def __post_init__(self) -> None:
        whole_numbers(self, {"causal": 0})
        if self.heads % self.devices:
            raise ValueError(
                f"UlyssesCase: {self.devices} ranks must divide the {self.heads} heads (each "
                "rank takes whole heads, an equal share)"
            )

    def __repr__(self) -> str:
        mask = "causal" if self.causal else "not causal"
        return (
            f"{self.devices} ranks, {self.tokens} tokens each, {self.heads} heads of dim "
            f"{self.dim}, {mask}, seed {self.seed}"
        )

    def build(self):
        """(q, k, v), each (heads, devices x tokens, dim)."""
        import torch

        gen = torch.Generator().manual_seed(self.seed)
        shape = (self.heads, self.devices * self.tokens, self.dim)
        return tuple(torch.randn(shape, generator=gen) for _ in range(3))

    def __course_call__(self, program: Callable) -> dict:
        import torch

        from course_utils.parallel.context_parallel.ulysses_program import run_ulysses_program

        q, k, v = self.build()
        run = run_ulysses_program(
            program, q, k, v, self.devices, bool(self.causal), raise_failure=False
        )
        outputs = [
            r.detach().clone() if isinstance(r, torch.Tensor) else f"a {type(r).__name__}"
            for r in run.results
        ]
        return run.evidence() | {"outputs": outputs}  # its `attended` with it
