"""Checks for lesson 01's exercises (why split a model; naive model parallelism).

Memory is counted in decimal gigabytes (1 GB = 10^9 bytes), like GPU data sheets. Bytes per
parameter of model state follow ZeRO's accounting (Rajbhandari et al. 2019, arXiv
1910.02054; SC 2020); mixed precision is Micikevicius et al. 2017 (arXiv 1710.03740; ICLR
2018): 16-bit weights and gradients, and an fp32 master copy of the weights kept by the
optimizer.
"""

from __future__ import annotations

import math

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
from course_utils.checks.programs import ProgramCase

for_student = checks.lesson_checks(__name__)

GB = 1e9  # the course counts memory in decimal gigabytes, like GPU data sheets

# Bytes per parameter of the weights and gradients the passes use, per number format.
PASS_BYTES = {"fp32": 4, "mixed": 2}
# Numbers the optimizer keeps per parameter, each in fp32 (4 bytes): Adam its two moments
# m and v, SGD with momentum its momentum buffer, plain SGD nothing.
OPTIMIZER_NUMBERS = {"adam": 2, "momentum": 1, "sgd": 0}
MASTER_COPY = {"fp32": 0, "mixed": 4}  # mixed precision: fp32 master weights in the optimizer


def state_bytes_per_parameter(precision: str, optimizer: str = "adam") -> dict[str, int]:
    """Bytes per parameter of each kind of model state (what exercise 1.2 asks to build)."""
    return {
        "parameters": PASS_BYTES[precision],
        "gradients": PASS_BYTES[precision],
        "optimizer": MASTER_COPY[precision] + 4 * OPTIMIZER_NUMBERS[optimizer],
    }


def _total_per_parameter(precision: str, optimizer: str = "adam") -> int:
    return sum(state_bytes_per_parameter(precision, optimizer).values())


given_1 = numbers(billions=pick("1n", 7, [3, 6, 8, 13, 20, 34]))


@exercise(given_1, memory_gb="number")
def exercise_1(g, memory_gb) -> str:
    """`billions` billion parameters, fp32, Adam: model state in GB."""
    n = g.billions * 1e9
    want, per = n * _total_per_parameter("fp32") / GB, n / GB  # per: GB per byte a parameter
    hints = {
        "That is only the parameters (4 bytes each). Training also keeps a gradient per "
        "parameter and Adam keeps two more numbers per parameter.": 4 * per,
        "You counted parameters and gradients. What does Adam keep for every parameter?": 8 * per,
        "Adam keeps two running averages per parameter (m and v), not one.": 12 * per,
        "The question is about plain fp32 training: every number is 4 bytes, not 2.": 2 * per,
        f"{memory_gb:g} GB is {memory_gb * GB / n:.3g} bytes per parameter. Count the fp32 "
        "bytes of each thing training keeps per parameter: the weight, its gradient, and "
        "Adam's state.": OTHERWISE,
    }
    mb = [(1e3, "looks like megabytes; give GB (1 GB = 1000 MB).")]
    judge(memory_gb, want, "memory_gb", hints, unit="GB", slips=mb)
    where = (
        "more than one 80 GB GPU holds"
        if want > 80
        else "it fits on one 80 GB GPU, before the activations"
    )
    return f"Right: {memory_gb:g} GB, 16 bytes per parameter: {where}."


KEYS = ("parameters", "gradients", "optimizer")


