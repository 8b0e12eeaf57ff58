"""The lesson 06 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import math
import re

import dpprograms as dp
import pytest
from checkskit import STUDENTS

from course_utils.checks import Variant
from course_utils.checks import l06 as check

RIGHT = {
    1: (64, [13, 13, 13, 13, 12, 12, 12, 12]),
    2: ("b",),
    3: (["c", "f", "b", "e", "a", "d"],),
    4: (dp.ring,),
    5: (1.75, 7),
    6: (0.625, "a", "a"),
    7: ([True, False, True, True, False],),
    8: (dp.ddp,),
}


def test_other_right_forms_pass(capsys):
    check.exercise_1(64.0, (12, 13, 12, 13, 12, 13, 12, 13))  # any order of the shards
    check.exercise_3(["F", "c", "b", "e", "a", "d"])  # broadcast before split, capitals
    check.exercise_5(1.75, 7.0)
    check.exercise_6(5 / 8, "A", "a")
    assert capsys.readouterr().out.count("✅") == 4


# Needles are regular expressions here ("a|b": either wording passes).
WRONG = [
    (k, args, re.compile(needle))
    for k, args, needle in [
        (1, (16384, [13] * 4 + [12] * 4), "shared"),
        (1, (1024, [13] * 4 + [12] * 4), "whole .model"),
        (1, (32, [13] * 4 + [12] * 4), "disjoint"),
        (1, (math.nan, [13] * 4 + [12] * 4), "NaN"),
        (1, ("64", [13] * 4 + [12] * 4), "without quotes"),
        (1, (64, [12.5] * 8), "whole number"),
        (1, (64, [12] * 8), "add up to 96"),
        (1, (64, [13] * 7 + [9]), "uneven"),
        (1, (64, [25] * 4), "8 numbers"),
        (1, (64, 12.5), "should be a list"),
        (2, ("a",), "drift|stop being copies"),
        (2, ("c",), "redo the whole batch"),
        (2, ("d",), "wasted"),
        (2, ("e",), "should be one of"),
        (3, (["c", "f", "b", "e", "d", "a"],), "drift apart"),
        (3, (["c", "f", "b", "a", "e", "d"],), "which event produces them"),
        (3, (["c", "f", "e", "b", "a", "d"],), "activations"),
        (3, (["b", "c", "f", "e", "a", "d"],), "too early"),
        (3, (["c", "f", "b", "e", "a"],), "6 items|exactly once"),
        (3, (["c", "c", "b", "e", "a", "d"],), "missing: f"),
        (3, ("cfbead",), "should be a list"),
        (3, (["c", "f", "b", "e", "a", "z"],), "should be one of"),
        (5, (0.875, 7), "two"),
        (5, (2, 7), "limit"),
        (5, (0.125, 7), "N - 1 steps"),
        (5, (1.5, 7), "Count chunks"),
        (5, (1750, 7), "looks like megabytes; give GB"),
        (5, (1.75e9, 7), "bytes; give GB"),
        (5, (1.63, 7), "GiB"),
        (5, (3.5, 7), "both directions"),
        (5, (1.8, 7), "close: give 3 significant figures"),
        (5, (0.4375, 7), "4 bytes"),
        (5, (1.75, 8), "to itself"),
        (5, (1.75, 1), "sends the sum back"),
        (5, (1.75, 14), "receives"),
        (5, (1.75, 6.52), "GiB"),
        (5, (1.75, 7000), "looks like megabytes; give GB"),
        (5, (1.75, 3), "Who does rank 0"),
        (6, (10.0, "a", "a"), "looks like a speed-up"),
        (6, (62.5, "a", "a"), "percentage"),
        (6, (0.6, "a", "a"), "close: give 3 significant figures"),
        (6, (0.63, "a", "a"), "close: give 3 significant figures"),
        (6, (1.0, "a", "a"), "leaves out the all-reduce"),
        (6, (0.5, "a", "a"), "not right yet"),
        (6, (0.625, "b", "a"), "learning rate"),
        (6, (0.625, "c", "a"), "hardly"),
        (6, (0.625, "d", "a"), "memory"),
        (6, (0.625, "a", "b"), "naive"),
        (6, (0.625, "a", "c"), "shrinks the compute"),
        (6, (0.625, "a", "d"), "waiting"),
        (7, ([True, True, True, True, False],), "Strategy 2"),
        (
            7,
            ([True, False, False, True, True],),
            re.compile(r"2 answers(.|\n)*Strategy 3(.|\n)*Strategy 5"),
        ),
        (7, ([False] * 5,), "Strategy 1"),
        (7, ([True, False, False, True, False],), "Strategy 3"),
        (7, ([True, False, True, True, "no"],), "True or False"),
        (7, ([True, False, True, True],), "5 items"),
        (1, (64, [13] * 7 + [0]), "every worker should get at least one sample"),
        (7, ([True, False, True, False, False],), "Strategy 4"),
        (7, ([True, False, True, True, True],), "Strategy 5"),
        (
            6,
            (10.0, "b", "c"),
            re.compile(r"3 answers(.|\n)*`efficiency_16`(.|\n)*`cause`(.|\n)*`fix`"),
        ),
        *((4, (wrong,), words) for wrong, words in dp.MISTAKES["ring"].items()),
        *((8, (wrong,), words) for wrong, words in dp.MISTAKES["ddp"].items()),
        (4, (dp.ring_receives_first,), "sends first, then receives"),
        (4, (dp.ring_whole,), "one chunk per step"),
        (4, (dp.ring_in_turn,), "the ranks waited for each other"),
        (4, (dp.ring_library,), "with `ctx.send` and `ctx.recv` only"),
        (4, (dp.ring_returns_nothing,), "Return `data`, holding the sum"),
        (4, (dp.ring_wrong_direction,), "A chunk index is off"),
        (4, (dp.ring_no_gather,), "not the sum over the ranks"),
        (4, (dp.ring_other_start,), "the first its own chunk"),
        (4, (42,), "should be a function"),
        (8, (dp.ddp_twice,), "reduced twice"),
        (8, (dp.ddp_blocking,), "blocking all-reduce"),
        (8, (dp.ddp_no_wait,), "never waited"),
        (8, (dp.ddp_after_backward,), "after the backward had ended"),
        (8, (dp.ddp_per_parameter,), "A bucket takes the next parameter"),
        (8, (dp.ddp_early_everywhere,), "passed None to all_reduce"),
        (8, (dp.ddp_one_rank,), "the same buckets, from the same hooks"),
        (8, (dp.ddp_mean_twice,), "averaged twice"),
        (8, (dp.ddp_scaled,), "exactly once, after its last micro-batch"),
    ]
]


def test_scaling_table_gives_nearly_eight_at_eight_and_ten_at_sixteen():
    """The seed question: 8 workers give nearly 8x, 16 only about 10x (one node vs two)."""
    rows = {n: (c, a) for n, c, a in check.scaling_table()}
    assert rows[1][0] / sum(rows[16]) == pytest.approx(10.0)
    assert rows[1][0] / sum(rows[8]) == pytest.approx(7.82, abs=0.01)


def right_for(v):
    """The right answers of the exercises whose numbers vary, for the student's numbers."""
    g1 = check.given_1(v)
    base, extra = divmod(g1["odd_batch"], g1["odd_workers"])
    shards = [base + 1] * extra + [base] * (g1["odd_workers"] - extra)
    g5 = check.given_5(v)
    s = 4 * g5["params_m"] / 1000
    n = g5["workers"]
    rows = {w: c + a for w, c, a in check.scaling_table(v)}
    return {
        1: (g1["batch"] // g1["workers"], shards),
        4: (dp.ring,),  # the programs are the same for everybody, tried on their numbers
        5: (2 * (n - 1) / n * s, (n - 1) * s),
        6: (rows[1] / rows[16] / 16, "a", "a"),
        8: (dp.ddp,),
    }


@pytest.mark.parametrize("student", ["default", *STUDENTS])
def test_every_variant_keeps_the_story_of_exercise_6(student):
    """Nearly N inside one node, far less across two: cause "a" stays the right answer."""
    rows = {n: (c, a) for n, c, a in check.scaling_table(Variant(student))}
    total = rows[1][0]
    assert total / sum(rows[8]) > 7.0
    assert total / sum(rows[16]) < 12.5
    assert rows[16][1] > 5 * rows[8][1]  # the all-reduce jumps when the ring leaves the node
