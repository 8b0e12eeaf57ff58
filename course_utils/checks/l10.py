"""Checks for lesson 10's exercises (mixture of experts and expert parallelism).

Every expected answer is computed with `course_utils.parallel.moe` (capacity, the simulator,
parameter counts) or plain arithmetic. Conventions shared with the lesson: capacity =
ceil(capacity_factor x tokens x k / E) (Switch Transformer, Fedus et al. 2021, arXiv
2101.03961, eq. 3, rounded up); slots are filled first come, first served in token order;
worker w of N holds the contiguous experts w x E/N ... (w+1) x E/N - 1; a token is d_model
numbers, and tokens for an expert on the sender's own worker never leave it.

Exercises 10.2, 10.8 and 10.9 are programs every rank runs, judged in the grader from their
runs against one device (`capacity_build`, `builds`, `bias_build`).
"""

from __future__ import annotations

import math

from course_utils import checks
from course_utils.checks import (
    DEFAULT,
    OTHERWISE,
    Variant,
    bias_build,
    builds,
    exercise,
    fail,
    numbers,
    pick,
    programs,
)
from course_utils.checks.capacity_build import dropping_seed
from course_utils.checks.programs import DispatchCase
from course_utils.checks.rank_cases import CapacityCase

for_student = checks.lesson_checks(__name__)


def _capacity(tokens: int, experts: int, factor: float, k: int) -> int:
    from course_utils.parallel.moe import capacity

    return capacity(tokens, experts, factor, k)


DEFAULT_CHOICES = [0, 2, 0, 1, 0, 3, 0, 2, 1, 0, 0, 3, 2, 0, 1, 0]


def given_1(variant: Variant = DEFAULT) -> dict:
    rng = variant.seeded("1seed")
    factor = variant.pick("1c", 1.0, [1.0, 1.25, 1.5])
    if rng is None:
        return {"experts": 4, "capacity_factor": factor, "choices": list(DEFAULT_CHOICES)}
    tokens = rng.choice([12, 16, 20, 24])
    while True:  # a routing where the capacity binds: at least one token is dropped
        hot = rng.randrange(4)
        choices = [hot if rng.random() < 0.45 else rng.randrange(4) for _ in range(tokens)]
        cap = _capacity(tokens, 4, factor, 1)
        if max(choices.count(e) for e in range(4)) > cap:
            return {"experts": 4, "capacity_factor": factor, "choices": choices}


def _positions(value, what: str) -> list[int]:
    checks.require(value, what)
    if isinstance(value, int | float) and not isinstance(value, bool):
        fail(
            f"`{what}` should list the dropped tokens' positions (a list such as [5, 9]), not "
            "how many there are."
        )
    return sorted(checks.as_sequence(value, what, item=checks.as_int))


