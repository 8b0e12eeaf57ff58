"""MoE block and expert parallelism: routing rules, equality with one device, timelines, CLI."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from course_utils.cli import OneLineParser
from course_utils.commands import moe as moe_command
from course_utils.errors import CourseInputError, WorkerError
from course_utils.parallel.moe import (
    ExpertParallel,
    MoE,
    MoECosts,
    all_to_all_bytes_per_worker,
    capacity,
    dropped_tokens,
    expert_params,
    fit_costs,
    load_balancing_loss,
    measured_expert_seconds,
    reference_step,
    route,
    simulate_moe,
    spread,
    tokens_per_expert,
    train_demo,
)

D, H = 6, 10


def _moe(experts=4, top_k=1, capacity_factor=None, skew=0.0, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return MoE(D, H, experts, top_k, capacity_factor, skew).to(dtype)


def _data(tokens, seed=1, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, D, generator=gen, dtype=dtype)
    return x, torch.randn(tokens, D, generator=gen, dtype=dtype)


def _max_diff(a, b):
    return (a - b).abs().max().item() if a.numel() else 0.0


def _step_diffs(ref, got):
    assert set(ref.grads) == set(got.grads)
    grads = max(_max_diff(ref.grads[n], got.grads[n]) for n in ref.grads)
    return _max_diff(ref.output, got.output), max(grads, _max_diff(ref.input_grad, got.input_grad))


# -- capacity and counts ------------------------------------------------------------------


@pytest.mark.parametrize(
    "tokens, experts, factor, k, expected",
    [
        (64, 4, 1.0, 1, 16),
        (64, 4, 1.25, 1, 20),
        (10, 4, 1.0, 1, 3),  # 2.5 rounds up
        (10, 1, 1.1, 1, 11),  # 1.1 x 10 is 11.000000000000002 in floats: still 11
        (64, 4, 1.25, 2, 40),  # top-2 doubles the slots (GShard, DeepSpeed)
        (7, 8, 0.5, 1, 1),
        (0, 4, 1.0, 1, 0),
        (13, 4, None, 2, 13),  # never drop: room for every token
    ],
)
def test_capacity_rounds_up(tokens, experts, factor, k, expected):
    assert capacity(tokens, experts, factor, k) == expected


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"capacity_factor": 0.0}, "capacity_factor"),
        ({"capacity_factor": float("nan")}, "capacity_factor"),
        ({"capacity_factor": float("inf")}, "capacity_factor"),
        ({"top_k": 3}, "top_k"),
        ({"experts": 0}, "experts"),
        ({"tokens": -1}, "tokens"),
    ],
)
def test_capacity_refuses_bad_input(kwargs, match):
    args = {"tokens": 8, "experts": 2, "capacity_factor": 1.0, "top_k": 1} | kwargs
    with pytest.raises(CourseInputError, match=match):
        capacity(**args)


def test_counts_by_hand():
    choices = [[0, 1], [0, 2], [0, 1], [3, 0]]
    assert tokens_per_expert(choices, 4) == [4, 2, 1, 1]
    kept = torch.tensor([[True, True], [True, False], [False, True], [True, True]])
    assert tokens_per_expert(choices, 4, kept) == [3, 2, 0, 1]
    assert dropped_tokens([5, 1, 0, 3], capacity=2) == 4
    assert dropped_tokens([5, 1, 0, 3], capacity=5) == 0
    with pytest.raises(CourseInputError, match="expert_index"):
        tokens_per_expert([[4]], 4)


# -- routing ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.integers(1, 30),
    experts=st.integers(2, 6),
    k=st.sampled_from([1, 2]),
    factor=st.sampled_from([None, 0.25, 0.5, 1.0, 1.3, 2.0]),
    seed=st.integers(0, 2**16),
)
def test_route_follows_the_rules(tokens, experts, k, factor, seed):
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(seed))
    r = route(logits, k, factor)
    probs = torch.softmax(logits, -1)
    cap = capacity(tokens, experts, factor, k)
    assert r.capacity == cap
    # the k experts with the largest probabilities, distinct, largest first
    assert torch.equal(r.expert, torch.topk(probs, k, dim=-1).indices)
    if k == 1:  # Switch: the gate is the probability itself
        assert torch.allclose(r.gate[:, 0], probs.max(-1).values)
    else:  # GShard: renormalised over the two choices
        assert torch.allclose(r.gate.sum(-1), torch.ones(tokens, dtype=r.gate.dtype))
    counts = r.counts()
    assert counts == tokens_per_expert(r.expert, experts)
    assert r.kept_counts() == [min(n, cap) for n in counts]
    assert r.dropped == dropped_tokens(counts, cap)
    for e in range(experts):
        token, gate = r.assignments(e)
        assert len(token) == min(counts[e], cap)
        slots = sorted(r.slot[r.expert == e].tolist())
        assert slots == list(range(counts[e]))  # a queue 0, 1, 2, ... per expert
        # first come, first served: first choices before any second choice, token order
        queue = [(j, t) for j in range(k) for t in range(tokens) if r.expert[t, j] == e]
        assert [t for _, t in queue[:cap]] == token.tolist()
        assert gate.tolist() == [r.gate[t, j].item() for j, t in queue[:cap]]


def test_balancing_loss_is_one_when_even_and_e_when_collapsed():
    even_probs = torch.full((8, 4), 0.25)
    assert load_balancing_loss(even_probs, torch.arange(8) % 4).item() == pytest.approx(1.0)
    collapsed = F.one_hot(torch.zeros(8, dtype=torch.long), 4).double()
    assert load_balancing_loss(collapsed, torch.zeros(8, dtype=torch.long)).item() == 4.0
    # by hand: f = (3/4, 1/4), P = column means
    probs = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.8, 0.2], [0.3, 0.7]])
    expected = 2 * (0.75 * 0.65 + 0.25 * 0.35)
    assert load_balancing_loss(probs, probs.argmax(-1)).item() == pytest.approx(expected)


# -- the single-device block ----------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(k=st.sampled_from([1, 2]), experts=st.integers(2, 5), seed=st.integers(0, 2**16))
def test_moe_without_drops_is_the_per_token_formula(k, experts, seed):
    moe = _moe(experts, k, None, seed=seed)
    x, _ = _data(9, seed + 1)
    out = moe(x.reshape(3, 3, D))  # any leading shape
    assert out.output.shape == (3, 3, D)
    assert out.dropped == 0
    with torch.no_grad():  # token by token, written independently of the module's batching
        for t in range(9):
            h = moe.norm(x[t])
            p = torch.softmax(moe.router(h), -1)
            top = torch.topk(p, k).indices
            gates = p[top] if k == 1 else p[top] / p[top].sum()
            y = x[t] + sum(g * moe.experts[int(e)](h) for g, e in zip(gates, top, strict=True))
            assert torch.allclose(out.output.reshape(9, D)[t], y, atol=1e-12)


def test_dropped_tokens_pass_through_unchanged():
    moe = _moe(experts=4, top_k=1, capacity_factor=0.5, skew=3.0)
    x, _ = _data(24)
    out = moe(x)
    assert out.capacity == [3]
    assert out.dropped > 0
    assert out.dropped == dropped_tokens(out.tokens_per_expert, 3)
    untouched = (out.output == x).all(dim=-1)
    assert int(untouched.sum()) == out.dropped  # exactly the dropped ones: y = x
    assert out.kept_per_expert == [min(n, 3) for n in out.tokens_per_expert]


def test_skew_sends_most_tokens_to_expert_zero():
    x, _ = _data(64)
    assert _moe(skew=4.0)(x).tokens_per_expert[0] > 48
    assert _moe(skew=0.0)(x).tokens_per_expert[0] < 48


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"top_k": 3}, "top_k"),
        ({"experts": 1, "top_k": 2}, "top_k"),
        ({"capacity_factor": -1.0}, "capacity_factor"),
        ({"skew": float("nan")}, "skew"),
        ({"experts": 65}, "experts"),
    ],
)
def test_moe_refuses_bad_configuration(kwargs, match):
    with pytest.raises(CourseInputError, match=match):
        _moe(**kwargs)


@pytest.mark.parametrize(
    "x, groups, match",
    [
        (torch.zeros(4, D + 1), 1, "shape"),
        (torch.zeros(D), 1, "shape"),
        (torch.zeros(2, D), 3, "at least one per group"),
        (torch.full((4, D), float("nan")), 1, "finite"),
        (torch.zeros(4, D), 0, "groups"),
    ],
)
def test_moe_refuses_bad_tokens(x, groups, match):
    with pytest.raises(CourseInputError, match=match):
        _moe(dtype=torch.float32)(x, groups=groups)


# -- expert parallelism equals one device ----------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    workers=st.integers(1, 4),
    per_worker=st.integers(1, 2),
    k=st.sampled_from([1, 2]),
    factor=st.sampled_from([None, 0.5, 1.0, 1.5]),
    extra_tokens=st.integers(0, 13),
    skew=st.sampled_from([0.0, 2.0]),
    aux_weight=st.sampled_from([0.0, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_expert_parallel_equals_one_device(
    workers, per_worker, k, factor, extra_tokens, skew, aux_weight, seed
):
    experts = workers * per_worker
    if k > experts:
        k = 1
    moe = _moe(experts, k, factor, skew, seed)
    tokens = workers + extra_tokens
    x, dy = _data(tokens, seed + 1)
    ref = reference_step(moe, x, dy, aux_weight, groups=workers)
    with ExpertParallel(moe, workers) as ep:
        got = ep.step(x, dy, aux_weight)
        assert ep.max_replica_diff() == 0.0  # all-reduced: the same bits everywhere
    out_diff, grad_diff = _step_diffs(ref, got)
    assert out_diff <= 1e-12 and grad_diff <= 1e-12  # float64; dropped tokens included
    assert got.aux_loss == pytest.approx(ref.aux_loss, abs=1e-12)
    assert got.dropped == ref.dropped
    assert got.tokens_per_expert == ref.tokens_per_expert
    assert got.kept_per_expert == ref.kept_per_expert
    assert got.routed == ref.routed and got.capacity == ref.capacity
    # bytes: the token all-to-alls move d_model doubles per token that leaves its worker
    dispatch = all_to_all_bytes_per_worker(got.routed, D, workers, element_size=8)
    combine = all_to_all_bytes_per_worker(got.routed, D, workers, 8, phase="combine")
    assert got.bytes_sent["dispatch"] == dispatch == got.bytes_sent["combine grad"]
    assert got.bytes_sent["combine"] == combine == got.bytes_sent["dispatch grad"]
    assert got.bytes_sent["counts"] == [(workers - 1) * per_worker * 8] * workers


def test_expert_parallel_in_float32_within_1e_5():
    moe = _moe(experts=4, top_k=2, capacity_factor=1.0, skew=1.0, dtype=torch.float32)
    x, dy = _data(40, dtype=torch.float32)
    ref = reference_step(moe, x, dy, aux_weight=0.01, groups=2)
    with ExpertParallel(moe, 2) as ep:
        got = ep.step(x, dy, aux_weight=0.01)
    assert ref.dropped > 0 and got.dropped == ref.dropped
    out_diff, grad_diff = _step_diffs(ref, got)
    assert out_diff <= 1e-5 and grad_diff <= 1e-5


def test_training_on_threads_keeps_the_same_parameters_as_one_device():
    moe = _moe(experts=4, top_k=2, capacity_factor=1.25, skew=1.0, seed=3)
    reference = _moe(experts=4, top_k=2, capacity_factor=1.25, skew=1.0, seed=3)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    with ExpertParallel(moe, 2) as ep:
        opts = [torch.optim.SGD(ep.parameters(w), lr=0.05) for w in range(2)]
        for step in range(3):
            x, dy = _data(16, seed=10 + step)
            ep.step(x, dy, aux_weight=0.1)
            for opt in opts:
                opt.step()
            ref_opt.zero_grad()
            out = reference(x, groups=2)
            ((out.output * dy).sum() + 0.1 * out.aux_loss).backward()
            ref_opt.step()
        state = ep.state_dict()
        copies = [ep.shards[w].router.weight for w in range(2)]
        assert torch.equal(copies[0], copies[1])  # the replicated router stays in sync
    expected = reference.state_dict()
    assert set(state) == set(expected)
    assert max(_max_diff(state[n], expected[n]) for n in state) <= 1e-12
    trained = zip(moe.parameters(), reference.parameters(), strict=True)
    assert max(_max_diff(p, q) for p, q in trained) > 0.0  # `moe` itself was not trained
    fresh = _moe(experts=4, top_k=2)
    fresh.load_state_dict(state)  # the gathered parameters load into a plain MoE


def test_measured_timeline_has_every_phase_in_order():
    moe = _moe(experts=4, top_k=1, skew=2.0, dtype=torch.float32)
    x, dy = _data(16, dtype=torch.float32)
    with ExpertParallel(moe, 2) as ep:
        got = ep.step(x, dy)
    tl = got.timeline
    assert tl.source == "measured" and tl.unit == "s" and tl.num_devices == 2
    for w, mine in enumerate((0, 1), start=0):
        events = tl.device_events(w)
        names = [(e.action.kind, e.label) for e in events]
        local = [2 * mine, 2 * mine + 1]
        assert names == [
            ("F", "router"),
            ("ALL_TO_ALL", "dispatch"),
            *[("F", f"expert {e}") for e in local],
            ("ALL_TO_ALL", "combine"),
            ("F", "weighted sum"),
            ("B", "weighted sum"),
            ("ALL_TO_ALL", "combine grad"),
            *[("B", f"expert {e}") for e in local],
            ("ALL_TO_ALL", "dispatch grad"),
            ("B", "router"),
            ("REDUCE_GRAD", "all-reduce"),
        ]
        expert_events = [e for e in events if e.label.startswith("expert")]
        assert [e.action.microbatch for e in expert_events] == local * 2  # coloured by expert
        for a, b in zip(events, events[1:], strict=False):
            assert a.start <= a.end <= b.start  # one thing at a time, in order
    # the skewed router loads worker 0 (experts 0, 1): counted, not timed
    received = tl.meta["received_per_expert"]
    assert received == got.kept_per_expert
    assert received[0] + received[1] > received[2] + received[3]


def test_moe_timelines_are_drawn_coloured_by_expert_and_never_claim_micro_batches():
    from course_utils.charts import gantt

    simulated = simulate_moe([[3, 1, 1, 1], [3, 1, 1, 1]], 2)
    fig = gantt.draw(simulated, pyplot=False, colour="expert")
    title = fig.axes[0].get_title(loc="left")
    assert title.startswith("expert parallel: E=4 experts on p=2 workers —")
    assert "m=" not in title and "micro-batch" not in title and "bubble" not in title
    assert fig.legends[0].get_title().get_text() == "colour = expert"
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "waiting for communication" in labels and not any("bubble" in t for t in labels)


def test_a_failing_expert_names_the_worker_and_the_phase_and_nothing_hangs(monkeypatch):
    moe = _moe(experts=4, top_k=2, dtype=torch.float32)
    x, dy = _data(12, dtype=torch.float32)
    with ExpertParallel(moe, 2, timeout=10.0) as ep:
        broken = ep.shards[1].experts[0]  # expert 2, on worker 1

        def explode(h):
            raise RuntimeError("out of memory (pretend)")

        monkeypatch.setattr(broken, "forward", explode)
        with pytest.raises(WorkerError, match=r"device 1 failed during expert 2 \(forward\)"):
            ep.step(x, dy)
        monkeypatch.undo()
        got = ep.step(x, dy)  # the next step runs cleanly after the failure
        ref = reference_step(moe, x, dy, groups=2)
        assert max(_step_diffs(ref, got)) <= 1e-5


def test_expert_parallel_refuses_bad_input():
    moe = _moe(experts=4, dtype=torch.float32)
    with pytest.raises(CourseInputError, match="workers must divide"):
        ExpertParallel(moe, 3)
    with pytest.raises(CourseInputError, match="workers"):
        ExpertParallel(moe, 0)
    with ExpertParallel(moe, 2) as ep:
        with pytest.raises(CourseInputError, match="at least one per worker"):
            ep.step(torch.zeros(1, D))
        with pytest.raises(CourseInputError, match="finite"):
            ep.step(torch.full((4, D), float("inf")))
        with pytest.raises(CourseInputError, match="grad_output"):
            ep.step(torch.zeros(4, D), torch.zeros(4, D + 1))
        with pytest.raises(CourseInputError, match="aux_weight"):
            ep.step(torch.zeros(4, D), aux_weight=float("nan"))


# -- sizes for the planner ------------------------------------------------------------------


def test_all_to_all_bytes_per_worker_by_hand():
    # worker 0 sends 3 tokens to expert 2 and 1 to expert 3 (both on worker 1); its own
    # experts' tokens stay home. Worker 1 sends 2 tokens to expert 0.
    routed = [[5, 0, 3, 1], [2, 0, 4, 4]]
    assert all_to_all_bytes_per_worker(routed, d_model=8, workers=2) == [128, 64]
    assert all_to_all_bytes_per_worker(routed, 8, 2, phase="combine") == [64, 128]
    with pytest.raises(CourseInputError, match="multiple of workers"):
        all_to_all_bytes_per_worker([[1, 2, 3], [1, 2, 3]], 8, 2)


@settings(max_examples=30, deadline=None)
@given(
    d=st.integers(1, 64),
    h=st.integers(1, 128),
    ep=st.integers(1, 8),
    per=st.integers(1, 4),
    k=st.sampled_from([1, 2]),
)
def test_expert_params_match_the_module_and_shard_over_ep(d, h, ep, per, k):
    experts = ep * per
    if k > experts:
        k = 1
    counts = expert_params(d, h, experts, ep, k)
    moe = MoE(d, h, experts, top_k=k)
    assert counts["total"] == sum(p.numel() for p in moe.parameters())
    assert counts["per_expert"] == sum(p.numel() for p in moe.experts[0].parameters())
    assert counts["per_worker"] * ep - counts["replicated"] * (ep - 1) == counts["total"]
    assert counts["active_per_token"] == k * counts["per_expert"] + counts["replicated"]


def test_expert_params_refuses_an_ep_that_does_not_divide_the_experts():
    with pytest.raises(CourseInputError, match="ep must divide"):
        expert_params(16, 32, experts=6, ep=4)


# -- the simulator ------------------------------------------------------------------------------


def test_simulated_straggler_by_hand():
    # 2 workers, experts 0, 1 on worker 0 and 2, 3 on worker 1; expert 0 gets 40 tokens.
    costs = MoECosts(router=0, router_backward=0, combine=0, combine_backward=0)
    tl = simulate_moe([40, 8, 8, 8], workers=2, costs=costs)
    # forward: worker 0 computes 48 tokens (48 units), worker 1 16; backward twice that
    assert tl.busy_per_device() == [48 * 3, 16 * 3]
    assert tl.makespan == 48 * 3  # everybody waits for worker 0 at every exchange
    combine = {e.device: e for e in tl.events if e.label == "combine"}
    assert combine[0].end == combine[1].end == 48  # worker 1 waits from 16 to 48
    assert combine[1].start == 16
    even = simulate_moe([16, 16, 16, 16], workers=2, costs=costs)
    assert even.makespan == 32 * 3 < tl.makespan
    assert even.bubble_fraction == 0.0 < tl.bubble_fraction
    # the router runs on every token a worker holds, dropped or not
    costs = MoECosts(router=1.0, router_backward=0, expert_forward=0, expert_backward=0)
    routers = simulate_moe([4, 4], 2, costs, tokens_per_worker=[10, 6]).busy_per_device()
    assert routers[0] - routers[1] == pytest.approx(4.0)


def test_simulated_communication_costs():
    costs = MoECosts(
        router=0,
        router_backward=0,
        expert_forward=0,
        expert_backward=0,
        combine=0,
        combine_backward=0,
        latency=1.0,
        per_byte=0.01,
    )
    # worker 0 sends 10 tokens of 4 floats (160 bytes) to expert 1; worker 1 sends none
    tl = simulate_moe([[0, 10], [0, 0]], workers=2, costs=costs, d_model=4, replicated_bytes=100)
    by = {(e.device, e.label): e.duration for e in tl.events}
    assert by[(0, "dispatch")] == pytest.approx(2 + 1.6)  # two exchanges: counts, tokens
    assert by[(1, "combine")] == pytest.approx(1 + 1.6)  # worker 1 sends the results back
    assert by[(0, "all-reduce")] == pytest.approx(2 * 1 / 2 * 100 * 0.01 + 2 * 1)


@pytest.mark.parametrize(
    "args, match",
    [
        (([1, 2, 3], 2), "multiple of workers"),
        (([[1, 2]], 2), "one row per worker"),
        (([1, -2], 2), "finite counts"),
        (([1, float("nan")], 2), "finite counts"),
        (([1, 2], 0), "workers"),
    ],
)
def test_simulate_refuses_bad_input(args, match):
    with pytest.raises(CourseInputError, match=match):
        simulate_moe(*args)


def test_fitted_costs_simulate_a_measured_step():
    moe = _moe(experts=4, top_k=1, skew=2.0, dtype=torch.float32)
    x, dy = _data(32, dtype=torch.float32)
    with ExpertParallel(moe, 2) as ep:
        got = ep.step(x, dy)
    costs = fit_costs(got)
    assert all(math.isfinite(v) and v >= 0 for v in vars(costs).values())
    assert costs.expert_forward > 0 and costs.expert_backward > 0
    sim = simulate_moe(got.routed, 2, costs, D, unit="s", tokens_per_worker=[16, 16])
    assert sim.unit == "s" and sim.makespan > 0
    measured = [(e.device, e.action, e.label) for e in got.timeline.events]
    simulated = [(e.device, e.action, e.label) for e in sim.events]
    assert sorted(measured, key=str) == sorted(simulated, key=str)  # the same phases
    with pytest.raises(CourseInputError, match="measured"):
        fit_costs(reference_step(moe, x, dy, groups=2))


def test_measured_expert_seconds_lay_out_each_expert_as_measured():
    moe = _moe(experts=4, top_k=1, skew=2.0, dtype=torch.float32)
    x, dy = _data(32, dtype=torch.float32)
    with ExpertParallel(moe, 2) as ep:
        got = ep.step(x, dy)
    seconds = measured_expert_seconds(got)
    assert len(seconds) == 4 and all(f > 0 and b > 0 for f, b in seconds)
    sim = simulate_moe(
        got.routed,
        2,
        fit_costs(got),
        D,
        unit="s",
        tokens_per_worker=[16, 16],
        expert_seconds=seconds,
    )
    for event in got.timeline.events:
        if event.action.microbatch is not None:  # an expert's forward or backward
            twin = [e for e in sim.events if (e.device, e.action) == (event.device, event.action)]
            assert len(twin) == 1 and twin[0].duration == pytest.approx(event.duration)
    with pytest.raises(CourseInputError, match="measured"):
        measured_expert_seconds(reference_step(moe, x, dy, groups=2))


def test_expert_seconds_by_hand():
    costs = MoECosts(router=0, router_backward=0, combine=0, combine_backward=0)
    # per-token costs would give expert 0 40 units; its measured 10 s forward wins
    tl = simulate_moe([40, 8, 8, 8], 2, costs, expert_seconds=[(10, 20), (1, 2), (3, 6), (4, 8)])
    assert tl.busy_per_device() == [11 + 22, 7 + 14]
    for bad, match in [
        ([(1, 2)] * 3, "one \\(forward, backward\\) pair"),
        ([(1, -2)] * 4, "expert_seconds"),
    ]:
        with pytest.raises(CourseInputError, match=match):
            simulate_moe([40, 8, 8, 8], 2, costs, expert_seconds=bad)


# -- training with and without the balancing loss ---------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_balancing_loss_evens_out_a_skewed_router(seed):
    balanced = train_demo(seed=seed)  # defaults: skew 2, aux_weight 1, 20 Adam steps
    unbalanced = train_demo(seed=seed, aux_weight=0.0)
    assert balanced.spread[0] == unbalanced.spread[0] > 0.8  # same skewed start
    assert max(balanced.spread[-3:]) < balanced.spread[0] - 0.3
    assert min(unbalanced.spread[-3:]) > unbalanced.spread[0] - 0.05
    assert balanced.aux_losses[-1] < balanced.aux_losses[0]
    assert balanced.losses[-1] < balanced.losses[0]  # and the task is still learned
    assert spread(balanced.tokens_per_expert[-1]) == balanced.spread[-1]


def test_spread_by_hand():
    assert spread([16, 16, 16, 16]) == 0.0
    assert spread([64, 0, 0, 0]) == 1.0
    assert spread([30, 10, 10, 14]) == 20 / 64


# -- the command line -----------------------------------------------------------------------------


def _cli(argv):
    parser = OneLineParser(prog="x")
    moe_command.add_arguments(parser)
    return moe_command.run(parser.parse_args(argv))


def test_cli_json(capsys):
    argv = ["--workers", "2", "--experts", "4", "--top-k", "2", "--capacity-factor", "0.75"]
    assert _cli([*argv, "--tokens", "32", "--skew", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["max_output_diff"] <= 1e-5 and result["max_grad_diff"] <= 1e-5
    assert result["dropped"] == result["dropped_one_device"] > 0
    assert result["capacity_per_worker"] == [capacity(16, 4, 0.75, 2)] * 2
    assert sum(result["tokens_per_expert"]) == 64  # 32 tokens x 2 choices
    assert result["bytes_sent_per_worker"]["dispatch"] == result["dispatch_bytes_predicted"]
    assert result["measured_step_s"] > 0 and result["simulated_step_s"] > 0


def test_cli_text(capsys):
    assert _cli(["--workers", "1", "--experts", "2", "--tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "max |output diff| vs one device" in out
    assert "dropped assignments: 0" in out
    assert "step time: measured" in out and "simulated" in out


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--workers", "3", "--experts", "4"], "--experts must be a multiple"),
        (["--workers", "9"], "--workers"),
        (["--top-k", "3"], "--top-k"),
        (["--experts", "1", "--workers", "1", "--top-k", "2"], "--top-k"),
        (["--capacity-factor", "nan"], "--capacity-factor"),
        (["--capacity-factor", "0"], "--capacity-factor"),
        (["--skew", "inf"], "--skew"),
        (["--tokens", "1"], "--tokens"),
        (["--tokens", "100000"], "--tokens"),
    ],
)
def test_cli_refuses_bad_input(argv, match):
    with pytest.raises(CourseInputError, match=match):
        _cli(argv)


def test_cli_rejects_non_numbers_with_exit_2():
    with pytest.raises(SystemExit) as info:
        _cli(["--workers", "two"])
    assert info.value.code == 2


def test_cli_validates_before_importing_torch():
    code = (
        "import sys\n"
        "from course_utils.cli import OneLineParser\n"
        "from course_utils.commands import moe\n"
        "from course_utils.errors import CourseInputError\n"
        "p = OneLineParser(prog='x'); moe.add_arguments(p)\n"
        "try:\n"
        "    moe.run(p.parse_args(['--workers', '3', '--experts', '4']))\n"
        "except CourseInputError:\n"
        "    print('torch' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- today's designs


def test_bias_steers_the_choice_and_not_the_gate():
    from course_utils.parallel.moe import biased_choice, expert_load, update_bias

    scores = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.45, 0.05], [0.2, 0.3, 0.5]])
    experts, gates = biased_choice(scores, torch.tensor([-0.1, 0.0, 0.0]))
    assert experts.flatten().tolist() == [0, 1, 2]  # token 1 switches to expert 1
    assert torch.equal(gates, scores.gather(-1, experts))  # the gate has no bias in it
    two, gates2 = biased_choice(scores, torch.zeros(3), top_k=2)
    assert torch.allclose(gates2.sum(-1), torch.ones(3))  # renormalised over the chosen
    load = expert_load(two, 3)
    assert load == [2, 3, 1]
    bias = update_bias(load, torch.zeros(3), 0.01)
    assert bias.tolist() == pytest.approx([0.0, -0.01, 0.01])  # mean load 2: equal, over, under


def test_bias_balancing_evens_a_frozen_skewed_router():
    from course_utils.parallel.moe import biased_choice, expert_load, update_bias

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(512, 4, generator=gen) + torch.tensor([2.0, 0.0, 0.0, 0.0])
    scores = torch.softmax(logits, dim=-1)
    bias = torch.zeros(4)
    first = None
    for _ in range(60):
        experts, _ = biased_choice(scores, bias)
        load = expert_load(experts, 4)
        first = first or max(load)
        bias = update_bias(load, bias, 0.02)
    assert first > 0.6 * 512 and max(load) < 0.35 * 512


def test_router_z_loss_is_the_mean_squared_logsumexp():
    from course_utils.parallel.moe import router_z_loss

    logits = torch.tensor([[0.0, 0.0], [1.0, 2.0]], requires_grad=True)
    z = router_z_loss(logits)
    want = (math.log(2) ** 2 + math.log(math.e + math.e**2) ** 2) / 2
    assert z.item() == pytest.approx(want)
    z.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    for bad in (torch.zeros(3), "x"):
        with pytest.raises(CourseInputError, match="logits must be"):
            router_z_loss(bad)


def test_router_z_loss_is_smallest_where_the_logsumexp_is_zero_not_at_zero_logits():
    from course_utils.parallel.moe import router_z_loss

    experts = 4
    flat = torch.full((1, experts), -math.log(experts), dtype=torch.float64)
    assert router_z_loss(flat).item() == pytest.approx(0.0, abs=1e-24)
    assert router_z_loss(torch.zeros(1, experts)).item() == pytest.approx(math.log(4) ** 2)
    # at its minimum its gradient is zero; at zero logits it pulls them down
    zeros = torch.zeros(1, experts, requires_grad=True)
    router_z_loss(zeros).backward()
    assert zeros.grad is not None and (zeros.grad > 0).all()
