"""Checks for the exercises of lesson 12 (capstone: planning a training run).

Each `exercise_K` is called by the check cell of Exercise 12.K in
`exercises/12_capstone_planning.ipynb`, with the learner's variant `v`: `given_K(variant)` draws
the exercise's numbers (the default student gets the course's own), and every expected
answer is computed from them with `course_utils.plan` (the formulas the lesson cites) or
the pipeline simulator, never stored as a bare number. `cases_1(variant)` are the inputs the
Build exercise's function is tried on. Wrong answers get a hint, never the answer. Answers
that are layouts, or the smallest degree that fits, are judged with `checks.layouts`.

Conventions the questions state and the checks share: memory in GiB (2^30 bytes) where a
GPU's memory is concerned, GB (10^9 bytes) for traffic; traffic is the bytes one GPU
sends (one direction: a full-duplex link carries as much the other way meanwhile), as in
`plan.traffic` and lessons 06 and 07; answers to 3 significant figures.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from course_utils import checks, plan
from course_utils.checks import (
    DEFAULT,
    OTHERWISE,
    Variant,
    exercise,
    fail,
    judge,
    layouts,
    numbers,
    pick,
)
from course_utils.checks.grid_build import cases_9, exercise_9, given_9  # noqa: F401 (a Build)

for_student = checks.lesson_checks(__name__)
GIB, GB = plan.GIB, plan.GB


# Bytes per parameter of mixed-precision Adam (ZeRO paper, Section 3.1): weights 2,
# gradients 2, optimizer states K = 12; what stays whole on every GPU at each ZeRO stage.
UNSHARDED = {0: 16, 1: 4, 2: 2, 3: 0}


B = 1_000_000_000
given_1 = numbers(
    params=pick("1p", 30 * B, [13 * B, 20 * B, 30 * B]),
    dp=pick("1d", 8, [8, 16]),
    gpu_gib=80,
    activation_gib=pick("1a", 20, [16, 20, 24]),
    big_params=pick("1b", 70 * B, [65 * B, 70 * B, 90 * B]),
    gpus=8,
    big_reserve_gib=10,  # what the big model keeps per GPU for its activations
)


def _needed(params, gpu_memory_gib, reserve_gib, zero, units=GIB, rounding=math.ceil, slack=1e-9):
    free = (gpu_memory_gib - reserve_gib) * units
    whole = UNSHARDED[zero] * params
    if free <= 0 or whole >= free:
        return None  # even one GPU's worth of unsharded bytes does not fit
    if zero == 0:
        return 1
    return max(1, rounding((16 - UNSHARDED[zero]) * params / (free - whole) - slack))


def _acceptable(case: tuple) -> set:
    """The right answer, also as a learner's float arithmetic may round an exact ratio."""
    params, gpu_memory_gib, reserve_gib, zero = case
    return {
        _needed(params, gpu_memory_gib, reserve_gib, zero),
        _needed(params, gpu_memory_gib, reserve_gib, zero, slack=0.0),
    }


def min_gpus_needed(params: float, gpu_memory_gib: float, reserve_gib: float, zero: int):
    """Fewest GPUs whose free memory holds the model states at this ZeRO stage, or None.

    Per GPU: u Psi + (16 - u) Psi / N bytes, u = the bytes per parameter the stage leaves
    whole (16, 4, 2, 0). It fits when that is at most the free memory F: N >= (16 - u) Psi /
    (F - u Psi), possible only while u Psi < F (ZeRO-0: one GPU or none).
    """
    return _needed(params, gpu_memory_gib, reserve_gib, zero)


