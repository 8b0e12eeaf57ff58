"""Gradient accumulation written as a per-rank program (Exercise 2.6): case, evidence, verdict.

A batch cut into m micro-batches gives the whole batch's gradient when each micro-batch's
loss, a mean over its own rows, is scaled before its backward so that the m gradients add
up, in `.grad`, to the gradient of the mean over all rows (GPipe, Huang et al. 2018, arXiv
1811.06965, accumulates so). Here the learner's program gets the micro-batch's mean loss
unscaled (`ctx.mean_loss(out, mb)`; `ctx.loss`, which scales it, is not there) and scales
it itself.

The grader compares every rank's gradients with one device's on the whole batch. A wrong
scale shows as gradients that are a multiple of the right ones: the factor says which
(none: m times; by the number of ranks: m / p times); gradients that equal the last
micro-batch's alone were cleared between micro-batches. Only l02 imports this module.
"""

from __future__ import annotations

from course_utils.checks import fail
from course_utils.checks.pipeline_cases import AccumCase
from course_utils.checks.programs import gradients_off


def _multiple(run: dict, case: AccumCase, want: dict) -> float | None:
    """The factor k if every rank's gradients are k times `want`'s (within rounding)."""
    import torch

    owned = [(r, key) for r in range(case.devices) for key in want if key in run["grads"][r]]
    got = [run["grads"][r][key] for r, key in owned]
    if not owned or not all(isinstance(g, torch.Tensor) for g in got):
        return None
    mine = torch.cat([g.flatten().double() for g in got])
    ref = torch.cat([want[key].flatten().double() for _, key in owned])
    if len(mine) != len(ref) or not ref.any():
        return None
    factor = float(mine @ ref / (ref @ ref))
    close = torch.allclose(mine, factor * ref, rtol=1e-4, atol=1e-6)
    return factor if close else None


def _last_alone(case: AccumCase) -> dict:
    """One device's gradients of the last micro-batch's mean loss alone."""
    from course_utils.models import loss_fn

    stages, x, y = case.build()
    size = case.batch // case.microbatches
    out = x[-size:]
    for stage in stages:
        out = stage(out)
    loss_fn(out, y[-size:]).backward()
    return {
        f"{s}.{name}": p.grad.detach().clone()
        for s, stage in enumerate(stages)
        for name, p in stage.named_parameters()
    }


def judge_gradients(shown: str, run: dict, case: AccumCase) -> None:
    """Fail unless every rank's gradients are one device's on the whole batch, naming what
    the factor they are off by says."""
    want = case.reference()["grads"]
    if not gradients_off(run, case, want):
        return
    m, p = case.microbatches, case.devices
    alone = _multiple(run, case, _last_alone(case))
    if alone is not None:
        fail(
            f"{shown}: every rank's gradients are those of the last micro-batch alone (times "
            f"{alone:.3g}): the gradients were cleared between micro-batches. `.grad` adds up "
            "each backward's gradients: that sum is what the step needs, so clear nothing "
            "until the step ends."
        )
    factor = _multiple(run, case, want)
    if factor is None:
        fail(
            f"{shown}: the gradients are not one device's on the whole batch, nor a multiple "
            "of them. Each micro-batch's loss is scaled by one same number before its "
            "backward, and each micro-batch goes forward and backward once."
        )
    said = f"{shown}: the gradients are {factor:.4g} times the whole batch's"
    if abs(factor - m) < 1e-3 * m:
        fail(
            f"{said}: {m} means added up, each as large as the whole batch's mean. Which "
            "factor turns a sum of the micro-batch means into the mean over every row?"
        )
    if abs(factor - m / p) < 1e-3 * m:
        fail(
            f"{said}: the losses were divided by the number of ranks, {p}. The ranks share "
            f"the model, not the batch: what adds up is one mean per micro-batch, {m} of them."
        )
    fail(
        f"{said}. Write the mean over all {case.batch} rows as a sum, over the {m} "
        "micro-batches, of their own means: the factor in front of each is the scale."
    )
