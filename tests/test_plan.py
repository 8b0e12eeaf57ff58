"""The planner against published figures, its own formulas, the simulator, and its CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_module
from hypothesis import given, settings
from hypothesis import strategies as st

from course_utils import plan
from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import SCHEDULES, Case

ROOT = Path(__file__).resolve().parents[1]
GB = 1e9  # the ZeRO paper's GB


@pytest.fixture
def cli(run_cli):
    """`python -m course_utils plan ARGS...` in this process: (returncode, stdout, stderr)."""
    return lambda *args: run_cli("plan", *args)


# --------------------------------------------------------------------------- published figures


@pytest.mark.parametrize(
    "zero, published_gb",
    [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)],
)
def test_zero_paper_figure_1(zero, published_gb):
    # Rajbhandari et al. 2019 (arXiv 1910.02054; SC 2020), Figure 1: 7.5B parameters, Nd = 64.
    states = plan.model_state_bytes(7.5e9, "bf16-mixed", zero=zero, dp=64)
    assert round(sum(states.values()) / GB, 1) == published_gb


def test_zero_shards_only_what_each_stage_says():
    base = plan.model_state_bytes(1e9, zero=0, dp=8)
    z1 = plan.model_state_bytes(1e9, zero=1, dp=8)
    z2 = plan.model_state_bytes(1e9, zero=2, dp=8)
    assert z1["optimizer"] == base["optimizer"] / 8 and z1["gradients"] == base["gradients"]
    assert z2["gradients"] == base["gradients"] / 8 and z2["parameters"] == base["parameters"]
    assert base == {"parameters": 2e9, "gradients": 2e9, "optimizer": 12e9}
    assert sum(plan.model_state_bytes(1e9, "fp32").values()) == 16e9


# GPT-3 175B in Korthikanti et al. 2022 (Table 3): a = 96, h = 12288, s = 2048, L = 96, t = 8.
A, H, S, L, T, B = 96, 12288, 2048, 96, 8, 1


def test_korthikanti_table_2_formulas_for_gpt3():
    sbh = S * B * H
    cases = {
        (1, False, "none"): sbh * (34 + 5 * A * S / H),
        (T, False, "none"): sbh * (10 + 24 / T + 5 * A * S / (H * T)),
        (T, True, "none"): sbh / T * (34 + 5 * A * S / H),
        (T, False, "selective"): sbh * (10 + 24 / T),
        (T, True, "selective"): 34 * sbh / T,
        (1, False, "full"): 2 * sbh,
        (T, False, "full"): 2 * sbh,
    }
    for (t, sp, recompute), expected in cases.items():
        got = plan.activation_bytes_per_layer(S, B, H, A, t, sp, recompute)
        assert got == pytest.approx(expected, rel=1e-12), (t, sp, recompute)


@pytest.mark.parametrize(
    "heads, hidden, saving",
    [(96, 12288, 0.70), (128, 20480, 0.65)],  # GPT-3 175B and MT-NLG 530B, s = 2048
)
def test_selective_recompute_saves_what_the_paper_reports(heads, hidden, saving):
    # Korthikanti et al. 2022, Section 4.2.2: selective recomputation cuts activation memory
    # by 70% for GPT-3 and 65% for MT-NLG.
    full = plan.activation_bytes_per_layer(S, 1, hidden, heads, 8, True, "none")
    selective = plan.activation_bytes_per_layer(S, 1, hidden, heads, 8, True, "selective")
    assert round(1 - selective / full, 2) == saving


def test_first_1f1b_stage_holds_a_whole_model_of_activations():
    # Korthikanti et al. 2022, Section 4.2.3: with 1F1B the first stage keeps p micro-batches of
    # L / p layers each, i.e. as much as the unpipelined model, whatever p is.
    model = plan.ModelShape(175_000_000_000, L, H, A, S)
    one = plan.memory(model, plan.Config(tp=T, sequence_parallel=True))["activations"]
    for pp in (2, 4, 8):
        cfg = plan.Config(tp=T, pp=pp, microbatches=4 * pp, sequence_parallel=True)
        assert plan.memory(model, cfg)["activations"] == pytest.approx(one)
    # sbhL / t (34 + 5as/h): the paper's total for the first stage with TP + SP
    assert one == pytest.approx(S * H * L / T * (34 + 5 * A * S / H))
    # interleaving costs (1 + (p - 1) / (p v)) times more (same section)
    cfg = plan.Config(tp=T, pp=8, microbatches=32, schedule="interleaved", chunks=2)
    inter = plan.memory(model, plan.replace_config(cfg, sequence_parallel=True))["activations"]
    assert inter == pytest.approx(one * (1 + 7 / 16))


def test_fp32_activations_count_values_at_four_bytes_and_masks_at_one():
    bf16 = plan.activation_bytes_per_layer(S, 1, H, A)
    fp32 = plan.activation_bytes_per_layer(S, 1, H, A, bytes_per_value=4)
    sbh, as2b = S * H, A * S * S
    assert bf16 == 34 * sbh + 5 * as2b
    assert fp32 == 66 * sbh + 9 * as2b  # 32 values x 4 + 2 masks; 2 values x 4 + 1 mask


def test_gpt3_activation_savings_order_and_what_fits_on_40_gib():
    # GPT-3 on t = 8, p = 8, d = 8 (ZeRO-1): each technique of Korthikanti et al. 2022 cuts
    # activations further; on a 40 GiB GPU only the combined ones leave room.
    model = plan.ModelShape(175_000_000_000, L, H, A, S)
    base = plan.Config(tp=8, pp=8, dp=8, microbatches=64, zero=1)
    small = plan.Hardware(gpu_memory_gib=40)
    variants = [
        {},
        {"sequence_parallel": True},
        {"sequence_parallel": True, "recompute": "selective"},
        {"sequence_parallel": True, "recompute": "full"},
    ]
    estimates = [
        plan.evaluate(model, plan.replace_config(base, **kw), hardware=small) for kw in variants
    ]
    acts = [e.memory["activations"] for e in estimates]
    assert acts == sorted(acts, reverse=True) and len(set(acts)) == 4
    assert not estimates[0].fits and "activations" in estimates[0].reason
    assert estimates[2].fits and estimates[3].fits


# --------------------------------------------------------------------------- pipelines


@settings(max_examples=25, deadline=None)
@given(
    schedule=st.sampled_from(plan.PLANNED_SCHEDULES),
    pp=st.sampled_from([2, 3, 4]),
    factor=st.integers(1, 4),
)
def test_closed_forms_agree_with_the_simulator(schedule, pp, factor):
    # Past SIMULATE_LIMIT the planner reads the registry's closed forms instead of simulating;
    # where both apply they must give the same figures.
    v = 2 if schedule in plan.LOOPING else 1
    m = 2 * pp * factor  # every schedule can run (DualPipeV needs m >= 2p)
    bubble, peak = plan.gpu_memory._simulated(schedule, pp, m, v)
    case = Case(pp, m, v)
    assert SCHEDULES[schedule].bubble(case) is not None  # the lessons' costs: F=1, B=2, W=B/2
    assert bubble == pytest.approx(SCHEDULES[schedule].bubble(case))
    assert peak == pytest.approx(SCHEDULES[schedule].peak(case))


def test_pipeline_bubble_values():
    assert plan.pipeline_bubble("1f1b", 4, 8) == pytest.approx(3 / 11)
    assert plan.pipeline_bubble("gpipe", 1, 8) == 0.0
    assert plan.pipeline_bubble("interleaved", 4, 8, 2) == pytest.approx(3 / 19)
    assert plan.pipeline_bubble("zb-h1", 4, 8) < plan.pipeline_bubble("1f1b", 4, 8)
    # large m uses the closed form; it keeps shrinking like (p - 1) / (m + p - 1)
    assert plan.pipeline_bubble("1f1b", 8, 4096) == pytest.approx(7 / 4103)
    with pytest.raises(CourseInputError, match="schedule"):
        plan.pipeline_bubble("zigzag", 4, 8)


def test_inflight_microbatches_per_schedule():
    assert plan.inflight_microbatches("gpipe", 4, 16) == 16
    assert plan.inflight_microbatches("1f1b", 4, 16) == 4
    assert plan.inflight_microbatches("1f1b", 4, 2) == 2
    assert plan.inflight_microbatches("1f1b", 1, 16) == 1  # plain gradient accumulation
    assert plan.inflight_microbatches("interleaved", 4, 16, 2) == pytest.approx(4 + 3 / 2)


# --------------------------------------------------------------------------- time


def test_ring_allreduce_and_flops_formulas():
    assert plan.ring_allreduce_time(8e9, 4, 1e9) == pytest.approx(2 * 3 / 4 * 8)
    assert plan.ring_allreduce_time(8e9, 4, 1e9, 1e-3) == pytest.approx(12 + 6e-3)
    assert plan.ring_allreduce_time(8e9, 1, 1e9) == 0.0
    assert plan.training_flops(1e9, 1000) == 6e12
    model = plan.ModelShape(120_000_000, 10, 1000, 10, 100)  # 12 L h^2 = 1.2e8
    attn = 4 * 10 * 1000 * 100  # forward attention FLOPs per token
    assert plan.training_flops(model, 1) == 6 * 1.2e8 + 3 * attn
    assert plan.training_flops(model, 1, "full") == 8 * 1.2e8 + 4 * attn
    assert plan.training_flops(model, 1, "selective") == 6 * 1.2e8 + 4 * attn


def test_step_time_parts_add_up_and_move_the_right_way():
    model = plan.MODEL_PRESETS["13B"]
    cfg = plan.Config(tp=2, pp=4, dp=8, microbatches=16, sequence_parallel=True)
    parts = plan.step_time(model, cfg)
    assert parts["total"] == pytest.approx(sum(v for k, v in parts.items() if k != "total"))
    assert all(parts[k] > 0 for k in ("compute", "bubble", "dp_comm", "tp_comm", "pp_comm"))
    assert parts["cp_comm"] == parts["ep_comm"] == 0  # no context or expert parallelism
    # more micro-batches: a smaller bubble share; slower links: more DP time
    more = plan.step_time(model, plan.replace_config(cfg, microbatches=64))
    assert more["bubble"] / more["compute"] < parts["bubble"] / parts["compute"]
    slow = plan.step_time(model, cfg, hardware=plan.Hardware(inter_node_gbs=2.5))
    assert slow["dp_comm"] == pytest.approx(10 * parts["dp_comm"], rel=0.01)
    assert (
        plan.step_time(model, plan.replace_config(cfg, recompute="full"))["compute"]
        > (parts["compute"])
    )


# --------------------------------------------------------------------------- the realistic planner
# Every restated formula against the module that executes it on threads (those import torch;
# the planner does not).

SMALL = plan.ModelShape(12 * 8 * 1024**2, 8, 1024, 16, 1024)  # exactly 12 L h^2 parameters


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("m", [1, 4])
def test_data_parallel_traffic_with_accumulation_equals_the_fsdp_module(zero, m):
    from course_utils.parallel import fsdp

    psi = SMALL.params
    sent = plan.traffic(SMALL, plan.Config(dp=8, microbatches=m, zero=zero))["data"]
    if zero == 0:
        assert sent == fsdp.dp_traffic_bytes([psi], 8, element_size=2)[0]
    else:
        assert sent == fsdp.fsdp_traffic_bytes([psi], 8, zero, m, element_size=2)["total"]


def test_zero3_gathers_and_zero2_reduce_scatters_every_microbatch():
    def sent(zero, m):
        return plan.traffic(SMALL, plan.Config(dp=8, microbatches=m, zero=zero))["data"]

    one = sent(0, 1)  # one all-reduce: 2 (N-1)/N of the gradients
    assert sent(0, 8) == sent(1, 8) == one  # accumulated locally, communicated once
    assert sent(2, 8) == pytest.approx(one * (8 + 1) / 2)  # 8 reduce-scatters + 1 all-gather
    assert sent(3, 1) == pytest.approx(1.5 * one)  # the ZeRO paper's 1.5x
    assert sent(3, 8) == pytest.approx(8 * 1.5 * one)  # gather, gather, scatter per micro-batch


def test_zero3_gathered_layers_are_fsdps_bound_plus_one_gradient():
    from course_utils.parallel import fsdp

    per_layer = SMALL.params // SMALL.layers
    got = plan.buffers(SMALL, plan.Config(dp=8, zero=3))["gathered layers"]
    weights = fsdp.gathered_bytes_bound([per_layer] * SMALL.layers, 8, prefetch=1, element_size=2)
    assert got == weights + 2 * per_layer
    assert plan.buffers(SMALL, plan.Config(dp=8, zero=2))["gathered layers"] == 0


def test_mlp_activation_terms_equal_the_sequence_parallel_module():
    from course_utils.parallel.sequence_parallel import korthikanti_mlp_block_bytes

    mlp = ("mlp layernorm input", "mlp input", "gelu input", "second linear input",
           "mlp dropout mask")  # fmt: skip
    for tp, sp in [(1, False), (4, False), (4, True)]:
        terms = plan.activation_terms(512, 2, 256, 8, tp, sp, bytes_per_value=2)
        mine = sum(terms[k] for k in mlp)
        ref = korthikanti_mlp_block_bytes(512, 2, 256, 1024, tp, sp, bytes_per_value=2)
        assert mine == pytest.approx(sum(ref.values())), (tp, sp)


def test_tensor_traffic_equals_the_sequence_parallel_modules_bytes():
    from course_utils.parallel.sequence_parallel import sp_comm_bytes
    from course_utils.threads.ring import ring_bytes_per_rank

    x = SMALL.seq * SMALL.hidden
    with_sp = plan.traffic(SMALL, plan.Config(tp=4, sequence_parallel=True))["tensor"]
    block = sp_comm_bytes(SMALL.seq, 1, SMALL.hidden, 4, element_size=2)
    assert with_sp == SMALL.layers * 2 * (block["forward"][0] + block["backward"][0])
    without = plan.traffic(SMALL, plan.Config(tp=4))["tensor"]
    assert without == SMALL.layers * 4 * ring_bytes_per_rank(x, 4, 2)[0]  # 4 all-reduces
    assert with_sp == pytest.approx(1.25 * without)  # the backward's extra all-gather


def test_context_parallel_traffic_and_buffers_equal_the_ring_attention_module():
    from course_utils.parallel import context_parallel as ring

    cfg = plan.Config(cp=4, microbatches=3)
    sent = plan.traffic(SMALL, cfg)["context"]
    per_layer = ring.ring_bytes_per_worker(SMALL.seq, 4, SMALL.heads, SMALL.head_dim, 2)
    assert sent == 3 * SMALL.layers * (per_layer["forward"] + per_layer["backward"])
    # the ring's buffers plus the q, k, v and output the activations keep: the module's peak
    t = SMALL.seq // 4
    kept = 2 * SMALL.heads * 4 * t * SMALL.head_dim
    whole = ring.attention_activation_bytes(SMALL.seq, 4, SMALL.heads, SMALL.head_dim, 2)
    assert plan.buffers(SMALL, cfg)["attention in flight"] + kept == whole
    assert plan.ring_attention_bytes(SMALL.seq, 4, SMALL.heads, SMALL.head_dim) == whole


def test_the_kv_heads_set_the_rings_bytes_and_the_ulysses_limit():
    from dataclasses import replace

    from course_utils.parallel import context_parallel as ctx

    gqa = replace(plan.MODEL_PRESETS["70B"], seq=8192)  # Llama 2 70B: 64 heads share 8 K/V
    mha = replace(gqa, kv_heads=0)
    assert (gqa.key_value_heads, mha.key_value_heads) == (8, 64)
    assert [gqa.kv_heads_per_gpu(t) for t in (1, 2, 8, 16)] == [8, 4, 1, 1]  # 16: copied
    # the ring's K/V block: tp = 8 leaves each GPU 1 K/V head (of its 8 query heads)
    cfg = plan.Config(tp=8, cp=4, microbatches=3)
    per_layer = ctx.ring_bytes_per_worker(gqa.seq, 4, 1, gqa.head_dim, 2)
    sent = plan.traffic(gqa, cfg)["context"]
    assert sent == 3 * gqa.layers * (per_layer["forward"] + per_layer["backward"])
    assert plan.traffic(mha, cfg)["context"] == 8 * sent
    t = gqa.seq // 4  # the arriving block: 1 K/V head instead of 8, 2 t D values each
    held = {m: plan.buffers(m, cfg)["attention in flight"] for m in (gqa, mha)}
    assert held[mha] - held[gqa] == 2 * (8 - 1) * 2 * t * gqa.head_dim
    assert plan.ring_attention_bytes(gqa.seq, 4, 8, 128, kv_heads=8) == plan.ring_attention_bytes(
        gqa.seq, 4, 8, 128
    )
    # Ulysses: q and the output carry the query heads, k and v the K/V heads
    uly = plan.Config(cp=8, cp_kind="ulysses", microbatches=2)
    per = ctx.ulysses_bytes_per_worker(gqa.seq, 8, 64, gqa.head_dim, 2, kv_heads=8)
    want = 2 * gqa.layers * (per["forward"] + per["backward"])
    assert plan.traffic(gqa, uly)["context"] == pytest.approx(want, rel=1e-12)
    # its limit is the K/V heads of a tensor-parallel GPU, not the query heads
    plan.check_config(gqa, uly)
    plan.check_config(mha, replace(uly, cp=16))
    with pytest.raises(CourseInputError, match="cp=16 must divide the 8 K/V heads"):
        plan.check_config(gqa, replace(uly, cp=16))
    with pytest.raises(CourseInputError, match="cp=2 must divide the 1 K/V head of"):
        plan.check_config(gqa, plan.Config(tp=8, cp=2, cp_kind="ulysses"))
    found = plan.search(replace(gqa, seq=16384), 32, 32, cp_kind="ulysses")
    pairs = {(e.config.tp, e.config.cp) for e in found["feasible"]}
    assert pairs and all(gqa.kv_heads_per_gpu(tp) % cp == 0 for tp, cp in pairs)
    assert any("K/V head" in reason for _, reason in found["rejected"])
    with pytest.raises(CourseInputError, match="must divide the 12 K/V heads or be a multiple"):
        plan.check_config(plan.ModelShape(13_000_000_000, 40, 6144, 48, kv_heads=12),
                          plan.Config(tp=8))  # fmt: skip
    with pytest.raises(CourseInputError, match=r"kv_heads \(3\) must divide heads \(40\)"):
        plan.ModelShape(13_000_000_000, 40, 5120, 40, kv_heads=3)


def test_context_parallelism_splits_activations_and_shards_weights_with_dp():
    long = plan.ModelShape(30_000_000_000, 48, 7168, 56, seq=32768)
    one = plan.memory(long, plan.Config(tp=8, sequence_parallel=True, recompute="selective"))
    four = plan.memory(
        long, plan.Config(tp=8, cp=4, sequence_parallel=True, recompute="selective", zero=3)
    )
    assert four["activations"] == pytest.approx(one["activations"] / 4)
    # the weights are replicated over the cp GPUs: ZeRO shards them over dp x cp = 4
    assert four["parameters"] == pytest.approx(one["parameters"] / 4)
    # without selective recomputation, cp > 1 still keeps no s x s scores (ring attention)
    scores = plan.activation_terms(32768, 1, 7168, 56, 8, True, cp=4)["attention scores"]
    assert scores == 0


def test_moe_parameters_and_all_to_all_equal_the_moe_module():
    from course_utils.parallel import moe

    h, f, experts, k, layers = 1024, 4096, 8, 2, 4
    model = plan.ModelShape(
        layers * (4 * h * h + experts * (2 * h * f + f + h) + h * experts + experts),
        layers, h, 16, 1024, experts=experts, top_k=k,
    )  # fmt: skip
    counts = moe.expert_params(h, f, experts, ep=4, top_k=k)
    assert model.expert_params_per_layer == counts["experts_total"]
    assert model.active_params == pytest.approx(
        model.params - layers * (experts - k) * counts["per_expert"]
    )
    cfg = plan.Config(dp=4, ep=4)
    routed = [[model.seq * k // experts] * experts for _ in range(4)]  # even routing
    per_a2a = moe.all_to_all_bytes_per_worker(routed, h, 4, element_size=2)[0]
    assert plan.traffic(model, cfg)["expert"] == layers * 4 * per_a2a  # 2 forward, 2 backward
    # experts are split over ep; the dense part is not
    states = plan.model_states(model, cfg)
    dense, expert = model.dense_params, model.expert_params
    assert states["parameters"] == pytest.approx(2 * (dense + expert / 4))


def test_moe_with_tensor_parallelism_needs_sequence_parallelism_and_ep_divides_dp():
    model = plan.MODEL_PRESETS["8x6.7B-MoE"]
    with pytest.raises(CourseInputError, match="sequence_parallel"):
        plan.memory(model, plan.Config(tp=2))
    with pytest.raises(CourseInputError, match="ep=4 must divide dp=2"):
        plan.memory(model, plan.Config(dp=2, ep=4))
    with pytest.raises(CourseInputError, match="mixture-of-experts"):
        plan.memory(plan.MODEL_PRESETS["6.7B"], plan.Config(dp=2, ep=2))


def test_search_covers_context_and_expert_parallelism():
    long = plan.ModelShape(6_700_000_000, 32, 4096, 32, seq=65536)
    result = plan.search(long, 16, 16)
    # at 64k tokens the s x s scores and the activations push every layout without context
    # parallelism out; several ring sizes fit
    cps = {e.config.cp for e in result["feasible"]}
    assert len(cps) > 1 and 1 not in cps
    assert any(isinstance(c, plan.Config) and c.cp == 1 for c, _ in result["rejected"])
    moe_result = plan.search(plan.MODEL_PRESETS["8x6.7B-MoE"], 16, 64)
    assert {e.config.ep for e in moe_result["feasible"]} > {1}
    assert plan.context_degrees(plan.MODEL_PRESETS["30B"], 8) == [1, 2]  # 1024 tokens at least


def test_no_plan_at_78_2_of_80_gib_is_called_fits():
    gpu = plan.Hardware()
    assert gpu.reserve == pytest.approx(2 + 0.05 * 80) and gpu.usable_gib == pytest.approx(74)
    assert plan.Hardware(gpu_memory_gib=40).reserve == pytest.approx(4)
    mem = {"parameters": 60.0, "gradients": 0.0, "optimizer": 0.0, "activations": 18.2,
           "buffers": 0.0}  # fmt: skip
    mem = {k: v * plan.GIB for k, v in mem.items()}
    mem["total"] = sum(mem.values())
    assert "does NOT fit" in plan.format_memory(mem, hardware=gpu)
    assert "fits" in plan.format_memory(mem, hardware=plan.Hardware(reserve_gib=1.0))
    with pytest.raises(CourseInputError, match="reserve_gib"):
        plan.Hardware(reserve_gib=80)
    # and in a search: nothing above the usable memory is feasible
    result = plan.search(plan.MODEL_PRESETS["30B"], 8, 256)
    assert max(e.memory["total"] for e in result["feasible"]) <= 74 * plan.GIB
    assert any("usable" in r for _, r in result["rejected"])


def test_mfu_and_hfu_differ_exactly_by_recomputation():
    model = plan.MODEL_PRESETS["13B"]
    base = plan.Config(tp=8, pp=2, microbatches=32, sequence_parallel=True)
    for recompute in plan.RECOMPUTE:
        est = plan.evaluate(model, plan.replace_config(base, recompute=recompute))
        u = est.utilisation
        # during the compute part, the GPU runs at `efficiency` of peak: HFU of that part
        assert u["hfu"] * est.time["total"] == pytest.approx(0.5 * est.time["compute"])
        if recompute == "none":
            assert u["mfu"] == pytest.approx(u["hfu"])
        else:
            assert u["mfu"] < u["hfu"]
    full = plan.evaluate(model, plan.replace_config(base, recompute="full")).utilisation
    assert full["mfu"] / full["hfu"] == pytest.approx(
        plan.training_flops(model, 1) / plan.training_flops(model, 1, "full")
    )


def test_overlapping_data_parallel_traffic_hides_all_but_the_last_bucket():
    model = plan.MODEL_PRESETS["1.3B"]
    cfg = plan.Config(dp=16, microbatches=4, zero=0)
    plain = plan.step_time(model, cfg)
    hidden = plan.step_time(model, plan.replace_config(cfg, dp_overlap=True))
    assert hidden["dp_comm"] < plain["dp_comm"] and hidden["compute"] == plain["compute"]
    # the last micro-batch's backward is the window: what does not fit in it stays exposed
    backward = plain["compute"] * 2 / 3 / 4 * (1 + 0)  # no recomputation: B = 2/3 of F + B
    assert hidden["dp_comm"] == pytest.approx(
        max(plain["dp_comm"] - backward, plain["dp_comm"] / model.layers), rel=0.02
    )
    # ZeRO-1's all-gather after the optimizer step cannot hide behind anything
    z1 = plan.step_time(model, plan.replace_config(cfg, zero=1, dp_overlap=True))
    assert z1["dp_comm"] >= plain["dp_comm"] / 2 * 0.99


def test_hardware_presets_and_their_echo():
    h100 = plan.HARDWARE_PRESETS["H100-80GB"]
    assert (h100.peak_tflops_bf16, h100.intra_node_gbs, h100.inter_node_gbs) == (989, 450, 50)
    assert plan.HARDWARE_PRESETS["A100-80GB"] == plan.Hardware()  # the defaults are an A100
    four = plan.hardware("H100-80GB", gpus_per_node=4)
    assert four.gpus_per_node == 4 and four.peak_tflops_bf16 == 989
    text = h100.describe()
    for word in ("H100-80GB", "989", "HFU", "450 GB/s", "50 GB/s", "reserve 6.0 GiB", "74.0"):
        assert word in text, word
    with pytest.raises(CourseInputError, match="GPU must be one of"):
        plan.hardware("B200")


def test_a_shape_whose_params_disagree_by_more_than_2x_is_refused():
    with pytest.raises(CourseInputError, match=r"12 x L x h\^2 = 12 x 32 x 4096\^2 = 6.44B"):
        plan.ModelShape(70_000_000_000, 32, 4096, 32)
    plan.ModelShape(12_000_000_000, 32, 4096, 32)  # 1.9x: accepted
    for name, model in plan.MODEL_PRESETS.items():
        assert plan.params_disagree(model.params, model) is None, name


def test_draw_cluster_shows_an_nvswitch_per_node():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plan.draw_cluster(plan.HARDWARE_PRESETS["H100-80GB"], nodes=2)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("NVSwitch") == 2 and texts.count("NIC") == 16
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("NVSwitch" in label and "450 GB/s" in label for label in labels)
    plt.close(fig)


# --------------------------------------------------------------------------- search


def test_search_ranks_by_step_time_and_explains_every_rejection():
    model = plan.MODEL_PRESETS["13B"]
    result = plan.search(model, 16, 64, plan.Hardware(gpu_memory_gib=40))
    feasible, rejected = result["feasible"], result["rejected"]
    assert feasible and rejected
    times = [e.time["total"] for e in feasible]
    assert times == sorted(times)
    assert all(e.memory["total"] <= (40 - 4) * plan.GIB for e in feasible)  # 4 GiB reserve
    assert all(isinstance(r, str) and len(r) > 10 for _, r in rejected)
    assert {e.config.gpus for e in feasible} == {16}


def test_70b_does_not_fit_on_8_gpus_of_80_gib_but_does_on_16():
    model = plan.MODEL_PRESETS["70B"]
    eight = plan.search(model, 8, 256)
    assert eight["feasible"] == []
    reasons = [r for _, r in eight["rejected"]]
    assert any("even with ZeRO-3" in r for r in reasons)
    # 16 bytes x 70e9 / 8 GPUs = 140 GB (130.4 GiB) of model states per GPU, whatever layout
    assert any(
        r.startswith("model states 130.4 GiB > 74.0 GiB usable (80 GiB - 6.0 GiB reserve) even")
        for r in reasons
    )
    sixteen = plan.search(model, 16, 256)
    assert sixteen["feasible"]
    best = sixteen["feasible"][0]
    assert best.memory["total"] <= 74 * plan.GIB
    # the fewest GPUs: 15 would hold the states alone, 16 is the first count that fits
    assert plan.states_lower_bound(model) == 15
    assert plan.min_gpus(model, 256) == 16


def test_widget_arithmetic_and_text_fallback():
    est = plan.estimate_from_sliders("30B", 8, 8, 1, 1, "1f1b", 1, "selective", "bf16-mixed", 64)
    assert est.config.dp == 1 and est.config.microbatches == 64
    text = plan.describe(est)
    assert "parameters" in text and "compute" in text and "GiB" in text
    with pytest.raises(CourseInputError, match="tp x cp x pp"):
        plan.estimate_from_sliders("30B", 8, 4, 4, 1, "1f1b", 0, "none", "bf16-mixed")


def test_draw_plan_has_labelled_charts():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    est = plan.estimate_from_sliders("6.7B", 8, 2, 2, 1, "1f1b", 1, "none", "bf16-mixed", 64)
    fig = plan.draw_plan(est)
    memory, time = fig.axes
    for ax in (memory, time):
        assert ax.get_title() and ax.get_legend() is not None
    # the step-time chart stacks one bar per part of the estimate, end to end
    widths = [patch.get_width() for patch in time.patches]
    assert widths == pytest.approx([est.time[part] for part in plan.TIME_PARTS])
    assert sum(widths) == pytest.approx(est.time["total"])
    assert [t.get_text() for t in time.get_legend().get_texts()] == list(plan.TIME_PARTS)
    plt.close(fig)


# --------------------------------------------------------------------------- input checks


@pytest.mark.parametrize(
    "text, value",
    [("7500000000", 7_500_000_000), ("7.5e9", 7_500_000_000), ("30B", 30_000_000_000),
     ("175b", 175_000_000_000), ("1.3B", 1_300_000_000), (70e9, 70_000_000_000)],
)  # fmt: skip
def test_parse_count(text, value):
    assert plan.parse_count(text) == value


@pytest.mark.parametrize("text", ["abc", "-5", "0", "7.5X", "", True])
def test_parse_count_rejects(text):
    with pytest.raises(CourseInputError, match="params"):
        plan.parse_count(text)


def test_bad_configs_are_one_line_errors():
    model = plan.MODEL_PRESETS["6.7B"]
    for cfg, word in [
        (plan.Config(tp=3), "tp=3"),
        (plan.Config(pp=5), "layers"),
        (plan.Config(schedule="zigzag"), "schedule"),
        (plan.Config(zero=4), "zero"),
        (plan.Config(recompute="some"), "recompute"),
        (plan.Config(pp=4, microbatches=6, schedule="interleaved", chunks=2), "multiple"),
        (plan.Config(chunks=2), "looping"),
    ]:
        with pytest.raises(CourseInputError, match=word) as info:
            plan.memory(model, cfg)
        assert "\n" not in str(info.value)
    with pytest.raises(CourseInputError, match="precision"):
        plan.memory(model, plan.Config(), "fp16")


# --------------------------------------------------------------------------- command line


def test_cli_memory_json_shape_and_zero_figure(cli):
    out = cli("memory", "--params", "7.5e9", "--dp", "64", "--zero", "3", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)["bytes"]
    assert set(data) == {
        "parameters", "gradients", "optimizer", "activations", "buffers", "total"
    }  # fmt: skip
    assert round(data["total"] / GB, 1) == 1.9 and data["activations"] == 0


def test_cli_memory_with_shape_counts_activations_and_prints_gib(cli):
    args = ["memory", "--params", "175B", "--layers", "96", "--hidden", "12288"]
    args += ["--heads", "96", "--seq", "2048", "--tp", "8", "--pp", "8", "--dp", "8"]
    out = cli(*args, "--zero", "1", "--recompute", "selective", "--sequence-parallel", "--json")
    data = json.loads(out.stdout)["bytes"]
    assert data["activations"] == pytest.approx(96 * 34 * 2048 * 12288 / 8)
    text = cli(*args, "--gpu-memory-gib", "80")
    assert text.returncode == 0 and "GiB" in text.stdout and "fit" in text.stdout


def test_cli_search_json_shape(cli):
    out = cli(
        "search", "--params", "6.7B", "--layers", "32", "--hidden", "4096", "--heads", "32",
        "--seq", "2048", "--global-batch", "64", "--gpus", "8", "--gpu-memory-gib", "24", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    keys = {"tp", "pp", "dp", "microbatch_size", "microbatches", "schedule", "zero"}
    keys |= {"recompute", "memory_bytes", "step_time_s"}
    assert data["feasible"] and keys <= set(data["feasible"][0])
    times = [row["step_time_s"] for row in data["feasible"]]
    assert times == sorted(times)
    assert data["rejected"] and all(set(r) == {"config", "reason"} for r in data["rejected"])


@pytest.mark.parametrize(
    "args, word",
    [
        (["memory", "--params", "lots"], "--params"),
        (["memory", "--params", "7B", "--layers", "32"], "--hidden"),
        (["memory", "--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32",
          "--seq", "2048", "--tp", "3"], "tp=3"),
        (["memory", "--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32",
          "--seq", "2048", "--pp", "5"], "layers"),
        (["memory", "--params", "7B", "--precision", "fp16"], "precision"),
        (["memory", "--params", "7B", "--tp", "0"], "--tp"),
        (["search", "--params", "7B"], "required"),
        (["search", "--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32",
          "--seq", "2048", "--global-batch", "64", "--gpus", "8", "--gpu-memory-gib", "-1"],
         "--gpu-memory-gib"),
        (["memory", "--params", "70B", "--layers", "32", "--hidden", "4096", "--heads", "32",
          "--seq", "2048"], "12 x L x h^2"),
        (["memory", "--params", "7B", "--cp", "0"], "--cp"),
        (["memory", "--params", "7B", "--cp", "2"], "cp and ep need the model's shape"),
        (["memory", "--params", "7B", "--experts", "8"], "--experts needs the shape"),
        (["memory", "--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32",
          "--seq", "2048", "--dp", "2", "--ep", "2"], "mixture-of-experts"),
        (["memory", "--params", "37B", "--layers", "32", "--hidden", "4096", "--heads", "32",
          "--seq", "2048", "--experts", "8", "--top-k", "2", "--dp", "4", "--ep", "3"], "ep=3"),
        (["memory", "--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32",
          "--seq", "2048", "--cp", "3"], "2 x cp"),
        (["memory", "--params", "7B", "--gpu", "B200"], "--gpu"),
        (["memory", "--params", "7B", "--kv-heads", "8"], "--kv-heads needs the shape"),
        (["memory", "--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32",
          "--kv-heads", "6", "--seq", "2048"], "--kv-heads (6) must divide --heads (32)"),
        (["memory", "--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32",
          "--kv-heads", "64", "--seq", "2048"], "--kv-heads must be an integer from 0 to 32"),
        (["memory", "--params", "70B", "--layers", "80", "--hidden", "8192", "--heads", "64",
          "--kv-heads", "8", "--seq", "8192", "--cp", "16", "--cp-kind", "ulysses"],
         "cp=16 must divide the 8 K/V heads"),
        (["memory", "--params", "7B", "--reserve-gib", "80"], "--reserve-gib"),
        (["memory", "--params", "7B", "--reserve-gib", "-1"], "--reserve-gib"),
        (["memory", "--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32",
          "--seq", "2048", "--experts", "2", "--top-k", "3"], "--top-k"),
        (["search", "--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32",
          "--seq", "2048", "--global-batch", "64", "--gpus", "8", "--efficiency", "1.5"],
         "--efficiency"),
    ],
)  # fmt: skip
def test_cli_bad_input_exits_2_with_one_line(cli, args, word):
    out = cli(*args)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert word in out.stderr


@pytest.mark.parametrize("zero, text", [(0, "120.00 GB"), (1, "31.41 GB"), (2, "16.64 GB"),
                                         (3, "1.88 GB")])  # fmt: skip
def test_cli_prints_the_zero_figure_in_gb_and_gib(cli, zero, text):
    # the ZeRO paper's 120 / 31.4 / 16.6 / 1.9 GB, as lesson 07 draws them, next to GiB
    out = cli("memory", "--params", "7.5e9", "--dp", "64", "--zero", str(zero))
    total = next(line for line in out.stdout.splitlines() if line.startswith("total"))
    assert text in total and "GiB" in total


def test_cli_echoes_every_assumption_and_the_fewest_gpus(cli):
    out = cli(
        "search", "--params", "70B", "--layers", "80", "--hidden", "8192", "--heads", "64",
        "--seq", "2048", "--global-batch", "256", "--gpus", "8", "--gpu", "H100-80GB",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    for word in ("H100-80GB", "989 TFLOP/s", "efficiency (HFU) 0.5", "450 GB/s", "50 GB/s",
                 "reserve 6.0 GiB", "do not overlap"):  # fmt: skip
        assert word in out.stdout, word
    assert "0 layouts fit" in out.stdout
    assert "The fewest GPUs on which a layout fits: 16" in out.stdout
    data = json.loads(
        cli("search", "--params", "70B", "--layers", "80", "--hidden", "8192", "--heads", "64",
            "--seq", "2048", "--global-batch", "256", "--gpus", "8", "--json").stdout
    )  # fmt: skip
    assert data["min_gpus"] == 16 and data["assumptions"]


def test_cli_kv_heads_reach_the_model_and_its_echo(cli):
    shape = ["--params", "70B", "--layers", "80", "--hidden", "8192", "--heads", "64"]
    args = ["search", *shape, "--seq", "8192", "--global-batch", "16", "--gpus", "16"]
    args += ["--cp-kind", "ulysses"]
    gqa = cli(*args, "--kv-heads", "8", "--json")
    mha = cli(*args, "--json")
    assert gqa.returncode == 0 and mha.returncode == 0, gqa.stderr + mha.stderr
    cps = {
        name: {(r["tp"], r["cp"]) for r in json.loads(out.stdout)["feasible"]}
        for name, out in (("gqa", gqa), ("mha", mha))
    }
    assert cps["gqa"] and all(8 // tp % cp == 0 for tp, cp in cps["gqa"])  # tp <= 8 here
    assert cps["mha"] - cps["gqa"]  # multi-head allows Ulysses degrees GQA does not
    text = cli(*args, "--kv-heads", "8", "--top", "1")
    assert "a=64 (8 K/V)" in text.stdout


def test_cli_context_and_expert_parallel_layouts(cli):
    args = ["memory", "--params", "37B", "--layers", "32", "--hidden", "4096", "--heads", "32",
            "--seq", "4096", "--experts", "8", "--top-k", "2", "--dp", "8", "--ep", "8",
            "--cp", "2", "--zero", "1", "--json"]  # fmt: skip
    out = cli(*args)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["config"]["ep"] == 8 and data["config"]["cp"] == 2 and "fits" in data


@pytest.mark.slow
def test_cli_smoke_in_a_subprocess():
    ok = run_module("plan", "memory", "--params", "7.5e9", "--dp", "64", "--zero", "3", timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "zero=3" in ok.stdout and re.search(r"^total +1\.88 GB +1\.75 GiB$", ok.stdout, re.M)
    bad = run_module("plan", "memory", "--params", "lots", timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "--params" in bad.stderr


def test_import_does_not_import_torch():
    code = "import sys, course_utils.plan; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
