"""Non-blocking collectives on the per-rank harness (`threads.async_comm`): handles that
`wait()`, a communication stream per rank on the virtual clock (overlap shows), results that
are the same every time, and the harness's guarantees kept: a deadlock is one message naming
who waits for whom, a runaway is stopped, and no thread outlives its run."""

from __future__ import annotations

import copy
import json
import threading
import time

import pytest
import torch

from course_utils.checks.programs import ProgramCase
from course_utils.checks.wire import call_outcome, decode, encode
from course_utils.models import MLP, loss_fn
from course_utils.parallel.rank_programs import (
    exposed_communication,
    max_weight_diff,
    run_collective,
    run_data_parallel,
)
from course_utils.threads import async_comm
from course_utils.threads.clock import replay_messages
from course_utils.threads.collectives import naive_bytes_per_rank, ring_bytes_per_rank
from course_utils.threads.links import Links
from course_utils.threads.rank_run import RankError
from course_utils.threads.ranks import run_ranks


def nothing_left(before: set) -> bool:
    return set(threading.enumerate()) <= before


def replicas(n=2, hidden=32, batch=64, seed=0):
    torch.manual_seed(seed)
    model = MLP(16, hidden, 10, 3)
    x, y = model.example_batch(batch, torch.Generator().manual_seed(seed))
    return model, x, y


def per_parameter(ctx):
    """One non-blocking all-reduce per parameter, issued from its hook."""
    work = []
    for p in ctx.stage.parameters():
        p.register_post_accumulate_grad_hook(
            lambda p: work.append(ctx.comm.all_reduce(p.grad, op="mean", async_op=True))
        )
    with ctx.forward(0):
        loss = ctx.loss(ctx.stage(ctx.inputs[0]), 0)
    with ctx.backward(0):
        loss.backward()
    for w in work:
        w.wait()


def one_worker(model, x, y, lr=0.1):
    model = copy.deepcopy(model)
    loss_fn(model(x), y).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    return model


def test_hooks_with_non_blocking_all_reduces_equal_one_worker_and_overlap_the_backward():
    model, x, y = replicas(hidden=64, batch=256)
    before = set(threading.enumerate())
    run_data_parallel(per_parameter, model, x, y, ranks=2)  # warm-up
    run = run_data_parallel(per_parameter, model, x, y, ranks=2)
    assert nothing_left(before)
    assert max_weight_diff(run, one_worker(model, x, y)) < 1e-6
    params = len(list(model.parameters()))
    assert [len(calls) for calls in run.collectives] == [params, params]
    assert all(c["async"] and c["waited"] and c["in"] == f"{r}B0" for r, calls in
               enumerate(run.collectives) for c in calls)  # fmt: skip
    names = {s.name for s in run.recorder.streams}
    assert names == {"compute", "communication"}
    _, count, early = exposed_communication(run.timeline.events)
    assert count == params and early >= 1  # on the lane under a backward still running
    # all the bytes of both streams are counted: one ring all-reduce per parameter
    want = [sum(b[r] for b in (ring_bytes_per_rank(p.numel(), 2) for p in model.parameters()))
            for r in range(2)]  # fmt: skip
    assert run.bytes_sent == want


def test_a_result_arrives_at_wait_and_the_tensors_are_read_when_issued():
    seen = {}

    def program(ctx):
        t = torch.full((6,), float(ctx.rank + 1))
        work = ctx.comm.all_reduce(t, async_op=True)
        t += 100  # changed after the issue: the collective reduces what was issued
        seen[ctx.rank, "before"] = t.clone()
        assert work.wait() is t and work.is_completed()
        seen[ctx.rank, "after"] = t.clone()
        assert work.wait() is t  # waiting twice is harmless

    model, x, y = replicas()
    run_ranks(program, 2, [torch.nn.Identity(), torch.nn.Identity()], x, y)
    for rank in range(2):
        assert torch.equal(seen[rank, "before"], torch.full((6,), rank + 101.0))
        assert torch.equal(seen[rank, "after"], torch.full((6,), 3.0))


def test_every_collective_can_be_non_blocking_and_equals_the_blocking_one():
    got = {}

    def program(ctx):
        r, n = ctx.rank, ctx.world
        mine = torch.arange(5.0) + 10 * r
        works = {
            "gather": ctx.comm.all_gather(mine, async_op=True),
            "scatter": ctx.comm.reduce_scatter(torch.arange(6.0) * (r + 1), async_op=True),
            "to_all": ctx.comm.all_to_all(
                [torch.full((2,), 10.0 * r + d) for d in range(n)], async_op=True
            ),  # fmt: skip
            "mean": ctx.comm.all_reduce(
                [mine.clone(), mine[:2].clone()], op="mean", async_op=True
            ),  # fmt: skip
        }
        got[r] = {k: w.wait() for k, w in works.items()}
        got[r, "sync"] = ctx.comm.all_gather(mine)

    model, x, y = replicas()
    run = run_ranks(program, 3, [torch.nn.Identity() for _ in range(3)], x, y)
    for r in range(3):
        assert torch.equal(got[r]["gather"], got[r, "sync"])
        assert torch.equal(got[r]["scatter"], (torch.arange(6.0) * 6)[2 * r : 2 * r + 2])
        assert [t.tolist() for t in got[r]["to_all"]] == [[10.0 * s + r] * 2 for s in range(3)]
        assert torch.equal(got[r]["mean"][0], torch.arange(5.0) + 10)
    ops = [c["op"] for c in run.collectives[0]]
    assert ops == ["all_gather", "reduce_scatter", "all_to_all", "all_reduce", "all_gather"]
    assert [c["async"] for c in run.collectives[0]] == [True] * 4 + [False]


