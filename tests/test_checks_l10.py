"""The lesson 10 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import re

import biasprograms as bias
import buildprograms as programs
import capacityprograms as capacity
import pytest
from checkskit import STUDENTS, fails_with_its_own_hint

from course_utils.checks import CheckFailed, Variant
from course_utils.checks import l10 as check


def dispatch_bytes(routed, d_model, element_size):
    workers, experts = len(routed), len(routed[0])
    per = experts // workers
    return [
        [
            0 if s == d else sum(routed[s][d * per : (d + 1) * per]) * d_model * element_size
            for d in range(workers)
        ]
        for s in range(workers)
    ]


def waiting_share(v=check.DEFAULT):
    tl = check.straggler_timeline(v)
    busy = tl.busy_per_device()
    fast = busy.index(min(busy))
    return sum(e.duration for e in tl.device_events(fast) if not e.action.is_compute) / tl.makespan


TOKEN = 1024 * 2  # d_model x bf16 bytes
DISPATCH = [96 * TOKEN, 150 * TOKEN]
COMBINE = [150 * TOKEN, 96 * TOKEN]
STEP_0 = 2 * (DISPATCH[0] + COMBINE[0])
GB = 77.32933632


def _capacity_variant():
    """A student whose capacity C x T / E is a fraction whose floor is not ceil(T / E), so
    rounding down and forgetting C are different slips (the default's C x T / E is whole)."""
    for k in range(200):
        v = Variant(f"student{k}")
        g = check.given_1(v)
        tokens, exact = len(g["choices"]), g["capacity_factor"] * len(g["choices"]) / 4
        if exact != int(exact) and int(exact) != -(-tokens // 4):
            return v, tokens, exact
    raise AssertionError("no student with a fractional capacity")


CAP_V, CAP_T, CAP_EXACT = _capacity_variant()
CAP_COUNTS = [check.given_1(CAP_V)["choices"].count(e) for e in range(4)]


def _swap_before(letter):
    """ORDER with `letter` moved one place earlier: it comes too early."""
    order = list(check.ORDER)
    k = order.index(letter)
    order[k - 1], order[k] = order[k], order[k - 1]
    return order


TOP_1 = Variant("s7", cases_seed=1)  # 3 ranks of 2 experts, top-1
RIGHT = {
    1: ([8, 3, 3, 2], 4, [9, 10, 13, 15], 8),
    2: (capacity.capacity_dispatch,),
    3: (DISPATCH, COMBINE, STEP_0),
    4: (check.ORDER,),
    5: (1, 3, waiting_share(), "a"),
    6: (4, GB, 8),
    7: (
        [0, 0, 0, 3, 0, 1, 1, 3],
        [0.62, 0.55, 0.48, 0.33, 0.70, 0.33, 0.45, 0.38],
        [-0.12, 0.05, 0.02, 0.05],
    ),
    8: (programs.moe_layer,),
    9: (bias.balance,),
}
_C7, _G7, _B7 = RIGHT[7]

W = waiting_share()

WRONG = [  # (exercise, arguments, words the hint must contain)
    (1, ([8, 3, 3, 3], 4, [9, 10, 13, 15], 8), "add up to 16"),
    (1, ([3, 8, 3, 2], 4, [9, 10, 13, 15], 8), "count how often"),
    (1, ([8, 3, 3, 2], 8, [9, 10, 13, 15], 8), "top-2 capacity"),
    (1, ([8, 3, 3, 2], 5, [9, 10, 13, 15], 8), "ceil(capacity_factor"),
    (1, ([8, 3, 3, 2], 4, 4, 8), "not how many"),
    (1, ([8, 3, 3, 2], 4, [0, 2, 4, 6], 8), "first come"),
    (1, ([8, 3, 3, 2], 4, [9, 10, 13], 8), "lists 3 tokens"),
    (1, ([8, 3, 3, 2], 4, [9, 10, 13, 15], 4), "k x tokens"),
    (1, ([8, 3, 3, 2], 4, [9, 10, 13, 15], 9), "k = 2"),
    (1, ([8, 3, 3], 4, [9, 10, 13, 15], 8), "should have 4 items"),
    (3, ([256 * TOKEN, 256 * TOKEN], COMBINE, STEP_0), "stay home"),
    (3, ([2 * x for x in DISPATCH], COMBINE, STEP_0), "bf16 is 2 bytes"),
    (3, ([96, 150], COMBINE, STEP_0), "counts tokens"),
    (3, (DISPATCH, DISPATCH, STEP_0), "the other way"),
    (3, (DISPATCH, [1, 2], STEP_0), "received in the dispatch"),
    (3, (DISPATCH, COMBINE, STEP_0 // 2), "forward only"),
    (3, (DISPATCH, COMBINE, 2 * STEP_0), "both directions"),
    (3, (DISPATCH, COMBINE, STEP_0 / 1e9), "GB; give bytes"),
    (3, (DISPATCH, COMBINE, 1_000_000), "3 significant figures"),
    (3, (DISPATCH, COMBINE, 5), "four all-to-alls"),
    (4, (["b", "e", "i", "g", "d", "f", "a", "j", "h", "c"],), "position 1 is not 'b'"),
    (4, (["e", "b", "i", "g", "d", "c", "a", "j", "h", "f"],), "position 6 is not 'c'"),
    (4, (["e", "b", "i", "g", "d", "f", "a", "h", "j", "c"],), "position 8"),
    (4, (["e", "b", "i", "g", "d", "f", "a", "j", "h", "h"],), "missing: c"),
    (4, (["e", "b"],), "should have 10 items"),
    (4, (["e", "b", "i", "g", "d", "f", "a", "j", "h", "z"],), "should be one of"),
    (5, (0, 3, W, "a"), "waiting hatch"),
    (5, (2, 3, W, "a"), "0 or 1"),
    (5, (1, 2, W, "a"), "add up `g.routed`"),
    (5, (1, 0, W, "a"), "worker that waits"),
    (5, (1, 7, W, "a"), "0, 1, 2 or 3"),
    (5, (1, 3, 100 * W, "a"), "percentage"),
    (5, (1, 3, 1 - W, "a"), "busy share"),
    (5, (1, 3, 0.5, "a"), "communication bars"),
    (5, (1, 3, W, "b"), "capacity factor"),
    (5, (1, 3, W, "c"), "faster network"),
    (5, (1, 3, W, "d"), "micro-batch"),
    (6, (3, GB, 8), "must divide"),
    (6, (2, GB, 8), "more than the 80 GB"),
    (6, (8, GB, 8), "smaller ep fits too"),
    (6, (8, 47.3, 8), "the state at your `ep`"),
    (6, (4, 2 * GB, 8), "forgets tensor parallelism"),
    (6, (4, 257.8, 8), "keeps all the experts"),
    (6, (4, GB * 1e9, 8), "bytes; give GB"),
    (6, (4, 77, 8), "3 significant figures"),
    (6, (4, 60.1, 8), "leaves out the attention"),
    (6, (4, 70.0, 8), "layers x (attention"),
    # "on how many GPUs each expert lives" read literally: every GPU with a piece of it
    (6, (4, GB, 16), "counts every GPU that holds a piece of the expert"),
    (6, (4, GB, 4), "groups of ep"),
    (7, ([0, 0, 0, 0, 0, 0, 1, 3], _G7, _B7), "follows the scores alone"),
    (7, ([e + 1 for e in _C7], _G7, _B7), "numbers the experts from 1"),
    (7, ([0] * 8, _G7, _B7), "the largest score + bias"),
    (7, (_C7, [0.52, 0.45, 0.38, 0.38, 0.60, 0.38, 0.50, 0.43], _B7), "adds the bias"),
    (7, (_C7, [1] * 8, _B7), "renormalises only its sigmoid scores"),
    (7, (_C7, [0.5] * 8, _B7), "each token's score for the expert"),
    (7, (_C7, _G7, [-0.08, 0.05, -0.02, 0.05]), "moves the wrong way"),
    (7, (_C7, _G7, [-0.14, 0.05, 0.04, 0.05]), "in proportion to its excess load"),
    (7, (_C7, _G7, [0, 0, 0, 0]), "count each expert's tokens"),
    (1, (CAP_COUNTS, int(CAP_EXACT), [0], 1, CAP_V), "round up, not down"),
    (1, (CAP_COUNTS, -(-CAP_T // 4), [0], 1, CAP_V), "forgets the capacity factor"),
    (1, ([8, 3, 3, 2], 4, [10, 11, 14, 16], 8), "`dropped` counts positions from 1"),
    *((2, (wrong,), words) for wrong, words in capacity.CAPACITY_MISTAKES.items()),
    (2, (capacity.no_capacity,), "apply the capacity before the dispatch"),
    (2, (capacity.dropped_zeroed,), "the residual carries it"),
    (2, (capacity.last_come,), "first come, first served"),
    (2, (capacity.counts_only,), "return their positions"),
    (2, (capacity.returns_y_only,), "not the pair (y, dropped)"),
    (2, (capacity.round_robin,), "dealt out round-robin"),
    (2, (capacity.rank_0_skips,), "An all-to-all completes only when every rank calls it"),
    (3, ([x / 2 for x in DISPATCH], COMBINE, STEP_0), "looks like 1 byte per number"),
    (3, ([1, 2], COMBINE, STEP_0), "`dispatch_sent` is not right. Worker w sends"),
    *[(4, (_swap_before(x),), check.TOO_EARLY[x]) for x in check.TOO_EARLY],
    (6, (4, GB, 2), "the number of experts on each GPU, E / ep"),
    *((8, (wrong,), words) for wrong, words in programs.MOE_MISTAKES.items()),
    (8, (programs.no_residual,), "leaves out the residual"),
    (8, (programs.unsorted_rows, TOP_1), "at other tokens' rows"),
    (8, (programs.first_choice,), "every token went to its first expert only"),
    (8, (programs.no_combine,), "come back in another (the combine)"),
    (8, (programs.broadcast,), "sends all its tokens to every other rank"),
    (8, (programs.round_robin,), "the tokens rank s routes to the experts rank d holds"),
    (8, (programs.unnormed,), "is not the MoE layer's"),
    (8, (programs.returns_nothing_moe,), "returned a NoneType"),
    (8, (programs.rank_0_skips,), "An all-to-all completes only when every rank calls it"),
    (8, ("moe_layer",), "should be a function"),
    *((9, (wrong,), words) for wrong, words in bias.BIAS_MISTAKES.items()),
    (9, (bias.proportional,), "only the sign of the excess counts"),
    (9, (bias.gathers_scores,), "all-reduce them, not the scores"),
    (9, (bias.rank_0_skips,), "every rank shares its counts in the same call"),
    (9, (bias.bias_only,), "not the pair"),
]


# -- 10.2: the dispatch with capacity, a per-rank program -----------------------------------


@pytest.mark.parametrize("wrong", list(capacity.CAPACITY_MISTAKES), ids=lambda f: f.__name__)
def test_10_2_the_three_commonest_mistakes_get_their_own_hint(wrong):
    fails_with_its_own_hint(check.exercise_2, wrong, capacity.CAPACITY_MISTAKES)


def test_10_2_cases_drop_tokens_send_some_and_are_secret_in_the_grader():
    from course_utils.checks.capacity_build import crosses_and_drops

    mine = check.cases_2(Variant("bob"))["capacity_dispatch"]
    assert mine == check.cases_2(Variant("bob"))["capacity_dispatch"]
    g, case = check.given_2(Variant("bob")), mine[0][0]
    assert (case.devices, case.experts, case.tokens, case.seed) == (
        g.N,
        g.experts,
        g.tokens,
        g.seed,
    )
    assert case.experts == 2 * case.devices  # a chunk per rank is not a chunk per expert
    assert all(crosses_and_drops(c) for (c,) in mine)
    secret = check.cases_2(Variant("bob", cases_seed="grader"))["capacity_dispatch"]
    assert secret[0] == mine[0] and secret[1:] != mine[1:]


def test_10_2_the_run_drops_what_one_device_drops_and_sends_only_the_kept_tokens():
    import torch

    from course_utils.checks.builds import byte_matrix
    from course_utils.checks.rank_cases import CapacityCase

    case = CapacityCase(2, 4, 8, 8, 100, check.given_2().seed)
    run = case.run(capacity.capacity_dispatch)
    moe, x = case.build()
    one = moe(x, groups=2)
    assert one.dropped == sum(len(d) for _, d in run.results) > 0
    assert torch.allclose(torch.cat([y for y, _ in run.results]), one.output, atol=1e-6)
    tokens = [[c[1] for c in w.collectives if c[2] == "float32"] for w in run.watches]
    assert [t[0] for t in tokens] == byte_matrix(one.routed, 8, 4)  # only the kept tokens


def right_for(v: Variant) -> dict:
    """Each exercise's right answer for student v, computed from their numbers."""
    g1 = check.given_1(v)
    choices, cap = g1["choices"], check._capacity(len(g1["choices"]), 4, g1["capacity_factor"], 1)
    seen = [choices[: t + 1].count(choices[t]) for t in range(len(choices))]
    one = (
        [choices.count(e) for e in range(4)],
        cap,
        [t for t in range(len(choices)) if seen[t] > cap],
        check._capacity(len(choices), 4, g1["capacity_factor"], 2),
    )
    g3 = check.given_3(v)
    m = dispatch_bytes(g3["routed"], g3["d_model"], g3["element_size"])
    sent, back = [sum(r) for r in m], [sum(c) for c in zip(*m, strict=True)]
    routed5 = check.given_5(v)["routed"]
    per_expert = [sum(c) for c in zip(*routed5, strict=True)]
    hot = per_expert.index(max(per_expert))
    g7 = check.given_7(v)
    chosen7 = check._choice_7(g7["scores"], g7["bias"])
    gates7 = [g7["scores"][t][e] for t, e in enumerate(chosen7)]
    load7 = [chosen7.count(e) for e in range(4)]
    bias7 = [
        b - g7["gamma"] if n > 2 else (b + g7["gamma"] if n < 2 else b)
        for n, b in zip(load7, g7["bias"], strict=True)
    ]
    return {
        1: one,
        3: (sent, back, 2 * (sent[0] + back[0])),
        7: (chosen7, gates7, bias7),
        5: (hot // 2, hot, waiting_share(v), "a"),
        6: check._plan(check.given_6(v)),
        2: (capacity.capacity_dispatch,),  # one program for everybody, on their own layer
        8: (programs.moe_layer,),  # one program for everybody, tried on their own layer
        9: (bias.balance,),
    }


def test_numbers_differ_between_students_and_never_leave_a_question_trivial():
    seen = {k: set() for k in (1, 3, 5, 6)}
    for student in ["default", *STUDENTS, "erin"]:
        v = Variant(student)
        for k in seen:
            seen[k].add(repr(getattr(check, f"given_{k}")(v)))
        answers = right_for(v)
        assert answers[1][2], "10.1 always drops a token"
        ep, _, expert_dp = answers[6]
        assert ep > 1 and expert_dp > 1
        tl = check.straggler_timeline(v)
        busy = tl.busy_per_device()
        assert busy.index(max(busy)) == answers[5][1] // 2  # the hot expert's worker is slow
    assert all(len(s) >= 5 for s in seen.values())


def test_the_straggler_exercise_matches_its_chart():
    tl = check.straggler_timeline()
    assert tl.num_devices == 2 and "m=" not in tl.name
    assert 0 < W < 1
    assert re.search(r"E=4 experts on p=2 workers", tl.name)


def test_10_4_hints_say_why_an_event_is_early_and_never_name_the_next_one():
    for letter in check.TOO_EARLY:
        order = _swap_before(letter)
        with pytest.raises(CheckFailed) as info:
            check.exercise_4(order)
        message = str(info.value)
        position = order.index(letter)
        right = check.ORDER[position]
        assert check.TOO_EARLY[letter] in message
        assert f"{right!r}" not in message and check.EVENTS[right] not in message


# -- 10.8: the expert-parallel MoE layer, a per-rank program ---------------------------------


@pytest.mark.parametrize("wrong", list(programs.MOE_MISTAKES), ids=lambda f: f.__name__)
def test_the_three_commonest_mistakes_get_their_own_hint(wrong):
    fails_with_its_own_hint(check.exercise_8, wrong, programs.MOE_MISTAKES)


def test_the_cases_are_the_learners_in_the_notebook_and_secret_in_the_grader():
    mine = check.cases_8(Variant("bob"))["moe_layer"]
    assert mine == check.cases_8(Variant("bob"))["moe_layer"]  # the same on every run
    g, case = check.given_8(Variant("bob")), mine[0][0]
    assert (case.devices, case.experts, case.top_k, case.d_model) == (
        g.N,
        g.experts,
        g.top_k,
        g.d_model,
    )
    assert {c.top_k for (c,) in mine} == {1, 2}
    secret = check.cases_8(Variant("bob", cases_seed="grader"))["moe_layer"]
    assert secret[0] == mine[0] and secret[1:] != mine[1:]
    assert TOP_1.student == "s7" and check.given_8(TOP_1).top_k == 1


def test_the_byte_matrix_is_read_from_the_run():
    import torch

    from course_utils.checks.builds import byte_matrix
    from course_utils.parallel.moe import MoE
    from course_utils.parallel.moe.rank_program import routed_counts, run_moe_program

    torch.manual_seed(0)
    moe = MoE(8, 16, 4, top_k=2, capacity_factor=None, skew=0.5)
    x = torch.randn(12, 8)
    run = run_moe_program(programs.moe_layer, moe, x, workers=2)
    assert torch.allclose(torch.cat(run.results), moe(x).output, atol=1e-6)
    routed = routed_counts(moe, x, 2)
    dispatch = [w.collectives[0][1] for w in run.watches]
    want = [[0, sum(routed[0][2:]) * 8 * 4], [sum(routed[1][:2]) * 8 * 4, 0]]
    assert dispatch == want == byte_matrix(routed, 8, 4)
    assert [w.collectives[2][1] for w in run.watches] == [list(c) for c in zip(*want, strict=True)]


@pytest.mark.slow  # a busy loop beside the test for a few seconds
def test_the_solution_passes_on_one_core_beside_a_busy_loop(capsys):
    from checkskit import beside_a_busy_loop

    with beside_a_busy_loop():
        check.exercise_8(programs.moe_layer)
    assert capsys.readouterr().out.startswith("✅ Right")


# -- 10.9: the bias update on every rank, a per-rank program --------------------------------


@pytest.mark.parametrize("wrong", list(bias.BIAS_MISTAKES), ids=lambda f: f.__name__)
def test_10_9_the_three_commonest_mistakes_get_their_own_hint(wrong):
    fails_with_its_own_hint(check.exercise_9, wrong, bias.BIAS_MISTAKES)


def test_10_9_every_case_tells_a_local_load_and_a_bias_free_choice_apart():
    from course_utils.checks.bias_build import telling

    for student in ("default", "bob"):
        mine = check.cases_9(Variant(student))["balance"]
        g = check.given_9(Variant(student))
        assert (mine[0][0].devices, mine[0][0].tokens) == (g.N, g.tokens)
        assert all(telling(c) for (c,) in mine)
    secret = check.cases_9(Variant("bob", cases_seed="grader"))["balance"]
    assert secret[0] == mine[0] and secret[1:] != mine[1:]
