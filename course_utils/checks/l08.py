"""Checks for lesson 08's exercises (sharded data parallelism: ZeRO and FSDP, executed).

Every expected answer is computed with `course_utils.parallel.fsdp` (the ZeRO memory
formula, the gathered-bytes bound, the step simulator). Conventions shared with the lesson:
Adam in fp32 keeps 4 bytes of parameters, 4 of gradient and 8 of optimizer state per
parameter (16 in all); ZeRO stage 1 shards the optimizer state, stage 2 also the gradients,
stage 3 also the parameters (Rajbhandari et al. 2019, arXiv 1910.02054); stage 3 is FSDP
(Zhao et al. 2023, arXiv 2304.11277). A layer is one flat vector, padded with zeros to a
multiple of N and cut into N equal contiguous shards.

Exercise 8.2's answer is a program every rank runs (`checks.rank_cases.ZeroCase`): ZeRO-2's
step, judged in the grader (`checks.zero_build`) against one device's steps, the optimizer
state each rank keeps and the bytes of its collectives.
Exercise 8.4's answer is a program every rank runs (`checks.recorded_cases.PrefetchCase`):
FSDP's forward with prefetch depth k, judged in the grader (`checks.prefetch_build`) on its
outputs, the gathers it issued and waited for, and the gathered layers it held at once.
Exercise 8.6's answer is a program every rank runs (`checks.programs.ShardCase`): judged in
the grader from its run's evidence against one device's SGD step, the ZeRO-3 traffic formula
and a memory target (its shards, one gathered layer and one gradient shard at a time).
"""

from __future__ import annotations

from course_utils import checks
from course_utils.checks import (
    DEFAULT,
    OTHERWISE,
    Variant,
    builds,
    exercise,
    fail,
    judge,
    numbers,
    pick,
    programs,
)
from course_utils.checks.programs import ShardCase
from course_utils.checks.rank_cases import ZeroCase
from course_utils.checks.recorded_cases import PrefetchCase

for_student = checks.lesson_checks(__name__)

given_1 = numbers(params=pick("1p", 1.5e9, [1e9, 3e9, 7e9]), N=pick("1n", 8, [4, 16, 64]))


def _zero(psi: float, n: int, stage: int, precision: str = "fp32") -> float:
    """Model-state bytes per worker: the planner's ZeRO formula (fp32 Adam: 4 + 4 + 8)."""
    from course_utils.plan import model_state_bytes

    return sum(model_state_bytes(psi, precision, zero=stage, dp=n).values())


@exercise(given_1, stage1="number", stage2="number", stage3="number", partial=True)
def exercise_1(g, stage1, stage2, stage3) -> str:
    """Model-state bytes per worker for ZeRO stages 1, 2 and 3 (fp32 Adam, 16 bytes/param)."""
    psi, n = g.params, g.N
    fp32 = {stage: _zero(psi, n, stage) for stage in range(4)}
    fields = checks.Fields()  # every wrong answer named at once
    for stage, value in ((1, stage1), (2, stage2), (3, stage3)):
        name, mixed = f"stage{stage}", _zero(psi, n, stage, "bf16-mixed")
        # fp32 stage 2 (4 + 12/N) is also the paper's mixed-precision stage 1 (4 + 12/N)
        either = (
            f", or stage {stage}'s in the paper's mixed precision (2 + 2 + 12 bytes)"
            if checks.matches(value, mixed)
            else ""
        )
        hints = {
            **{
                f"`{name}` is stage {other}'s count in fp32{either}. Here everything is fp32 "
                "(parameters 4, gradients 4, Adam's two states 8 bytes), and stage 1 shards the "
                "optimizer state; stage 2 also the gradients; stage 3 also the "
                "parameters.": fp32[other]
                for other in (1, 2, 3)
                if other != stage
            },
            f"`{name}` is plain data parallelism: 16 bytes per parameter, nothing sharded.": fp32[
                0
            ],
            f"`{name}` uses the paper's mixed-precision counts (2 + 2 + 12 bytes). Here "
            "everything is fp32: parameters 4, gradients 4, Adam's two states 8.": mixed,
            f"`{name}` is not right: add parameters, gradients and optimizer state, dividing by "
            "N what this stage shards.": OTHERWISE,
        }
        with fields.judging():
            judge(value, fp32[stage], name, hints, unit="bytes")
    fields.verdict()
    return (
        f"Right: {fp32[1] / 1e9:.3g}, {fp32[2] / 1e9:.3g} and {fp32[3] / 1e9:.3g} GB per "
        f"worker, against {fp32[0] / 1e9:.3g} GB for plain data parallelism. Only stage 3 "
        f"scales with N = {n}: it is the one that lets a model larger than one device's "
        "memory train at all."
    )


given_2 = numbers(N=pick("2n", 3, [2, 3, 4]), hidden=pick("2h", 9, [7, 11, 13]))