def test_a_collective_a_peer_never_joins_is_a_deadlock_naming_the_stream():
    def program(ctx):
        if ctx.rank == 0:
            with ctx.backward(0):
                work = ctx.comm.all_reduce(torch.ones(4), async_op=True)
            work.wait()

    model, x, y = replicas()
    before, t0 = set(threading.enumerate()), time.monotonic()
    with pytest.raises(RankError) as info:
        run_data_parallel(program, model, x, y, ranks=2)
    assert time.monotonic() - t0 < 2.0
    assert info.value.kind == "deadlock"
    message = str(info.value)
    assert "rank 0 (after 0B0) waits for its all_reduce #0 to finish" in message
    assert "rank 0's communication stream waits for rank 1's part of a collective" in message
    assert "rank 1 (before its first action) has finished" in message
    assert "stream has finished" not in message and "waits for work" not in message
    assert nothing_left(before)


def test_a_runaway_with_collectives_in_flight_leaves_no_thread():
    def program(ctx):
        ctx.comm.all_reduce(torch.ones(8), async_op=True)  # issued, never waited for
        if ctx.rank == 1:
            while True:
                pass

    model, x, y = replicas()
    before = set(threading.enumerate())
    with pytest.raises(RankError) as info:
        run_data_parallel(program, model, x, y, ranks=2, timeout=0.5)
    assert info.value.kind == "timeout"
    message = str(info.value)  # the ranks still running, not their threads
    assert "with rank 1 still running" in message and "rank 0 had finished" in message
    assert nothing_left(before), threading.enumerate()


def test_past_the_graders_time_limit_the_comm_threads_stop_too():
    def program(ctx):
        ctx.comm.all_reduce(torch.ones(8), async_op=True)
        while ctx.rank == 1:
            pass

    case = ProgramCase(devices=2, batch=4, hidden=8, seed=3)
    before, t0 = set(threading.enumerate()), time.monotonic()
    outcome = call_outcome(program, (case,), 1.0)
    assert "timeout" in outcome and time.monotonic() - t0 < 4.0
    assert nothing_left(before), threading.enumerate()


def test_a_rank_that_raises_after_issuing_stops_its_peers_streams():
    def program(ctx):
        work = ctx.comm.all_reduce(torch.ones(8), async_op=True)
        if ctx.rank == 0:
            raise ValueError("boom")
        work.wait()

    model, x, y = replicas()
    before = set(threading.enumerate())
    with pytest.raises(RankError, match="rank 0 raised ValueError: boom"):
        run_data_parallel(program, model, x, y, ranks=2)
    assert nothing_left(before)


def test_none_in_a_bucket_is_named():
    def program(ctx):
        ctx.comm.all_reduce([p.grad for p in ctx.stage.parameters()], async_op=True)

    model, x, y = replicas()
    with pytest.raises(RankError, match="passed None to all_reduce, not a tensor") as info:
        run_data_parallel(program, model, x, y, ranks=2)
    assert info.value.kind == "not a tensor"


def test_more_ranks_than_streams_run_their_collectives_in_the_open():
    assert async_comm.threads_for(8) == 8 and async_comm.threads_for(9) == 0
    data = [torch.full((3,), float(r)) for r in range(9)]

    def program(ctx, t):
        return ctx.comm.all_reduce(t, async_op=True).wait()

    run = run_collective(program, data)
    assert all(torch.equal(r, torch.full((3,), 36.0)) for r in run.extra["results"])
    assert {s.name for s in run.recorder.streams} == {"compute"}


def test_the_messages_replayed_without_compute_give_the_naive_formula():
    def naive(ctx, data):
        if ctx.rank == 0:
            for src in range(1, ctx.world):
                data += ctx.recv(src)
            for dst in range(1, ctx.world):
                ctx.send(data, to=dst)
            return data
        ctx.send(data, to=0)
        return ctx.recv(0)

    n, numel = 4, 1000
    run = run_collective(naive, [torch.randn(numel) for _ in range(n)])
    assert run.bytes_sent == naive_bytes_per_rank(numel, n)
    links = Links(8, 1e6, 1e5, 1e-5)
    log = decode(json.loads(json.dumps(encode(run.evidence()["messages"]))))
    want = 2 * (n - 1) * (1e-5 + 4 * numel / 1e6)
    assert replay_messages(log, links) == pytest.approx(want, rel=1e-9)


def test_ranks_that_end_together_are_never_taken_for_a_deadlock():
    """A rank's stream is told to stop before the rank counts as finished: else the last rank
    to finish could see every stream idle and nobody left to give them work. (Threads switch
    every microsecond here, so that the moment in between is hit if it exists.)"""
    import sys

    def last_one_late(ctx, t):
        if ctx.rank == ctx.world - 1:
            time.sleep(0.002)
        return t

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(100):
            run_collective(last_one_late, [torch.ones(1)] * 2)
    finally:
        sys.setswitchinterval(interval)
