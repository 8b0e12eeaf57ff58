"""The lesson 06 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import math
import re

import numpy as np
import pytest

from course_utils.checks import CheckFailed, NotAnswered
from course_utils.checks import l06 as check
from course_utils.threads.collectives import chunk_bounds


def ring_allreduce(data, send):
    """The reference solution: reduce-scatter, then all-gather, one chunk per step."""
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


RIGHT = {
    1: (64, [13, 13, 13, 13, 12, 12, 12, 12]),
    2: ("b",),
    3: (["c", "f", "b", "e", "a", "d"],),
    4: (ring_allreduce,),
    5: (1750, 7000),
    6: (0.625, "a", "a"),
    7: ([True, False, False, True, False],),
}


def test_other_right_forms_pass(capsys):
    check.exercise_1(64.0, (12, 13, 12, 13, 12, 13, 12, 13))  # any order of the shards
    check.exercise_3(["F", "c", "b", "e", "a", "d"])  # broadcast before split, capitals
    check.exercise_5(1750.0, 7e3)
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
        (5, (875, 7000), "two"),
        (5, (2000, 7000), "limit"),
        (5, (125, 7000), "N - 1 steps"),
        (5, (1500, 7000), "Count chunks"),
        (5, (1750, 8000), "to itself"),
        (5, (1750, 1000), "sends the sum back"),
        (5, (1750, 14000), "receives"),
        (5, (1750, 3000), "Who does rank 0"),
        (6, (10.0, "a", "a"), "looks like a speed-up"),
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
    ]
]


def test_build_exercise_catches_wrong_functions():
    def cheat(data, send):  # right sums, but reads the other ranks' memory
        total = [sum(col) for col in zip(*data, strict=True)]
        return [list(total) for _ in data]

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
        return [[x / n for x in row] for row in ring_allreduce(data, send)]

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

    def crashes(data, send):
        return ring_allreduce(data, send) if len(data) > 1 else data[1]

    def stub(data, send):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="sent no message"):
        check.exercise_4(cheat)
    with pytest.raises(CheckFailed, match="right neighbour"):
        check.exercise_4(naive)
    with pytest.raises(CheckFailed, match="more than a ring needs"):
        check.exercise_4(whole_vector)
    with pytest.raises(CheckFailed, match="holds the mean"):
        check.exercise_4(mean)
    with pytest.raises(CheckFailed, match="not the sum"):
        check.exercise_4(all_gather_off_by_one)
    with pytest.raises(CheckFailed, match="IndexError"):
        check.exercise_4(crashes)

    def bad_rank(data, send):
        return [send(0, 1.5, row) for row in data]

    def numpy_ranks(data, send):
        return ring_allreduce(data, lambda s, d, v: send(np.int64(s), np.int64(d), np.array(v)))

    with pytest.raises(CheckFailed, match="ranks are whole numbers"):
        check.exercise_4(bad_rank)
    check.exercise_4(numpy_ranks)
    with pytest.raises(NotAnswered):
        check.exercise_4(stub)
    with pytest.raises(CheckFailed, match="should be a function"):
        check.exercise_4("ring")


def test_scaling_table_gives_ten_x_at_sixteen():
    rows = {n: (c, a) for n, c, a in check.scaling_table()}
    assert rows[1][0] / sum(rows[16]) == pytest.approx(10.0)
    assert rows[1][0] / sum(rows[8]) == pytest.approx(6.25)
