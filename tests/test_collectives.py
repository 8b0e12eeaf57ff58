"""The hand-made all-reduce: right sums, right byte counts, clean failure when a peer is gone."""

import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_utils.errors import CourseInputError, WorkerError
from course_utils.threads.collectives import (
    CommAborted,
    CommError,
    ThreadGroup,
    chunk_bounds,
    naive_bytes_per_rank,
    ring_allreduce_steps,
    ring_bytes_per_rank,
    ring_plan,
    run_all_reduce,
)
from course_utils.threads.devices import DeviceThreads

MAX_RANKS = 6


@pytest.fixture(scope="module")
def pool():
    with DeviceThreads(MAX_RANKS, name="rank") as threads:
        yield threads


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, MAX_RANKS),
    length=st.integers(0, 23),
    algorithm=st.sampled_from(["ring", "naive"]),
    seed=st.integers(0, 2**16),
)
def test_all_reduce_sums_like_torch(pool, n, length, algorithm, seed):
    gen = torch.Generator().manual_seed(seed)
    data = [torch.randn(length, generator=gen) for _ in range(n)]
    results, sent = run_all_reduce(data, algorithm=algorithm, threads=pool)
    expected = torch.stack(data).sum(0)
    for r in range(n):
        assert torch.allclose(results[r], expected, atol=1e-6, rtol=0)
        # the reduced chunk is computed once and copied: every rank holds the very same bits
        assert torch.equal(results[r], results[0])
    nbytes = length * 4
    if algorithm == "ring":
        assert sent == ring_bytes_per_rank(length, n)
        ideal = 2 * (n - 1) / n * nbytes
        for b in sent:  # uneven chunks: off by at most one element per step
            assert abs(b - ideal) <= 2 * (n - 1) * 4
    else:
        assert sent == naive_bytes_per_rank(length, n)
        if n > 1:
            assert sent[0] == (n - 1) * nbytes
            assert all(b == nbytes for b in sent[1:])


def test_ring_bytes_are_exactly_the_formula_when_chunks_are_even(pool):
    n, length = 4, 4 * 1000
    data = [torch.ones(length) * r for r in range(n)]
    _, sent = run_all_reduce(data, algorithm="ring", threads=pool)
    assert sent == [2 * (n - 1) * length // n * 4] * n  # 2(N-1)/N x 16 kB = 24 kB each


def test_mean_op_and_inputs_untouched(pool):
    data = [torch.full((3, 2), float(r)) for r in range(4)]
    before = [t.clone() for t in data]
    results, _ = run_all_reduce(data, op="mean", threads=pool)
    for r in range(4):
        assert torch.allclose(results[r], torch.full((3, 2), 1.5))
        assert torch.equal(data[r], before[r])


@pytest.mark.parametrize("algorithm", ["ring", "naive"])
def test_list_of_differently_shaped_tensors(pool, algorithm):
    n = 3
    shapes = [(2, 3), (5,), (1, 1, 4), ()]
    gen = torch.Generator().manual_seed(0)
    per_rank = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(n)]
    expected = [torch.stack([per_rank[r][i] for r in range(n)]).sum(0) for i in range(len(shapes))]
    group = ThreadGroup(n, abort=pool.abort)

    def work(rank):
        return lambda: group.comm(rank).all_reduce(per_rank[rank], algorithm=algorithm)

    outs = pool.run([work(r) for r in range(n)])
    for r in range(n):
        assert outs[r] is per_rank[r]  # in place, like torch.distributed
        for got, want, shape in zip(per_rank[r], expected, shapes, strict=True):
            assert got.shape == torch.Size(shape)
            assert torch.allclose(got, want, atol=1e-6)
    numel = sum(t.numel() for t in per_rank[0])
    if algorithm == "ring":
        assert group.bytes_sent == ring_bytes_per_rank(numel, n)
    else:  # rank 0 is the hub: it receives N-1 copies and sends N-1 copies
        assert group.bytes_received[0] == group.bytes_sent[0] == (n - 1) * numel * 4
    assert sum(group.bytes_received) == sum(group.bytes_sent)


