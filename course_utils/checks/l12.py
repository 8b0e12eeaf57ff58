"""Checks for the exercises of lesson 12 (capstone: planning a training run).

Each `exercise_K` is called by the check cell of Exercise 12.K in
`exercises/12_capstone_planning.ipynb`. The expected values come from `course_utils.plan`
(the same formulas the lesson cites), recomputed here, never stored as bare numbers.
Wrong answers get a hint, never the answer.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from dataclasses import asdict
from typing import TypedDict

from course_utils import plan
from course_utils.checks import (
    as_choice,
    as_int,
    as_number,
    check_function,
    close,
    fail,
    passed,
    require,
)
from course_utils.errors import CourseInputError

GIB = plan.GIB

# ---------------------------------------------------------------- the scenarios' numbers
# (the notebook states the same numbers in its questions)

NODE = plan.Hardware(gpu_memory_gib=80, gpus_per_node=8)
ACTIVATION_RESERVE_GIB = 20  # Exercise 12.1: what the team keeps free for activations


def exercise_1(zero_stage) -> None:
    """30B, bf16-mixed Adam, dp=8 on one node: smallest ZeRO stage whose states fit 60 GiB."""
    stage = as_int(zero_stage, "zero_stage")
    if stage not in plan.ZERO_STAGES:
        fail(f"`zero_stage` should be 0, 1, 2 or 3, but it is {stage}.")
    budget = (NODE.gpu_memory_gib - ACTIVATION_RESERVE_GIB) * GIB

    def states(z: int) -> float:
        return sum(plan.model_state_bytes(30e9, "bf16-mixed", z, dp=8).values())

    right = min(z for z in plan.ZERO_STAGES if states(z) <= budget)
    if stage == right:
        passed(
            f"Right: ZeRO-{right} leaves {states(right) / GIB:.1f} GiB of model states per GPU; "
            "every smaller stage keeps a full copy of something that does not fit."
        )
        return
    if stage < right:
        fail(
            f"With ZeRO-{stage} each GPU still holds {states(stage) / GIB:.0f} GiB of model "
            "states, more than the 60 GiB budget. Which parts does that stage leave unsharded?"
        )
    fail(
        f"ZeRO-{stage} fits, but a smaller stage may fit too (and communicates less). "
        "Try each stage with plan.model_state_bytes and pick the smallest that fits."
    )


MUST_CHANGE = {
    "a": "nothing: ZeRO-3 over the 8 GPUs is enough",
    "b": "full activation recomputation",
    "c": "more GPUs (or fewer bytes per parameter, e.g. offloading optimizer states)",
    "d": "more tensor parallelism inside the node",
}


def _min_gpus(params: float, gpu_memory_gib: float, reserve_gib: float) -> int:
    # Fully sharded (ZeRO-3) model states, 16 bytes per parameter (Rajbhandari et al. 2020).
    return math.ceil(16 * params / ((gpu_memory_gib - reserve_gib) * GIB))


def exercise_2(min_gpus_to_fit, what_must_change) -> None:
    """Build min_gpus_to_fit(params, gpu_memory_gib, reserve_gib) and say what must change."""
    call = check_function(min_gpus_to_fit, "min_gpus_to_fit")
    rng = random.Random()
    cases = [(70e9, 80, 10)]
    cases += [
        (
            rng.choice([7, 13, 30, 70, 175, 405]) * 1e9,
            rng.choice([24, 40, 80, 141]),
            rng.randint(0, 20),
        )
        for _ in range(6)
    ]
    answers = []
    for params, mem, reserve in cases:
        shown = f"min_gpus_to_fit({params:.3g}, {mem}, {reserve})"
        answers.append((shown, as_number(call(params, mem, reserve), shown)))
    wrong = [
        (shown, got, case)
        for (shown, got), case in zip(answers, cases, strict=True)
        if got != _min_gpus(*case)
    ]
    if wrong:
        shown, got, _ = wrong[0]
        # Name the likely mistake when one wrong formula explains every answer.
        mistakes: dict[str, Callable[[float, float, float], int]] = {
            "ignores the reserve: only gpu_memory_gib - reserve_gib is free for model states.": (
                lambda p, m, r: math.ceil(16 * p / (m * GIB))
            ),
            "rounds down: a fraction of a GPU still needs a whole GPU, so round up.": (
                lambda p, m, r: math.floor(16 * p / ((m - r) * GIB))
            ),
        }

        def counting(n: int) -> Callable[[float, float, float], int]:
            return lambda p, m, r: math.ceil(n * p / ((m - r) * GIB))

        for n in (1, 2, 4, 8, 12):
            mistakes[
                f"counts {n} bytes per parameter: Adam training keeps 16 (bf16 weights and "
                "gradients, fp32 master weights and two moments)."
            ] = counting(n)
        for message, formula in mistakes.items():
            if all(
                got_i == formula(*case) for (_, got_i), case in zip(answers, cases, strict=True)
            ):
                fail(f"{shown} returned {got:g}. Your function {message}")
        if not float(got).is_integer():
            fail(f"{shown} returned {got:g}: a number of GPUs is a whole number (round up).")
        fail(
            f"{shown} returned {got:g}, which is not right. Fully sharded states take "
            "bytes-per-parameter x params / GPUs on each GPU; compare that with the free GiB."
        )
    choice = as_choice(what_must_change, MUST_CHANGE, "what_must_change")
    if choice != "c":
        hint = {
            "a": "ZeRO-3 already spreads the 16 bytes per parameter over all 8 GPUs. Is that "
            "enough for 70B? Look at what your function returns for 8 GPUs.",
            "b": "Recomputation shrinks activations, but model states alone are over budget.",
            "d": "Tensor parallelism divides states over the same 8 GPUs ZeRO-3 already uses.",
        }[choice]
        fail(f"Your function is right; `what_must_change` is not. {hint}")
    passed(
        f"Right: 70B needs at least {_min_gpus(70e9, 80, 10)} GPUs of 80 GiB just for its fully "
        "sharded model states. On 8 GPUs, only fewer bytes per parameter (offload, 8-bit "
        "optimizer states) or more GPUs make it possible."
    )


PROBLEMS = {
    "a": "too few micro-batches: the fill-and-drain bubble dominates",
    "b": "one stage is slower than the others: the rest wait for it in the steady state",
    "c": "slow communication between stages",
    "d": "the data-parallel all-reduce at the end of the step",
}
FIXES = {
    "a": "more micro-batches per step",
    "b": "re-balance the partition so every stage costs the same",
    "c": "more tensor parallelism",
    "d": "ZeRO-3",
}
DIAGNOSIS = ("b", "b")  # the notebook's measured run: stage 1 holds 7 of the MLP's 9 layers


def exercise_3(problem, fix) -> None:
    """Diagnose a pipeline timeline with low utilization: problem and fix."""
    p = as_choice(problem, PROBLEMS, "problem")
    f = as_choice(fix, FIXES, "fix")
    want_p, want_f = DIAGNOSIS
    if p != want_p:
        hint = {
            "a": "Look at the middle of the step, not the ends: do devices still idle once "
            "the pipeline is full?",
            "c": "Communication shows as its own bars (or as gaps right after a send). Which "
            "device's compute bars are longer than the others'?",
            "d": "There is no data parallelism in this run.",
            "b": "",
        }[p]
        fail(f"`problem` is not right yet. {hint}")
    if f != want_f:
        fail(
            "`problem` is right, but that fix does not remove it. What makes one stage slower "
            "than the others, and how would you even them out?"
        )
    passed(
        "Right: the second stage holds most of the layers and is the bottleneck; the other "
        "device waits for it all through the step, not just at the ends. More micro-batches "
        "would not help: give every stage the same cost."
    )


PARTS = ("compute", "bubble", "dp_comm", "tp_comm", "pp_comm")
REGRESSION_FIXES = {
    "a": "use more micro-batches",
    "b": "keep tp within a node (tp=8) and use the extra GPUs for data parallelism",
    "c": "switch to the GPipe schedule",
    "d": "turn off sequence parallelism",
}


def exercise_4(grew_most, fix) -> None:
    """Scaling regression: tp 8 -> 16 across nodes. Which part grew most, and the fix."""
    part = as_choice(grew_most, PARTS, "grew_most")
    f = as_choice(fix, REGRESSION_FIXES, "fix")
    model = plan.MODEL_PRESETS["175B"]
    before = plan.Config(8, 8, 1, 1, 64, "1f1b", 1, 0, "selective", True)
    after = plan.replace_config(before, tp=16)
    t0, t1 = plan.step_time(model, before), plan.step_time(model, after)
    growth = {k: t1[k] - t0[k] for k in PARTS}
    right = max(growth, key=lambda k: growth[k])
    if part != right:
        fail(
            f"`grew_most`: {part} changed by {growth[part]:+.2f} s. Compare the two "
            "plan.step_time breakdowns part by part: which one grew the most?"
        )
    if f != "b":
        fail(
            "`grew_most` is right. Now the fix: where do the tp=16 all-reduces run, over "
            "which links, and what could use the 8 extra GPUs instead?"
        )
    passed(
        f"Right: tensor-parallel all-reduces went from {t0['tp_comm']:.1f} s to "
        f"{t1['tp_comm']:.1f} s once a TP group spans two nodes. Keep TP inside a node."
    )


# Exercise 12.5: two clusters joined by a slow link.
CROSS_GBS = 2.0
CROSS_MODEL = plan.MODEL_PRESETS["13B"]
CROSS_TP, CROSS_PP, CROSS_M, CROSS_B = 8, 4, 32, 1


def cross_cluster_times() -> tuple[float, float]:
    """(DP all-reduce over the slow link, pipeline sends over the slow link), seconds/step."""
    bw = CROSS_GBS * 1e9
    grads = CROSS_MODEL.params / (CROSS_TP * CROSS_PP) * 2  # bf16 gradients per GPU
    dp = plan.ring_allreduce_time(grads, 2, bw)
    message = CROSS_B * CROSS_MODEL.seq * CROSS_MODEL.hidden * 2 / CROSS_TP
    pp = 2 * CROSS_M * message / bw  # activations forward + gradients back, per micro-batch
    return dp, pp


def exercise_5(dp_across_s, pp_across_s, across) -> None:
    """One job over two clusters: seconds per step over the slow link for DP or PP across."""
    dp = as_number(dp_across_s, "dp_across_s")
    pp = as_number(pp_across_s, "pp_across_s")
    choice = as_choice(across, ("dp", "pp"), "across")
    want_dp, want_pp = cross_cluster_times()
    if not close(dp, want_dp, rel=0.02):
        if close(dp, 2 * want_dp, rel=0.02):
            fail(
                "`dp_across_s` is twice too big: a ring over N = 2 workers moves "
                "2 (N - 1) / N = 1 copy of the gradients."
            )
        if close(dp, want_dp * CROSS_TP * CROSS_PP, rel=0.05):
            fail(
                "`dp_across_s`: each GPU all-reduces only its own shard's gradients "
                "(params / (tp x pp), 2 bytes each)."
            )
        fail(
            "`dp_across_s` is not right yet. Use plan.ring_allreduce_time with this GPU's "
            "gradient bytes, 2 workers and the slow link's bytes per second."
        )
    if not close(pp, want_pp, rel=0.02):
        if close(pp, want_pp / 2, rel=0.02):
            fail(
                "`pp_across_s` is half the traffic: gradients travel back across the same "
                "boundary in the backward pass."
            )
        if close(pp, want_pp * CROSS_TP, rel=0.02):
            fail("`pp_across_s`: each of the tp GPUs at the boundary sends only its 1/tp slice.")
        fail(
            "`pp_across_s` is not right yet. Count the bytes of one micro-batch's boundary "
            "activations (b x s x h x 2 / tp), times 2 directions, times the micro-batches."
        )
    right = "pp" if want_pp < want_dp else "dp"
    if choice != right:
        fail("Both times are right. Which dimension sends fewer bytes over the slow link?")
    passed(
        f"Right: {want_pp:.3f} s of pipeline sends against {want_dp:.3f} s of gradient "
        "all-reduce. Put the pipeline boundary over the slow link; keep DP and TP on fast links."
    )


OLD_HARDWARE = plan.Hardware(gpu_memory_gib=40, peak_tflops_bf16=312, inter_node_gbs=25)
NEW_HARDWARE = plan.Hardware(
    gpu_memory_gib=80, peak_tflops_bf16=989, intra_node_gbs=450, inter_node_gbs=50
)


class _Refresh(TypedDict):
    model: plan.ModelShape
    gpus: int
    global_batch: int


REFRESH: _Refresh = {"model": plan.MODEL_PRESETS["30B"], "gpus": 32, "global_batch": 256}


def _as_config(value, what: str) -> plan.Config:
    require(value, what)
    if isinstance(value, plan.Estimate):
        return value.config
    if isinstance(value, plan.Config):
        return value
    if isinstance(value, dict):
        fields = set(asdict(plan.Config()))
        try:
            return plan.Config(**{k: v for k, v in value.items() if k in fields})
        except TypeError as exc:
            fail(f"`{what}` could not be read as a configuration: {exc}")
    fail(
        f"`{what}` should be a plan.Config (e.g. result['feasible'][0].config), "
        f"not a {type(value).__name__}."
    )


@functools.lru_cache(maxsize=2)
def _best(which: str) -> tuple[plan.Config, float]:
    hardware = OLD_HARDWARE if which == "old" else NEW_HARDWARE
    result = plan.search(REFRESH["model"], REFRESH["gpus"], REFRESH["global_batch"], hardware)
    best = result["feasible"][0]
    return best.config, best.time["total"]


def _check_best(value, what: str, which: str) -> plan.Config:
    config = _as_config(value, what)
    hardware = OLD_HARDWARE if which == "old" else NEW_HARDWARE
    label = "old (40 GiB)" if which == "old" else "new (80 GiB)"
    try:
        estimate = plan.evaluate(REFRESH["model"], config, "bf16-mixed", hardware)
    except CourseInputError as exc:
        fail(f"`{what}` is not a valid layout for the 30B model: {exc}")
    if config.gpus != REFRESH["gpus"] or config.global_batch != REFRESH["global_batch"]:
        fail(
            f"`{what}` uses {config.gpus} GPUs and a global batch of {config.global_batch}; "
            "the scenario has 32 GPUs and 256 sequences per step."
        )
    if not estimate.fits:
        fail(f"`{what}` does not fit on the {label} GPUs: {estimate.reason}.")
    _, best_time = _best(which)
    if estimate.time["total"] > best_time * 1.01:
        fail(
            f"`{what}` fits on the {label} GPUs but is not the fastest layout the planner "
            "finds. Run plan.search with that hardware and take the top row."
        )
    return config


def exercise_6(best_before, best_after) -> None:
    """Hardware refresh: the planner's best layout before and after."""
    before = _check_best(best_before, "best_before", "old")
    after = _check_best(best_after, "best_after", "new")
    changed = before.recompute != after.recompute
    passed(
        "Right: both are the planner's fastest layouts. "
        + (
            f"With twice the memory, recomputation goes from {before.recompute!r} to "
            f"{after.recompute!r}: the extra memory buys back the recomputed FLOPs."
            if changed
            else "Compare their memory and time breakdowns to see what the refresh changed."
        )
    )


