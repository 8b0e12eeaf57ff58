"""The lesson 08 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import pytest
from checkskit import STUDENTS

from course_utils.checks import NotAnswered, Variant
from course_utils.checks import l08 as check


def shard(flat, workers, rank):
    size = -(-len(flat) // workers)
    padded = list(flat) + [0.0] * (size * workers - len(flat))
    return padded[rank * size : (rank + 1) * size]


def shard_tensor(flat, workers, rank):  # torch's way: pad, then chunk (a tensor is fine)
    import torch

    t = torch.tensor(flat)
    size = -(-len(flat) // workers)
    t = torch.nn.functional.pad(t, (0, size * workers - len(flat)))
    return t[rank * size : (rank + 1) * size]


def no_padding(flat, workers, rank):
    size = -(-len(flat) // workers)
    return flat[rank * size : (rank + 1) * size]


def floor_size(flat, workers, rank):
    size = len(flat) // workers
    return flat[rank * size : (rank + 1) * size]


def round_robin(flat, workers, rank):
    return flat[rank::workers]


def letters(names, variant=check.DEFAULT):
    table = check.given_3(variant)
    return [next(k for k, t in table.items() if t == check.EVENTS[n]) for n in names]


PSI, N = 1.5e9, 8
RIGHT = {
    1: (8 * PSI + 8 * PSI / N, 4 * PSI + 12 * PSI / N, 16 * PSI / N),
    2: (shard,),
    3: (letters(check.ORDER),),
    4: (2, 96_000_000),
    5: (0.375, "a", check.their_timeline().makespan / check.their_timeline(prefetch=1).makespan),
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
    (2, (no_padding,), "last shard is short"),
    (2, (floor_size,), "Round up"),
    (2, (round_robin,), "round-robin"),
    (2, (lambda flat, w, r: [0.0] * 99,), "ceil"),
    (2, (lambda flat, w, r: 5,), "should be a list"),
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
    (4, (3, 128_000_000), "Count that one too"),
    (4, (1, 64_000_000), "a deeper one does too"),
    (4, (4, 136_000_000), "over the limit"),
    (4, (9, 1), "depth from 0"),
    (4, (2, 24_000_000), "counts shards"),
    (4, (2, 44_000_000), "smallest layers"),
    (4, (2, 50_000_000), "k + 1 largest"),
    (5, (0.625, "a", RIGHT[5][2]), "spent computing"),
    (5, (1.5, "a", RIGHT[5][2]), "a number between 0 and 1"),
    (5, (0.5, "a", RIGHT[5][2]), "(makespan - compute time) / makespan"),
    (5, (37.5, "a", RIGHT[5][2]), "percentage"),
    (5, (0.375, "b", RIGHT[5][2]), "(N-1)/N"),
    (5, (0.375, "c", RIGHT[5][2]), "cannot be reduce-scattered earlier"),
    (5, (0.375, "d", RIGHT[5][2]), "dilutes"),
    (5, (0.375, "a", 1 / RIGHT[5][2]), "upside down"),
    (5, (0.375, "a", 2.0), "prefetch=1"),
    (2, (lambda flat, w, r: list(reversed(shard(flat, w, r))),), "; it should be"),
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
]


def test_the_default_numbers_are_the_lessons():
    assert check.given_1() == {"params": 1.5e9, "N": 8}
    assert RIGHT[5][2] == pytest.approx(1.3913, rel=1e-3)


def test_other_right_answers_pass(capsys):
    check.exercise_2(shard_tensor)
    alternative = letters(
        ["gather", "forward", "free", "gather", "backward", "free", "reduce", "adam"]
    )
    check.exercise_3(alternative)
    assert capsys.readouterr().out.count("✅") == 2


def test_a_stub_and_a_half_filled_order_are_not_answered():
    def stub(flat, workers, rank):
        raise NotImplementedError()

    with pytest.raises(NotAnswered):
        check.exercise_2(stub)
    with pytest.raises(NotAnswered):
        check.exercise_3(["a", None])


def test_build_cases_are_plain_data_and_fixed_by_the_cases_seed():
    a = check.cases_2(Variant("s7", cases_seed=3))
    assert a == check.cases_2(Variant("s7", cases_seed=3))
    assert a != check.cases_2(Variant("s7", cases_seed=4))
    assert any(len(flat) % w for flat, w, _ in a["shard"])  # padding is needed somewhere
    assert any(len(flat) < w for flat, w, _ in a["shard"])  # and a shard of padding only


def right_for(v: Variant) -> dict:
    """Each exercise's right answer for student v, computed here from their numbers."""
    from course_utils.parallel.fsdp import gathered_bytes_bound

    g1 = check.given_1(v)
    psi, n = g1["params"], g1["N"]
    g4 = check.given_4(v)
    fits = [
        k
        for k in range(len(g4["layer_numels"]))
        if gathered_bytes_bound(g4["layer_numels"], g4["N"], k, 4) <= g4["limit_bytes"]
    ]
    theirs, fixed = check.their_timeline(v), check.their_timeline(v, prefetch=1)
    return {
        1: (8 * psi + 8 * psi / n, 4 * psi + 12 * psi / n, 16 * psi / n),
        3: (letters(check.ORDER, v),),
        4: (max(fits), gathered_bytes_bound(g4["layer_numels"], g4["N"], max(fits), 4)),
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
        assert 1 <= answers[4][0] < len(check.given_4(v)["layer_numels"]) - 1  # a real choice
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