@exercise(
    given_1,
    tokens_per_expert=checks.sequence(item=checks.as_int, length=4),  # every variant has 4 experts
    capacity="whole number",
    dropped=_positions,
    capacity_top2="whole number",
    partial=True,
)
def exercise_1(g, tokens_per_expert, capacity, dropped, capacity_top2) -> str:
    """Top-1 routing of T tokens: counts, capacity, which tokens are dropped; top-2 capacity."""
    experts, factor, choices = g.experts, g.capacity_factor, g.choices
    tokens = len(choices)
    counts = [choices.count(e) for e in range(experts)]
    cap, cap2 = _capacity(tokens, experts, factor, 1), _capacity(tokens, experts, factor, 2)
    seen = [choices[: t + 1].count(choices[t]) for t in range(tokens)]  # place in the queue
    want_dropped = [t for t in range(tokens) if seen[t] > cap]
    hints = {
        f"`tokens_per_expert` adds up to {sum(tokens_per_expert)}, but top-1 sends each of the "
        f"{tokens} tokens to exactly one expert: the counts add up to "
        f"{tokens}.": sum(tokens_per_expert) != tokens,
        "`tokens_per_expert` is not right: count how often each expert number 0, 1, 2, 3 "
        "appears in `g.choices` (entry e is expert e's count).": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    fields.judge(tokens_per_expert, counts, "tokens_per_expert", hints)
    exact = factor * tokens / experts
    hints = {
        f"{factor:g} x {tokens} / {experts} = {exact:g}: round up, not down.": math.floor(exact),
        "`capacity` forgets the capacity factor: multiply by it.": math.ceil(tokens / experts)
        if factor != 1
        else None,
        "That is the top-2 capacity (k = 2). This routing is top-1: k = 1.": cap2,
        "`capacity` is not right. It is ceil(capacity_factor x tokens x k / experts), slots "
        "per expert.": OTHERWISE,
    }
    fields.judge(capacity, cap, "capacity", hints)
    hints = {
        "`dropped` counts positions from 1. Positions are counted from 0, like Python's "
        "indices: the first token of `g.choices` is token 0.": [t + 1 for t in want_dropped],
        f"`dropped` lists {len(dropped)} tokens. An expert keeps `capacity` tokens and drops "
        "the rest: how many are left over for each expert?": len(dropped) != len(want_dropped),
        "`dropped` has the right number of tokens, but not the right ones. Slots go first "
        "come, first served in token order: an expert's first `capacity` tokens keep "
        "theirs.": OTHERWISE,
    }
    fields.judge(dropped, want_dropped, "dropped", hints)
    hints = {
        "With top-2 every token makes two assignments, so there are k x tokens assignments to "
        "share: the capacity has the factor k = 2 in it.": cap,
        "`capacity_top2` is not right: ceil(capacity_factor x tokens x k / experts), k = "
        "2.": OTHERWISE,
    }
    fields.judge(capacity_top2, cap2, "capacity_top2", hints)
    fields.verdict()
    return (
        f"Right: counts {counts}, {cap} slots per expert, tokens {want_dropped} dropped (their "
        f"residual carries them through unchanged); top-2 doubles the slots to {cap2}."
    )


given_2 = numbers(
    N=pick("2n", 2, [2, 3]),
    experts=lambda g: 2 * g.N,  # two experts per rank: the chunk is per rank, not per expert
    d_model=pick("2d", 8, [4, 6, 8]),
    tokens=pick("2t", 8, [6, 8, 10]),
    percent=pick("2c", 100, [100, 125]),
    seed=lambda g: dropping_seed(g.N, g.experts, g.d_model, g.tokens, g.percent, 10 * g.tokens),
)


def cases_2(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own layer, then two more drawn afresh in the grader."""
    g, rng = given_2(variant), variant.cases("2")
    cases = [CapacityCase(g.N, g.experts, g.d_model, g.tokens, g.percent, g.seed)]
    for n, per in ((rng.choice([2, 4]), 2), (3, rng.choice([1, 2]))):
        d, tokens = rng.choice([4, 6, 8]), rng.choice([5, 6, 8])
        percent = rng.choice([100, 125, 150])
        seed = dropping_seed(n, n * per, d, tokens, percent, rng.randint(1, 10**6))
        cases.append(CapacityCase(n, n * per, d, tokens, percent, seed))
    return {"capacity_dispatch": [(case,) for case in cases]}


@exercise(given_2, capacity_dispatch=programs.as_program, points=3, partial=True)
def exercise_2(capacity_dispatch, variant) -> str:
    """Build the dispatch with capacity: drop, split by rank, send, return in token order."""
    from course_utils.checks.capacity_build import capacity_dispatch as judged

    return judged(capacity_dispatch, cases_2(variant)["capacity_dispatch"])


DEFAULT_ROUTED_3 = [[120, 40, 70, 26], [60, 90, 30, 76]]


def given_3(variant: Variant = DEFAULT) -> dict:
    rng = variant.seeded("3seed")
    d_model = variant.pick("3d", 1024, [512, 768, 1024, 2048, 4096])
    routed = (
        [list(r) for r in DEFAULT_ROUTED_3]
        if rng is None
        else [[rng.randint(10, 140) for _ in range(4)] for _ in range(2)]
    )
    return {"routed": routed, "d_model": d_model, "element_size": 2}


NUMBERS = checks.sequence(item=checks.as_number, length=2)


@exercise(given_3, dispatch_sent=NUMBERS, combine_sent=NUMBERS, step_sent_0="number", partial=True)
def exercise_3(g, dispatch_sent, combine_sent, step_sent_0) -> str:
    """Bytes each of 2 workers sends in the dispatch and the combine; worker 0 per step."""
    from course_utils.parallel.moe import all_to_all_bytes_per_worker

    args = (g.routed, g.d_model, 2, g.element_size)
    dispatch, combine = (
        all_to_all_bytes_per_worker(*args, phase=p) for p in ("dispatch", "combine")
    )
    per_token = g.d_model * g.element_size
    doubled, halved, tokens = ([x / f for x in dispatch] for f in (0.5, 2, per_token))
    every = [sum(row) * per_token for row in g.routed]
    hints = {
        "`dispatch_sent` counts every routed token, but tokens for the worker's own experts "
        "stay home. Worker 0 holds experts 0 and 1, worker 1 experts 2 and 3.": every,
        "`dispatch_sent` looks like 4-byte numbers: bf16 is 2 bytes per number.": doubled,
        "`dispatch_sent` looks like 1 byte per number: bf16 is 2 bytes per number.": halved,
        "`dispatch_sent` counts tokens: give bytes (d_model x element_size per token).": tokens,
        "`dispatch_sent` is not right. Worker w sends the tokens it routed to the other "
        "worker's experts, each d_model x element_size bytes.": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    fields.judge(dispatch_sent, dispatch, "dispatch_sent", hints)
    hints = {
        "`combine_sent` equals the dispatch, but the combine goes the other way: each "
        "expert's outputs return to the tokens' owners, so a worker sends back what it "
        "received.": dispatch if dispatch != combine else None,
        "`combine_sent` is not right: in the combine, worker w returns the outputs of the "
        "tokens it received in the dispatch (one d_model vector per token).": OTHERWISE,
    }
    fields.judge(combine_sent, combine, "combine_sent", hints)
    want = 2 * (dispatch[0] + combine[0])
    both = (2, "counts both directions (sent and received); give only what worker 0 sends.")
    hints = {
        "`step_sent_0` counts the forward only. The backward sends gradients back along both "
        "all-to-alls: output gradients to the experts' workers, input gradients back to the "
        "tokens' owners.": dispatch[0] + combine[0],
        "`step_sent_0` is not right: one training step has four all-to-alls (dispatch, "
        "combine, and the two in reverse in the backward).": OTHERWISE,
    }
    fields.judge(step_sent_0, want, "step_sent_0", hints, unit="bytes", slips=[both])
    fields.verdict()
    return (
        f"Right: the dispatch sends {dispatch} bytes, the combine {combine}; worker 0 sends "
        f"{want:,} bytes per step, and the backward doubles the forward's traffic."
    )


# The letters as the exercise lists them, and the order they happen in on one worker.
EVENTS = {
    "a": "the local experts' backward",
    "b": "dispatch all-to-all: each token to the worker of its expert",
    "c": "all-reduce the router and norm gradients over the workers",
    "d": "weighted sum of the expert outputs, plus the residual",
    "e": "route: norm, router, top-k choice, capacity",
    "f": "all-to-all of the output gradients to the experts' workers",
    "g": "combine all-to-all: expert outputs back to the tokens' workers",
    "h": "backward through the norm to the block's input x",
    "i": "the local experts' forward",
    "j": "all-to-all of the input gradients back to the tokens' workers",
}
ORDER = ["e", "b", "i", "g", "d", "f", "a", "j", "h", "c"]


# Why an event cannot come before the events that precede it in ORDER (what it waits for),
# in words that do not name the event that comes next.
TOO_EARLY = {
    "b": "the dispatch can only send tokens once the router has chosen their experts",
    "i": "an expert can only compute tokens that the dispatch has delivered to its worker",
    "g": "the combine returns the experts' outputs, so the experts must have run",
    "d": "the weighted sum needs every expert output back on the token's own worker",
    "f": "the output gradients exist only once the forward has ended, weighted sum included",
    "a": "an expert's backward needs the gradient of its outputs on the expert's worker",
    "j": "the input gradients come out of the experts' backward, which must run first",
    "h": "the gradient through the norm needs every expert's input gradient back on the "
    "token's worker",
    "c": "the router and norm gradients are complete only when every backward is done",
}


@exercise(
    order=checks.sequence(item=lambda x, what: checks.as_choice(x, list(EVENTS), what), length=10)
)
def exercise_4(order) -> str:
    """The ten events of one expert-parallel training step, in order."""
    got = order
    if sorted(got) != sorted(ORDER):
        missing = sorted(set(ORDER) - set(got))
        fail(f"`order` must use each letter once; missing: {', '.join(missing)}.")
    for i, (mine, right) in enumerate(zip(got, ORDER, strict=True)):
        if mine != right:
            # Say why the learner's event cannot come yet, never which one comes instead.
            fail(
                f"The first {i} event(s) are in the right order; position {i + 1} is not "
                f"{mine!r}: {TOO_EARLY[mine]}. Which of the events left can happen now?"
            )
    return (
        "Right: route, dispatch, experts, combine, weighted sum; then the same two "
        "all-to-alls in reverse carry the gradients, and the replicated router and norm "
        "gradients are all-reduced last."
    )


DEFAULT_ROUTED_5 = [[10, 14, 12, 60], [11, 13, 9, 63]]


def given_5(variant: Variant = DEFAULT) -> dict:
    rng = variant.seeded("5seed")
    if rng is None:
        return {"routed": [list(r) for r in DEFAULT_ROUTED_5]}
    hot = rng.randrange(4)
    routed = [
        [rng.randint(45, 70) if e == hot else rng.randint(6, 16) for e in range(4)]
        for _ in range(2)
    ]
    return {"routed": routed}


def straggler_timeline(variant: Variant = DEFAULT):
    """The simulated step Exercise 10.5 draws: 4 experts on 2 workers, unit costs."""
    from course_utils.parallel.moe import simulate_moe

    return simulate_moe(given_5(variant)["routed"], 2)


@exercise(
    given_5,
    straggler="whole number",
    hot_expert="whole number",
    waiting_share="number",
    fix={
        "a": checks.RIGHT,
        "b": "A larger capacity factor lets the hot expert keep even more tokens: the "
        "straggler gets no faster (capacity only caps it by dropping tokens).",
        "c": "The links are free in this simulation, and the waiting is for compute: a "
        "faster network would not shorten it.",
        "d": "Micro-batches shrink a pipeline's bubble; here one worker simply has more "
        "tokens to compute in every micro-batch.",
    },
    partial=True,
)
def exercise_5(g, straggler, hot_expert, waiting_share, fix, variant) -> str:
    """Read a simulated expert-parallel step: straggler, hot expert, waiting share, the fix."""
    timeline = straggler_timeline(variant)
    per_expert = [sum(col) for col in zip(*g.routed, strict=True)]
    hot = per_expert.index(max(per_expert))
    busy = timeline.busy_per_device()
    slow = busy.index(max(busy))
    fast = 1 - slow
    waiting = sum(e.duration for e in timeline.device_events(fast) if not e.action.is_compute)
    waiting /= timeline.makespan
    hints = {
        "`straggler` is a worker number: 0 or 1.": straggler not in (0, 1),
        "`straggler` is not the worker everybody waits for. In the chart, whose expert bars "
        "are longest? The other worker's row shows the waiting hatch meanwhile.": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    fields.judge(straggler, slow, "straggler", hints)
    hints = {
        "`hot_expert` is an expert number: 0, 1, 2 or 3.": hot_expert not in range(4),
        "That expert is on the straggler, but it is not the one with the most tokens: add up "
        "`g.routed` over both workers, expert by expert.": hot_expert // 2 == slow,
        "`hot_expert` is on the worker that waits. Which worker's bars are longest?": OTHERWISE,
    }
    fields.judge(hot_expert, hot, "hot_expert", hints)
    hints = {
        f"That is worker {fast}'s busy share. The question asks for its waiting "
        "share.": timeline.busy(fast) / timeline.makespan,
        f"`waiting_share` is not right. Add up worker {fast}'s communication bars (all-to-alls "
        "and all-reduce: with free links they are pure waiting) and divide by the makespan; "
        "`timeline.device_events(w)` lists them.": OTHERWISE,
    }
    fields.judge(waiting_share, waiting, "waiting_share", hints, unit="fraction")
    fields.verdict()
    return (
        f"Right: expert {hot} got {max(per_expert)} of {sum(per_expert)} tokens, so worker "
        f"{slow} computes longest and worker {fast} waits {waiting:.1%} of the step. The "
        "balancing loss spreads the tokens, and the wait shrinks."
    )


BYTES_PER_PARAM = 16  # mixed-precision Adam: 2 + 2 + 12 (ZeRO, arXiv 1910.02054)


CHOICES_6 = {
    "layers": [16, 24, 32, 40],
    "d_model": [2048, 3072, 4096],
    "hidden": [8192, 11008, 14336],
    "experts": [8, 16, 32],
    "gpus": [32, 64, 128],
    "tp": [1, 2, 4],
    "budget_gb": [40, 64, 80],
}


def given_6(variant: Variant = DEFAULT) -> dict:
    rng = variant.seeded("6seed")
    if rng is None:
        return dict(layers=32, d_model=4096, hidden=14336, experts=8, gpus=64, tp=2, budget_gb=80)
    while True:  # a real choice: ep > 1 is needed, and each expert is still replicated dp / ep > 1
        g = {name: rng.choice(options) for name, options in CHOICES_6.items()}
        best = _plan(g)
        if best is not None and best[0] > 1 and best[2] > 1:
            return g


def _gb_per_gpu(g: dict, ep: int) -> float:
    from course_utils.parallel.moe import expert_params

    moe = expert_params(g["d_model"], g["hidden"], g["experts"], ep)
    attention = 4 * g["d_model"] ** 2
    per_layer = attention + moe["per_worker"]
    return g["layers"] * per_layer * BYTES_PER_PARAM / g["tp"] / 1e9


def _valid_ep(g: dict) -> list[int]:
    dp = g["gpus"] // g["tp"]
    return [ep for ep in range(1, g["experts"] + 1) if g["experts"] % ep == 0 and dp % ep == 0]


def _plan(g: dict) -> tuple[int, float, int] | None:
    """(smallest ep that fits, GB per GPU there, expert data-parallel degree dp / ep)."""
    dp = g["gpus"] // g["tp"]
    for ep in _valid_ep(g):
        gb = _gb_per_gpu(g, ep)
        if gb <= g["budget_gb"]:
            return ep, gb, dp // ep
    return None


@exercise(given_6, ep="whole number", gb_per_gpu="number", expert_dp="whole number", partial=True)
def exercise_6(g, ep, gb_per_gpu, expert_dp) -> str:
    """Smallest ep whose model state fits, its GB per GPU, and each expert's dp degree."""
    want_ep, want_gb, want_edp = _plan(g) or (0, 0.0, 0)  # given_6 draws budgets some ep fits
    mine = ep if ep in _valid_ep(g) else want_ep  # the learner's ep, where it is one
    gb = _gb_per_gpu(g, mine)
    hints = {
        f"`ep` = {ep} does not work: ep must divide the {g.experts} experts (each worker holds "
        f"E/ep whole experts) and the data-parallel degree dp = gpus / tp = {g.gpus // g.tp} "
        "(the expert-parallel groups are cut out of the data-parallel ones).": ep != mine,
        f"With ep = {ep} each GPU holds {gb:.1f} GB of model state, more than the "
        f"{g.budget_gb} GB budget: spread the experts further.": gb > g.budget_gb,
        f"`ep` = {ep} fits, but a smaller ep fits too. The question asks for the smallest: every "
        "extra expert-parallel rank sends a larger share of the tokens away.": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    fields.judge(ep, want_ep, "ep", hints)
    no_attn = want_gb - g.layers * 4 * g.d_model**2 * BYTES_PER_PARAM / g.tp / 1e9
    all_experts = _gb_per_gpu(g, 1) if ep != 1 else None
    hints = {
        "`gb_per_gpu` forgets tensor parallelism: tp splits every weight tp ways.": want_gb * g.tp,
        "`gb_per_gpu` keeps all the experts on every GPU: each holds E/ep of them.": all_experts,
        "`gb_per_gpu` leaves out the attention (4 x d_model^2 per layer, replicated).": no_attn,
        "`gb_per_gpu` is the state at your `ep`, which is not the smallest that fits: it "
        "comes right with it.": _gb_per_gpu(g, mine) if mine != want_ep else None,
        "`gb_per_gpu` is not right: layers x (attention + router and norm + E/ep experts) "
        "parameters, x 16 bytes, / tp, in GB (10^9 bytes).": OTHERWISE,
    }
    fields.judge(gb_per_gpu, want_gb, "gb_per_gpu", hints, unit="GB")
    hints = {
        f"`expert_dp` = {expert_dp} is gpus / ep: it counts every GPU that holds a piece of the "
        f"expert, tp = {g.tp} of them per copy. The expert's data-parallel degree counts its "
        "copies, the GPUs that hold the same shard: dp / ep, with dp = gpus / "
        "tp.": g.gpus // mine if g.tp > 1 else None,
        "`expert_dp` is the number of experts on each GPU, E / ep. The question asks how many "
        "GPUs hold the same expert shard: dp / ep.": g.experts // mine,
        "`expert_dp` is not right: how many GPUs hold the same expert shard? The dp replicas "
        "are cut into groups of ep.": OTHERWISE,
    }
    fields.judge(expert_dp, want_edp, "expert_dp", hints)
    fields.verdict()
    return (
        f"Right: ep = {want_ep} puts {g.experts // want_ep} experts on each GPU, {want_gb:.1f} "
        f"GB of model state, and every expert is replicated on {want_edp} GPUs whose gradients "
        "it all-reduces."
    )


DEFAULT_SCORES_7 = [
    [0.62, 0.18, 0.12, 0.08],
    [0.55, 0.25, 0.05, 0.15],
    [0.48, 0.12, 0.30, 0.10],
    [0.41, 0.09, 0.17, 0.33],
    [0.70, 0.10, 0.10, 0.10],
    [0.36, 0.33, 0.16, 0.15],
    [0.22, 0.45, 0.21, 0.12],
    [0.30, 0.12, 0.20, 0.38],
]


def given_7(variant: Variant = DEFAULT) -> dict:
    rng = variant.seeded("7seed")
    options = [[-0.15, 0.0, 0.05, 0.1], [-0.1, 0.1, 0.0, 0.0]]
    bias = variant.pick("7b", [-0.1, 0.05, 0.0, 0.05], options)
    gamma = variant.pick("7g", 0.02, [0.01, 0.05])
    if rng is None:
        return {"scores": [list(r) for r in DEFAULT_SCORES_7], "bias": bias, "gamma": gamma}
    while True:  # a favoured expert 0, no ties after the bias, a load above and below the mean
        scores = []
        for _ in range(8):
            raw = [rng.uniform(0.3, 0.7)] + [rng.uniform(0.05, 0.4) for _ in range(3)]
            total = sum(raw)
            scores.append([round(x / total, 2) for x in raw])
        biased = [[s + b for s, b in zip(row, bias, strict=True)] for row in scores]
        gaps = [sorted(row)[-1] - sorted(row)[-2] for row in biased]
        load = _load_7(scores, bias)
        if min(gaps) > 0.005 and max(load) > 2 and min(load) < 2:
            return {"scores": scores, "bias": bias, "gamma": gamma}


def _choice_7(scores, bias) -> list[int]:
    return [max(range(len(row)), key=lambda e: row[e] + bias[e]) for row in scores]


def _load_7(scores, bias) -> list[int]:
    chosen = _choice_7(scores, bias)
    return [chosen.count(e) for e in range(len(bias))]


def _new_bias_7(load, bias, gamma) -> list[float]:
    mean = sum(load) / len(load)
    return [
        b - gamma if n > mean else b + gamma if n < mean else b
        for n, b in zip(load, bias, strict=True)
    ]


@exercise(  # every variant routes 8 tokens to 4 experts
    given_7,
    chosen=checks.sequence(item=checks.as_int, length=8),
    gates=checks.sequence(item=checks.as_number, length=8),
    new_bias=checks.sequence(item=checks.as_number, length=4),
    partial=True,
)
def exercise_7(g, chosen, gates, new_bias) -> str:
    """DeepSeek-V3's bias balancing, one step by hand: the choice, the gates, the new bias."""
    scores, bias, gamma = g.scores, g.bias, g.gamma
    tokens, experts = len(scores), len(bias)
    want = _choice_7(scores, bias)
    hints = {
        "`chosen` follows the scores alone. The bias is added to each expert's score to "
        "choose: pick the largest score + bias.": _choice_7(scores, [0.0] * experts),
        "`chosen` numbers the experts from 1; they are numbered 0 to 3.": [e + 1 for e in want],
        "`chosen` is not right: for each token, the expert with the largest score + "
        "bias.": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    fields.judge(chosen, want, "chosen", hints)
    biased = [scores[t][e] + bias[e] for t, e in enumerate(want)]
    hints = {
        "`gates` adds the bias. The bias only steers the choice; the gate that weighs the "
        "expert's output is the score itself.": biased,
        "`gates` are all 1, as if renormalised over the one expert chosen. DeepSeek-V3 "
        "renormalises only its sigmoid scores; these are softmax probabilities, and with top-1 "
        "the gate is the chosen expert's score itself.": [1.0] * tokens,
        "`gates` is not right: each token's score for the expert it was sent to.": OTHERWISE,
    }
    fields.judge(gates, [scores[t][e] for t, e in enumerate(want)], "gates", hints)
    load, mean = _load_7(scores, bias), tokens / experts
    want_bias = _new_bias_7(load, bias, gamma)
    backwards = [2 * b - w for b, w in zip(bias, want_bias, strict=True)]
    proportional = [b - gamma * (n - mean) for n, b in zip(load, bias, strict=True)]
    hints = {
        "`new_bias` moves the wrong way: an expert that got more than its share must become "
        "LESS attractive, so its bias goes down by gamma.": backwards,
        "`new_bias` moves each bias in proportion to its excess load. The update moves by a "
        "fixed gamma, down or up: only the sign of the excess counts.": proportional,
        "`new_bias` is not right: count each expert's tokens; b - gamma where that is more than "
        f"the mean ({mean:g}), b + gamma where less, unchanged where equal.": OTHERWISE,
    }
    fields.judge(new_bias, want_bias, "new_bias", hints)
    fields.verdict()
    return (
        f"Right: loads {load} against a mean of {mean:g}, so the biases become "
        f"{[round(b, 3) for b in want_bias]}. The busy experts get slightly less attractive, "
        "step after step, without any gradient on the router."
    )


# --------------------------------------------------------------------------- 10.8: the program


given_8 = numbers(
    N=pick("8n", 2, [2, 3, 4]),
    per=pick("8p", 2, [1, 2]),
    experts=lambda g: g.N * g.per,
    top_k=pick("8k", 2, [1, 2]),
    d_model=pick("8d", 8, [4, 8, 16]),
    tokens=pick("8t", 6, [5, 6, 8]),
)


def cases_8(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own layer (their numbers), then two more: in the notebook fixed by their
    name, in the grader drawn afresh (other ranks, experts, k, widths and seeds)."""
    g, rng = given_8(variant), variant.cases("8")
    cases = [DispatchCase(g.N, g.experts, g.top_k, g.d_model, g.tokens, seed=10)]
    for top_k in (1, 2):
        n = rng.choice([2, 3, 4])
        experts = n * rng.choice([1, 2])
        d, tokens = rng.choice([4, 6, 8]), rng.choice([3, 5, 8])
        cases.append(DispatchCase(n, experts, top_k, d, tokens, rng.randint(1, 10**6)))
    return {"moe_layer": [(case,) for case in cases]}


@exercise(given_8, moe_layer=programs.as_program, points=3, partial=True)
def exercise_8(moe_layer, variant) -> str:
    """Build the expert-parallel MoE layer's dispatch and combine; judged on what the run did."""
    return builds.moe_layer(moe_layer, cases_8(variant)["moe_layer"])


# --------------------------------------------------------------------------- 10.9: the program
given_9 = bias_build.given


def cases_9(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    return bias_build.cases(variant)


@exercise(given_9, balance=programs.as_program, points=3, partial=True)
def exercise_9(balance, variant) -> str:
    """Build the bias update on every rank: the whole batch's load, the same bias on all."""
    return bias_build.judged(balance, cases_9(variant)["balance"])
