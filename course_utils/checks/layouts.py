"""Training-run layouts as answers, judged with the planner (`course_utils.plan`).

Lesson 12's learner plans runs with the planner, so some answers are a whole layout (tp, pp,
dp, ...) or the smallest degree that makes one fit. Here a layout is read however the
learner hands it over (`as_layout`: a dict, a `plan.Config` or a `plan.Estimate`), judged
against the planner's fastest on some hardware (`judge_fastest`), a smallest degree judged
against what fits (`judge_smallest_fit`), and a hardware refresh's two best layouts told
apart (`refresh_story`).

Everything here is computed with the planner the lesson hands the learner, so the checks'
stand-in in the grading sandbox may hold this module as it is (`grading/stand_in.py`).
"""

from __future__ import annotations

import functools
from contextlib import nullcontext
from dataclasses import asdict
from typing import Any

from course_utils import plan
from course_utils.checks.feedback import fail, require
from course_utils.checks.fields import Fields
from course_utils.errors import CourseInputError


def as_layout(value: Any, what: str) -> plan.Config:
    """`value` as a layout: a `plan.Config`, an `Estimate`'s, or a dict of Config's fields."""
    require(value, what)
    if isinstance(value, plan.Estimate):
        return value.config
    if isinstance(value, plan.Config):
        return value
    if isinstance(value, dict):
        fields = set(asdict(plan.Config()))
        return plan.Config(**{k: value[k] for k in value if k in fields})
    fail(
        f"`{what}` should be a layout as a dict, e.g. dataclasses.asdict(result['feasible'][0]"
        f".config), not a {type(value).__name__}."
    )


@functools.lru_cache(maxsize=32)
def fastest(model: str, gpus: int, batch: int, gpu: str) -> plan.Estimate:
    """The planner's fastest layout of a preset model on a preset GPU (a search of about a
    second, made once per process for each set of numbers)."""
    hardware = plan.HARDWARE_PRESETS[gpu]
    return plan.search(plan.MODEL_PRESETS[model], gpus, batch, hardware)["feasible"][0]


def judge_fastest(value: Any, what: str, model: str, gpus: int, batch: int, gpu: str) -> float:
    """The step time of the learner's layout `value` of `model` on `gpus` GPUs of kind `gpu`
    with a global batch of `batch`, once it is a valid layout of that run, fits and is the
    fastest the planner finds there; otherwise a message saying which of those it is not."""
    config = as_layout(value, what)
    hardware = plan.HARDWARE_PRESETS[gpu]
    try:
        estimate = plan.evaluate(plan.MODEL_PRESETS[model], config, "bf16-mixed", hardware)
    except CourseInputError as exc:
        fail(f"`{what}` is not a valid layout for the {model} model: {exc}.")
    if config.gpus != gpus or config.global_batch != batch:
        fail(
            f"`{what}` uses {config.gpus} GPUs and a global batch of {config.global_batch}; "
            f"the scenario has {gpus} GPUs and {batch} sequences per step."
        )
    if not estimate.fits:
        fail(f"`{what}` does not fit on the {gpu} GPUs: {estimate.reason}.")
    if estimate.time["total"] > fastest(model, gpus, batch, gpu).time["total"] * 1.001:
        fail(
            f"`{what}` fits on the {gpu} GPUs but is not the fastest layout the planner finds "
            f"there. Run plan.search with plan.HARDWARE_PRESETS[{gpu!r}] and take the top row."
        )
    return estimate.time["total"]


def judge_smallest_fit(
    got: int,
    what: str,
    degree: str,
    fit: dict[int, plan.Estimate],
    usable_gib: float,
    *,
    allowed: str,
    too_small: str,
    too_big: str = "",
    fields: Fields | None = None,
) -> int:
    """The smallest `degree` (cp, ep, ...) whose layout fits, once the learner's `got` is it.
    `fit` holds each allowed degree's estimate, `usable_gib` a GPU's usable memory; a wrong
    answer hears that it is not `allowed`, or `too_small` (the question's hint after the
    memory it needs), or that a smaller one fits too (`too_big`: what that one costs). Judged
    as one of `fields`, it returns the smallest whatever `got`, for the next answer."""
    right = min(d for d, estimate in fit.items() if estimate.fits)
    with fields.judging() if fields is not None else nullcontext():
        if got not in fit:
            fail(f"`{what}` should be {allowed}.")
        if got < right:
            needs = fit[got].memory["total"] / plan.GIB
            fail(
                f"With {degree}={got} each GPU needs {needs:.0f} GiB, more than the "
                f"{usable_gib:.0f} GiB usable. {too_small}"
            )
        if got > right:
            fail(
                f"{degree}={got} fits, but a smaller {degree} fits too{too_big}. Find the smallest."
            )
    return right


def refresh_story(model: str, gpus: int, batch: int, old: str, new: str) -> str:
    """What a hardware refresh from `old` to `new` GPUs does to the planner's best layouts:
    how close the step's speed-up comes to the ratio of peak FLOP rates, and why."""
    steps = {w: fastest(model, gpus, batch, gpu) for w, gpu in (("old", old), ("new", new))}
    peak = plan.HARDWARE_PRESETS[new].peak_tflops_bf16 / plan.HARDWARE_PRESETS[old].peak_tflops_bf16
    speedup = steps["old"].time["total"] / steps["new"].time["total"]
    share = {w: steps[w].time["compute"] / steps[w].time["total"] for w in steps}
    told = (
        f"The step got {speedup:.3g}x faster against {peak:.3g}x more peak FLOP/s. It is "
        f"{share['old']:.0%} compute on the old GPUs and {share['new']:.0%} on the new"
    )
    if abs(speedup / peak - 1) < 0.05:
        told += ", so it scales almost with the FLOPs: communication and bubble are small in both."
    else:
        told += ": what did not scale with the FLOPs (communication, bubble) makes the difference."
    split = {w: steps[w].config.tp * steps[w].config.pp for w in steps}
    if split["new"] < split["old"]:
        told += (
            f" With twice the memory the planner also splits the model less (tp x pp "
            f"{split['old']} -> {split['new']})."
        )
    return told
