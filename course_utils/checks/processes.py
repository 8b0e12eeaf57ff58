"""The trials of lesson 13's Builds, whose answer is a worker file run on real processes.

Lesson 13's Builds pass a `Worker` (a function of a file the learner wrote with
`%%writefile`) to their check: `check.exercise_2(Worker("ring_worker.py", "ring_sum"))`.
Their cases, `WorkerRingCase` and `WorkerDDPCase`, are numbers (a seed, sizes), never
objects, so that they can be sent to a learner's kernel. Each case runs the worker on `world`
fresh processes (`distributed.workers.run_worker`) and comes back as the run's evidence, plain
data: what each rank returned, its arguments after the call (a model as its parameters), the
`torch.distributed` calls each rank made, the failure if any (`WorkerRun.evidence`).

Graded, the kernel makes that call (`wire.call_outcome`: the case says how to call the
answer, and that it needs `least_call_seconds` to start its processes) and only the evidence
crosses. The verdict is computed in the grader from it (`checks.worker_runs`, which a graded
kernel does not get): the sums against the inputs the grader drew, the parameters against one
process training on the whole batch.

This module imports torch only when a case is run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from course_utils.checks.rank_cases import _Case, seeded_mlp

LR = 0.5  # plain SGD's learning rate in WorkerDDPCase: summed gradients move twice as far
RUN_TIMEOUT_S = 90.0  # a run's own limit: past it, the run says where each rank was
# Graded, each call gets this long at least, whatever the grader's limit per call: starting the
# processes alone takes seconds on a busy machine, and the run's own limit should come first.
LEAST_CALL_S = RUN_TIMEOUT_S + 10


def _run(worker: Any, rank_args: list[tuple]) -> dict:
    """Run `worker` on `rank_args` (one tuple per rank); the run's evidence."""
    run = worker.run(rank_args=rank_args, timeout=RUN_TIMEOUT_S, echo=False, raise_failure=False)
    return run.evidence()


@dataclass(frozen=True)
class WorkerRingCase(_Case):
    """`world` ranks, each holding `size` whole numbers drawn from `seed`."""

    world: int
    size: int
    seed: int
    least_call_seconds: ClassVar[float] = LEAST_CALL_S

    def __repr__(self) -> str:
        return f"{self.world} processes, {self.size} numbers each, seed {self.seed}"

    def inputs(self) -> list:
        """Each rank's tensor: whole numbers (as floats), so any order of adding is exact."""
        import torch

        g = torch.Generator().manual_seed(self.seed)
        return [torch.randint(-9, 10, (self.size,), generator=g).float() for _ in range(self.world)]

    def __course_call__(self, worker: Any) -> dict:
        return _run(worker, [(x,) for x in self.inputs()])


@dataclass(frozen=True)
class WorkerDDPCase(_Case):
    """`world` ranks training the course's MLP (8 inputs, `hidden` wide, 4 classes) made from
    `seed` for `steps` steps of SGD on a batch of `batch` rows, each rank on its own shard."""

    world: int
    batch: int
    hidden: int
    steps: int
    seed: int
    least_call_seconds: ClassVar[float] = LEAST_CALL_S

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch % self.world:
            raise ValueError("WorkerDDPCase.batch must be a multiple of world")

    def __repr__(self) -> str:
        return (
            f"{self.world} processes, MLP 8-{self.hidden}x2-4, batch {self.batch}, "
            f"{self.steps} steps, seed {self.seed}"
        )

    def build(self):
        """(model, inputs, targets): the same numbers wherever they are made."""
        return seeded_mlp(self.seed, 8, self.hidden, 4, 2, self.batch)

    def shards(self) -> list[tuple]:
        """Each rank's arguments: the model, its shard of the batch, the steps, the rate."""
        model, x, y = self.build()
        return [
            (model, xs, ys, self.steps, LR)
            for xs, ys in zip(x.chunk(self.world), y.chunk(self.world), strict=True)
        ]

    def __course_call__(self, worker: Any) -> dict:
        return _run(worker, self.shards())
