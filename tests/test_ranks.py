"""run_ranks: a learner's per-rank program on the device threads, equal to one device, every
failure one message naming rank and action, and nothing left running after it."""

from __future__ import annotations

import json
import threading
import time

import pytest
import rankprograms as programs
import torch

from course_utils.checks.programs import ProgramCase
from course_utils.checks.wire import call_outcome, decode, encode
from course_utils.errors import CourseInputError
from course_utils.models import MLP, loss_fn, partition
from course_utils.threads.collectives import ring_bytes_per_rank
from course_utils.threads.rank_run import RankError
from course_utils.threads.ranks import run_ranks


def model_and_batch(depth=3, batch=8, seed=0):
    torch.manual_seed(seed)
    model = MLP(16, 32, 10, depth)
    x, y = model.example_batch(batch, torch.Generator().manual_seed(seed))
    return model, x, y


def one_device(model, x, y, stages):
    """{"stage.name": gradient} of the whole batch on one thread."""
    model.zero_grad(set_to_none=True)
    loss_fn(model(x), y).backward()
    grads = {
        f"{s}.{n}": p.grad.clone() for s, st in enumerate(stages) for n, p in st.named_parameters()
    }
    model.zero_grad(set_to_none=True)
    return grads


def same_grads(run, want) -> bool:
    got = {k: g for per_rank in run.grads for k, g in per_rank.items()}
    return got.keys() == want.keys() and all(
        torch.allclose(got[k], want[k], rtol=1e-5, atol=1e-6) for k in want
    )


def nothing_left(before: set) -> bool:
    return set(threading.enumerate()) <= before


def gpipe(ctx):
    """All forwards, then all backwards, over any number of ranks and micro-batches."""
    r, last = ctx.rank, ctx.world - 1
    ins, outs = [], []
    for mb in range(ctx.microbatches):
        x = ctx.inputs[mb] if r == 0 else ctx.recv(r - 1, tag=("act", mb)).requires_grad_()
        with ctx.forward(mb):
            out = ctx.stage(x)
            out = ctx.loss(out, mb) if r == last else out
        if r < last:
            ctx.send(out, r + 1, tag=("act", mb))
        ins.append(x)
        outs.append(out)
    for mb in range(ctx.microbatches):
        grad = None if r == last else ctx.recv(r + 1, tag=("grad", mb))
        with ctx.backward(mb):
            torch.autograd.backward(outs[mb], grad)
        if r > 0:
            ctx.send(ins[mb].grad, r - 1, tag=("grad", mb))


def one_at_a_time(ctx):
    """Micro-batch after micro-batch, each forward and backward before the next."""
    r, last = ctx.rank, ctx.world - 1
    for mb in range(ctx.microbatches):
        x = ctx.inputs[mb] if r == 0 else ctx.recv(r - 1).requires_grad_()
        with ctx.forward(mb):
            out = ctx.stage(x)
            out = ctx.loss(out, mb) if r == last else out
        if r < last:
            ctx.send(out, r + 1)
        grad = None if r == last else ctx.recv(r + 1)
        with ctx.backward(mb):
            torch.autograd.backward(out, grad)
        if r > 0:
            ctx.send(x.grad, r - 1)


# --------------------------------------------------------------------------- right programs


def test_the_naive_program_equals_one_device_and_says_what_it_did():
    model, x, y = model_and_batch()
    stages = partition(model, 2)
    before = set(threading.enumerate())
    run = run_ranks(programs.naive, 2, stages, x, y)
    assert nothing_left(before)
    assert same_grads(run, one_device(model, x, y, stages))
    assert [[str(a) for a in acts] for acts in run.actions] == [["0F0", "0B0"], ["1F0", "1B0"]]
    handed = 8 * 32 * 4  # one activation of the batch, float32
    assert run.bytes_sent == run.bytes_received == [handed, handed]
    assert run.sends == [[(1, "None", handed, "0F0")], [(0, "None", handed, "1B0")]]
    assert run.losses[0] == pytest.approx(loss_fn(model(x), y).item(), rel=1e-6)
    assert all(b > 0 for b in run.saved_bytes) and run.saved_microbatches == [1, 1]
    kinds = [str(e.action) for e in run.timeline.events]
    assert {"0F0", "0SEND_F0", "1F0", "1B0", "1SEND_B0", "0B0"} == set(kinds)
    evidence = decode(json.loads(json.dumps(encode(run.evidence()))))
    assert evidence["bytes_sent"] == run.bytes_sent and evidence["failure"] is None
    assert torch.equal(evidence["grads"][0]["0.0.0.weight"], run.grads[0]["0.0.0.weight"])


