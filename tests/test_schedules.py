"""The schedules: every action once, dependencies kept, and what each device holds.

The closed forms (bubble, peak) are held to the simulator in test_registry.py, on cases
hypothesis draws, for every schedule of the registry."""

from __future__ import annotations

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from course_utils.actions import Action
from course_utils.errors import CourseInputError
from course_utils.parallel.timelines import data_parallel_timeline, dp_pp_timeline
from course_utils.pipeline.schedules import (
    SCHEDULES,
    gpipe,
    interleaved,
    make_schedule,
    naive,
    one_f_one_b,
    zb_h1,
)
from course_utils.pipeline.simulate import CostModel, simulate, validate

F, B = 1.0, 2.0


@st.composite
def shapes(draw):
    name = draw(st.sampled_from(list(SCHEDULES)))
    info = SCHEDULES[name]
    p = draw(st.integers(1, 8))
    m = draw(st.integers(1, 32))
    v = draw(st.integers(1, 4)) if info.uses_chunks else 1
    if name == "interleaved":
        m = p * draw(st.integers(1, max(1, 32 // p)))
    assume(info.shape_rule(p, m, v) is None)  # e.g. DualPipeV needs m >= 2p
    return name, p, m, v


def _check_complete(name: str, p: int, m: int, v: int, everything: list[Action]) -> None:
    """One F per stage and micro-batch, and its backward: B, or (split schedules) I then W.

    DualPipeV runs some backwards whole (B) where no bubble is left to fill with a W."""
    info = SCHEDULES[name]
    stages, mbs = p * info.chunks(v), (m if info.microbatched else 1)
    cells = {(s, i) for s in range(stages) for i in range(mbs)}
    assert {(a.stage, a.microbatch) for a in everything} == cells
    have = {(a.stage, a.microbatch, a.kind) for a in everything}
    for s, i in cells:
        assert (s, i, "F") in have
        split = (s, i, "I") in have and (s, i, "W") in have and (s, i, "B") not in have
        whole = (s, i, "B") in have and not {(s, i, "I"), (s, i, "W")} & have
        assert whole or (split and info.split_backward), f"stage {s}, micro-batch {i}"
    assert len(everything) == len(have)


def _expected_device(name: str, stage: int, p: int) -> int:
    """Looping placement (stage s on device s % p), or the V's fold (d and 2p-1-d on device d)."""
    info = SCHEDULES[name]
    if not info.uses_chunks and info.chunks_per_device == 2:
        return min(stage, 2 * p - 1 - stage)
    return stage % p


@settings(max_examples=80, deadline=None)
@given(shapes(), st.floats(0.1, 3), st.floats(0.1, 3), st.floats(0, 1), st.floats(0, 0.5))
@example(("dualpipe-v", 1, 2, 1), 1.0, 1.0, 0.0, 0.0)  # stage 0's I waits for stage 1's whole B
def test_every_schedule_is_complete_and_runs_in_dependency_order(shape, fwd, bwd, wf, p2p):
    name, p, m, v = shape
    sched = make_schedule(name, p, m, v)
    everything = [a for actions in sched.devices for a in actions]
    assert len(everything) == len(set(everything)), "an action appears twice"
    _check_complete(name, p, m, v, everything)
    assert all(
        _expected_device(name, a.stage, p) == d
        for d, actions in enumerate(sched.devices)
        for a in actions
    )
    assert validate(sched) == []

    timeline = simulate(sched, CostModel(fwd, bwd, wf, p2p))
    assert len(timeline.events) == len(everything)
    end = {e.action: e.end for e in timeline.events}
    start = {e.action: e.start for e in timeline.events}
    device = {e.action: e.device for e in timeline.events}
    last = sched.stages - 1
    for a in everything:
        s, i = a.stage, a.microbatch
        needs = []
        if a.kind == "F" and s > 0:
            needs = [Action(s - 1, "F", i)]
        elif a.kind in ("B", "I"):
            needs = [Action(s, "F", i)]
            if s < last:  # the gradient from the next stage, whole (B) or input-only (I):
                # DualPipeV splits some backwards and keeps others whole on the same stage
                after = [Action(s + 1, k, i) for k in ("B", "I") if Action(s + 1, k, i) in end]
                assert len(after) == 1, f"stage {s + 1} needs one backward of micro-batch {i}"
                needs += after
        elif a.kind == "W":
            needs = [Action(s, "I", i)]
        for n in needs:
            gap = p2p * sched.batch_scale if device[n] != device[a] else 0.0
            assert start[a] >= end[n] + gap - 1e-9, f"{a} started before {n} was done"
    for d in range(p):
        events = timeline.device_events(d)
        assert [e.action for e in events] == list(sched.devices[d]), "order not kept"
        for before, after in zip(events, events[1:], strict=False):
            assert after.start >= before.end - 1e-9, f"device {d} runs two actions at once"


@pytest.mark.parametrize("p, m", [(1, 4), (4, 8), (4, 2), (8, 32), (5, 3)])
def test_1f1b_holds_at_most_p_minus_d_microbatches_gpipe_holds_all(p, m):
    assert simulate(one_f_one_b(p, m)).peak_activations == [min(m, p - d) for d in range(p)]
    assert simulate(gpipe(p, m)).peak_activations == [m] * p


def test_naive_runs_one_device_at_a_time_on_the_whole_batch():
    p, m = 4, 8
    timeline = simulate(naive(p, m))
    assert timeline.makespan == pytest.approx(p * m * (F + B))
    assert timeline.bubble_fraction == pytest.approx(1 - 1 / p)
    assert timeline.peak_activations == [m] * p  # the whole batch, like GPipe
    # its actions number one micro-batch (0), each carrying all m
    assert naive(p, m).numbered == 1 and {a.microbatch for a in naive(p, m).devices[0]} == {0}
    assert make_schedule("1f1b", p, m).numbered == m


def test_interleaved_with_one_chunk_is_1f1b():
    assert interleaved(4, 8, 1).devices == one_f_one_b(4, 8).devices


@pytest.mark.parametrize("p, m", [(1, 3), (4, 8), (4, 2), (8, 32), (6, 5)])
def test_zb_h1_needs_no_more_activation_memory_than_1f1b(p, m):
    # Like the paper, every device may hold as many micro-batches as 1F1B's first device
    # (counting a micro-batch until its W is done), so the memory to provision per device
    # stays 1F1B's peak; device 0, which bounds it, holds exactly as much as in 1F1B.
    zb = simulate(zb_h1(p, m)).peak_activations
    f1b = simulate(one_f_one_b(p, m)).peak_activations
    assert max(zb) <= max(f1b)
    assert zb[0] == f1b[0]


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: make_schedule("pipedream", 4, 8), "schedule must be one of"),
        (lambda: make_schedule("gpipe", 0, 8), "devices must be an integer >= 1"),
        (lambda: make_schedule("gpipe", 4, -1), "microbatches must be an integer >= 1"),
        (lambda: make_schedule("1f1b", 4, 8, 2), "chunks > 1 works only with"),
        (lambda: make_schedule("interleaved", 4, 6, 2), "multiple of devices (4)"),
        (lambda: make_schedule("breadth-first", 2, 4, 0), "chunks must be an integer >= 1"),
        (lambda: gpipe(2.5, 4), "devices must be an integer"),
    ],
)
def test_bad_input_names_the_parameter(call, words):
    with pytest.raises(CourseInputError) as info:
        call()
    assert words in str(info.value)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------- data parallel timelines


