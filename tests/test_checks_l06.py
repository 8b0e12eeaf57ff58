"""The lesson 06 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import math
import re

import dpprograms as dp
import hierarchyprograms as hierarchy
import pytest
from checkskit import STUDENTS

from course_utils.checks import Variant
from course_utils.checks import l06 as check

RIGHT = {
    1: (64, [13, 13, 13, 13, 12, 12, 12, 12]),
    2: ("b",),
    3: (["c", "f", "b", "e", "a", "d"],),
    4: (dp.ring,),
    5: (hierarchy.hierarchical,),
    6: (0.625, "a", "a"),
    7: ([True, False, True, True, False],),
    8: (dp.ddp,),
}


def test_other_right_forms_pass(capsys):
    check.exercise_1(64.0, (12, 13, 12, 13, 12, 13, 12, 13))  # any order of the shards
    check.exercise_3(["F", "c", "b", "e", "a", "d"])  # broadcast before split, capitals
    check.exercise_6(5 / 8, "A", "a")
    assert capsys.readouterr().out.count("✅") == 3


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
        *((5, (wrong,), words) for wrong, words in hierarchy.HIERARCHY_MISTAKES.items()),
        (5, (hierarchy.summed,), "the sum, not the mean"),
        (5, (hierarchy.node_mean_only,), "divided by the size of one group only"),
        (5, (hierarchy.cross_whole,), "across the nodes only the shard travels"),
        (5, (hierarchy.skip_cross,), "is three steps"),
        (5, (hierarchy.rank_0_leaves,), "every rank of its group calls it"),
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
    rows = {w: c + a for w, c, a in check.scaling_table(v)}
    return {
        1: (g1["batch"] // g1["workers"], shards),
        4: (dp.ring,),  # the programs are the same for everybody, tried on their numbers
        5: (hierarchy.hierarchical,),
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


# -- 6.5: the hierarchical all-reduce, a per-rank program ------------------------------------


@pytest.mark.parametrize("wrong", list(hierarchy.HIERARCHY_MISTAKES), ids=lambda f: f.__name__)
def test_6_5_the_three_commonest_mistakes_get_their_own_hint(wrong):
    from checkskit import fails_with_its_own_hint

    fails_with_its_own_hint(check.exercise_5, wrong, hierarchy.HIERARCHY_MISTAKES)


def test_6_5_cases_are_the_learners_then_fresh_clusters_secret_in_the_grader():
    mine = check.cases_5(Variant("bob"))["hierarchical_all_reduce"]
    g, case = check.given_5(Variant("bob")), mine[0][0]
    assert (case.nodes, case.per_node, case.length) == (g.nodes, g.per_node, g.length)
    assert all(c.length % c.devices == 0 for (c,) in mine)  # the formulas' bytes are exact
    assert {c.nodes for (c,) in mine} == {2, 3} and len({c.per_node for (c,) in mine}) > 1
    secret = check.cases_5(Variant("bob", cases_seed="grader"))["hierarchical_all_reduce"]
    assert secret[0] == mine[0] and secret[1:] != mine[1:]


def test_6_5_the_run_records_each_collective_and_what_crossed_between_nodes():
    import torch

    from course_utils.checks.hierarchical_build import formula
    from course_utils.checks.rank_cases import HierarchyCase
    from course_utils.parallel.hierarchical import cross_bytes, run_hierarchical

    case = HierarchyCase(2, 4, 16, 5)
    data = case.data()
    run = run_hierarchical(hierarchy.hierarchical, data, nodes=2)
    assert all(torch.allclose(r, sum(data) / 8) for r in run.extra["results"])
    want = formula(case)
    for rank, calls in enumerate(run.extra["calls"]):
        assert [c[:2] for c in calls] == [
            ["node", "reduce_scatter"],
            ["cross", "all_reduce"],
            ["node", "all_gather"],
        ]
        assert [sum(c[2]) for c in calls] == [48, 16, 48]
        assert cross_bytes(calls, rank, 8, 2) == want["all_reduce"] == 16  # its shard, S / G
        assert sum(map(sum, (c[2] for c in calls))) == run.bytes_sent[rank]
    assert want["flat"] == 2 * 7 * 64 // 8  # a flat ring's rank: 2(N-1)/N S
