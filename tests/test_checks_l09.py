"""The lesson 09 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import math

import buildprograms as programs
import pytest
import seqprograms
import splitprograms
import torch
import ulyssesprograms
from checkskit import STUDENTS, fails_with_its_own_hint

from course_utils.checks import GIB, NotAnswered, Variant
from course_utils.checks import l09 as check
from course_utils.parallel.context_parallel import attention, causal_work
from course_utils.parallel.sequence_parallel import korthikanti_mlp_block_bytes

RIGHT = {
    1: (seqprograms.sp,),
    2: (programs.ring_attention,),
    3: ([1, 0, 3, 2], 3),
    4: (splitprograms.zigzag,),
    5: (3, 0.75, "a", 8.0 / 4.5),
    6: (4, 16 * (6 * 16384 * 128 + 16384 + 2 * 16384**2) / GIB),
    7: (ulyssesprograms.right,),
    8: (8, 4),
}

WRONG = [
    *((1, (wrong,), words) for wrong, words in seqprograms.MISTAKES.items()),
    *((2, (wrong,), words) for wrong, words in programs.RING_MISTAKES.items()),
    (2, (programs.not_causal,), "attends to every block"),
    (2, (programs.overflows,), "overflows float32"),
    (2, (programs.unnormalised,), "do not add up to 1"),
    (2, (programs.swapped,), "weights of the merge are swapped"),
    (2, (programs.larger_lse,), "larger of the two"),
    (2, (programs.summed_lse,), "multiplies the two sums"),
    (2, (programs.starts_at_zero,), "is not causal attention over the keys of ranks 0 to"),
    (2, (programs.own_block_sent,), "passes on the block in hand"),
    (2, (programs.sent_left,), "goes to the right neighbour"),
    (2, (programs.sends_queries,), "not a K/V block"),
    (2, (programs.sends_last,), "The block in hand at the last step goes nowhere"),
    (2, (programs.waits_first,), "Sends never wait, receives do"),
    (2, (programs.returns_nothing,), "returned a NoneType"),
    (2, ("ring_attention",), "should be a function"),
    (3, ([1, 2, 3, 0], 3), "wrong way"),
    (3, ([0, 3, 2, 1], 3), "Off by one"),
    (3, ([1, 0, 3], 3), "one owner per step"),
    (3, ([1, 1, 3, 2], 3), "exactly once"),
    (3, ([1, 0, 3, 2], 4), "last block is not passed on"),
    (3, ([1, 0, 3, 2], 7), "backward too"),
    (5, (0, 0.75, "a", 16 / 9), "computes least"),
    (5, (2, 0.75, "a", 16 / 9), "not the one computing longest"),
    (5, (3, 0.25, "a", 16 / 9), "share worker 0 computed"),
    (5, (3, 6.0, "a", 16 / 9), "time in ms"),
    (5, (3, 75, "a", 16 / 9), "percentage"),
    (5, (3, 0.75, "b", 16 / 9), "direction"),
    (5, (3, 0.75, "c", 16 / 9), "imbalance"),
    (5, (3, 0.75, "d", 16 / 9), "already hidden"),
    (5, (3, 0.75, "a", 9 / 16), "upside down"),
    (5, (3, 0.75, "a", 1.5), "zigzag=True"),
    (6, (8, 2.0), "smaller one"),
    (6, (2, 32.4), "over the budget"),
    (6, (3, 8.2), "power of 2"),
    (6, (4, 4.0), "only the scores"),
    (6, (4, 128.8), "unsplit layer"),
    (6, (4, RIGHT[6][1] * 2**30), "bytes; give GiB"),
    (6, (4, 16.4), "16-bit"),
    (8, (32, 4), "splits the query heads"),
    (8, (16, 2), "cannot exceed the 8 K/V heads, and with the course's even split"),
    (8, (4, 8), "too small"),
    (8, (8, 2), "must use the 32 GPUs"),
    (3, ([2, 1, 4, 3], 3), "`held` numbers the workers from 1"),
    (3, ([1, 3, 0, 2], 3), "follow one hop to the right per step"),
    (3, ([1, 0, 3, 2], 5), "how many times does a block change hands"),
    (5, (3, 0.5, "a", 16 / 9), "(makespan - worker 0's busy time) / makespan"),
    (6, (16, 4.0), "they shrink with N squared, not N"),
    (6, (4, 5.0), "e x H x (6 t D + t + 2 t^2) bytes"),
]


def test_the_default_numbers_are_the_lessons():
    g = check.given_1()
    assert (g["tokens"], g["d_model"]) == (6, 8)
    tp = sum(korthikanti_mlp_block_bytes(2048, 1, 4096, 4 * 4096, 4, False, 2).values())
    assert tp == pytest.approx(2048 * 4096 * (5 + 16 / 4))  # the lesson's (5 + 16/t) sbh
    assert causal_work(4, False) == [1, 2, 3, 4] and causal_work(4, True) == [9, 9, 9, 9]
    assert check.their_timeline().makespan / check.their_timeline(zigzag=True).makespan == (
        pytest.approx(RIGHT[5][3])
    )


def test_a_stub_is_not_answered():
    def stub(ctx):
        raise NotImplementedError()

    with pytest.raises(NotAnswered, match="NotImplementedError"):
        check.exercise_2(stub)


def test_the_cases_are_the_learners_in_the_notebook_and_secret_in_the_grader():
    mine = check.cases_2(Variant("alice"))["ring_attention"]
    assert mine == check.cases_2(Variant("alice"))["ring_attention"]  # the same on every run
    g = check.given_2(Variant("alice"))
    assert (mine[0][0].devices, mine[0][0].tokens, mine[0][0].dim) == (g.N, g.tokens, g.dim)
    assert mine[1][0].sharp > 1  # their own ring with sharp attention too
    q, k, _ = mine[1][0].build()
    assert torch.logsumexp(q @ k.T / k.shape[1] ** 0.5, dim=-1).max() > 88  # exp overflows
    secret = check.cases_2(Variant("alice", cases_seed="grader"))["ring_attention"]
    assert secret[:2] == mine[:2] and secret[2:] != mine[2:]


@pytest.mark.parametrize("wrong", list(programs.RING_MISTAKES), ids=lambda f: f.__name__)
def test_the_three_commonest_mistakes_get_their_own_hint(wrong):
    fails_with_its_own_hint(check.exercise_2, wrong, programs.RING_MISTAKES)


def test_the_run_shows_the_blocks_going_round_the_ring():
    from course_utils.parallel.context_parallel.rank_program import outputs, run_ring_program

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(12, 4, generator=gen) for _ in range(3))
    run = run_ring_program(programs.ring_attention, q, k, v, workers=3, causal=True)
    assert torch.allclose(torch.cat(outputs(run)), attention(q, k, v, causal=True), atol=1e-6)
    assert [[m[:2] for m in w.messages] for w in run.watches] == [
        [(1, "kv0"), (1, "kv2")],
        [(2, "kv1"), (2, "kv0")],
        [(0, "kv2"), (0, "kv1")],
    ]


@pytest.mark.slow  # a busy loop beside the test for a few seconds
def test_the_solution_passes_on_one_core_beside_a_busy_loop(capsys):
    from checkskit import beside_a_busy_loop

    with beside_a_busy_loop():
        check.exercise_2(programs.ring_attention)
    assert capsys.readouterr().out.startswith("✅ Right")


def right_for(v: Variant) -> dict:
    """Each exercise's right answer for student v, computed here from their numbers."""
    g3 = check.given_3(v)
    g5 = check.given_5(v)
    plain, zz = check.their_timeline(v), check.their_timeline(v, zigzag=True)
    g6 = check.given_6(v)

    def gib(cp):
        tok = g6["seq"] // cp
        return g6["e"] * g6["heads"] * (6 * tok * g6["dim"] + tok + 2 * tok * tok) / GIB

    cp = next(2**k for k in range(12) if gib(2**k) <= g6["budget_gib"])
    g8 = check.given_8(v)
    u8 = max(
        d for d in range(1, g8["kv_heads"] + 1) if g8["kv_heads"] % d == 0 and g8["gpus"] % d == 0
    )
    return {
        1: (seqprograms.sp,),  # one program for everybody, tried on their own block
        2: (programs.ring_attention,),  # one program for everybody, tried on their own ring
        3: ([(g3["w"] - k) % g3["N"] for k in range(g3["N"])], g3["N"] - 1),
        4: (splitprograms.zigzag,),  # one program for everybody, tried on their own ring
        5: (g5["N"] - 1, 1 - g5["block_ms"] / plain.makespan, "a", plain.makespan / zz.makespan),
        6: (cp, gib(cp)),
        7: (ulyssesprograms.right,),  # one program for everybody, tried on their own ranks
        8: (u8, g8["gpus"] // u8),
    }


def test_every_variant_keeps_the_exercises_sensible():
    seen = {k: set() for k in (1, 2, 3, 4, 5, 6, 7, 8)}
    for student in ["default", *STUDENTS, "erin"]:
        v = Variant(student)
        for k in seen:
            seen[k].add(repr(getattr(check, f"given_{k}")(v)))
        answers = right_for(v)
        assert 2 <= answers[6][0] <= 64  # context parallelism is needed, and not absurdly
        g5 = check.given_5(v)
        assert g5["transfer_ms"] <= g5["block_ms"] / 2  # the transfers hide, even zig-zag's
        n5 = g5["N"]
        assert math.isclose(answers[5][3], 4 * n5 / (2 * n5 + 1))  # hidden transfers: 9.4's gain
        assert 0 < check.given_3(v)["w"] < check.given_3(v)["N"]
        g7 = check.given_7(v)
        assert g7["heads"] % g7["N"] == 0 and g7["tokens"] % g7["N"] == 0  # whole heads each
    assert all(len(s) >= 3 for s in seen.values())