def test_data_parallel_without_overlap_waits_for_the_whole_backward():
    t = data_parallel_timeline(4, 1.0, 2.0, grad_bytes=8e6, bandwidth=1e6, buckets=2)
    per_bucket = 2 * 3 / 4 * 4e6 / 1e6  # ring: 2(N-1)/N * bytes / bandwidth
    reduces = sorted(
        {(e.start, e.end, e.label) for e in t.events if e.action.kind == "REDUCE_GRAD"}
    )
    assert reduces == [
        (3.0, 3.0 + per_bucket, "all-reduce bucket 1"),
        (3.0 + per_bucket, 3.0 + 2 * per_bucket, "all-reduce bucket 2"),
    ]
    assert t.makespan == pytest.approx(3.0 + 2 * per_bucket)
    assert all(t.busy(w) == pytest.approx(3.0) for w in range(4))  # comm is not busy


def test_data_parallel_overlap_hides_buckets_behind_the_backward():
    args = dict(workers=4, compute_forward=1.0, compute_backward=4.0, grad_bytes=4e6)
    plain = data_parallel_timeline(**args, bandwidth=2e6, buckets=4, overlap=False)
    overlapped = data_parallel_timeline(**args, bandwidth=2e6, buckets=4, overlap=True)
    # 4 buckets of 1 MB: 0.75 s each. Bucket k is ready at 1 + k; only the last is exposed.
    assert overlapped.makespan == pytest.approx(5.0 + 0.75)
    assert plain.makespan == pytest.approx(5.0 + 4 * 0.75)
    assert overlapped.meta["exposed_communication"] < plain.meta["exposed_communication"]


def test_dp_pp_breadth_first_reduces_gradients_earlier_than_interleaved():
    kwargs = dict(
        devices=4,
        microbatches=8,
        chunks=2,
        dp_workers=4,
        grad_bytes_per_stage=4.0,
        bandwidth=1.0,
    )
    bfs = dp_pp_timeline("breadth-first", **kwargs)
    dfs = dp_pp_timeline("interleaved", **kwargs)
    # Same compute time (same bubble), but breadth-first hides most of its reduction.
    assert bfs.meta["compute_end"] == pytest.approx(dfs.meta["compute_end"])
    assert bfs.meta["exposed_reduction"] < dfs.meta["exposed_reduction"]
    assert bfs.makespan < dfs.makespan
    # Breadth-first starts reducing its later stages long before the compute ends.
    first = min(bfs.meta["reduction_start"].values())
    assert first < bfs.meta["compute_end"] - 2 * (F + B)
    for t in (bfs, dfs):
        comm = [e for e in t.events if e.action.kind == "REDUCE_GRAD"]
        assert len(comm) == 8 and all(e.label.startswith("all-reduce stage") for e in comm)
        for e in comm:  # a stage's reduction starts only after its last backward
            last_b = max(
                x.end for x in t.events if x.action.is_backward and x.action.stage == e.action.stage
            )
            assert e.start >= last_b - 1e-9
            assert e.device == e.action.stage % 4


def test_dp_pp_rejects_wrong_gradient_sizes():
    with pytest.raises(CourseInputError, match="one value per stage"):
        dp_pp_timeline("gpipe", 2, 4, 1, 2, grad_bytes_per_stage=[1.0], bandwidth=1.0)
