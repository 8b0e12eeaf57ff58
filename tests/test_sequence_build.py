"""What the Build of Exercise 9.1 (Megatron's sequence parallelism) adds to the per-rank
Builds' shared tests (tests/test_rank_builds.py: its mistakes, evidence and cases): the run
equals the unsplit block and leaves no hook behind, the verdict prints what the learner's run
sent and kept, a rank that skips a collective is named within seconds, and a mistake seen only
on the fresh cases earns part of the points."""

from __future__ import annotations

import time

import pytest
import seqprograms as seq
import torch

from course_utils.checks import CheckFailed, Variant, l09
from course_utils.checks.rank_cases import SequenceCase
from course_utils.parallel.sp_program import block_on_one_device, run_sequence_parallel, sp_shards


def test_the_run_equals_the_unsplit_block_and_each_layernorm_holds_its_tokens():
    norm, linear1, linear2, x, dy = SequenceCase(3, 7, 5, 9, 2).build()
    shards = sp_shards(norm, linear1, linear2, 3, 7)
    run = run_sequence_parallel(seq.sp, shards, x, dy)
    xr = x.clone().requires_grad_()
    y = block_on_one_device(norm, linear1, linear2, xr)
    y.backward(dy)
    assert torch.allclose(torch.cat(run.extra["outputs"]), y, atol=1e-5)
    assert torch.allclose(torch.cat(run.extra["input_grads"]), xr.grad, atol=1e-5)
    assert run.extra["norm_inputs"] == [[[3, 5]], [[2, 5]], [[2, 5]]]  # 7 tokens: 3, 2, 2
    assert all(not s.norm._forward_hooks and not s.up._forward_hooks for s in shards)
    # the gathers and scatters send what two ring all-reduces of the sequence would
    assert sum(run.bytes_sent) == 2 * 2 * 2 * 7 * 5 * 4


def test_the_verdict_prints_the_bytes_sent_and_the_tokens_held(capsys):
    l09.exercise_1(seq.sp)
    out = capsys.readouterr().out
    # the default block: 6 tokens of width 8 on 3 ranks: 2 x 2 x (2/3) x 48 floats
    assert "rank 0 sent 512 bytes, what tensor parallelism's two all-reduces send (512)" in out
    assert "its LayerNorm held 2 of the 6 tokens" in out


def test_a_rank_that_skips_the_reduce_scatter_is_named_within_seconds():
    skips = seq.edit(
        seq.SP,
        "skips",
        (
            "        return comm.reduce_scatter(partial, dim=0)",
            "        if comm.rank == 0:\n"
            "            return partial[: len(partial) // comm.world_size].clone()\n"
            "        return comm.reduce_scatter(partial, dim=0)",
        ),
    )
    start = time.monotonic()
    with pytest.raises(CheckFailed) as info:
        l09.exercise_1(skips)
    said = str(info.value)
    assert "never finished" in said and "Every rank calls the same collectives" in said
    assert time.monotonic() - start < 15


def test_a_mistake_seen_only_on_fresh_cases_earns_part_of_the_points():
    # g's backward cuts dL/dZ at multiples of tokens // world: right on the learner's 3 ranks,
    # which divide their tokens, wrong on the fresh cases' uneven shards
    floor = seq.edit(
        seq.SP,
        "floor",
        (
            "        return fctx.comm.reduce_scatter(grad, dim=0), None\n",
            "        n, r = fctx.comm.world_size, fctx.comm.rank\n"
            "        size = len(grad) // n\n"
            "        return fctx.comm.reduce_scatter(grad, dim=0, sizes=[size] * (n - 1)"
            " + [len(grad) - size * (n - 1)]), None\n",
        ),
    )
    with pytest.raises(CheckFailed) as info:
        l09.exercise_1(floor, variant=Variant("s7", cases_seed="grader"))
    assert 0 < info.value.share < 1
