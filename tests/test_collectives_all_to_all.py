"""The hand-made all-to-all: every chunk arrives where it was addressed, bytes as counted."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_utils.errors import CourseInputError, WorkerError
from course_utils.threads.collectives import ThreadGroup, all_to_all_bytes
from course_utils.threads.devices import DeviceThreads

MAX_RANKS = 5


@pytest.fixture(scope="module")
def pool():
    with DeviceThreads(MAX_RANKS, name="rank") as threads:
        yield threads


def _run(pool, chunks, timeout=10.0):
    """chunks[s][d] is what rank s sends to rank d; returns (received per rank, group)."""
    n = len(chunks)
    group = ThreadGroup(n, abort=pool.abort, timeout=timeout)
    results = pool.run([lambda r=r: group.comm(r).all_to_all(chunks[r]) for r in range(n)])
    return results, group


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, MAX_RANKS),
    seed=st.integers(0, 2**16),
    width=st.integers(1, 4),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.int64]),
    data=st.data(),
)
def test_all_to_all_is_a_transpose_and_counts_bytes(pool, n, seed, width, dtype, data):
    # uneven numbers of rows per (source, destination), zero included, as in MoE dispatch
    rows = [[data.draw(st.integers(0, 4)) for _ in range(n)] for _ in range(n)]
    gen = torch.Generator().manual_seed(seed)
    chunks = [
        [(torch.randn(rows[s][d], width, generator=gen) * 100).to(dtype) for d in range(n)]
        for s in range(n)
    ]
    originals = [[c.clone() for c in row] for row in chunks]
    received, group = _run(pool, chunks)
    for r in range(n):
        assert len(received[r]) == n
        for s in range(n):
            # what rank r got from s is exactly what s addressed to r (values, shape, dtype)
            assert torch.equal(received[r][s], originals[s][r])
            assert received[r][s].dtype == dtype
    # the result is the torch "transpose" of the chunk matrix, rebuilt with torch.cat
    for r in range(n):
        expected = torch.cat([originals[s][r] for s in range(n)])
        assert torch.equal(torch.cat(received[r]), expected)
    # the inputs are untouched and the results are copies, not the senders' tensors
    for s in range(n):
        for d in range(n):
            assert torch.equal(chunks[s][d], originals[s][d])
            if chunks[s][d].numel():
                assert received[d][s].data_ptr() != chunks[s][d].data_ptr()
    numel = [[rows[s][d] * width for d in range(n)] for s in range(n)]
    size = torch.tensor([], dtype=dtype).element_size()
    assert group.bytes_sent == all_to_all_bytes(numel, size)
    assert group.bytes_received == all_to_all_bytes(numel, size, direction="received")
    assert group.messages_sent == [n - 1] * n  # empty chunks are still sent (0 bytes)


def test_all_to_all_bytes_by_hand():
    # rank 0 sends 3 elements to rank 1 and 5 to rank 2; its own 7 stay home
    numel = [[7, 3, 5], [1, 0, 0], [0, 2, 9]]
    assert all_to_all_bytes(numel) == [32, 4, 8]
    assert all_to_all_bytes(numel, element_size=8, direction="received") == [8, 40, 40]
    assert all_to_all_bytes([[123]]) == [0]


def test_all_to_all_twice_in_a_row_keeps_messages_apart(pool):
    n = 3
    group = ThreadGroup(n, abort=pool.abort, timeout=10.0)

    def work(r):
        comm = group.comm(r)
        first = comm.all_to_all([torch.full((1,), 10.0 * r + d) for d in range(n)])
        second = comm.all_to_all([torch.full((2,), -(10.0 * r + d)) for d in range(n)])
        return first, second

    results = pool.run([lambda r=r: work(r) for r in range(n)])
    for r, (first, second) in enumerate(results):
        assert [t.item() for t in first] == [10.0 * s + r for s in range(n)]
        assert [t.tolist() for t in second] == [[-(10.0 * s + r)] * 2 for s in range(n)]


@pytest.mark.parametrize(
    "chunks, match",
    [
        ([torch.zeros(1)], "list of 2 tensors"),
        (torch.zeros(2, 1), "got a tensor"),
        ([torch.zeros(1), [1.0]], "torch.Tensor"),
    ],
)
def test_all_to_all_refuses_bad_chunks(chunks, match):
    group = ThreadGroup(2)
    with pytest.raises(CourseInputError, match=match):
        group.comm(0).all_to_all(chunks)


@pytest.mark.parametrize(
    "numel, kwargs",
    [
        ([[1, 2], [3]], {}),
        ([[1, -2], [3, 4]], {}),
        ([[1.5, 2], [3, 4]], {}),
        ([[1, 2], [3, 4]], {"direction": "both"}),
    ],
)
def test_all_to_all_bytes_refuses_bad_input(numel, kwargs):
    with pytest.raises(CourseInputError):
        all_to_all_bytes(numel, **kwargs)


def test_a_rank_that_never_calls_all_to_all_does_not_hang_the_others(pool):
    group = ThreadGroup(3, abort=pool.abort, timeout=10.0)

    def work(r):
        if r == 2:
            raise RuntimeError("rank 2 crashed before the all-to-all")
        return group.comm(r).all_to_all([torch.zeros(1)] * 3)

    with pytest.raises(WorkerError, match="device 2 failed: RuntimeError: rank 2 crashed"):
        pool.run([lambda r=r: work(r) for r in range(3)])
