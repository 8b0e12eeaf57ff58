"""What the Builds of Exercises 7.1 (a column-parallel layer) and 8.2 (ZeRO-2's step) add to
those of tests/test_rank_builds.py (which tries their mistakes, evidence and cases with the
other per-rank Builds): the right program's verdict says what the run measured, and each
check's cases make its mistakes show."""

from __future__ import annotations

import pytest
import splitprograms as sp

from course_utils.checks import CheckFailed, Variant, l07, l08
from course_utils.parallel.fsdp.zero_program import one_device_flats, run_zero_program


def test_the_verdicts_say_the_bytes_each_rank_sent(capsys):
    l07.exercise_1(sp.column)
    l08.exercise_2(sp.zero)
    out = capsys.readouterr().out
    assert "rank 0 sent 160 bytes" in out  # 3 ranks: two blocks of 5 tokens x 4 columns
    assert "each rank keeps 85 numbers of momentum instead of 253" in out


def test_a_mistake_seen_only_on_fresh_cases_earns_part_of_the_points():
    with pytest.raises(CheckFailed) as info:  # the learner's 3 ranks divide the columns
        l07.exercise_1(sp.column_chunked_grad, variant=Variant("s7", cases_seed="grader"))
    assert 0 < info.value.share < 1


def test_zero_steps_on_threads_equal_one_device_and_leave_the_model_as_it_was():
    from course_utils.checks.rank_cases import seeded_mlp

    model, x, y = seeded_mlp(4, 16, 9, 10, 1, 8)
    before = [p.detach().clone() for p in model.parameters()]
    run = run_zero_program(sp.zero, model, 4, x, y, steps=3)
    want = one_device_flats(model, x, y, steps=3)
    for watch in run.watches:
        assert all(got.allclose(w, atol=1e-6) for got, w in zip(watch.ctx.flats, want, strict=True))
    assert all(p.equal(b) for p, b in zip(model.parameters(), before, strict=True))
    with pytest.raises(ValueError, match="split evenly"):
        run_zero_program(sp.zero, model, 3, x, y)


def test_a_rank_that_leaves_a_group_is_named_within_seconds():
    import time

    start = time.monotonic()
    with pytest.raises(CheckFailed) as info:
        l07.exercise_5(sp.grid_rank0_leaves)
    said = str(info.value)
    assert "never finished: deadlock" in said and "waits for rank 0's part of a collective" in said
    assert "do the ranks agree on their groups?" in said and time.monotonic() - start < 10