SHRINKS = ("model states", "activations", "both", "neither")
SYMPTOMS = {
    "a": "the loss slowly drifts upwards while the gradients stay finite",
    "b": "gradients overflow to inf/NaN: the scaler skips steps and keeps halving the scale, "
    "or without a scaler the loss becomes NaN",
    "c": "the step time doubles",
    "d": "the GPU runs out of memory",
}


def exercise_7(what_shrinks, loss_scale, divergence_sign) -> None:
    """Mixed precision for a memory-bound run: what shrinks, fp16 loss scale, divergence."""
    part = as_choice(what_shrinks, SHRINKS, "what_shrinks")
    scale = as_number(loss_scale, "loss_scale")
    sign = as_choice(divergence_sign, SYMPTOMS, "divergence_sign")
    if part != "activations":
        fail(
            "`what_shrinks`: compare the two plan.memory results, adding parameters + "
            "gradients + optimizer into model states. Which total got smaller?"
        )
    # fp16's smallest normal number is 2**-14 (IEEE 754 half precision); the smallest
    # power-of-two scale that lifts a 1e-9 gradient to it (Micikevicius et al. 2018).
    want = 2 ** math.ceil(math.log2(2**-14 / 1e-9))
    if scale != want:
        if scale <= 0 or not math.isfinite(math.log2(scale)) or not math.log2(scale).is_integer():
            fail("`loss_scale` should be a power of two (scaling by 2^k is exact in floats).")
        if close(scale, math.log2(want)):
            fail("That looks like the exponent k; give the scale itself, 2 ** k.")
        if scale < want:
            fail(
                "`loss_scale` is too small: 1e-9 times it is still below fp16's smallest "
                "normal number, 2 ** -14 (about 6.1e-5)."
            )
        fail(
            "`loss_scale` works but is bigger than needed: a larger scale brings overflow "
            "(inf) closer. Find the smallest power of two."
        )
    if sign != "b":
        fail(
            "`what_shrinks` and `loss_scale` are right. `divergence_sign` is not: what happens "
            "to values above fp16's largest number, 65504, and what does a loss scaler do?"
        )
    passed(
        f"Right: bf16-mixed halves the activations (model states stay 16 bytes per parameter), "
        f"loss scale {want} = 2^{int(math.log2(want))} "
        "keeps small fp16 gradients alive, and overflow shows as inf/NaN and skipped steps."
    )
