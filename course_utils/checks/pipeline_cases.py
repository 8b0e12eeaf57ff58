"""The cases of the pipeline Builds that the course's `ProgramCase` does not cover alone, as a
learner's kernel runs them.

Lessons 02 to 04: Exercise 2.6 (gradient accumulation), 3.4 (GPipe in rounds under a memory
budget) and 4.4 (ZB-H1) each run the learner's rank program on a `ProgramCase` of their own:
`AccumCase` hands the program each micro-batch's mean loss unscaled (`ctx.mean_loss`),
`BudgetCase` calls `program(ctx, budget)`, `SplitCase` notes for every I and W whether the
parameters' gradients changed inside it. The cards print a learner's own run beside what the
lesson compares it with, for the notebook.

Lessons 11 and 12: stages not dealt out in a loop. `programs.ProgramCase` places stage s on
rank s mod p. `VCase` (Exercise 11.3) places the 2p stages in a V (rank d holds stage d going
down and stage 2p-1-d coming back up, as ZB-V does: Qi et al. 2024, arXiv 2401.10241);
`GridCase` (Exercise 12.9) runs `replicas` copies of a `stages`-stage pipeline, rank r
holding stage r mod `stages` of replica r // `stages`; `VSplitCase` (Exercise 11.2, ZB-V) is a
V whose I's and W's are noted as `SplitCase`'s are.

Each case is made of numbers only, so it crosses to a learner's kernel like the other cases
(`wire.CASES`), runs the learner's program on the course's devices with
`threads.ranks.run_ranks`, and its run's evidence crosses back; the verdicts are the grader's
(`accumulation_build`, `rounds_build`, `zero_bubble_build`, `v_pipeline_build`, `grid_build`),
never here.

This module imports torch only when a case is run.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from course_utils.checks.programs import ProgramCase, Target, replayed
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


# --------------------------------------------------------------------------- 2.6


@dataclass(frozen=True, repr=False)
class AccumCase(ProgramCase):
    """A `ProgramCase` whose ranks get each micro-batch's mean loss unscaled:
    `ctx.mean_loss(out, mb)`."""

    def run(self, program: Callable, microbatches: int | None = None, raise_failure=True):
        """`run_ranks` of `program` on this case, its `ctx` with `mean_loss` (a `RankRun`)."""
        return super().run(lambda ctx: program(_Unscaled(ctx)), microbatches, raise_failure)


class _Unscaled:
    """A rank's `ctx` whose loss is the micro-batch's mean, for the program to scale."""

    def __init__(self, ctx) -> None:
        self._ctx = ctx

    def __getattr__(self, name: str):
        if name == "loss":
            raise AttributeError(
                "in this exercise the loss is yours to scale: ctx.mean_loss(out, mb) is the "
                "micro-batch's mean loss as it is"
            )
        return getattr(self._ctx, name)

    def mean_loss(self, out, mb: int):
        """The mean loss over micro-batch `mb`'s rows (not divided by anything else)."""
        return self._ctx.loss(out, mb) * self._ctx.microbatches


def gradients_card(run, case: AccumCase) -> str:
    """The learner's gradients (a `RankRun`) against one device's on the whole batch."""
    import torch

    want = case.reference()["grads"]
    worst, ratio = 0.0, []
    for grads in run.grads:
        for key, g in grads.items():
            if g is None:
                return f"{key}: no gradient (None)"
            worst = max(worst, float((g - want[key]).abs().max()))
            ratio.append(float(g.norm() / want[key].norm()))
    size = torch.tensor(ratio)
    return (
        f"largest difference from one device's gradients on the whole batch: {worst:.2e}; "
        f"|your gradient| / |the whole batch's| per parameter: {float(size.min()):.4g} to "
        f"{float(size.max()):.4g}"
    )


# --------------------------------------------------------------------------- 3.4