@pytest.mark.parametrize("devices, microbatches", [(2, 4), (3, 2), (4, 1)])
def test_a_pipeline_of_any_size_equals_one_device(devices, microbatches):
    model, x, y = model_and_batch(depth=4)
    stages = partition(model, devices)
    run = run_ranks(gpipe, devices, stages, x, y, microbatches)
    assert same_grads(run, one_device(model, x, y, stages))
    assert [len(a) for a in run.actions] == [2 * microbatches] * devices


def test_saved_activations_count_the_micro_batches_a_schedule_holds():
    model, x, y = model_and_batch(depth=4, batch=16)
    stages = partition(model, 2)
    held = run_ranks(gpipe, 2, stages, x, y, 4)
    one = run_ranks(one_at_a_time, 2, stages, x, y, 4)
    assert held.saved_microbatches == [4, 4] and one.saved_microbatches == [1, 1]
    for rank in range(2):  # all four micro-batches' activations at once, or one's
        assert held.saved_bytes[rank] == 4 * one.saved_bytes[rank] > 0
    # parameters are not activations: a stage that saves nothing but its weights holds 0
    lone = [torch.nn.Linear(16, 10, bias=False)]
    run = run_ranks(lambda ctx: ctx.loss(ctx.stage(ctx.inputs[0]), 0), 1, lone, x, y)
    assert run.saved_bytes == [0]  # (outside `with ctx.forward`: nothing is counted)


def test_ranks_owning_several_chunks_number_actions_by_stage():
    model, x, y = model_and_batch(depth=3)
    stages = partition(model, 4)  # rank 0 holds stages 0 and 2, rank 1 stages 1 and 3

    def looped(ctx):
        x = ctx.inputs[0]
        keep = []
        for chunk, stage in enumerate(ctx.stages):
            if ctx.stage_ids[chunk] > 0:
                x = ctx.recv(1 - ctx.rank, tag=("act", chunk)).requires_grad_()
            with ctx.forward(0, chunk):
                out = stage(x)
            if ctx.stage_ids[chunk] == 3:
                out = ctx.loss(out, 0)
            else:
                ctx.send(out, 1 - ctx.rank, tag=("act", chunk + ctx.rank))
            keep.append((x, out))
        for chunk in reversed(range(2)):
            x, out = keep[chunk]
            last = ctx.stage_ids[chunk] == 3
            grad = None if last else ctx.recv(1 - ctx.rank, tag=("grad", chunk + ctx.rank))
            with ctx.backward(0, chunk):
                torch.autograd.backward(out, grad)
            if ctx.stage_ids[chunk] > 0:
                ctx.send(x.grad, 1 - ctx.rank, tag=("grad", chunk))

    run = run_ranks(looped, 2, stages, x, y)
    assert same_grads(run, one_device(model, x, y, stages))
    assert [[str(a) for a in acts] for acts in run.actions] == [
        ["0F0", "2F0", "2B0", "0B0"],
        ["1F0", "3F0", "3B0", "1B0"],
    ]


def test_collectives_go_through_the_communicator_and_count_their_bytes():
    model, x, y = model_and_batch()

    def ring(ctx):
        t = torch.full((10,), float(ctx.rank + 1))
        ctx.comm.all_reduce(t)
        assert torch.equal(t, torch.full((10,), 6.0))

    run = run_ranks(ring, 3, partition(model, 3), x, y)
    assert run.bytes_sent == ring_bytes_per_rank(10, 3)


def test_a_message_is_a_copy_without_its_graph():
    model, x, y = model_and_batch()
    seen = {}

    def program(ctx):
        if ctx.rank == 0:
            out = ctx.stage(ctx.inputs[0])
            ctx.send(out, to=1)
            out.data.zero_()  # the sender changes its tensor after sending
        else:
            got = ctx.recv(0)
            seen["graph"], seen["grad"], seen["zero"] = (
                got.grad_fn,
                got.requires_grad,
                got.abs().sum() == 0,
            )

    run_ranks(program, 2, partition(model, 2), x, y)
    assert seen == {"graph": None, "grad": False, "zero": False}


# --------------------------------------------------------------------------- failures


def expect_failure(program, kind, *words, devices=2, **kwargs):
    model, x, y = model_and_batch()
    before = set(threading.enumerate())
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        run_ranks(program, devices, partition(model, devices), x, y, **kwargs)
    took = time.monotonic() - t0
    assert info.value.kind == kind, str(info.value)
    message = str(info.value)
    for word in words:
        assert word in message, (word, message)
    assert "Traceback" not in message and "File " not in message
    assert info.value._render_traceback_() == [f"RankError: {message}"]
    assert nothing_left(before)
    return message, took


def test_a_deadlock_is_one_message_within_two_seconds():
    message, took = expect_failure(
        programs.recvs_swapped,
        "deadlock",
        "rank 0 (after 0F0) waits for a message from rank 1",
        "rank 1 (before its first action) waits for a message from rank 0",
    )
    assert took < 2.0, took


