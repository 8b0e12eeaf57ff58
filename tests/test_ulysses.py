"""Ulysses on threads: equal to full attention, bytes equal to the formula, and the limits."""

from __future__ import annotations

import json

import pytest
import torch

from course_utils.charts import gantt
from course_utils.errors import CourseInputError
from course_utils.parallel.context_parallel import (
    RingAttention,
    UlyssesAttention,
    attention,
    attention_activation_bytes,
    check_ulysses_degree,
    ring_bytes_per_worker,
    ulysses_activation_bytes,
    ulysses_bytes_per_worker,
    ulysses_max_degree,
)


def reference(q, k, v, dout, causal):
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = attention(*leaves, causal=causal)
    out.backward(dout)
    return out.detach(), [t.grad for t in leaves]


def inputs(shape, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen, dtype=dtype) for _ in range(4)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("workers, shape", [(2, (4, 32, 8)), (4, (8, 64, 4)), (4, (2, 4, 16, 8))])
def test_ulysses_equals_full_attention_in_float64(workers, shape, causal):
    q, k, v, dout = inputs(shape)
    with UlyssesAttention(workers, causal=causal) as ulysses:
        result = ulysses.forward_backward(q, k, v, dout)
    out, grads = reference(q, k, v, dout, causal)
    assert (result.out - out).abs().max().item() < 1e-12
    for got, want in zip((result.dq, result.dk, result.dv), grads, strict=True):
        assert (got - want).abs().max().item() < 1e-12
    assert result.heads_per_worker == shape[-3] // workers


@pytest.mark.parametrize("workers, heads, seq, dim", [(2, 4, 32, 8), (4, 8, 64, 4), (8, 8, 64, 2)])
def test_bytes_per_worker_equal_the_formula(workers, heads, seq, dim):
    q, k, v, dout = inputs((heads, seq, dim), dtype=torch.float32)
    with UlyssesAttention(workers) as ulysses:
        result = ulysses.forward_backward(q, k, v, dout)
        forward_only = ulysses.forward(q, k, v)
    want = ulysses_bytes_per_worker(seq, workers, heads, dim, element_size=4)
    assert result.bytes_forward == [want["forward"]] * workers
    assert result.bytes_backward == [want["backward"]] * workers
    assert forward_only.bytes_backward == [0] * workers and forward_only.dq is None
    # (N-1)/N of each worker's q, k, v and output leave it: 4 (N-1)/N x (L/N) H D e
    assert want["forward"] == 4 * (workers - 1) * (seq // workers) * heads * dim * 4 // workers


def test_ulysses_sends_less_than_the_ring_and_less_with_more_workers():
    heads, seq, dim = 8, 256, 16
    q, k, v, dout = inputs((heads, seq, dim), dtype=torch.float32)
    with UlyssesAttention(4) as ulysses, RingAttention(4) as ring:
        u = ulysses.forward_backward(q, k, v, dout)
        r = ring.forward_backward(q, k, v, dout)
    assert u.bytes_forward[0] < r.bytes_forward[0] and u.bytes_backward[0] < r.bytes_backward[0]
    ring_total = [sum(ring_bytes_per_worker(seq, n, heads, dim).values()) for n in (2, 4, 8)]
    ulysses_total = [sum(ulysses_bytes_per_worker(seq, n, heads, dim).values()) for n in (2, 4, 8)]
    assert ring_total[0] < ring_total[1] < ring_total[2]  # nearly constant forward, more hops
    assert ulysses_total[0] > ulysses_total[1] > ulysses_total[2]  # shrinks like 1/N


def test_grouped_query_attention_shrinks_the_kv_traffic_and_the_degree():
    seq, dim, heads, kv = 1024, 128, 32, 8
    mha = ulysses_bytes_per_worker(seq, 8, heads, dim, 2)["forward"]
    gqa = ulysses_bytes_per_worker(seq, 8, heads, dim, 2, kv_heads=kv)["forward"]
    assert gqa * 4 == mha * (2 * heads + 2 * kv) // heads  # k, v carry kv heads, q and out all
    ring_mha = ring_bytes_per_worker(seq, 8, heads, dim, 2)["forward"]
    ring_gqa = ring_bytes_per_worker(seq, 8, kv, dim, 2)["forward"]  # the ring sends only K/V
    assert ring_mha == 4 * ring_gqa
    assert ulysses_max_degree(heads) == 32 and ulysses_max_degree(heads, kv) == 8
    with pytest.raises(CourseInputError, match="must divide the 8 K/V heads"):
        ulysses_bytes_per_worker(seq, 16, heads, dim, 2, kv_heads=kv)


def test_memory_score_term_shrinks_like_one_over_n_against_the_rings_n_squared():
    seq, heads, dim = 8192, 8, 64
    assert ulysses_activation_bytes(seq, 1, heads, dim, 2) > attention_activation_bytes(
        seq, 1, heads, dim, 2
    )
    for n in (2, 4, 8):
        t = seq // n
        u = ulysses_activation_bytes(seq, n, heads, dim, 2)
        assert u == 2 * heads * (8 * t * dim + t + 2 * n * t * t)
        assert u > attention_activation_bytes(seq, n, heads, dim, 2)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: check_ulysses_degree(3, 8), "workers must divide the 8 heads for Ulysses"),
        (lambda: ulysses_bytes_per_worker(102, 4, 8, 16), "seq must be a multiple of workers"),
        (lambda: ulysses_max_degree(8, 3), "kv_heads \\(3\\) must divide heads \\(8\\)"),
        (lambda: UlyssesAttention(0), "workers must be an integer from 1"),
        (lambda: UlyssesAttention(2, timeout=-1), "timeout must be"),
    ],
)
def test_bad_input_is_one_line(call, message):
    with pytest.raises(CourseInputError, match=message) as info:
        call()
    assert "\n" not in str(info.value)