def cases_2(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """Every precision with every optimizer, on random sizes, then a few large models."""
    rng = variant.cases("2")
    cases = [
        (rng.randint(1, 10**6) * 1000 + rng.randint(1, 999), precision, optimizer)
        for precision in PASS_BYTES
        for optimizer in OPTIMIZER_NUMBERS
    ]
    cases += [
        (rng.randint(10**8, 10**11), rng.choice(list(PASS_BYTES)), rng.choice(["adam", "sgd"]))
        for _ in range(3)
    ]
    return {"model_state_bytes": cases}


def _optimizer_hint(precision: str, optimizer: str) -> str:
    what = {
        "adam": "Adam keeps two fp32 numbers per parameter (m and v)",
        "momentum": "SGD with momentum keeps one fp32 number per parameter (its momentum)",
        "sgd": "plain SGD keeps no numbers of its own",
    }[optimizer]
    if precision == "mixed":
        return f"In mixed precision the optimizer also keeps an fp32 master copy; {what}."
    return f"In fp32 there is no separate master copy; {what}."


@exercise(model_state_bytes="function", partial=True)
def exercise_2(model_state_bytes, variant) -> str:
    """Build model_state_bytes(num_params, precision, optimizer) -> bytes per kind of state."""
    for (n, precision, optimizer), shown, got in checks.each_call(
        model_state_bytes, cases_2(variant)["model_state_bytes"]
    ):
        checks.as_dict(got, shown, KEYS)
        hints = {
            "parameters": "Which number format holds the weights the passes use?",
            "gradients": "Gradients have the same format as the weights the passes use.",
            "optimizer": _optimizer_hint(precision, optimizer),
        }
        for key, want in state_bytes_per_parameter(precision, optimizer).items():
            what = f"{shown}[{key!r}]"
            value = checks.as_number(got[key], what)
            wrong = f"{what} is {value / n:g} bytes per parameter, which is not right. {hints[key]}"
            one = (1 / n, "is the bytes of one parameter; give the bytes of all of them.")
            judge(value, n * want, what, wrong, unit="bytes", slips=[one])
    return (
        "Right on random model sizes, for both formats and all three optimizers. With "
        "Adam it is 16 bytes per parameter either way: mixed precision moves bytes from the "
        "weights to the optimizer, it does not save model state."
    )


given_3 = numbers(
    billions=pick("3n", 30, [13, 20, 34, 40, 52, 70]),
    gpu_gb=pick("3g", 80, [40, 48, 80, 96]),
    reserve_gb=pick("3r", 20, [8, 12, 16, 24]),
)


def fewest_stages(billions: float, gpu_gb: float, reserve_gb: float) -> int:
    """Equal stages whose mixed-precision Adam model state fits beside the reserve."""
    total_gb = billions * 1e9 * _total_per_parameter("mixed") / GB
    return math.ceil(total_gb / (gpu_gb - reserve_gb) - 1e-9)


@exercise(given_3, devices="whole number")
def exercise_3(g, devices) -> str:
    """`billions` B parameters, mixed + Adam, GPUs of `gpu_gb`, `reserve_gb` kept free."""
    billions, gpu, reserve = g.values()
    budget = gpu - reserve
    total_gb = billions * 1e9 * _total_per_parameter("mixed") / GB
    want = fewest_stages(billions, gpu, reserve)
    if devices < 1:
        fail("`devices` counts GPUs: at least 1.")
    if devices > want:
        fail(
            f"{devices} stages works, but fewer would too: the question asks for the fewest "
            f"equal stages whose model state fits in the {budget:g} GB per GPU left after the "
            "activation reserve."
        )
    # too few stages: say which budget the answer broke, never "more than needed"
    if devices < want and total_gb / devices <= gpu:
        fail(
            f"Too few: with {devices} stages the model state fits in the whole {gpu:g} GB, but "
            f"leaves less than the {reserve:g} GB each GPU must keep free for activations. "
            f"Only {budget:g} GB per GPU may hold model state."
        )
    weights = billions * 1e9 * PASS_BYTES["mixed"] / GB
    hints = {
        "Too few. Is that counting only the 16-bit weights? Count the gradients and the "
        "optimizer's state too: how many bytes per parameter in mixed precision with "
        "Adam?": checks.any_of(*(math.ceil(weights / b - 1e-9) for b in (budget, gpu))),
        f"Too few: with {devices} stages each GPU would hold more than {gpu:g} GB of model "
        "state. Start from the total: how many bytes per parameter in mixed precision with "
        "Adam?": OTHERWISE,
    }
    judge(devices, want, "devices", hints)
    return (
        f"Right: {total_gb:g} GB of model state; {want} equal stages put {total_gb / want:.1f} "
        f"GB on each GPU, within the {budget:g} GB left beside the {reserve:g} GB activation "
        "reserve."
    )


given_4 = numbers(p=pick("4p", 4, [3, 5, 6, 8]))


@exercise(given_4, utilization="number", speedup="number", partial=True)
def exercise_4(g, utilization, speedup) -> str:
    """Naive model parallelism over p equal stages: utilization per device and speed-up."""
    p, idle = g.p, 1 - 1 / g.p
    hints = {
        f"`utilization` = {utilization:g} is the idle fraction; it asks for the busy "
        "fraction.": idle,
        f"`utilization`: not yet. Draw the staircase: while one stage computes, what are the "
        f"other {p - 1} doing? How long is the step compared with one device's busy "
        "time?": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    with fields.judging():
        judge(utilization, 1 / p, "utilization", hints, unit="fraction")
    hints = {
        f"`speedup`: {p}x would need all {p} devices computing at once; in the naive schedule "
        "they take turns. Does the step get any shorter?": p,
        f"`speedup` is not right. The {p} devices do the same work one device would, one "
        "after another: does the step get any shorter?": OTHERWISE,
    }
    with fields.judging():
        judge(speedup, 1.0, "speedup", hints)
    fields.verdict()
    return (
        f"Right: each device is busy 1/{p} of the step, and the step is as long as on one "
        "device (no speed-up). Naive model parallelism buys memory, not speed."
    )


@exercise(
    problem={
        "b": checks.RIGHT,
        "a": "The bars differ in length (the stage with the output head is heavier), but "
        "balanced stages would still take turns. Look at how many rows compute at once in "
        "the simulated chart.",
        "c": "Handing a tensor to the next thread takes microseconds; the gaps are as long "
        "as whole forward and backward passes. What are the idle devices waiting for?",
        "d": "This run has no optimizer step at all. Look at when each device works.",
    },
    fix={
        "a": checks.RIGHT,
        "b": "More devices make each stage shorter but the staircase longer: utilization "
        "is still 1/p. What would let two stages work at the same time?",
        "c": "A larger batch makes every bar longer, but still only one device works at a "
        "time. Think of an assembly line.",
        "d": "Balanced stages all take the same time, but they still take turns: balancing "
        "fixes uneven bars, not the waiting. What change to the *data* lets stages overlap?",
    },
    partial=True,
)
def exercise_5(problem, fix) -> str:
    """Diagnose naive model parallelism's chart: the problem, and the fix that keeps the
    split between layers."""
    return (
        "Right: the whole batch has to leave a stage before the next one starts, so one device "
        "works and the rest wait; cutting the batch into micro-batches lets stages overlap."
    )


@exercise(
    scenario_a={
        "tensor": checks.RIGHT,
        "pipeline": "Splitting between layers puts whole layers on devices: can it help "
        "when one single layer is larger than a device?",
    },
    scenario_b={
        "pipeline": checks.RIGHT,
        "tensor": "Which split needs an all-reduce in every layer, and which only sends "
        "activations at a few stage boundaries?",
    },
)
def exercise_6(scenario_a, scenario_b) -> str:
    """Tensor or pipeline parallelism for two scenarios."""
    return (
        "Right: a layer bigger than a device must be cut inside (tensor parallelism); over a "
        "slow link, cut between layers (pipeline) so only stage boundaries communicate."
    )


# --------------------------------------------------------------------------- 1.7: the program


given_7 = numbers(batch=pick("7b", 8, [4, 6, 12, 16]), hidden=pick("7h", 32, [16, 24, 48]))


def cases_7(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own model (their numbers), then two drawn at random: other sizes, depths
    and seeds."""
    g, rng = given_7(variant), variant.cases("7")
    cases = [ProgramCase(devices=2, batch=g.batch, hidden=g.hidden, seed=7)]
    cases += [
        ProgramCase(
            devices=2,
            batch=rng.choice([2, 4, 6, 10]),
            hidden=rng.choice([8, 12, 20]),
            depth=rng.choice([1, 2, 4]),
            seed=rng.randint(1, 10**6),
        )
        for _ in range(2)
    ]
    return {"naive_program": [(case,) for case in cases]}


NAIVE_ACTIONS = [["0F0", "0B0"], ["1F0", "1B0"]]


def _failed_run(shown: str, failure: dict) -> str:
    """The hint for a run that stopped with `failure` (its kind, rank and message)."""
    kind, rank, said = failure.get("kind"), failure.get("rank"), str(failure["message"])
    if kind == "deadlock":
        return (
            f"{shown} never finished: {said}. A receive waits until the other rank has sent: "
            "rank 0 must send its activation before it waits for the gradient, and rank 1 "
            "can only send the gradient after its backward."
        )
    if kind == "not a tensor" and rank == 1:
        return (
            f"{shown}: {said}. Rank 1's `x.grad` is None: what rank 1 received is a plain "
            "tensor (a message carries no graph), so its backward stops before it. Make it a "
            "leaf that wants a gradient: `x = ctx.recv(0).requires_grad_()`."
        )
    if "does not require grad" in said:
        return (
            f"{shown}: {said}. Rank {rank}'s output has no graph to backpropagate through: "
            "it was detached (or computed under torch.no_grad()) before the rank kept it. Keep "
            "the stage's output as it is: `send` already sends a copy without the graph."
        )
    if "implicitly created only for scalar" in said:
        return (
            f"{shown}: {said}. Only the loss is a single number to start a backward from: "
            "rank 0 must start from its output with the gradient rank 1 sent back, "
            "`torch.autograd.backward(out, grad)`."
        )
    return f"{shown}: {said}. Compare it with the six steps listed above the answer cell."


@exercise(given_7, naive_program=programs.as_program, points=3, partial=True)
def exercise_7(naive_program, variant) -> str:
    """Build the naive two-rank program; judged on what the run did (evidence)."""
    for (case,), shown, got in checks.each_call(naive_program, cases_7(variant)["naive_program"]):
        run = programs.evidence(got, shown, case)
        if run["failure"] is not None:
            fail(_failed_run(shown, run["failure"]))
        ran = [[str(a) for a in actions] for actions in run["actions"]]
        for rank, (mine, want) in enumerate(zip(ran, NAIVE_ACTIONS, strict=True)):
            if mine != want:
                fail(
                    f"{shown}: rank {rank} ran the actions {mine or 'none'}, not {want}. Put "
                    "each stage's forward in `with ctx.forward(0):` and its backward in `with "
                    "ctx.backward(0):`, so the harness sees (and times) them."
                )
        one_device = case.reference()
        off = programs.gradients_off(run, case, one_device["grads"])
        if off.get(1):
            fail(
                f"{shown}: rank 1's gradients are not those of one device. Rank 1 computes "
                "the loss with `ctx.loss(out, 0)` on its stage's output and backpropagates it."
            )
        if off.get(0) == "none":
            fail(
                f"{shown}: rank 0's gradients are None: its backward never reached its stage. "
                "Rank 0 starts it from the output it kept, with the gradient rank 1 sent "
                "back: `torch.autograd.backward(out, grad)`."
            )
        if off.get(0) == "zero":
            fail(
                f"{shown}: rank 0's gradients are all zero: the gradient rank 1 sent back was "
                "zeros. Did rank 1 make the activation it received want a gradient "
                "(`requires_grad_()`) before its forward?"
            )
        if off.get(0):
            fail(
                f"{shown}: rank 1's gradients are right, rank 0's are not. Rank 0's backward "
                "must start from the gradient rank 1 sent back, `torch.autograd.backward(out, "
                "grad)`, not from its own output (`out.sum().backward()`)."
            )
        handed = one_device["handed"][0]
        if run["bytes_sent"] != [handed, handed] or run["bytes_received"] != [handed, handed]:
            fail(
                f"{shown}: the ranks sent {run['bytes_sent']} bytes; the naive program sends "
                f"one activation forward and one gradient back, {handed} bytes each."
            )
    return (
        "Right: on your model and two others, both ranks' gradients equal one device's, with "
        "one activation sent forward and one gradient sent back. That hand-over, a leaf that "
        "wants a gradient on one side and `backward(out, grad)` on the other, is every "
        "pipeline's stage boundary."
    )