def test_a_collective_one_rank_skips_is_a_deadlock():
    def skips(ctx):
        if ctx.rank == 0:
            ctx.comm.all_reduce(torch.ones(4))

    expect_failure(skips, "deadlock", "rank 0", "part of a collective", "rank 1")


def test_a_rank_that_raises_is_named_with_its_action_and_its_own_line():
    expect_failure(
        programs.output_backward,
        "raised",
        "rank 0 raised RuntimeError: grad can be implicitly created only for scalar outputs",
        "out.backward()",
        "(in 0B0)",
    )


TAGS = [
    ("to itself", lambda c: c.rank or c.send(c.inputs[0], 0), "peer",
     ["rank 0 sent a message to rank 0; the other ranks are 1"]),
    ("unreceived", lambda c: c.rank or c.send(c.inputs[0], 1, tag="act"), "unreceived",
     ["rank 0 ended with 1 message(s) to rank 1 that nobody received", "tagged 'act'"]),
    ("not a tensor", lambda c: c.rank or c.send(None, 1), "not a tensor", ["rank 0 sent None"]),
    ("no such rank", lambda c: c.rank or c.recv(5), "peer", ["waited for a message from rank 5"]),
]  # fmt: skip


@pytest.mark.parametrize("name, program, kind, words", TAGS, ids=[t[0] for t in TAGS])
def test_bad_messages_are_named(name, program, kind, words):
    expect_failure(program, kind, *words)


def test_a_receive_out_of_order_is_caught_by_its_tag_and_a_wrong_shape_by_its_shape():
    def swapped(ctx):
        if ctx.rank == 0:
            with ctx.forward(0):
                out = ctx.stage(ctx.inputs[0])
            ctx.send(out, 1, tag=("act", 0))
            ctx.send(out, 1, tag=("act", 1))
        else:
            ctx.recv(0, tag=("act", 1))

    expect_failure(
        swapped,
        "tag",
        "rank 1 expected a message tagged ('act', 1) from rank 0",
        "tagged ('act', 0) (sent after 0F0)",
        "receives must come in the order of the sends",
    )

    def misshapen(ctx):
        if ctx.rank == 0:
            ctx.send(torch.zeros(3, 5), 1)
        else:
            ctx.recv(0, shape=(8, 32))

    expect_failure(misshapen, "shape", "expected shape (8, 32) from rank 0, got (3, 5)")


def test_actions_are_checked_where_they_are_opened():
    def nested(ctx):
        with ctx.forward(0), ctx.backward(0):
            pass

    expect_failure(nested, "call", "started 0B0 inside another action (in 0F0)", devices=1)
    expect_failure(lambda c: c.forward(3).__enter__(), "call", "named micro-batch 3", devices=1)


def test_a_stub_raises_not_implemented_and_bad_arguments_one_line():
    model, x, y = model_and_batch()
    with pytest.raises(NotImplementedError):
        run_ranks(programs.stub, 2, partition(model, 2), x, y)
    with pytest.raises(CourseInputError, match="placement"):
        run_ranks(programs.naive, 2, partition(model, 2), x, y, placement=[[0], [0]])
    with pytest.raises(CourseInputError, match="microbatches"):
        run_ranks(programs.naive, 2, partition(model, 2), x, y, microbatches=3)


# --------------------------------------------------------------------------- runaways


def test_a_runaway_is_stopped_at_the_time_limit_with_no_thread_left():
    expect_failure(
        programs.forever,
        "timeout",
        "timed out after 0.5 s with rank 0, 1 still running and were stopped",
        "rank 0 was waiting for a message from rank 1 (before its first action)",
        "rank 1 was running (before its first action)",
        timeout=0.5,
    )


def test_past_the_graders_time_limit_the_threads_are_stopped_and_the_next_case_passes():
    from course_utils.checks import l01

    case = ProgramCase(devices=2, batch=4, hidden=8, seed=3)
    before = set(threading.enumerate())
    t0 = time.monotonic()
    outcome = call_outcome(programs.forever, (case,), 1.0)  # as the grader's kernel calls it
    assert "timeout" in outcome and time.monotonic() - t0 < 4.0
    assert nothing_left(before), threading.enumerate()
    outcome = call_outcome(programs.naive, (case,), 5.0)
    evidence = decode(json.loads(json.dumps(outcome["result"])))
    assert evidence["failure"] is None and l01 is not None
    assert nothing_left(before)


@pytest.mark.slow  # a busy loop beside the test for a few seconds
def test_the_solution_passes_on_one_core_beside_a_busy_loop(capsys):
    from checkskit import beside_a_busy_loop

    from course_utils.checks import l01

    with beside_a_busy_loop():  # the ranks' threads share this thread's core too
        l01.exercise_7(programs.naive)
    assert capsys.readouterr().out.startswith("✅ Right")
