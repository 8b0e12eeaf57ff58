"""The lesson 08 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import buildprograms as programs
import prefetchprograms as pp
import pytest
import splitprograms as sp
from checkskit import STUDENTS, fails_with_its_own_hint

from course_utils.checks import CheckFailed, NotAnswered, Variant
from course_utils.checks import l08 as check


def letters(names, variant=check.DEFAULT):
    table = check.given_3(variant)
    return [next(k for k, t in table.items() if t == check.EVENTS[n]) for n in names]


PSI, N = 1.5e9, 8
RIGHT = {
    1: (8 * PSI + 8 * PSI / N, 4 * PSI + 12 * PSI / N, 16 * PSI / N),
    2: (sp.zero,),
    3: (letters(check.ORDER),),
    4: (pp.right,),
    5: (0.375, "a", check.their_timeline().makespan / check.their_timeline(prefetch=1).makespan),
    6: (programs.fsdp_step,),
}

WRONG = [
    (1, (RIGHT[1][0], 2 * PSI + 14 * PSI / N, RIGHT[1][2]), "mixed-precision"),
    # stage 1 in mixed precision is stage 2's fp32 count: the hint names both (issue 23)
    (1, (4 * PSI + 12 * PSI / N, RIGHT[1][1], RIGHT[1][2]), "or stage 1's in the paper's mixed"),
    (1, (RIGHT[1][0], RIGHT[1][2], RIGHT[1][2]), "stage 3's count"),
    (1, (RIGHT[1][1], RIGHT[1][1], RIGHT[1][2]), "stage 2's count"),
    (1, (16 * PSI, RIGHT[1][1], RIGHT[1][2]), "plain data parallelism"),
    (1, (RIGHT[1][0] / 1e9, RIGHT[1][1], RIGHT[1][2]), "GB; give bytes"),
    (1, (RIGHT[1][0], RIGHT[1][1], 4e9), "not right"),
    (2, ("shard",), "should be a function"),
    (
        3,
        (letters(["gather", "forward", "free", "backward", "reduce", "free", "adam"]),),
        "come back",
    ),
    (
        3,
        (letters(["gather", "forward", "free", "gather", "backward", "adam", "reduce", "free"]),),
        "before the gradient",
    ),
    (
        3,
        (letters(["gather", "forward", "gather", "backward", "reduce", "free", "adam"]),),
        "count the uses",
    ),
    (
        3,
        (letters(["forward", "gather", "free", "gather", "backward", "reduce", "free", "adam"]),),
        "what must come first",
    ),
    (3, (["a", "z"],), "should be one of"),
    (4, ("shard",), "should be a function"),
    (4, (pp.waits_at_once,), "no overlap"),
    (5, (0.625, "a", RIGHT[5][2]), "spent computing"),
    (5, (1.5, "a", RIGHT[5][2]), "a number between 0 and 1"),
    (5, (0.5, "a", RIGHT[5][2]), "(makespan - compute time) / makespan"),
    (5, (37.5, "a", RIGHT[5][2]), "percentage"),
    (5, (0.375, "b", RIGHT[5][2]), "(N-1)/N"),
    (5, (0.375, "c", RIGHT[5][2]), "cannot be reduce-scattered earlier"),
    (5, (0.375, "d", RIGHT[5][2]), "dilutes"),
    (5, (0.375, "a", 1 / RIGHT[5][2]), "upside down"),
    (5, (0.375, "a", 2.0), "prefetch=1"),
    (
        3,
        (letters(["gather", "forward", "free", "gather", "reduce", "backward", "free", "adam"]),),
        "only exists after the backward",
    ),
    (
        3,
        (letters(["gather", "forward", "gather", "free", "backward", "reduce", "free", "adam"]),),
        "in an order that cannot run",
    ),
    (5, (7.2, "a", RIGHT[5][2]), "`waiting_share` is a time"),
    *((6, (wrong,), words) for wrong, words in programs.FSDP_MISTAKES.items()),
    (6, (programs.not_stored,), "shards are as they were before the step"),
    (6, (programs.own_loss,), "times one device's step"),
    (6, (programs.no_chain,), "the next layer handed back"),
    (6, (programs.spreads_update,), "every layer gathered twice"),
    (6, (programs.rank_0_leaves,), "A collective completes only when every rank calls it"),
    (6, (programs.shard_not_gathered,), "flat must be layer 0's whole flat vector"),
    (6, (programs.shard_not_gathered,), "Compare it with the steps of one layer"),
    (6, (42,), "should be a function"),
]


def test_the_default_numbers_are_the_lessons():
    assert check.given_1() == {"params": 1.5e9, "N": 8}
    assert RIGHT[5][2] == pytest.approx(1.3913, rel=1e-3)


def test_other_right_answers_pass(capsys):
    alternative = letters(
        ["gather", "forward", "free", "gather", "backward", "free", "reduce", "adam"]
    )
    check.exercise_3(alternative)
    assert capsys.readouterr().out.count("✅") == 1


def test_a_half_filled_order_is_not_answered():
    with pytest.raises(NotAnswered):
        check.exercise_3(["a", None])


def test_build_cases_are_plain_data_and_fixed_by_the_cases_seed():
    a = check.cases_2(Variant("s7", cases_seed=3))
    assert a == check.cases_2(Variant("s7", cases_seed=3))
    assert a != check.cases_2(Variant("s7", cases_seed=4))
    for (case,) in a["zero_step"]:  # padding is needed in every case
        assert (27 * case.hidden + 10) % case.devices and case.batch % case.devices == 0


def right_for(v: Variant) -> dict:
    """Each exercise's right answer for student v, computed here from their numbers."""
    g1 = check.given_1(v)
    psi, n = g1["params"], g1["N"]
    theirs, fixed = check.their_timeline(v), check.their_timeline(v, prefetch=1)
    return {
        6: (programs.fsdp_step,),  # one program for everybody, tried on their own model
        2: (sp.zero,),
        1: (8 * psi + 8 * psi / n, 4 * psi + 12 * psi / n, 16 * psi / n),
        3: (letters(check.ORDER, v),),
        4: (pp.right,),  # one program for everybody, tried at their own depth
        5: (
            1 - theirs.busy_per_device()[0] / theirs.makespan,
            "a",
            theirs.makespan / fixed.makespan,
        ),
    }


