"""A watched run (threads.watched): each collective's bytes per rank, each message named, and
the memory a program holds of what it was handed, by weak reference, never by RSS."""

from __future__ import annotations

import json

import buildprograms as programs
import pytest
import torch

from course_utils.checks.programs import AttentionCase, DispatchCase, ShardCase, held_at_peak
from course_utils.checks.wire import call_outcome, decode, encode
from course_utils.threads.rank_run import RankError
from course_utils.threads.watched import run_watched

N = 3


def nothing(ctx, watch):
    ctx.block = torch.ones(N, 4) * ctx.rank  # type: ignore[attr-defined]


def run(program, setup=nothing):
    return run_watched(program, N, setup)


def peak(watch) -> int:
    return held_at_peak(watch.evidence())[0]


def test_every_collective_is_written_down_with_the_bytes_it_sent_to_each_rank():
    def program(ctx):
        ctx.comm.all_gather(ctx.block)
        ctx.comm.reduce_scatter(ctx.block)
        ctx.comm.all_reduce(ctx.block)
        ctx.comm.all_to_all(list(ctx.block.split(1)))

    watches = run(program).watches
    row = 4 * 4  # one row of the block, float32
    right = lambda r, nbytes: [0 if d != (r + 1) % N else nbytes for d in range(N)]  # noqa: E731
    for r, w in enumerate(watches):
        kinds = [c[0] for c in w.collectives]
        assert kinds == ["all_gather", "reduce_scatter", "all_reduce", "all_to_all"]
        assert w.collectives[0][1] == right(r, 2 * 3 * row)  # the ring: N - 1 shards, right
        assert w.collectives[1][1] == right(r, 2 * row)  # N - 1 chunks of one row each
        assert w.collectives[3][1] == [0 if d == r else row for d in range(N)]
        assert w.collectives[3][2:] == ("float32", [4])


def test_memory_is_what_the_program_still_holds():
    def keeps(ctx):
        ctx.kept = [ctx.comm.all_gather(ctx.block) for _ in range(3)]

    def drops(ctx):
        for _ in range(3):
            ctx.comm.all_gather(ctx.block)

    def frees_the_storage(ctx):  # FSDP's way: the tensor stays, its storage goes
        for _ in range(3):
            full = ctx.comm.all_gather(ctx.block)
            full.untyped_storage().resize_(0)

    def saved_by_autograd(ctx):  # del'd, but autograd keeps it for the backward
        x = torch.ones(3 * N, 4, requires_grad=True)
        outs = []
        for _ in range(3):
            full = ctx.comm.all_gather(ctx.block)
            outs.append(x * full)
            del full

    gathered = 3 * N * 4 * 4
    assert [peak(w) for w in run(keeps).watches] == [3 * gathered] * N
    assert [peak(w) for w in run(drops).watches] == [gathered] * N
    assert [peak(w) for w in run(frees_the_storage).watches] == [gathered] * N
    assert [peak(w) for w in run(saved_by_autograd).watches] == [3 * gathered] * N


def test_messages_are_named_and_received_ones_held():
    def program(ctx):
        if ctx.rank == 0:
            ctx.send(ctx.block, to=1)
        elif ctx.rank == 1:
            ctx.kept = ctx.recv(0)

    def named(ctx, watch):
        nothing(ctx, watch)
        watch.name_message = lambda t: f"block{int(t[0, 0])}"

    watches = run(program, named).watches
    assert watches[0].messages == [(1, "block0", 48)]
    assert watches[1].buffers == [("a message from rank 0", 48)] and peak(watches[1]) == 48


def test_a_failure_is_raised_or_kept_and_a_stub_is_not_answered():
    def deadlock(ctx):
        ctx.recv((ctx.rank + 1) % N)

    with pytest.raises(RankError, match="deadlock"):
        run(deadlock)
    kept = run_watched(deadlock, N, nothing, raise_failure=False)
    assert kept.failure.kind == "deadlock"

    def stub(ctx):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        run(stub)


def test_a_program_without_a_batch_has_no_stages_to_misread():
    def program(ctx):
        return [hasattr(ctx, name) for name in ("inputs", "targets", "stage", "stages")]

    assert run(program).results == [[False] * 4] * N


@pytest.mark.parametrize(
    "case, program",
    [
        (ShardCase(devices=2, batch=4, hidden=8, seed=3), programs.fsdp_step),
        (AttentionCase(devices=2, tokens=3, dim=4, seed=3), programs.ring_attention),
        (
            DispatchCase(devices=2, experts=2, top_k=1, d_model=4, tokens=3, seed=3),
            programs.moe_layer,
        ),
    ],
    ids=lambda x: type(x).__name__,
)
def test_a_builds_case_crosses_and_its_record_comes_back_as_data(case, program):
    back = decode(json.loads(json.dumps(encode((case,)))))
    assert back == (case,) and repr(back) == repr((case,))  # Replay finds it by its repr
    outcome = call_outcome(program, back, 20)
    record = decode(json.loads(json.dumps(outcome["result"])))
    assert record["failure"] is None and len(record["watched"]) == 2
    with pytest.raises(ValueError, match=f"{type(case).__name__}.seed"):
        type(case)(**{**vars(case), "seed": 0})