def test_inputs_are_checked_before_any_thread_work():
    with UlyssesAttention(4) as ulysses:
        q = torch.randn(6, 32, 8)  # 6 heads on 4 workers
        with pytest.raises(CourseInputError, match="must divide the 6 heads"):
            ulysses.forward(q, q, q)
        q = torch.randn(8, 30, 8)
        with pytest.raises(CourseInputError, match="seq must be a positive multiple"):
            ulysses.forward(q, q, q)
        with pytest.raises(CourseInputError, match="heads, seq, dim"):
            ulysses.forward(torch.randn(32, 8), torch.randn(32, 8), torch.randn(32, 8))
        q = torch.randn(8, 32, 8)
        assert ulysses.forward(q, q, q).out.shape == q.shape  # still usable


def test_timeline_has_the_four_all_to_alls_and_draws():
    q, k, v, dout = inputs((4, 32, 8), dtype=torch.float32)
    with UlyssesAttention(2, causal=True) as ulysses:
        result = ulysses.forward_backward(q, k, v, dout)
    for d in range(2):
        kinds = [e.action.kind for e in result.timeline.device_events(d)]
        assert kinds == ["ALL_TO_ALL", "F", "ALL_TO_ALL", "ALL_TO_ALL", "B", "ALL_TO_ALL"]
    assert all(s > 0 for s in result.compute_seconds)
    assert gantt.draw(result.timeline, pyplot=False).axes


@pytest.mark.parametrize("causal", [False, True])
def test_command_reports_ulysses_as_json(run_cli, causal):
    flags = ["--causal"] if causal else []
    out = run_cli("context-parallel", "--ulysses", "--workers", 2, "--seq", 64, "--json", *flags)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["method"] == "ulysses" and data["causal"] is causal
    assert data["max_output_diff"] < 1e-12 and data["max_grad_diff"] < 1e-12
    sent, formula = data["bytes_all_to_all_per_worker"], data["bytes_formula"]
    assert sent["forward"] == [formula["forward"]] * 2
    assert sent["backward"] == [formula["backward"]] * 2
    assert formula["forward"] + formula["backward"] < sum(data["ring_bytes_formula"].values())


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--zigzag"], "--zigzag does not apply to --ulysses"),
        (["--zigzag", "--causal"], "--zigzag does not apply to --ulysses"),
        (["--workers", 3, "--seq", 96], "--workers must divide --heads for --ulysses"),
    ],
)
def test_command_refuses_what_ulysses_cannot_do_in_one_line(run_cli, flags, needle):
    out = run_cli("context-parallel", "--ulysses", *flags)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and needle in out.stderr


# --------------------------------------------------------------------------- the planner


def test_planner_counts_ulysses_traffic_and_memory_with_the_modules_formulas():
    from course_utils import plan

    model = plan.ModelShape(params=50_000_000, layers=4, hidden=1024, heads=16, seq=4096)
    e, tp, cp = 2, 2, 4
    config = plan.Config(tp=tp, cp=cp, cp_kind="ulysses", sequence_parallel=True)
    heads, dim = model.heads // tp, model.hidden // model.heads
    per_layer = ulysses_bytes_per_worker(model.seq, cp, heads, dim, e)
    want = model.layers * (per_layer["forward"] + per_layer["backward"])
    assert plan.traffic(model, config)["context"] == pytest.approx(want)
    ring = plan.traffic(model, plan.replace_config(config, cp_kind="ring"))["context"]
    assert ring > want  # the all-to-all sends less than the ring at this degree
    whole = ulysses_activation_bytes(model.seq, cp, heads, dim, e)
    kept = e * heads * 4 * (model.seq // cp) * dim
    assert plan.buffers(model, config)["attention in flight"] == pytest.approx(whole - kept)
    assert "cp=4(ulysses)" in config.short()


def test_planner_refuses_a_ulysses_degree_beyond_the_heads():
    from course_utils import plan

    model = plan.ModelShape(params=50_000_000, layers=4, hidden=1024, heads=16, seq=4096)
    with pytest.raises(CourseInputError, match="must divide the 4 heads of a tensor-parallel GPU"):
        plan.memory(model, plan.Config(tp=4, cp=8, cp_kind="ulysses", sequence_parallel=True))
    with pytest.raises(CourseInputError, match="cp_kind must be one of ring, ulysses"):
        plan.memory(model, plan.Config(cp=2, cp_kind="striped"))
    result = plan.search(model, 64, 64, cp_kind="ulysses")
    reasons = [r for c, r in result["rejected"] if isinstance(c, dict) and "cp" in c]
    assert any("of the all-to-all computes whole heads" in r for r in reasons)
    assert all(e.config.cp_kind == "ulysses" for e in result["feasible"])
    assert any(e.config.cp > 1 for e in result["feasible"])


def test_plan_command_takes_cp_kind(run_cli):
    shape = ["--params", "50M", "--layers", 4, "--hidden", 1024, "--heads", 16, "--seq", 4096]
    out = run_cli("plan", "memory", *shape, "--cp", 4, "--cp-kind", "ulysses", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["config"]["cp_kind"] == "ulysses"
    bad = run_cli("plan", "memory", *shape, "--tp", 4, "--cp", 8, "--cp-kind", "ulysses")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Ulysses" in bad.stderr