def test_every_variant_keeps_the_exercises_sensible():
    seen = {k: set() for k in (1, 3, 4, 5)}
    for student in ["default", *STUDENTS, "erin"]:
        v = Variant(student)
        for k in seen:
            seen[k].add(repr(getattr(check, f"given_{k}")(v)))
        answers = right_for(v)
        g4 = check.given_4(v)
        assert 1 <= g4["prefetch"] < g4["depth"]  # prefetch matters, and not every layer
        assert 0 < answers[5][0] < 1 and answers[5][2] > 1.1  # the gathers cost, prefetch helps
    assert all(len(s) >= 3 for s in seen.values())


def test_8_5_can_be_worked_out_from_the_numbers_it_gives():
    # Without prefetch the compute waits for every gather, and each backward gather also
    # waits for the reduce-scatter issued before it on the one communication stream.
    for v in (Variant("default"), Variant("s1"), Variant("alice")):
        g = check.given_5(v)
        layers, f, b = g["layers"], g["forward_ms"], g["backward_ms"]
        gather, rs = g["gather_ms"], g["reduce_scatter_ms"]
        waiting = 2 * layers * gather + layers * rs
        makespan = layers * (f + b) + waiting
        assert check.their_timeline(v).makespan * 1e3 == pytest.approx(makespan)


# -- 8.6: the FSDP step, a per-rank program ------------------------------------------------


def test_another_right_program_passes(capsys):
    check.exercise_6(programs.graph_kept)  # no torch.no_grad(): the gathered copy wants no grad
    assert capsys.readouterr().out.startswith("✅")


@pytest.mark.parametrize("wrong", list(programs.FSDP_MISTAKES), ids=lambda f: f.__name__)
def test_the_three_commonest_mistakes_get_their_own_hint(wrong):
    fails_with_its_own_hint(check.exercise_6, wrong, programs.FSDP_MISTAKES)


def test_the_cases_are_the_learners_in_the_notebook_and_secret_in_the_grader():
    mine = check.cases_6(Variant("alice"))["fsdp_step"]
    assert mine == check.cases_6(Variant("alice"))["fsdp_step"]  # the same on every run
    g = check.given_6(Variant("alice"))
    assert (mine[0][0].devices, mine[0][0].hidden, mine[0][0].depth) == (g.N, g.hidden, g.depth)
    secret = check.cases_6(Variant("alice", cases_seed="grader"))["fsdp_step"]
    assert secret[0] == mine[0] and secret[1:] != mine[1:]


def test_forgetting_to_free_names_the_layers_still_held():
    with pytest.raises(CheckFailed) as info:
        check.exercise_6(programs.keeps_gathered)
    said = str(info.value)
    assert "layer 0's gathered parameters" in said and "layer 1's gathered parameters" in said


def test_memory_is_what_the_program_holds_by_weak_reference():
    from course_utils.models import MLP
    from course_utils.parallel.fsdp import gathered_bytes_bound
    from course_utils.parallel.fsdp.rank_program import run_fsdp_program

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = MLP(16, 24, 10, 2)
    x, y = model.example_batch(6)
    numels = [sum(p.numel() for p in layer.parameters()) for layer in model.layers()]
    right = run_fsdp_program(programs.fsdp_step, model, 3, x, y)
    kept = run_fsdp_program(programs.keeps_gathered, model, 3, x, y)
    shards = right.watches[0].fixed
    largest = gathered_bytes_bound(numels, 3, 0)
    assert right.peak_bytes() == [shards + largest + largest // 3] * 3  # + one gradient shard
    assert kept.peak_bytes()[0] >= shards + gathered_bytes_bound(numels, 3, len(numels) - 1)


@pytest.mark.slow  # a busy loop beside the test for a few seconds
def test_the_solution_passes_on_one_core_beside_a_busy_loop(capsys):
    from checkskit import beside_a_busy_loop

    with beside_a_busy_loop():
        check.exercise_6(programs.fsdp_step)
    assert capsys.readouterr().out.startswith("✅ Right")