def test_point_to_point_is_fifo_and_copies(pool):
    group = ThreadGroup(2, abort=pool.abort)
    buf = torch.zeros(3)

    def sender():
        c = group.comm(0)
        c.send(1, buf)
        buf.fill_(7.0)  # editing after send must not change the message
        c.send(1, buf)
        c.barrier()

    def receiver():
        c = group.comm(1)
        got = [c.recv(0), c.recv(0)]
        c.barrier()
        return got

    _, got = pool.run([sender, receiver])
    assert torch.equal(got[0], torch.zeros(3)) and torch.equal(got[1], torch.full((3,), 7.0))
    assert group.bytes_sent == [24, 0] and group.messages_sent == [2, 0]
    assert group.bytes_received == [0, 24]


def test_recv_times_out_with_a_clear_error():
    group = ThreadGroup(2, timeout=0.2)
    start = time.monotonic()
    with pytest.raises(CommError, match="no message from rank 1"):
        group.comm(0).recv(1)
    assert time.monotonic() - start < 5


def test_recv_gives_up_when_aborted():
    abort = threading.Event()
    group = ThreadGroup(2, abort=abort, timeout=60)
    threading.Timer(0.1, abort.set).start()
    with pytest.raises(CommAborted, match="aborted"):
        group.comm(1).recv(0)


def test_a_failing_rank_does_not_hang_the_others(pool):
    group = ThreadGroup(3, abort=pool.abort, timeout=60)

    def good(rank):
        return lambda: group.comm(rank).all_reduce(torch.ones(10))

    def bad():
        raise RuntimeError("boom")

    start = time.monotonic()
    with pytest.raises(WorkerError, match="device 1 failed: RuntimeError: boom"):
        pool.run([good(0), bad, good(2)])
    assert time.monotonic() - start < 10  # nobody waited for the 60 s timeout
    # the pool is usable again afterwards
    results, _ = run_all_reduce([torch.ones(2), torch.ones(2)], threads=pool)
    assert torch.equal(results[0], torch.full((2,), 2.0))


def test_ring_trace_ends_with_the_sum_and_matches_the_plan():
    values = [[1.0, 2.0, 3.0, 4.0, 5.0], [10.0, 20.0, 30.0, 40.0, 50.0], [100.0] * 5]
    states = ring_allreduce_steps(values)
    n = len(values)
    assert len(states) == 1 + 2 * (n - 1)
    assert [s.phase for s in states] == ["start"] + ["reduce-scatter"] * 2 + ["all-gather"] * 2
    expected = [sum(col) for col in zip(*values, strict=True)]
    for r in range(n):
        flat = [x for chunk in states[-1].values[r] for x in chunk]
        assert flat == expected
        assert all(c == frozenset(range(n)) for c in states[-1].contributors[r])
    # after reduce-scatter rank r owns the complete chunk (r + 1) mod n
    mid = states[n - 1]
    for r in range(n):
        assert mid.contributors[r][(r + 1) % n] == frozenset(range(n))
    # the trace sends exactly what the threaded algorithm sends
    for i, state in enumerate(states[1:]):
        assert state.transfers == tuple((r, (r + 1) % n, ring_plan(r, n)[i][2]) for r in range(n))
    assert "rank 0" in states[1].describe()


def test_chunk_bounds_cover_everything():
    assert chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert chunk_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]


def test_bad_input_is_one_line():
    with pytest.raises(CourseInputError, match="world_size"):
        ThreadGroup(0)
    group = ThreadGroup(2)
    with pytest.raises(CourseInputError, match="rank must be"):
        group.comm(2)
    with pytest.raises(CourseInputError, match="dst must be"):
        group.comm(0).send(0, torch.ones(1))
    with pytest.raises(CourseInputError, match="op must be one of sum, mean"):
        run_all_reduce([torch.ones(1)], op="max")
    with pytest.raises(CourseInputError, match="algorithm must be one of ring, naive"):
        group.comm(0).all_reduce(torch.ones(1), algorithm="tree")
    with pytest.raises(CourseInputError, match="same length"):
        ring_allreduce_steps([[1.0], [1.0, 2.0]])
