"""The lesson 06 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import math
import re

import numpy as np
import pytest
from checkskit import STUDENTS

from course_utils.checks import CheckFailed, NotAnswered, Variant
from course_utils.checks import l06 as check
from course_utils.checks.wire import Replay, call_outcome, decode, encode
from course_utils.threads.collectives import chunk_bounds


def ring_with(data, send):
    """The reference ring: reduce-scatter, then all-gather, one chunk per step."""
    n = len(data)
    bufs = [list(row) for row in data]
    bounds = chunk_bounds(len(bufs[0]), n)
    for step in range(n - 1):
        out = [(r - step) % n for r in range(n)]
        msgs = [send(r, (r + 1) % n, bufs[r][slice(*bounds[out[r]])]) for r in range(n)]
        for r in range(n):
            a, b = bounds[(r - step - 1) % n]
            bufs[r][a:b] = [x + y for x, y in zip(bufs[r][a:b], msgs[(r - 1) % n], strict=True)]
    for step in range(n - 1):
        out = [(r + 1 - step) % n for r in range(n)]
        msgs = [send(r, (r + 1) % n, bufs[r][slice(*bounds[out[r]])]) for r in range(n)]
        for r in range(n):
            a, b = bounds[(r - step) % n]
            bufs[r][a:b] = msgs[(r - 1) % n]
    return bufs


def logged(ring):
    """ring(data, send) as the exercise asks for it: ring_allreduce(data) -> (result, log)."""

    def ring_allreduce(data):
        log = []

        def send(src, dst, values):
            log.append((src, dst, list(values)))
            return list(values)

        return ring(data, send), log

    return ring_allreduce


ring_allreduce = logged(ring_with)


def cheat(data):  # right sums, but reads the other ranks' memory
    total = [sum(col) for col in zip(*data, strict=True)]
    return [list(total) for _ in data], []


def naive(data, send):  # gather on rank 0 and broadcast: not a ring
    n = len(data)
    total = list(data[0])
    for r in range(1, n):
        total = [a + b for a, b in zip(total, send(r, 0, data[r]), strict=True)]
    return [list(total)] + [send(0, r, total) for r in range(1, n)]


def whole_vector(data, send):  # passes the whole vector around the ring, N-1 times
    n = len(data)
    bufs = [list(row) for row in data]
    acc = list(bufs[0])
    for r in range(n - 1):
        acc = [a + b for a, b in zip(send(r, r + 1, acc), bufs[r + 1], strict=True)]
    result = [None] * n
    result[n - 1] = acc
    for r in range(n - 1, 2 * n - 2):
        result[(r + 1) % n] = send(r % n, (r + 1) % n, acc)
    return [row if row is not None else acc for row in result]


def mean(data, send):
    n = len(data)
    return [[x / n for x in row] for row in ring_with(data, send)]


def all_gather_off_by_one(data, send):  # starts the all-gather with an unfinished chunk
    n = len(data)
    bufs = [list(row) for row in data]
    bounds = chunk_bounds(len(bufs[0]), n)
    for step in range(n - 1):
        for r in range(n):
            msg = send(r, (r + 1) % n, bufs[r][slice(*bounds[(r - step) % n])])
            a, b = bounds[(r - step) % n]
            dst = (r + 1) % n
            bufs[dst][a:b] = [x + y for x, y in zip(bufs[dst][a:b], msg, strict=True)]
    for step in range(n - 1):
        for r in range(n):
            msg = send(r, (r + 1) % n, bufs[r][slice(*bounds[(r - step) % n])])
            a, b = bounds[(r - step) % n]
            bufs[(r + 1) % n][a:b] = msg
    return bufs


def library_sums_with_dummy_messages(data):  # the sums from the library, made-up messages
    from course_utils.threads.collectives import ring_allreduce_steps

    n = len(data)
    final = ring_allreduce_steps(data)[-1].values  # per rank, its chunks
    fake = [(r, (r + 1) % n, [0.0]) for r in range(n) for _ in range(2 * (n - 1))]
    return [[x for chunk in row for x in chunk] for row in final], fake


def crashes(data):
    return ring_allreduce(data) if len(data) > 1 else data[1]


def stub(data):
    raise NotImplementedError()


def twice(data, send):  # the right ring, run twice: more messages than a ring needs
    ring_with(data, send)
    return ring_with(data, lambda s, d, v: v)


def numpy_values(data):
    result, log = ring_allreduce(data)
    return np.array(result), [(np.int64(s), np.int64(d), np.array(v)) for s, d, v in log]


def wrong_all_gather_messages(data):  # right sums and reduce-scatter, all-gather log garbled
    result, log = ring_allreduce(data)
    n, sent, out = len(data), {}, []
    for src, dst, values in log:
        k = sent[src] = sent.get(src, -1) + 1
        out.append((src, dst, [v + 1.0 for v in values] if k >= n - 1 else values))
    return result, out


def one_message_short(data):  # right sums, the log lacks the last message
    result, log = ring_allreduce(data)
    return result, log[:-1]


RIGHT = {
    1: (64, [13, 13, 13, 13, 12, 12, 12, 12]),
    2: ("b",),
    3: (["c", "f", "b", "e", "a", "d"],),
    4: (ring_allreduce,),
    5: (1.75, 7),
    6: (0.625, "a", "a"),
    7: ([True, False, False, True, False],),
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
        (7, ([True, True, False, True, False],), "Strategy 2"),
        (7, ([True, False, True, True, True],), "2 answers.*Strategy 3"),
        (7, ([False] * 5,), "Strategy 1"),
        (7, ([True, False, False, True, "no"],), "True or False"),
        (7, ([True, False, False, True],), "5 items"),
        (1, (64, [13] * 7 + [0]), "every worker should get at least one sample"),
        (4, (cheat,), "gives the right sums but sent no message"),
        (4, (logged(naive),), "a rank only sends to its right neighbour"),
        (4, (logged(whole_vector),), "A ring sends one chunk per step, about L/N"),
        (4, (logged(lambda d, send: (ring_with(d, send), ring_with(d, send))[0]),), "more than a"),
        (7, ([True, False, False, False, False],), "Strategy 4"),
        (7, ([True, False, False, True, True],), "Strategy 5"),
        (4, (logged(mean),), "holds the mean; this exercise asks for the sum"),
        (4, (logged(all_gather_off_by_one),), "not the sum over the ranks"),
        (4, (library_sums_with_dummy_messages,), "the partial sum it has built so far"),
        (4, (wrong_all_gather_messages,), "a finished sum"),
        (4, (one_message_short,), "of the ring's"),
        (4, (lambda data: ring_allreduce(data)[0],), "should return two things"),
        (4, (lambda data: 7,), "`the result of ring_allreduce"),
        (4, (lambda data: (7, []),), "`the result list of ring_allreduce"),
        (
            4,
            (lambda data: (ring_allreduce(data)[0][:1], []),),
            "it should return one list per rank",
        ),
        (4, (lambda data: ([row[:1] for row in data], []),), "'s result has 1 numbers instead of"),
        (4, (lambda data: (ring_allreduce(data)[0], [(0, 9, [1.0])]),), "ranks are whole numbers"),
        (
            4,
            (lambda data: (ring_allreduce(data)[0], [("x", 1, [1.0])]),),
            "message 0's source rank",
        ),
        (
            4,
            (lambda data: (ring_allreduce(data)[0], [(0, "y", [1.0])]),),
            "message 0's destination",
        ),
    ]
]


def test_build_exercise_catches_wrong_functions(capsys):
    with pytest.raises(CheckFailed, match="sent no message"):
        check.exercise_4(cheat)
    with pytest.raises(CheckFailed, match="right neighbour"):
        check.exercise_4(logged(naive))
    with pytest.raises(CheckFailed, match="one chunk per step"):
        check.exercise_4(logged(whole_vector))

    with pytest.raises(CheckFailed, match="more than a ring needs"):
        check.exercise_4(
            logged(lambda data, send: (ring_with(data, send), ring_with(data, send))[0])
        )
    with pytest.raises(CheckFailed, match="holds the mean"):
        check.exercise_4(logged(mean))
    with pytest.raises(CheckFailed, match="not the sum"):
        check.exercise_4(logged(all_gather_off_by_one))
    with pytest.raises(CheckFailed, match="not what the ring sends"):
        check.exercise_4(library_sums_with_dummy_messages)
    with pytest.raises(CheckFailed, match="IndexError"):
        check.exercise_4(crashes)
    with pytest.raises(CheckFailed, match="two things"):
        check.exercise_4(lambda data: ring_allreduce(data)[0])
    with pytest.raises(CheckFailed, match="ranks are whole numbers"):
        check.exercise_4(lambda data: (ring_allreduce(data)[0], [(0, 9, [1.0])]))

    check.exercise_4(numpy_values)
    assert capsys.readouterr().out.startswith("✅")
    with pytest.raises(NotAnswered):
        check.exercise_4(stub)
    with pytest.raises(CheckFailed, match="should be a function"):
        check.exercise_4("ring")


def test_build_exercise_is_judged_on_replayed_calls(capsys):
    variant = Variant("s7", cases_seed="grader")
    cases = check.cases_4(variant)["ring_allreduce"]
    assert cases == check.cases_4(Variant("s7", cases_seed="grader"))["ring_allreduce"]
    outcomes = [call_outcome(ring_allreduce, decode(encode(tuple(c))), 5) for c in cases]
    check.exercise_4(Replay("ring_allreduce", cases, outcomes), variant=variant)
    assert capsys.readouterr().out.startswith("✅")


def test_scaling_table_gives_nearly_eight_at_eight_and_ten_at_sixteen():
    """The seed question: 8 workers give nearly 8x, 16 only about 10x (one node vs two)."""
    rows = {n: (c, a) for n, c, a in check.scaling_table()}
    assert rows[1][0] / sum(rows[16]) == pytest.approx(10.0)
    assert rows[1][0] / sum(rows[8]) == pytest.approx(7.82, abs=0.01)


def right_for(v):
    """Exercises 1, 5, 6's right answers from the student's own numbers."""
    g1 = check.given_1(v)
    base, extra = divmod(g1["odd_batch"], g1["odd_workers"])
    shards = [base + 1] * extra + [base] * (g1["odd_workers"] - extra)
    g5 = check.given_5(v)
    s = 4 * g5["params_m"] / 1000
    n = g5["workers"]
    rows = {w: c + a for w, c, a in check.scaling_table(v)}
    return {
        1: (g1["batch"] // g1["workers"], shards),
        5: (2 * (n - 1) / n * s, (n - 1) * s),
        6: (rows[1] / rows[16] / 16, "a", "a"),
    }


@pytest.mark.parametrize("student", ["default", *STUDENTS])
def test_every_variant_keeps_the_story_of_exercise_6(student):
    """Nearly N inside one node, far less across two: cause "a" stays the right answer."""
    rows = {n: (c, a) for n, c, a in check.scaling_table(Variant(student))}
    total = rows[1][0]
    assert total / sum(rows[8]) > 7.0
    assert total / sum(rows[16]) < 12.5
    assert rows[16][1] > 5 * rows[8][1]  # the all-reduce jumps when the ring leaves the node