@dataclass(frozen=True, repr=False)
class BudgetCase(ProgramCase):
    """A `ProgramCase` whose ranks have room for the activations of `budget` micro-batches;
    the program is called as `program(ctx, budget)`."""

    budget: int = 1

    def __repr__(self) -> str:
        return f"{super().__repr__()}, room for {self.budget} micro-batches per rank"

    def run(self, program: Callable, microbatches: int | None = None, raise_failure=True):
        """`run_ranks` of `program(ctx, budget)` on this case (a `RankRun`)."""
        budget = self.budget
        return super().run(lambda ctx: program(ctx, budget), microbatches, raise_failure)


def rounds(actions: list) -> list[int]:
    """The sizes of the rounds one rank ran: each a run of forwards, then of backwards."""
    sizes: list[int] = []
    previous = "B"
    for a in actions:
        if a.kind == "F":
            if previous != "F":
                sizes.append(0)
            sizes[-1] += 1
        previous = a.kind
    return sizes


def rounds_card(run, case: BudgetCase) -> str:
    """The learner's run (`RankRun`) beside one GPipe step of every micro-batch at once: the
    step and the bubble of each order replayed with the model's costs, and the most
    micro-batches a rank held (lines of text)."""
    from course_utils.pipeline import make_schedule, simulate

    try:
        mine = replayed(run, case)
        step, bubble = f"{mine.makespan:.4g} units", f"{mine.bubble_fraction:.1%}"
    except Exception as exc:  # noqa: BLE001 - an order that cannot be replayed says why
        step, bubble = f"cannot be replayed ({exc})", "-"
    whole = simulate(make_schedule("gpipe", case.devices, case.microbatches), case.costs())
    sizes = rounds(run.actions[0])
    return "\n".join(
        [
            f"{'':26}{'yours':<26}one GPipe step of all {case.microbatches}",
            f"{'rounds (rank 0)':<26}{str(sizes):<26}[{case.microbatches}]",
            f"{'most held by a rank':<26}{max(run.saved_microbatches):<26}{case.microbatches}"
            f"   (room for {case.budget})",
            f"{'step, order replayed':<26}{step:<26}{whole.makespan:.4g} units",
            f"{'bubble, order replayed':<26}{bubble:<26}{whole.bubble_fraction:.1%}",
            f"measured on the virtual clock: a step of {1e3 * run.timeline.makespan:.2f} ms",
        ]
    )


# --------------------------------------------------------------------------- 4.4


@dataclass(frozen=True, repr=False)
class SplitCase(ProgramCase):
    """A `ProgramCase` whose run also records, per rank, each I and W it ran and whether the
    parameters' gradients changed inside it: ("0I1", False), ..."""

    def __course_call__(self, program: Callable) -> dict:
        split: list[list] = [[] for _ in range(self.devices)]
        run = self.run(lambda ctx: program(_Watched(ctx, split[ctx.rank])), raise_failure=False)
        return run.evidence() | {"split": split}


class _Watched:
    """A rank's `ctx` whose `backward_input` and `backward_weight` blocks note whether the
    gradients of the rank's parameters changed inside them."""

    def __init__(self, ctx, notes: list) -> None:
        self._ctx, self._notes = ctx, notes

    def __getattr__(self, name: str):
        return getattr(self._ctx, name)

    def backward_input(self, mb: int, chunk: int = 0):
        return self._watching(self._ctx.backward_input(mb, chunk))

    def backward_weight(self, mb: int, chunk: int = 0):
        return self._watching(self._ctx.backward_weight(mb, chunk))

    def _grads(self) -> list:
        params = [p for stage in self._ctx.stages for p in stage.parameters()]
        return [
            None if p.grad is None else (p.grad.data_ptr(), p.grad._version, float(p.grad.sum()))
            for p in params
        ]

    @contextmanager
    def _watching(self, block) -> Iterator[None]:
        before = self._grads()
        with block:
            yield
        self._notes.append((str(self._ctx.actions[-1]), self._grads() != before))


