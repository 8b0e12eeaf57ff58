"""GPipe in rounds under a memory budget (Exercise 3.4): the case, the target and the verdict.

A GPipe step holds every micro-batch's activations at once. When a device has room for only
`budget` micro-batches, the step runs in rounds: a GPipe of at most `budget` micro-batches,
its backwards freeing what its forwards saved, then the next round; the gradients add up
over the rounds (nothing clears them until the step ends), so the step's gradients are one
device's. Each round pays the pipeline's fill and drain again: that is the bubble the budget
costs, (p - 1) / (k + p - 1) of each round of k micro-batches with equal stages (Huang et al.
2018, arXiv 1811.06965, for GPipe's bubble).

The learner's program runs on the course's devices (`BudgetCase`); the grader judges its
evidence: gradients against one device's (and against its last round's alone, the mark of
gradients cleared between rounds), the most micro-batches any rank held at once as the
harness counted them, the rounds each rank ran, and the order replayed by the simulator
against rounds of `budget` micro-batches in order (`target`). Only l03 imports this module.
"""

from __future__ import annotations

import math

from course_utils.checks import fail
from course_utils.checks.pipeline_cases import BudgetCase, rounds
from course_utils.checks.programs import gradients_off, replayed


def schedule(case: BudgetCase):
    """GPipe in rounds of `case.budget` micro-batches, in order, each round's backwards
    first in, first out (a `Schedule` for the simulator)."""
    from course_utils.actions import Action, Schedule

    p, m, k = case.devices, case.microbatches, case.budget
    devices = []
    for d in range(p):
        acts: list[Action] = []
        for start in range(0, m, k):
            group = range(start, min(start + k, m))
            acts += [Action(d, "F", mb) for mb in group] + [Action(d, "B", mb) for mb in group]
        devices.append(tuple(acts))
    return Schedule(f"GPipe in rounds of {k}", p, m, tuple(devices))


def target(case: BudgetCase):
    """The simulator's timeline of `schedule(case)` with the model's costs."""
    from course_utils.pipeline import simulate

    return simulate(schedule(case), case.costs())


def last_round_alone(run: dict, case: BudgetCase) -> list[int] | None:
    """The micro-batches of rank 0's last round if every rank's gradients are theirs alone
    (the gradients were cleared between rounds), else None."""
    from course_utils.models import loss_fn

    acts = run["actions"][0]
    start = max((i for i, a in enumerate(acts) if a.kind == "F"), default=None)
    if start is None:
        return None
    while start > 0 and acts[start - 1].kind == "F":
        start -= 1
    last = sorted({a.microbatch for a in acts[start:] if a.kind == "F"})
    if len(last) == case.microbatches:
        return None
    stages, x, y = case.build()
    size = case.batch // case.microbatches
    for mb in last:
        out = x[mb * size : (mb + 1) * size]
        for stage in stages:
            out = stage(out)
        (loss_fn(out, y[mb * size : (mb + 1) * size]) / case.microbatches).backward()
    want = {
        f"{s}.{name}": p.grad.detach().clone()
        for s, stage in enumerate(stages)
        for name, p in stage.named_parameters()
    }
    return last if not gradients_off(run, case, want) else None


def judge(shown: str, run: dict, case: BudgetCase) -> None:
    """Fail unless no rank held more than the budget, the ranks ran the fewest rounds, and
    the order replays to GPipe in rounds of the budget (`run`: a run already judged whole,
    with one device's gradients, by `pipeline_hints.judged_run`)."""
    k, m = case.budget, case.microbatches
    held = max(run["saved_microbatches"])
    rank = run["saved_microbatches"].index(held)
    sizes = rounds(run["actions"][rank])
    if held > k:
        what = (
            f"{shown}: rank {rank} held the activations of {held} micro-batches at once, more "
            f"than the {k} it has room for"
        )
        if len(sizes) == 1:
            fail(
                f"{what}: every forward before the first backward, one GPipe step. Run the "
                "step in rounds: a round's backwards free what its forwards saved before the "
                "next round's forwards start."
            )
        if max(sizes) <= k:
            fail(
                f"{what}, though no round of yours has more than {k}: activations kept after "
                "their backward. A backward frees what its forward saved unless told to keep "
                "it (`retain_graph=True`, or the output kept alive): let each backward free "
                "its micro-batch."
            )
        fail(
            f"{what}: its rounds had {sizes} micro-batches. A round holds all of its "
            "micro-batches at its peak, so no round may have more than the budget."
        )
    if len(sizes) > math.ceil(m / k):
        fail(
            f"{shown}: your ranks ran {len(sizes)} rounds of {sizes} micro-batches. That fits, "
            f"but fewer rounds would too: every round pays the pipeline's fill and drain (its "
            "bubble) again, so each round takes as many micro-batches as the budget allows."
        )
    want, step = target(case), replayed(run, case).makespan
    if abs(step - want.makespan) > 1e-9 * want.makespan:
        fail(
            f"{shown}: the order your ranks ran replays to a step of {step:.4g} units; GPipe "
            f"in rounds of {k} gives {want.makespan:.4g}. Take the micro-batches in order, "
            "rounds of the budget; in each round all forwards, then the backwards in the "
            "order their gradients come back."
        )