def cases_2(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's model (their numbers), then two more; every model's parameter count
    (27 x hidden + 10, hidden odd) not a multiple of the ranks, so padding matters."""
    g, rng = given_2(variant), variant.cases("2")
    cases = [ZeroCase(devices=g.N, batch=2 * g.N, hidden=g.hidden, seed=2)]
    for n in (rng.choice([2, 3]), 4):
        hidden, batch = rng.choice([5, 7, 9, 11, 15]), n * rng.choice([1, 2])
        cases.append(ZeroCase(devices=n, batch=batch, hidden=hidden, seed=rng.randint(1, 10**6)))
    return {"zero_step": [(case,) for case in cases]}


@exercise(given_2, zero_step=programs.as_program, points=3, partial=True)
def exercise_2(zero_step, variant) -> str:
    """Build ZeRO-2's step as a per-rank program; judged on what the run did."""
    from course_utils.checks.zero_build import zero_step as verdict  # the grader's

    return verdict(zero_step, cases_2(variant)["zero_step"])


EVENTS = {
    "gather": "all-gather the layer's parameters",
    "forward": "forward of the layer",
    "free": "free the gathered parameters",
    "backward": "backward of the layer",
    "reduce": "reduce-scatter the layer's gradient",
    "adam": "Adam step on the worker's shard",
}
ORDER = ["gather", "forward", "free", "gather", "backward", "reduce", "free", "adam"]


def given_3(variant: Variant = DEFAULT) -> dict:
    rng, names = variant.seeded("3s"), list(EVENTS)
    if rng is None:
        names = ["backward", "gather", "adam", "free", "forward", "reduce"]
    else:
        rng.shuffle(names)
    return {letter: EVENTS[name] for letter, name in zip("abcdef", names, strict=True)}


@exercise(given_3, order="list")
def exercise_3(g, order) -> str:
    """One layer's events in a ZeRO-3 step (prefetch 0, one micro-batch), as letters."""
    name_of = {letter: key for letter, text in g.items() for key in EVENTS if EVENTS[key] == text}
    names = [name_of[checks.as_choice(x, list(g), f"order[{i}]")] for i, x in enumerate(order)]
    alternative = ORDER[:5] + ["free", "reduce", "adam"]  # freeing the weights first is fine too
    if names in (ORDER, alternative):
        return (
            "Right: gathered for the forward, freed, gathered again for the backward, its "
            "gradient reduce-scattered, and only then Adam on the shard. Between uses a worker "
            "holds 1/N of the layer: that is all of ZeRO-3's memory saving, paid for with the "
            "second all-gather."
        )
    if names.count("gather") == 1 and "forward" in names and "backward" in names:
        fail(
            "The gathered copy is freed after the forward, yet the backward needs the full "
            "weights again: how do they come back?"
        )
    if "adam" in names and "reduce" in names and names.index("adam") < names.index("reduce"):
        fail(
            "Adam runs before the gradient is summed over the workers: it needs the reduce-scatter."
        )
    if names.count("free") != 2:
        fail("A gathered copy is freed after each use of the layer: count the uses.")
    if "reduce" in names and names.index("reduce") < names.index("backward"):
        fail("The gradient to reduce-scatter only exists after the backward.")
    if names[:2] != ["gather", "forward"]:
        fail("Before its forward a worker holds only its shard of the layer: what must come first?")
    fail(f"`order` has {len(names)} events in an order that cannot run; follow one layer's life.")


given_4 = numbers(
    N=pick("4n", 2, [2, 3]),
    depth=pick("4d", 4, [4, 5, 6]),
    hidden=pick("4h", 24, [16, 20, 28]),
    prefetch=pick("4k", 2, [1, 2, 3]),
    batch=lambda g: 2 * g.N,
)


def cases_4(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's model and depth (their numbers), then two more drawn afresh: other
    ranks, depths, widths, prefetch depths (no prefetch among them) and seeds."""
    g, rng = given_4(variant), variant.cases("4")
    cases = [PrefetchCase(g.N, g.depth, g.hidden, g.prefetch, seed=4, batch=g.batch)]
    for k in (rng.choice([0, 1]), rng.choice([2, 3])):
        n, depth = rng.choice([2, 3]), rng.choice([4, 5])
        hidden, seed = rng.choice([12, 20, 28]), rng.randint(1, 10**6)
        cases.append(PrefetchCase(n, depth, hidden, k, seed, batch=n * rng.choice([1, 2])))
    return {"fsdp_forward": [(case,) for case in cases]}


@exercise(given_4, fsdp_forward=programs.as_program, points=3, partial=True)
def exercise_4(fsdp_forward, variant) -> str:
    """Build FSDP's forward with prefetch depth k as a per-rank program; judged on its run."""
    from course_utils.checks.prefetch_build import prefetch_forward  # the grader's

    return prefetch_forward(fsdp_forward, cases_4(variant)["fsdp_forward"])


given_5 = numbers(
    layers=pick("5l", 4, [3, 5, 6]),
    forward_ms=1.0,
    backward_ms=2.0,
    gather_ms=pick("5g", 0.6, [0.4, 0.8, 1.0]),
    # the same bytes as a gather, on the same communication stream: the backward's gathers
    # queue behind the reduce-scatters
    reduce_scatter_ms=lambda g: g.gather_ms,
    N=2,
)


def their_costs(variant: Variant = DEFAULT):
    """Exercise 8.5's costs: equal layers, one all-gather of a layer takes gather_ms."""
    from course_utils.parallel.fsdp import FSDPCosts

    g = given_5(variant)
    numel, n = 1_000_000, g["N"]
    shard_bytes = numel // n * 4
    return FSDPCosts(
        forward=(g["forward_ms"] / 1e3,) * g["layers"],
        backward=(g["backward_ms"] / 1e3,) * g["layers"],
        layer_numels=(numel,) * g["layers"],
        bandwidth=(n - 1) * shard_bytes / (g["gather_ms"] / 1e3),
    )


# The calls of its material a graded notebook may make (the grader computes their results and
# hands them to the sandbox as data: course_utils.grading.stand_in): name -> other arguments.
MATERIAL = {"their_timeline": [{}, {"prefetch": 1}]}


def their_timeline(variant: Variant = DEFAULT, prefetch: int = 0):
    """Exercise 8.5's ZeRO-3 step, simulated (no prefetch unless asked)."""
    from course_utils.parallel.fsdp import simulate_fsdp

    return simulate_fsdp(their_costs(variant), given_5(variant)["N"], stage=3, prefetch=prefetch)


@exercise(
    given_5,
    waiting_share="number",
    fix={
        "a": checks.RIGHT,
        "b": "With more workers each shard is smaller, but an all-gather still brings "
        "(N-1)/N of the layer over each link, and the compute still waits for it.",
        "c": "A layer's gradient exists only once its backward is done, so it cannot be "
        "reduce-scattered earlier; and on the one communication stream each backward gather "
        "would still wait for the reduce-scatter before it.",
        "d": "A bigger batch dilutes the wait but does not hide it: every gather is still "
        "waited for.",
    },
    gain="number",
    partial=True,
)
def exercise_5(g, waiting_share, fix, gain, variant) -> str:
    """A ZeRO-3 step with unhidden gathers: the compute's waiting share, the fix, its gain."""
    theirs, fixed = their_timeline(variant), their_timeline(variant, prefetch=1)
    busy = theirs.busy_per_device()[0]
    want, waited_ms = 1 - busy / theirs.makespan, (theirs.makespan - busy) * 1e3
    hints = {
        "`waiting_share` is the share spent computing; the question asks for the wait.": 1 - want,
        "`waiting_share` is a time; give it as a share of the step (0 to 1).": waited_ms,
        "`waiting_share` is not right: (makespan - compute time) / makespan, for one "
        "worker.": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    with fields.judging():
        judge(waiting_share, want, "waiting_share", hints, unit="fraction")
    want_gain = theirs.makespan / fixed.makespan
    how = "the step without prefetch over the step with it"
    hint = "`gain` is not right: simulate the same costs with prefetch=1 "
    hint += "(their_timeline(prefetch=1)) and divide the makespans."
    with fields.judging():
        judge(gain, want_gain, "gain", hint, upside_down=how)
    fields.verdict()
    return (
        f"Right: without prefetch the compute waits for every all-gather, {want:.0%} of the "
        f"step. Issuing the next layer's gather before computing the current one hides "
        f"them behind compute: {want_gain:.2f}x as fast, for one more gathered layer of memory."
    )


# --------------------------------------------------------------------------- 8.6: the program


given_6 = numbers(
    N=pick("6n", 2, [2, 3, 4]),
    hidden=pick("6h", 24, [16, 20, 28]),
    depth=pick("6d", 2, [1, 2, 3]),
    batch=lambda g: 4 * g.N,
)


def cases_6(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own model (their numbers), then two more: in the notebook fixed by their
    name, in the grader drawn afresh (other ranks, sizes, depths and seeds)."""
    g, rng = given_6(variant), variant.cases("6")
    cases = [ShardCase(devices=g.N, batch=g.batch, hidden=g.hidden, depth=g.depth, seed=8)]
    for _ in range(2):
        n = rng.choice([2, 3, 4])
        cases.append(
            ShardCase(
                devices=n,
                batch=n * rng.choice([1, 2, 3]),
                hidden=rng.choice([12, 20, 28]),
                depth=rng.choice([1, 2, 3]),
                seed=rng.randint(1, 10**6),
            )
        )
    return {"fsdp_step": [(case,) for case in cases]}


@exercise(given_6, fsdp_step=programs.as_program, points=3, partial=True)
def exercise_6(fsdp_step, variant) -> str:
    """Build one FSDP (ZeRO-3) step as a per-rank program; judged on what the run did."""
    return builds.fsdp_step(fsdp_step, cases_6(variant)["fsdp_step"])
