"""The trials of the pipeline Builds whose stages are not dealt out in a loop: a V (Exercise
11.3) and a grid of pipelines side by side (Exercise 12.9).

`programs.ProgramCase` places stage s on rank s mod p. `VCase` places the 2p stages in a V
(rank d holds stage d going down and stage 2p-1-d coming back up, as ZB-V does: Qi et al.
2024, arXiv 2401.10241); `GridCase` runs `replicas` copies of a `stages`-stage pipeline, rank
r holding stage r mod `stages` of replica r // `stages`. Each is made of numbers only, so it
crosses to a learner's kernel like the other cases (`wire.CASES`), and runs the learner's
program on the course's devices with `threads.ranks.run_ranks`. The verdicts are the
grader's (`checks.v_pipeline_build`, `checks.grid_build`).

This module imports torch only when a case is run.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

from course_utils.checks.programs import ProgramCase, Target
from course_utils.checks.rank_cases import seeded_mlp


@dataclass(frozen=True)
class VCase(ProgramCase):
    """A `ProgramCase` of `devices` ranks holding two stages each, placed in a V."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.chunks != 2 or self.devices < 2:
            raise ValueError("a VCase has 2 chunks per rank and at least 2 ranks")

    def __repr__(self) -> str:
        return super().__repr__().replace("2 chunks per rank", "2 stages per rank in a V")

    def placement(self) -> list[list[int]]:
        """Rank d's stages: [d, 2p-1-d] (its down chunk, then its up chunk)."""
        return [[d, 2 * self.devices - 1 - d] for d in range(self.devices)]

    def owner(self, stage: int) -> int:
        return stage if stage < self.devices else 2 * self.devices - 1 - stage

    def run(self, program: Callable, microbatches: int | None = None, raise_failure=True):
        from course_utils.threads.ranks import run_ranks

        stages, x, y = self.build()
        m = self.microbatches if microbatches is None else microbatches
        return run_ranks(
            program, self.devices, stages, x, y, m, self.placement(), raise_failure=raise_failure
        )


def v_fill_drain(p: int, m: int):
    """Fill and drain on a V: each device runs its down chunk's forwards, then its up
    chunk's; then the up chunk's backwards (their gradients come first, from the loss),
    then the down chunk's."""
    from course_utils.actions import Action, Schedule

    rows = []
    for d in range(p):
        down, up = d, 2 * p - 1 - d
        row = [Action(s, "F", i) for s in (down, up) for i in range(m)]
        rows.append(tuple(row + [Action(s, "B", i) for s in (up, down) for i in range(m)]))
    return Schedule("v fill-drain", 2 * p, m, tuple(rows))


def v_target(case: VCase) -> Target:
    """Fill and drain on the V of `case`, simulated with its model's stage costs."""
    from course_utils.pipeline import simulate

    timeline = simulate(v_fill_drain(case.devices, case.microbatches), case.costs())
    held = tuple(int(h) for h in timeline.peak_activations or ())
    return Target("fill and drain on a V", timeline.makespan, held, 2)


@dataclass(frozen=True)
class GridCase(ProgramCase):
    """`devices` ranks as `devices // stages` replicas of a `stages`-stage pipeline: rank r
    holds stage r mod `stages` of replica r // `stages`; the batch's `microbatches` are dealt
    to the replicas in consecutive blocks."""

    stages: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.devices % self.stages or self.devices == self.stages or self.chunks != 1:
            raise ValueError("a GridCase has replicas x stages ranks, 2 replicas or more")
        if self.microbatches % self.replicas:
            raise ValueError("a GridCase deals its micro-batches evenly to its replicas")

    @property
    def replicas(self) -> int:
        return self.devices // self.stages

    def __repr__(self) -> str:
        shape = f"MLP {self.d_in}-{self.hidden}x{self.depth}-{self.classes}"
        return (
            f"{self.replicas} replicas x {self.stages} stages on {self.devices} ranks, {shape}, "
            f"batch {self.batch} in {self.microbatches} micro-batches, seed {self.seed}"
        )

    def owner(self, stage: int) -> int:  # the ranks' copies of the stages: 0..devices-1
        return stage

    def build(self):
        """(one module per rank, inputs, targets): replica k's copy of stage s at k * stages
        + s, each copy equal to the one model's stage."""
        from course_utils.models import partition

        model, x, y = seeded_mlp(
            self.seed, self.d_in, self.hidden, self.classes, self.depth, self.batch
        )
        pieces = partition(model, self.stages)
        copies = [copy.deepcopy(p) if k else p for k in range(self.replicas) for p in pieces]
        return copies, x, y

    def run(self, program: Callable, microbatches: int | None = None, raise_failure=True):
        from course_utils.threads.ranks import run_ranks

        modules, x, y = self.build()
        placement = [[r] for r in range(self.devices)]
        m = self.microbatches if microbatches is None else microbatches
        return run_ranks(
            program, self.devices, modules, x, y, m, placement, raise_failure=raise_failure
        )

    def reference(self) -> dict:
        """What one device computes on the whole batch: each stage's gradients
        ("stage.name"; rank r holds stage r mod `stages`), as one pipeline's case has them."""
        one = ProgramCase(
            self.stages, self.batch, self.hidden, self.seed, self.depth, self.d_in, self.classes
        )
        return one.reference()

    def partner(self, rank: int) -> int:
        """The rank that holds the same stage in the other replica (2 replicas)."""
        return (rank + self.stages) % self.devices


def grid_report(run, case: GridCase) -> str:
    """A run of a grid program (`RankRun`) beside one device on the whole batch, per rank:
    the bytes it sent to the other replica, its stage's gradient bytes, and how far its
    gradients are from one device's."""
    want = case.reference()["grads"]
    lines = [f"{'rank':<6}{'stage':<7}{'bytes to its group':<20}{'gradients':<11}off by at most"]
    for rank, sends in enumerate(run.sends):
        stage = rank % case.stages
        mine = {k.split(".", 1)[1]: g for k, g in want.items() if k.startswith(f"{stage}.")}
        grads = {k.split(".", 1)[1]: g for k, g in run.grads[rank].items()}
        sent = sum(n for to, _, n, _ in sends if to == case.partner(rank))
        size = sum(g.numel() * g.element_size() for g in mine.values())
        off = max(
            (float((grads[k] - g).abs().max()) if grads.get(k) is not None else float("inf"))
            for k, g in mine.items()
        )
        lines.append(f"{rank:<6}{stage:<7}{sent:<20}{size:<11}{off:.2g}")
    return "\n".join(lines)