def cases_1(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    g = given_1(variant)
    rng = variant.cases("1")
    cases = [(g["params"], g["gpu_gib"], g["activation_gib"], z) for z in range(4)]
    cases.append((g["big_params"], g["gpu_gib"], g["big_reserve_gib"], 3))
    for _ in range(8):
        mem = rng.choice([24, 40, 80, 141])
        params = rng.choice([7, 13, 30, 70, 175, 405]) * B
        cases.append((params, mem, rng.randint(0, min(20, mem // 2)), rng.randint(0, 3)))
    return {"min_gpus_to_fit": cases}


MUST_CHANGE = {
    "a": "nothing: ZeRO-3 over the 8 GPUs is enough",
    "b": "full activation recomputation",
    "c": "more GPUs (or fewer bytes per parameter, e.g. offloading optimizer states)",
    "d": "more tensor parallelism inside the node",
}


def _wrong_formulas() -> dict[str, Callable[[float, float, float, int], int | None]]:
    """Mistakes a whole set of answers can reveal, each with the hint that names it."""
    return {
        "counts memory in GB (10^9 bytes), but GPU memory is in GiB: 1 GiB = 2^30 bytes "
        "(plan.GIB).": lambda p, m, r, z: _needed(p, m, r, z, units=GB),
        "ignores the reserve: only gpu_memory_gib - reserve_gib is free for model "
        "states.": lambda p, m, r, z: _needed(p, m, 0, z),
        "rounds down: a fraction of a GPU still needs a whole GPU, so round "
        "up.": lambda p, m, r, z: _needed(p, m, r, z, rounding=math.floor),
        "treats every stage like ZeRO-3: at stages 0-2 some bytes per parameter stay whole on "
        "every GPU, however many GPUs there are.": lambda p, m, r, z: _needed(p, m, r, 3),
    }


@exercise(
    given_1,
    min_gpus_to_fit="function",
    zero_stage="whole number",
    what_must_change=tuple(MUST_CHANGE),
    partial=True,
)
def exercise_1(g, min_gpus_to_fit, zero_stage, what_must_change, variant) -> str:
    """Build min_gpus_to_fit(params, gpu_memory_gib, reserve_gib, zero); then the smallest
    ZeRO stage for the given model on dp GPUs; then what must change for the big model."""
    fields = checks.Fields()  # every wrong answer named at once
    with fields.judging():
        cases = cases_1(variant)["min_gpus_to_fit"]
        answers = []
        for case, _, got in checks.each_call(min_gpus_to_fit, cases):
            shown = "min_gpus_to_fit({:.3g}, {}, {}, {})".format(*case)
            answers.append((shown, got if got is None else checks.as_number(got, shown)))
        wrong = [
            (shown, got, case)
            for (shown, got), case in zip(answers, cases, strict=True)
            if got not in _acceptable(case)
        ]
        if wrong:
            shown, got, case = wrong[0]
            for message, formula in _wrong_formulas().items():
                if all(a == formula(*c) for (_, a), c in zip(answers, cases, strict=True)):
                    fail(f"{shown} returned {got}. Your function {message}")
            if min_gpus_needed(*case) is None:
                fail(
                    f"{shown} returned {got}, but at ZeRO-{case[3]} "
                    f"{UNSHARDED[case[3]]} bytes per parameter stay whole on every GPU and already "
                    "fill its free memory: no number of GPUs helps. Return None then."
                )
            if got is None:
                fail(f"{shown} returned None, but enough GPUs do hold these states: how many?")
            if not float(got).is_integer():
                fail(f"{shown} returned {got:g}: a number of GPUs is a whole number (round up).")
            fail(
                f"{shown} returned {got:g}, which is not right. Per GPU, a stage keeps u bytes per "
                "parameter whole and shards the other 16 - u over the N GPUs: solve "
                "u x params + (16 - u) x params / N <= free bytes for N."
            )
    stage, p, dp = zero_stage, g["params"], g["dp"]
    mem, act = g["gpu_gib"], g["activation_gib"]

    def fits(z: int) -> bool:
        n = min_gpus_needed(p, mem, act, z)
        return n is not None and n <= dp

    right = min(z for z in plan.ZERO_STAGES if fits(z))
    states = {z: sum(plan.model_state_bytes(p, "bf16-mixed", z, dp=dp).values()) for z in range(4)}
    with fields.judging():
        if stage not in plan.ZERO_STAGES:
            fail(f"`zero_stage` should be 0, 1, 2 or 3, but it is {stage}.")
        if stage < right:
            fail(
                f"`zero_stage`: with ZeRO-{stage} each of the {dp} GPUs "
                f"still holds {states[stage] / GIB:.0f} GiB of model states, more than the "
                f"{mem - act} GiB left beside the activations. Which parts does that stage leave "
                "unsharded?"
            )
        if stage > right:
            fail(
                f"`zero_stage`: ZeRO-{stage} fits, but a smaller stage fits "
                "too (and communicates less). Try your function on each stage with the given "
                "numbers."
            )
    with fields.judging():
        choice = what_must_change
        big, gpus = g["big_params"], g["gpus"]
        if choice != "c":
            hint = {
                "a": f"ZeRO-3 already spreads the 16 bytes per parameter over all {gpus} GPUs. Is "
                f"that enough for {big / 1e9:g}B? Ask your function how many GPUs ZeRO-3 needs.",
                "b": "Recomputation shrinks activations, but the model states alone are over "
                "budget.",
                "d": f"Tensor parallelism divides the states over the same {gpus} GPUs ZeRO-3 "
                "already uses.",
            }[choice]
            fail(f"`what_must_change` is not right. {hint}")
    fields.verdict()
    need = min_gpus_needed(big, mem, g["big_reserve_gib"], 3)
    return (
        f"Right: ZeRO-{right} leaves {states[right] / GIB:.1f} GiB of model states per GPU; "
        f"{big / 1e9:g}B needs at least {need} GPUs of {mem} GiB just for its fully sharded "
        f"model states, so on {gpus} GPUs only fewer bytes per parameter (offload, 8-bit "
        "optimizer states) or more GPUs make it possible."
    )


LAYERS_2 = 9  # the teammate's MLP: 9 layers of equal cost (lesson 12's measured one)


def given_2(variant: Variant = DEFAULT) -> dict:
    first = variant.pick("2s", 2, [1, 2, 3, 6, 7])
    return {"split": (first, LAYERS_2 - first), "microbatches": 8}


def teammate_timeline(variant: Variant = DEFAULT):
    """The simulated 1F1B step of the given split: a stage costs its layers (F = 1, B = 2)."""
    from course_utils.pipeline import CostModel, make_schedule, simulate

    split, m = given_2(variant).values()
    costs = CostModel(stage_forward=list(split), stage_backward=[2 * n for n in split])
    return simulate(make_schedule("1f1b", 2, m), costs)


@exercise(
    given_2,
    problem={
        "b": checks.RIGHT,
        "a": "Look at the middle of the step, not the ends: does a device still idle once "
        "the pipeline is full?",
        "c": "Sends take no time in this simulation. Which device's compute bars are "
        "longer than the other's?",
        "d": "There is no data parallelism in this run.",
    },
    fix={
        "b": checks.RIGHT,
        OTHERWISE: "That fix leaves one stage slower than the other. What would balance them?",
    },
    slow_device="whole number",
    partial=True,
)
def exercise_2(g, problem, fix, slow_device) -> str:
    """Diagnose a pipeline timeline with low utilization: problem, fix, the slow device."""
    split = g["split"]
    if slow_device not in (0, 1):
        fail("`slow_device` is a device number: 0 or 1 (the course numbers devices from 0).")
    slow = 0 if split[0] > split[1] else 1
    if slow_device != slow:
        fail(
            "`slow_device` is not right: which device has no grey in the middle of the step "
            "(the others wait for it)?"
        )
    return (
        f"Right: device {slow} holds {max(split)} of the {sum(split)} layers and sets the pace; "
        "the other device waits for it all through the step, not just at the ends. More "
        "micro-batches would not help: give every stage the same cost."
    )


REGRESSION_FIXES = {
    "a": "use more micro-batches",
    "b": "keep tp within a node (tp=8) and use the extra GPUs for data parallelism",
    "c": "switch to the GPipe schedule",
    "d": "turn off sequence parallelism",
}


given_3 = numbers(
    model=pick("3m", "175B", ["175B", "70B"]), pp=8, microbatches=pick("3b", 64, [32, 64, 128])
)


def regression(variant: Variant = DEFAULT) -> tuple[plan.Config, plan.Config]:
    """The run before (tp=8 on 64 GPUs) and after (tp=16 on 128 GPUs)."""
    g = given_3(variant)
    before = plan.Config(tp=8, pp=g["pp"], dp=1, microbatches=g["microbatches"],
                         recompute="selective", sequence_parallel=True)  # fmt: skip
    return before, replace(before, tp=16)


@exercise(given_3, grew_most="answer", fix="answer", partial=True)  # choices read below
def exercise_3(g, grew_most, fix, variant) -> str:
    """Scaling regression: tp 8 -> 16 across nodes. Which part grew most, and the fix."""
    model = plan.MODEL_PRESETS[g["model"]]
    before, after = regression(variant)
    t0, t1 = plan.step_time(model, before), plan.step_time(model, after)
    growth = {k: t1[k] - t0[k] for k in plan.TIME_PARTS}
    right = max(growth, key=lambda k: growth[k])
    fields = checks.Fields()  # every wrong answer named at once
    with fields.judging():
        part = checks.as_choice(grew_most, plan.TIME_PARTS, "grew_most")
        hint = f"`grew_most`: {part} changed by {growth[part]:+.2f} s. Compare the two "
        hint += "plan.step_time breakdowns part by part: which one grew the most?"
        judge(part, right, "grew_most", hint)
    hint = "`fix` is not it: where do the tp=16 all-reduces run, over which links, and what "
    hint += "could use the extra GPUs instead?"
    fields.judge(fix, "b", "fix", hint, choices=REGRESSION_FIXES)
    fields.verdict()
    return (
        f"Right: tensor-parallel communication went from {t0['tp_comm']:.1f} s to "
        f"{t1['tp_comm']:.1f} s once a TP group spans two nodes. Keep TP inside a node."
    )


given_4 = numbers(
    model="13B",
    slow_gbs=pick("4b", 2.0, [1.0, 2.0, 4.0]),
    tp=8,
    pp=4,
    dp=2,
    microbatch_size=1,
    microbatches=pick("4m", 32, [16, 32, 64]),
)


def cross_cluster_times(variant: Variant = DEFAULT) -> tuple[float, float]:
    """(DP across, PP across): seconds per step each GPU sends over the slow link.

    One convention: the bytes one GPU sends, over the link's bandwidth in one direction.
    DP across: a ring all-reduce of this GPU's bf16 gradients between 2 workers sends
    2 (N-1)/N = 1 copy of them. PP across: the boundary GPU of stage 1 sends its 1/tp slice
    of each micro-batch's activations forward; the gradients coming back are the other
    direction, sent by its partner at the same time (as `plan.traffic` counts pipelines).
    """
    g = given_4(variant)
    model = plan.MODEL_PRESETS[g["model"]]
    bw = g["slow_gbs"] * 1e9
    grads = model.params / (g["tp"] * g["pp"]) * 2  # bf16 gradients per GPU
    dp = plan.ring_allreduce_time(grads, 2, bw)
    message = g["microbatch_size"] * model.seq * model.hidden * 2 / g["tp"]
    return dp, g["microbatches"] * message / bw


@exercise(given_4, dp_across_s="number", pp_across_s="number", across="answer", partial=True)
def exercise_4(g, dp_across_s, pp_across_s, across, variant) -> str:
    """One job over two clusters: seconds per step over the slow link for DP or PP across."""
    want_dp, want_pp = cross_cluster_times(variant)
    slips = [
        (2, "is twice the right time: it counts both directions, 4-byte (fp32) gradients "
            "instead of bf16's 2 bytes, or a ring sending 2S. A ring of 2 workers sends "
            "2 (N - 1) / N = 1 copy of this GPU's bf16 gradients, one way."),
        (g["tp"] * g["pp"], "counts all the model's gradients; each GPU all-reduces only its "
                            "own shard, params / (tp x pp) values."),
    ]  # fmt: skip
    hint = (
        "`dp_across_s` is not right yet. Use plan.ring_allreduce_time with this GPU's gradient "
        "bytes (2 per value), 2 workers and the slow link's bytes per second."
    )
    fields = checks.Fields()  # every wrong answer named at once
    fields.judge(dp_across_s, want_dp, "dp_across_s", hint, unit="s", slips=slips)
    slips = [
        (2, "is twice the right time: it counts both directions, or 4-byte values instead of "
            "bf16's 2 bytes. Count the bf16 activations one GPU sends, one way: the gradients "
            "come back on the other direction of the same full-duplex link at the same time."),
        (g["tp"], "counts the whole activation; each of the tp GPUs at the boundary sends only "
                  "its 1/tp slice."),
        (2 * g["tp"], "counts the whole activation (each GPU sends only its 1/tp slice), and "
                      "twice over: both directions, or 4-byte values instead of bf16's 2."),
    ]  # fmt: skip
    hint = (
        "`pp_across_s` is not right yet. Count the bytes of one micro-batch's boundary "
        "activations on one GPU (b x s x h x 2 / tp), times the micro-batches, over the slow "
        "link's bytes per second."
    )
    fields.judge(pp_across_s, want_pp, "pp_across_s", hint, unit="s", slips=slips)
    hint = "`across` is not it: which dimension sends fewer bytes over the slow link?"
    fields.judge(across, "pp" if want_pp < want_dp else "dp", "across", hint, choices=("dp", "pp"))
    fields.verdict()
    return (
        f"Right: {want_pp:.3g} s of pipeline sends against {want_dp:.3g} s of gradient "
        "all-reduce, counted the same way (what one GPU sends). Put the pipeline boundary over "
        "the slow link; keep DP and TP on fast links."
    )


given_5 = numbers(
    model=pick("5m", "30B", ["13B", "30B"]),
    gpus=32,
    global_batch=256,
    old="A100-40GB",
    new="H100-80GB",
)


@exercise(given_5, best_before="answer", best_after="answer", speedup="number")
def exercise_5(g, best_before, best_after, speedup) -> str:
    """Hardware refresh: the planner's best layout on the old and on the new GPUs, and the
    speed-up of the step (old best's step time / new best's)."""
    run = g["model"], g["gpus"], g["global_batch"]
    before = layouts.judge_fastest(best_before, "best_before", *run, g["old"])
    after = layouts.judge_fastest(best_after, "best_after", *run, g["new"])
    want = before / after
    old, new = plan.HARDWARE_PRESETS[g["old"]], plan.HARDWARE_PRESETS[g["new"]]
    peak = new.peak_tflops_bf16 / old.peak_tflops_bf16
    slips = [
        (1 / want, "is a speed-up of 1: the same hardware twice? Search the new GPUs with "
                   f"plan.HARDWARE_PRESETS[{g['new']!r}]."),
        (1 / want**2, "is upside down: the speed-up is the old step time over the new one."),
    ]  # fmt: skip
    hints = {
        f"{peak:.3g} is the ratio of the peak FLOP rates, close to the speed-up here but not "
        "it: divide the old best layout's step time by the new best's.": peak,
        "`speedup` is not right yet: the old best's step time / the new best's.": OTHERWISE,
    }
    judge(speedup, want, "speedup", hints, slips=slips)
    ob = layouts.as_layout(best_before, "best_before")
    nb = layouts.as_layout(best_after, "best_after")
    story = layouts.refresh_story(*run, g["old"], g["new"])
    return f"Right: {ob.short()} on the old GPUs, {nb.short()} on the new. {story}"


SHRINKS = ("model states", "activations", "both", "neither")
SYMPTOMS = {
    "a": "the loss slowly drifts upwards while the gradients stay finite",
    "b": "gradients overflow to inf/NaN: the scaler skips steps and keeps halving the scale, "
    "or without a scaler the loss becomes NaN",
    "c": "the step time doubles",
    "d": "the GPU runs out of memory",
}


given_6 = numbers(smallest_grad=pick("6g", 1e-9, [1e-9, 3e-9, 2e-10, 5e-8]))


@exercise(
    given_6,
    what_shrinks="answer",  # choices, read (and judged) below
    loss_scale="number",
    divergence_sign="answer",
    partial=True,
)
def exercise_6(g, what_shrinks, loss_scale, divergence_sign) -> str:
    """Mixed precision for a memory-bound run: what shrinks, fp16 loss scale, divergence."""
    grad, scale = g["smallest_grad"], loss_scale
    hint = "`what_shrinks`: compare the two plan.memory results, adding parameters + "
    hint += "gradients + optimizer into model states. Which total got smaller?"
    fields = checks.Fields()  # every wrong answer named at once
    fields.judge(what_shrinks, "activations", "what_shrinks", hint, choices=SHRINKS)
    # fp16's smallest normal number is 2**-14 (IEEE 754 half precision); the smallest
    # power-of-two scale that lifts the smallest gradient to it (Micikevicius et al. 2017).
    want = 2 ** math.ceil(math.log2(2**-14 / grad) - 1e-12)
    hints = {
        "`loss_scale` should be a power of two (scaling by 2^k is exact in floats).": scale <= 0
        or not math.log2(scale).is_integer(),
        "`loss_scale` looks like the exponent k; give the scale itself, 2 ** k.": math.log2(want),
        f"`loss_scale` is too small: {grad:g} times it is still below fp16's smallest normal "
        "number, 2 ** -14 (about 6.1e-5).": scale < want,
        "`loss_scale` works but is bigger than needed: a larger scale brings overflow (inf) "
        "closer. Find the smallest power of two.": OTHERWISE,
    }
    fields.judge(scale, want, "loss_scale", hints, rounding=False)
    hint = "`divergence_sign` is not it: what happens to values above fp16's largest number, "
    hint += "65504, and what does a loss scaler do?"
    fields.judge(divergence_sign, "b", "divergence_sign", hint, choices=SYMPTOMS)
    fields.verdict()
    return (
        f"Right: bf16-mixed halves the activations (model states stay 16 bytes per parameter), "
        f"loss scale {want} = 2^{int(math.log2(want))} keeps a {grad:g} gradient a normal fp16 "
        "number, and overflow shows as inf/NaN and skipped steps."
    )


LONG_CONTEXT = [("13B", 65536), ("13B", 131072), ("6.7B", 65536), ("6.7B", 131072),
                ("30B", 65536)]  # fmt: skip


def given_7(variant: Variant = DEFAULT) -> dict:
    model, seq = variant.pick("7c", LONG_CONTEXT[0], LONG_CONTEXT)
    return {"model": model, "seq": seq, "gpus": 64, "tp": 8, "global_batch": 64, "zero": 1,
            "gpu": "A100-80GB"}  # fmt: skip


# The calls of its material a graded notebook may make (the grader computes their results and
# hands them to the sandbox as data: course_utils.grading.stand_in): name -> other arguments.
MATERIAL = {
    "long_context_layout": [{"cp": cp} for cp in (1, 2, 4, 8)],
    "moe_layout": [{"ep": ep} for ep in (1, 2, 4, 8)],
}


def long_context_layout(cp: int, variant: Variant = DEFAULT) -> tuple[plan.ModelShape, plan.Config]:
    """The 64 GPUs as tp=8 (+sp) x cp x dp, selective recomputation, b = 1, 1F1B, pp = 1."""
    g = given_7(variant)
    model = replace(plan.MODEL_PRESETS[g["model"]], seq=g["seq"])
    dp = g["gpus"] // (g["tp"] * cp)
    config = plan.Config(tp=g["tp"], dp=dp, cp=cp, microbatches=g["global_batch"] // dp,
                         zero=g["zero"], recompute="selective", sequence_parallel=True)  # fmt: skip
    return model, config


@exercise(given_7, smallest_cp="whole number", context_gb="number", partial=True)
def exercise_7(g, smallest_cp, context_gb, variant) -> str:
    """Long context: the smallest cp that fits, and the ring's GB per GPU per step there."""
    hardware = plan.HARDWARE_PRESETS[g["gpu"]]
    options = [c for c in (1, 2, 4, 8) if g["gpus"] % (g["tp"] * c) == 0]
    fit = {c: plan.evaluate(*long_context_layout(c, variant), hardware=hardware) for c in options}
    fields = checks.Fields()  # every wrong answer named at once
    right = layouts.judge_smallest_fit(
        smallest_cp, "smallest_cp", "cp", fit, hardware.usable_gib,
        allowed=f"one of {options} (cp x dp = {g['gpus'] // g['tp']})",
        too_small="Which part grows with the sequence, and how does cp divide it?",
        too_big=", and every extra ring step costs traffic", fields=fields,
    )  # fmt: skip
    model, config = long_context_layout(right, variant)
    want = plan.traffic(model, config)["context"] / GB
    slips = [
        (2, "is twice the right amount: it counts both directions, or 4-byte values instead "
            "of bf16's 2. Count what one GPU sends, in bf16, as everywhere in the planner."),
        ((right - 1) / (3 * right - 2), "counts the forward ring only; the backward sends the "
                                        "K/V blocks around again and the dK/dV home."),
        (config.tp, "counts the K/V of all heads; each tensor-parallel GPU sends only its own "
                    "heads' K/V, h / tp values per token."),
    ]  # fmt: skip
    hint = (
        "`context_gb` is not right yet. At the smallest cp that fits, per layer and micro-batch "
        "a GPU sends its K/V block (2 x s/cp x h/tp values, 2 bytes each) cp - 1 times forward, "
        "and backward cp - 1 times plus cp hops of dK/dV; or ask "
        "plan.traffic(model, config)['context']."
    )
    fields.judge(context_gb, want, "context_gb", hint, unit="GB", slips=slips)
    fields.verdict()
    return (
        f"Right: at {g['seq']:,} tokens cp={right} is the smallest ring that fits "
        f"({fit[right].memory['total'] / GIB:.1f} GiB per GPU), and each GPU sends "
        f"{want:.3g} GB per step around it, over NVLink inside the node."
    )


def given_8(variant: Variant = DEFAULT) -> dict:
    gpus, zero = variant.pick("8g", (16, 1), [(16, 1), (16, 2), (32, 1), (32, 2)])
    return {"model": "8x6.7B-MoE", "gpus": gpus, "zero": zero, "global_batch": 128,
            "gpu": "A100-80GB"}  # fmt: skip


def moe_layout(ep: int, variant: Variant = DEFAULT) -> tuple[plan.ModelShape, plan.Config]:
    """Pure data parallelism over all GPUs (tp = pp = cp = 1), experts split over ep."""
    g = given_8(variant)
    dp = g["gpus"]
    config = plan.Config(dp=dp, ep=ep, microbatches=g["global_batch"] // dp, zero=g["zero"],
                         recompute="selective")  # fmt: skip
    return plan.MODEL_PRESETS[g["model"]], config


def _moe_slips(ep: int, top_k: int) -> list[tuple[float, str]]:
    """The all-to-all's slips; two that give the same factor share one message."""
    forward = "the forward only (the backward runs the dispatch and combine again, for the "
    forward += "gradients)"
    copies = f"one copy per token (each token goes to its top-{top_k} experts)"
    slips = [
        (
            2.0,
            "is twice the right amount: it counts both directions, or 4-byte values instead "
            "of bf16's 2. Count what one GPU sends, in bf16.",
        )
    ]
    if top_k == 2:
        slips.append((0.5, f"is half the right amount: it counts {forward}, or {copies}."))
    else:
        slips += [(0.5, f"counts {forward}."), (1 / top_k, f"counts {copies}.")]
    if ep > 1:
        slips.append(
            (
                ep / (ep - 1),
                "counts every routed token, but the tokens for this GPU's own experts stay "
                "home: only (ep - 1) / ep of them leave.",
            )
        )
    return slips


@exercise(given_8, smallest_ep="whole number", all_to_all_gb="number", partial=True)
def exercise_8(g, smallest_ep, all_to_all_gb, variant) -> str:
    """Mixture of experts: the smallest ep that fits, and the all-to-all GB per GPU there."""
    hardware = plan.HARDWARE_PRESETS[g["gpu"]]
    fit = {e: plan.evaluate(*moe_layout(e, variant), hardware=hardware) for e in (1, 2, 4, 8)}
    fields = checks.Fields()  # every wrong answer named at once
    right = layouts.judge_smallest_fit(
        smallest_ep, "smallest_ep", "ep", fit, hardware.usable_gib,
        allowed="1, 2, 4 or 8 (it divides the 8 experts)",
        too_small="Which parameters does ep split?", fields=fields,
    )  # fmt: skip
    model, config = moe_layout(right, variant)
    want = plan.traffic(model, config)["expert"] / GB
    hint = (
        "`all_to_all_gb` is not right yet. At the smallest ep that fits, per MoE layer and "
        "micro-batch: 4 all-to-alls (dispatch and combine, forward and backward), each sending "
        "this GPU's tokens x top-k x h values of 2 bytes, (ep - 1) / ep of them; or ask "
        "plan.traffic(model, config)['expert']."
    )
    slips = _moe_slips(right, model.top_k)
    fields.judge(all_to_all_gb, want, "all_to_all_gb", hint, unit="GB", slips=slips)
    fields.verdict()
    return (
        f"Right: ep={right} splits the {model.expert_params / 1e9:.3g}B expert parameters "
        f"{right} ways ({fit[right].memory['total'] / GIB:.1f} GiB per GPU), and each GPU sends "
        f"{want:.3g} GB per step in all-to-alls: inside a node while ep <= 8."
    )
