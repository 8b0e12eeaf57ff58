"""Checks for lesson 07's exercises (tensor parallelism and hybrid parallelism).

Sources: the column/row split of the Megatron-LM MLP (Shoeybi et al. 2019, arXiv
1909.08053), the ring all-reduce's 2(N-1)/N bytes per device (Patarasuk & Yuan 2009),
ZeRO's model-state formulas (Rajbhandari et al. 2019, arXiv 1910.02054), 3D layouts
(Narayanan et al. 2021, arXiv 2104.04473) and activation recomputation (Chen et al. 2016,
arXiv 1604.06174). torch is imported lazily, only by the checks that need it.
"""

from __future__ import annotations

from course_utils import checks
from course_utils.checks import (
    DEFAULT,
    OTHERWISE,
    Variant,
    exercise,
    fail,
    judge,
    numbers,
    pick,
    programs,
)
from course_utils.checks.rank_cases import ColumnCase, GroupsCase, TPCase, close

for_student = checks.lesson_checks(__name__)

GB = 1e9


# --------------------------------------------------------------------------- 7.1: columns


given_1 = numbers(tokens=pick("1t", 5, [4, 6, 7]), d_out=pick("1d", 12, [9, 15, 18]))


def cases_1(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's layer on 3 ranks (3 divides its columns), then fresh ones: other
    numbers of ranks, columns the ranks do not divide."""
    g, rng = given_1(variant), variant.cases("1")
    cases = [ColumnCase(3, g.tokens, 6, g.d_out, seed=1)]
    for devices in (rng.randint(2, 3), 4):
        d_out = devices * rng.randint(1, 3) + rng.randint(1, devices - 1)
        d_in, tokens = rng.randint(2, 8), rng.randint(2, 6)
        cases.append(ColumnCase(devices, tokens, d_in, d_out, rng.randint(1, 10**6)))
    return {"column_parallel": [(case,) for case in cases]}


@exercise(given_1, column_parallel=programs.as_program, points=3, partial=True)
def exercise_1(column_parallel, variant) -> str:
    """Build a column-parallel layer per rank: its columns' output, all-gathered; judged
    against the unsplit layer, with the bytes each rank sent."""
    from course_utils.checks.column_build import column_parallel as verdict  # the grader's

    return verdict(column_parallel, cases_1(variant)["column_parallel"])


SHAPES_2 = [(2, 2048, 4096), (8, 512, 2048), (4, 2048, 5120)]  # (sequences, tokens, d_model)
given_2 = numbers(
    pick("2shape", (4, 1024, 3072), SHAPES_2, "sequences", "tokens", "d_model"),
    tp=pick("2tp", 4, [2, 4, 8]),
)


@exercise(
    given_2,
    collective={
        "all-reduce": checks.RIGHT,
        "all-gather": "An all-gather puts slices side by side, but each device holds a "
        "full-size partial sum: the partial sums have to be added.",
        "reduce-scatter": "A reduce-scatter adds the partial sums but leaves each device "
        "only 1/N of the result (sequence parallelism uses that); here every device needs "
        "the whole Y.",
        "broadcast": "A broadcast copies one device's tensor to the others, but no single "
        "device has the sum yet.",
        "none": "Each device holds only a partial sum X_i A_i; Y is their sum.",
    },
    bytes_per_device="number",
    partial=True,
)
def exercise_2(g, collective, bytes_per_device) -> str:
    """Row-parallel output: which collective, and the bytes each device sends (ring)."""
    size, n = g.sequences * g.tokens * g.d_model * 2, g.tp
    want = 2 * (n - 1) / n * size
    sent, all_ = bytes_per_device, n * want if n > 2 else None  # all_: every device's together
    hints = {
        "`bytes_per_device`: that is the size of the tensor itself; in a ring all-reduce "
        "each device sends 2(N-1)/N times that (a reduce-scatter, then an all-gather).": size,
        "`bytes_per_device`: that counts only one of the two phases of the ring all-reduce "
        "(reduce-scatter, then all-gather).": (n - 1) / n * size,
        "`bytes_per_device`: check the bytes per value: bf16 takes 2 bytes, and the "
        "factor is 2(N-1)/N.": checks.any_of(2 * want, 2 * size),
        "`bytes_per_device`: that is all devices together; the question asks per device.": all_,
        "`bytes_per_device`: (N-1) x size is what rank 0 sends in the naive all-reduce; the "
        "question asks for the ring, where every device sends the same amount.": (n - 1) * size,
        "`bytes_per_device` should be in bytes: tokens x d_model x bytes per value, times the "
        "ring's factor.": not 1e3 <= sent <= 1e12,
        "`bytes_per_device` is not right yet. Size of the output tensor in bytes "
        "(sequences x tokens x d_model x 2 for bf16), times the ring's 2(N-1)/N.": OTHERWISE,
    }
    judge(sent, want, "bytes_per_device", hints, rel=1e-3, rounding=False)
    return (
        f"Right: an all-reduce; with the ring each device sends 2(N-1)/N x {size:,} = "
        f"{want:,.0f} bytes."
    )


given_3 = numbers(
    pick("3", (5e9, 16), [(7e9, 8), (3e9, 32), (13e9, 64), (6e9, 16)], "params", "dp")
)


def _zero_gb(stage: int, variant: Variant = DEFAULT) -> float:
    g = given_3(variant)
    psi, n = g["params"], g["dp"]
    return {0: 16 * psi, 1: 4 * psi + 12 * psi / n, 2: 2 * psi + 14 * psi / n, 3: 16 * psi / n}[
        stage
    ] / GB


SHARDED = {
    1: "the optimizer state",
    2: "the optimizer state and the gradients",
    3: "everything (weights, gradients and optimizer state)",
}


@exercise(zero1_gb="number", zero2_gb="number", zero3_gb="number", partial=True)
def exercise_3(zero1_gb, zero2_gb, zero3_gb, variant) -> str:
    """Model states per device under ZeRO-1/2/3 for the given parameters and devices."""
    gb = {z: _zero_gb(z, variant) for z in range(4)}
    fields = checks.Fields()  # every wrong answer named at once
    for stage, value in ((1, zero1_gb), (2, zero2_gb), (3, zero3_gb)):
        name, rest = f"zero{stage}_gb", "; the rest stays replicated on every device."
        hints = {
            f"`{name}` = {value:g} GB is plain data parallelism: nothing is sharded yet.": gb[0],
            **{
                f"`{name}` = {value:g} GB is the value of ZeRO-{other}. ZeRO-{stage} shards "
                f"{SHARDED[stage]}{rest if stage < 3 else '.'}": gb[other]
                for other in (1, 2, 3)
                if other != stage
            },
            f"`{name}` is not right. Start from 2 + 2 + 12 bytes per parameter (bf16 weights, "
            f"bf16 gradients, fp32 Adam state); ZeRO-{stage} divides {SHARDED[stage]} by the "
            f"{given_3(variant)['dp']} data-parallel devices"
            + (" and keeps the rest whole on every device." if stage < 3 else "."): OTHERWISE,
        }
        with fields.judging():
            judge(value, gb[stage], name, hints, unit="GB", rel=2e-3)
    fields.verdict()
    return (
        f"Right: {gb[0]:g} GB per device without ZeRO becomes {gb[1]:g}, {gb[2]:g} and "
        f"{gb[3]:g} GB with ZeRO-1, 2 and 3."
    )


EX4 = {
    "gpus": 32,
    "per_node": 8,
    "params": 20e9,
    "layers": 48,
    "heads": 48,
    "batch": 64,
    "state_budget_gb": 40,
    "max_bubble": 0.2,
}


@exercise(tp="whole number", pp="whole number", dp="whole number")
def exercise_4(tp, pp, dp) -> str:
    """Choose tp, pp, dp for a 20B model on 4 nodes of 8 GPUs, graded by constraints."""
    t, p, d = tp, pp, dp
    s = EX4
    if min(t, p, d) < 1:
        fail("Each degree is a number of devices: at least 1.")
    if t * p * d != s["gpus"]:
        fail(f"tp x pp x dp = {t * p * d}, but the job has {s['gpus']} GPUs: use all of them.")
    if t > s["per_node"]:
        fail(
            f"tp = {t} puts one tensor-parallel group on more than one node of "
            f"{s['per_node']} GPUs: its all-reduces, in every layer, would cross the slow "
            "network. Keep tp within a node."
        )
    # (tp divides the 32 GPUs and is at most 8, so it always divides the 48 heads)
    if s["layers"] % p:
        fail(f"pp = {p} does not divide the {s['layers']} layers into equal stages.")
    states = 16 * s["params"] / (t * p) / GB
    if states > s["state_budget_gb"]:
        fail(
            f"With tp x pp = {t * p} each GPU holds {states:g} GB of model state (16 bytes per "
            f"parameter / (tp x pp)), over the {s['state_budget_gb']} GB budget. The model "
            "needs a larger model-parallel part."
        )
    m = s["batch"] // d
    bubble = (p - 1) / (m + p - 1)
    if bubble > s["max_bubble"] + 1e-12:
        fail(
            f"With dp = {d} each replica gets {m} micro-batches, and pp = {p} leaves a bubble "
            f"of {bubble:.0%} > {s['max_bubble']:.0%}. Use fewer pipeline stages (more tensor "
            "parallelism inside the node instead)."
        )
    fewest = 16 * s["params"] / (s["state_budget_gb"] * GB)  # smallest tp x pp that fits
    if t * p > fewest:
        fail(
            f"That layout works, but tp x pp = {t * p} is more model parallelism than the memory "
            "needs. Every GPU you take from data parallelism adds per-layer (TP) or per-stage "
            "(PP) communication: use the smallest tp x pp that fits, and give the rest to dp."
        )
    return (
        f"Right: tp={t}, pp={p}, dp={d}. Model state {states:g} GB per GPU, tensor groups inside "
        f"a node, bubble {bubble:.0%} with {m} micro-batches per replica, and as much data "
        "parallelism as the memory allows. (tp=8/pp=1, tp=4/pp=2 and tp=2/pp=4 all pass; a "
        "planner would pick between them by step time.)"
    )


# --------------------------------------------------------------------------- 7.5: groups


given_5 = numbers(pick("5", (2, 3), [(3, 2), (2, 4), (4, 2)], "tp", "dp"))


def cases_5(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's grid, then two fresh ones (tp and dp differ, so that the groups of
    the two kinds differ in size)."""
    g, rng = given_5(variant), variant.cases("5")
    cases = [GroupsCase(g.tp, g.dp, seed=5)]
    others = [grid for grid in [(2, 3), (3, 2), (4, 2), (2, 4)] if grid != (g.tp, g.dp)]
    for tp, dp in rng.sample(others, 2):
        cases.append(GroupsCase(tp, dp, rng.randint(1, 10**6)))
    return {"grid_groups": [(case,) for case in cases]}


@exercise(given_5, grid_groups=programs.as_program, points=3, partial=True)
def exercise_5(grid_groups, variant) -> str:
    """Build a tp x dp grid's process groups per rank, with one all-reduce in each; judged
    on the ranks each all-reduce joined and its sums."""
    from course_utils.checks.groups_build import grid_groups as verdict  # the grader's

    return verdict(grid_groups, cases_5(variant)["grid_groups"])


@exercise(
    problem={
        "b": checks.RIGHT,
        "a": "Compare the bubble bars of the two runs: they hardly changed. Which part of the "
        "step grew?",
        "c": "Both runs have dp = 1, so no data-parallel all-reduce. Which part grew?",
        "d": "The memory per GPU went down, not up, when tp doubled. Which part grew?",
    },
    fix={
        "b": checks.RIGHT,
        "a": "More micro-batches shrink the bubble, which is not what grew.",
        "c": "A tensor group of 16 would span even more nodes: every layer's all-reduces would "
        "cross the slow network again.",
        "d": "ZeRO-3 saves memory (and adds communication); memory is not the problem.",
    },
    partial=True,
)
def exercise_6(problem, fix) -> str:
    """Diagnose a regression when tensor parallelism grows from 4 to 8 on nodes of 4 GPUs."""
    return (
        "Right: with nodes of 4 GPUs, tp = 8 sends every layer's all-reduces over the slow "
        "network. Keep tp = 4 inside a node and use the new GPUs as data (or pipeline) "
        "parallelism: the step then really gets about 2x faster."
    )


given_7 = numbers(
    pick("7ls", (16, 4), [(24, 6), (36, 6), (32, 8), (12, 3)], "layers", "segments"),
    pick("7gb", (0.5, 0.125), [(0.4, 0.1), (0.6, 0.2), (0.8, 0.25)], "block_gb", "input_gb"),
)


@exercise(given_7, peak_gb="number", extra_compute="number", partial=True)
def exercise_7(g, peak_gb, extra_compute) -> str:
    """Activation recomputation: peak activation memory and extra compute with k segments."""
    L, k, a, x = g.values()  # noqa: N806 - the lesson's L
    want = k * x + (L // k) * a
    hints = {
        f"`peak_gb` = {L * a:g} GB is memory without recomputation: every block keeps "
        "everything.": L * a,
        "`peak_gb` counts the segment being recomputed, but not the segment inputs stored for "
        "the other segments.": (L // k) * a,
        "`peak_gb` counts the stored segment inputs, but during the backward pass one "
        "segment's activations are recomputed and alive again.": k * x,
        "`peak_gb` is not right. At the peak of the backward pass: the stored inputs of all "
        "segments, plus the full activations of the one segment being worked on.": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    with fields.judging():
        judge(peak_gb, want, "peak_gb", hints, rel=2e-3, rounding=False)
    hints = {
        "`extra_compute` is the extra share, not the new total: subtract the original 1.": 4 / 3,
        "`extra_compute` = 1 would double the step. Only the forward pass is repeated, and the "
        "backward costs twice the forward.": 1.0,
        "`extra_compute`: relative to what? The step is forward (1) + backward (2); add one "
        "more forward.": 0.5,
        "`extra_compute` is not right. Each block's forward runs once more; compare that with "
        "a step of forward (1) + backward (2).": OTHERWISE,
    }
    with fields.judging():
        judge(extra_compute, 1 / 3, "extra_compute", hints, rel=1e-2)
    fields.verdict()
    return (
        f"Right: {want:g} GB instead of {L * a:g} GB of activations, for a third more compute. "
        "With k segments of L/k layers the peak is about k inputs + L/k layers: smallest near "
        "k = sqrt(L)."
    )


# --------------------------------------------------------------------------- 7.8: the TP MLP


given_8 = numbers(tokens=pick("8t", 6, [4, 5, 8]), d_model=pick("8d", 8, [6, 10, 12]))


def cases_8(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own MLP on 2 ranks, then fresh ones: more ranks, hidden sizes the
    ranks do not divide."""
    g, rng = given_8(variant), variant.cases("8")
    cases = [TPCase(2, g.tokens, g.d_model, 4 * g.d_model, seed=8)]
    for devices in (rng.randint(3, 4), 2):
        d_model = rng.randint(4, 12)
        hidden = devices * rng.randint(2, 6) + rng.randint(0, devices - 1)
        cases.append(TPCase(devices, rng.randint(3, 9), d_model, hidden, rng.randint(1, 10**6)))
    return {"tp_mlp": [(case,) for case in cases]}


def _tp_failed(shown: str, failure: dict) -> str:
    said = str(failure["message"])
    if failure.get("kind") == "deadlock":
        return (
            f"{shown} never finished: {said}. Every rank must call the same all-reduces in "
            "the same order: one in g's forward, one in f's backward."
        )
    return f"{shown}: {said}."


def _tp_counts(shown: str, calls: list[dict]) -> None:
    """Exactly one all-reduce in the forward (g) and one in the backward (f)."""
    from course_utils.actions import Action

    kinds = [
        Action.parse(c["in"]).kind if c["in"] else None for c in calls if c["op"] == "all_reduce"
    ]
    forward, backward = kinds.count("F"), kinds.count("B")
    if backward > 1:
        fail(
            f"{shown} reduced twice in the backward ({backward} all-reduces): g's backward "
            "passes dL/dY on unchanged, since every rank already holds all of it. Only f's "
            "backward sums."
        )
    if backward == 0:
        fail(
            f"{shown} has no all-reduce in the backward: each rank's input gradient is then "
            "only its slice's share. f's backward must sum them (f as an autograd Function, "
            "applied to the input)."
        )
    if forward != 1:
        fail(
            f"{shown} ran {forward} all-reduces in the forward; the column-then-row MLP needs "
            "exactly one, g's, summing the partial outputs."
        )


@exercise(given_8, tp_mlp=programs.as_program, points=3, partial=True)
def exercise_8(tp_mlp, variant) -> str:
    """Build the tensor-parallel MLP with f and g; judged against the unsplit MLP, with the
    all-reduces counted."""
    from course_utils.checks.rank_references import tp_reference  # the grader's only

    tried = []
    for (case,), shown, got in checks.each_call(tp_mlp, cases_8(variant)["tp_mlp"]):
        run = programs.evidence(got, shown, case, ("collectives", "outputs", "input_grads"))
        if run["failure"] is not None:
            fail(_tp_failed(shown, run["failure"]))
        for calls in run["collectives"]:
            _tp_counts(shown, calls)
        want, n = tp_reference(case), case.devices
        for r, (y, dx) in enumerate(zip(run["outputs"], run["input_grads"], strict=True)):
            if close(y, want["output"]):
                pass
            elif close(y, want["swapped"][r]):
                fail(
                    f"{shown}: rank {r}'s output is not the MLP's: the all-reduce is in f's "
                    "forward instead of g's. Every rank already holds the whole input: f passes "
                    "it on as it is; g sums the partial outputs of the row-parallel layer."
                )
            elif close(y, want["bias"]):
                fail(
                    f"{shown}: rank {r}'s output is the MLP's plus {n - 1} times the bias b2: "
                    f"each of the {n} ranks added it before the sum. Add b2 once, after g."
                )
            elif close(y, want["mean"]):
                fail(
                    f"{shown}: rank {r}'s output is the mean of the partial outputs: g must "
                    'sum them (`op="sum"`), since the row-parallel layer splits a sum.'
                )
            else:
                fail(f"{shown}: rank {r}'s output is not the unsplit MLP's output.")
            if not close(dx, want["input_grad"]):
                fail(
                    f"{shown}: rank {r}'s input gradient is not the unsplit MLP's: f's "
                    "backward sums the ranks' shares of dL/dX, once."
                )
            for key in ("w1", "b1", "w2", "b2"):
                if not close(run["grads"][r].get(f"{r}.{key}"), want["grads"][f"{r}.{key}"]):
                    fail(
                        f"{shown}: rank {r}'s gradient of its `{key}` is not its share of "
                        "the unsplit MLP's."
                    )
        tried.append(f"{n} ranks")
    return (
        f"Right on your MLP and fresh ones ({', '.join(tried)}): every rank's output and input "
        "gradient equal the unsplit MLP's, its shard's weight gradients are its share of the "
        "unsplit ones', with exactly one all-reduce in the forward (g) and one in the "
        "backward (f)."
    )
