"""All-gather and reduce-scatter by hand: torch's answers, exact byte counts, clean failures."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_utils.errors import CourseInputError, WorkerError
from course_utils.threads.collectives import (
    ThreadGroup,
    chunk_sizes,
    ring_all_gather_bytes,
    ring_bytes_per_rank,
    ring_reduce_scatter_bytes,
    run_all_gather,
    run_all_reduce,
    run_reduce_scatter,
)
from course_utils.threads.devices import DeviceThreads

MAX_RANKS = 5


@pytest.fixture(scope="module")
def pool():
    with DeviceThreads(MAX_RANKS, name="rank") as threads:
        yield threads


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 7), min_size=1, max_size=MAX_RANKS),
    width=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_all_gather_concatenates_uneven_shards_like_torch_cat(pool, lengths, width, seed):
    gen = torch.Generator().manual_seed(seed)
    shards = [torch.randn(n, width, generator=gen) for n in lengths]
    results, sent = run_all_gather(shards, threads=pool)
    expected = torch.cat(shards)
    for result in results:
        assert torch.equal(result, expected)  # copies only: bit for bit
    assert sent == ring_all_gather_bytes([n * width for n in lengths])


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, MAX_RANKS),
    length=st.integers(0, 13),
    op=st.sampled_from(["sum", "mean"]),
    seed=st.integers(0, 2**16),
)
def test_reduce_scatter_gives_each_rank_its_chunk_of_the_sum(pool, n, length, op, seed):
    gen = torch.Generator().manual_seed(seed)
    data = [torch.randn(length, 2, generator=gen) for _ in range(n)]
    results, sent = run_reduce_scatter(data, op=op, threads=pool)
    total = torch.stack(data).sum(0) / (n if op == "mean" else 1)
    sizes = chunk_sizes(length, n)
    expected = total.split(sizes)
    for r in range(n):
        assert results[r].shape == expected[r].shape
        assert torch.allclose(results[r], expected[r], atol=1e-6, rtol=0)
    assert sent == ring_reduce_scatter_bytes([s * 2 for s in sizes])


def test_reduce_scatter_with_explicit_sizes_and_another_dim(pool):
    data = [torch.arange(12.0).reshape(2, 6) * (r + 1) for r in range(3)]
    results, sent = run_reduce_scatter(data, dim=1, sizes=[1, 0, 5], threads=pool)
    total = data[0] * 6  # 1 + 2 + 3
    assert torch.equal(results[0], total[:, :1])
    assert results[1].shape == (2, 0)
    assert torch.equal(results[2], total[:, 1:])
    assert sent == ring_reduce_scatter_bytes([2, 0, 10])


def test_even_chunks_move_half_an_all_reduce_each(pool):
    """Reduce-scatter + all-gather is the ring all-reduce: same bytes, same sum."""
    n, length = 4, 4 * 250
    data = [torch.randn(length) for _ in range(n)]
    chunks, rs_sent = run_reduce_scatter(data, threads=pool)
    gathered, ag_sent = run_all_gather(chunks, threads=pool)
    reduced, ar_sent = run_all_reduce(data, threads=pool)
    half = (n - 1) * length // n * 4
    assert rs_sent == ag_sent == [half] * n
    assert [a + b for a, b in zip(rs_sent, ag_sent, strict=True)] == ar_sent
    for r in range(n):
        assert torch.allclose(gathered[r], reduced[r], atol=1e-5)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 6), length=st.integers(0, 40))
def test_byte_formulas_add_up_to_the_all_reduce_in_total(n, length):
    sizes = chunk_sizes(length, n)
    assert sum(sizes) == length
    both = sum(ring_reduce_scatter_bytes(sizes)) + sum(ring_all_gather_bytes(sizes))
    assert both == sum(ring_bytes_per_rank(length, n))
    # each rank sends (N-1)/N of the data, give or take one chunk's rounding
    for sent in ring_all_gather_bytes(sizes):
        assert abs(sent - (n - 1) * length / n * 4) <= 4


def test_all_gather_into_out_buffer(pool):
    group = ThreadGroup(3, abort=pool.abort)
    outs = [torch.full((6,), -1.0) for _ in range(3)]

    def work(rank):
        def run():
            shard = outs[rank][2 * rank : 2 * rank + 2]  # our shard lives inside `out`
            shard.fill_(float(rank))
            return group.comm(rank).all_gather(shard, out=outs[rank])

        return run

    results = pool.run([work(r) for r in range(3)])
    expected = torch.tensor([0.0, 0, 1, 1, 2, 2])
    for r in range(3):
        assert results[r] is outs[r]
        assert torch.equal(outs[r], expected)


def test_bad_input_is_one_line(pool):
    comm = ThreadGroup(1).comm(0)
    with pytest.raises(CourseInputError, match="dim"):
        comm.all_gather(torch.zeros(3), dim=1)
    with pytest.raises(CourseInputError, match="at least one dimension"):
        comm.reduce_scatter(torch.tensor(1.0))
    with pytest.raises(CourseInputError, match="sizes"):
        comm.reduce_scatter(torch.zeros(4), sizes=[3])
    with pytest.raises(CourseInputError, match="op"):
        comm.reduce_scatter(torch.zeros(4), op="max")
    with pytest.raises(CourseInputError, match="out"):
        comm.all_gather(torch.zeros(3), out=torch.zeros(4))


def test_a_missing_peer_fails_cleanly_instead_of_hanging():
    with DeviceThreads(2, name="rank") as threads:
        group = ThreadGroup(2, abort=threads.abort, timeout=0.3)

        def gatherer():
            return group.comm(0).all_gather(torch.zeros(2))

        def quitter():
            raise RuntimeError("rank 1 crashed")

        with pytest.raises(WorkerError, match="device 1.*crashed"):
            threads.run([gatherer, quitter])