def split_card(run, case: SplitCase) -> str:
    """The learner's run (`RankRun`) against ZB-H1 and 1F1B on the same case: each rank's
    idle time and the step, orders replayed with the model's costs (lines of text)."""
    from course_utils.pipeline import make_schedule, simulate

    costs = case.costs()
    theirs = {
        name: simulate(make_schedule(name, case.devices, case.microbatches), costs)
        for name in ("zb-h1", "1f1b")
    }
    try:
        mine = replayed(run, case)
        idle = str([round(mine.idle(d), 3) for d in range(case.devices)])
        step = f"{mine.makespan:.4g} units"
    except Exception as exc:  # noqa: BLE001 - an order that cannot be replayed says why
        idle, step = f"cannot be replayed ({exc})", "-"
    lines = [f"{'':22}{'idle per rank (units)':<34}step"]
    lines.append(f"{'yours':<22}{idle:<34}{step}")
    for name, tl in theirs.items():
        idle = str([round(tl.idle(d), 3) for d in range(case.devices)])
        lines.append(f"{name.upper():<22}{idle:<34}{tl.makespan:.4g} units")
    lines.append(f"most micro-batches held per rank: {run.saved_microbatches}")
    lines.append(f"measured on the virtual clock: a step of {1e3 * run.timeline.makespan:.2f} ms")
    return "\n".join(lines)


# --------------------------------------------------------------------------- 11.2: ZB-V


@dataclass(frozen=True, repr=False)
class VSplitCase(VCase):
    """A `VCase` whose run also records, per rank, each I and W it ran and whether the
    gradients of the rank's parameters changed inside it: ("3I1", False), ... (an I that
    changes them computed W with it)."""

    def __course_call__(self, program: Callable) -> dict:
        split: list[list] = [[] for _ in range(self.devices)]
        run = self.run(lambda ctx: program(_Watched(ctx, split[ctx.rank])), raise_failure=False)
        return run.evidence() | {"split": split}


def equal_costs():
    """The lesson's chunk costs F = I = W = 1 unit, under which ZB-V's idle time per device
    is (p-1) I once m >= 2p-1 (`vshape.zb_v_idle`)."""
    from course_utils.pipeline.vshape import chunk_costs

    return chunk_costs(1.0, 1.0, 1.0)


def zb_v_timeline(case: VCase, order=None):
    """The course's ZB-V (`make_schedule("zb-v", p, m)`), or `order` (a `Schedule`),
    simulated with the lesson's equal chunk costs."""
    from course_utils.pipeline import make_schedule, simulate

    schedule = order or make_schedule("zb-v", case.devices, case.microbatches)
    return simulate(schedule, equal_costs())


def zb_v_card(run, case: VCase) -> str:
    """The learner's run (`RankRun`) beside the course's ZB-V on the same V: each rank's idle
    time and the step, both orders replayed with the lesson's equal chunk costs, and the
    lesson's (p-1) I."""
    from course_utils.checks.programs import recorded
    from course_utils.pipeline.vshape import zb_v_idle

    p, ours = case.devices, zb_v_timeline(case)
    try:
        mine = zb_v_timeline(case, recorded(run, case))
        idle = str([round(mine.idle(d), 3) for d in range(p)])
        step = f"{mine.makespan:.4g} units"
    except Exception as exc:  # noqa: BLE001 - an order that cannot be replayed says why
        idle, step = f"cannot be replayed ({exc})", "-"
    return "\n".join(
        [
            "orders replayed with the lesson's chunk costs F = I = W = 1 unit:",
            f"{'':8}{'idle per rank (units)':<34}step",
            f"{'yours':<8}{idle:<34}{step}",
            f"{'ZB-V':<8}{str([round(ours.idle(d), 3) for d in range(p)]):<34}"
            f"{ours.makespan:.4g} units",
            f"the lesson's formula for ZB-V's idle time: (p-1) I = {zb_v_idle(p, 1, 1, 1):g} "
            f"units per rank (exact once m >= 2p-1 = {2 * p - 1})",
            f"most micro-batch chunks held per rank: {run.saved_microbatches}",
            f"measured on the virtual clock: a step of {1e3 * run.timeline.makespan:.2f} ms",
        ]
    )
