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
    # Rajbhandari et al. 2020, Figure 1: 7.5B parameters, Nd = 64, K = 12.
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
    schedule=st.sampled_from(plan.SCHEDULES),
    pp=st.sampled_from([2, 3, 4]),
    factor=st.integers(1, 4),
)
def test_closed_forms_agree_with_the_simulator(schedule, pp, factor):
    # Past SIMULATE_LIMIT the planner reads the registry's closed forms instead of simulating;
    # where both apply they must give the same figures.
    v = 2 if schedule in plan.LOOPING else 1
    m = 2 * pp * factor  # every schedule can run (DualPipeV needs m >= 2p)
    bubble, peak = plan.model._simulated(schedule, pp, m, v)
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
    model = plan.ModelShape(1_000_000_000, 10, 1000, 10, 100)
    attn = 4 * 10 * 1000 * 100  # forward attention FLOPs per token
    assert plan.training_flops(model, 1) == 6e9 + 3 * attn
    assert plan.training_flops(model, 1, "full") == 8e9 + 4 * attn
    assert plan.training_flops(model, 1, "selective") == 6e9 + 4 * attn


def test_step_time_parts_add_up_and_move_the_right_way():
    model = plan.MODEL_PRESETS["13B"]
    cfg = plan.Config(tp=2, pp=4, dp=8, microbatches=16, sequence_parallel=True)
    parts = plan.step_time(model, cfg)
    assert parts["total"] == pytest.approx(sum(v for k, v in parts.items() if k != "total"))
    assert all(parts[k] > 0 for k in plan.TIME_PARTS)
    # more micro-batches: a smaller bubble share; slower links: more DP time
    more = plan.step_time(model, plan.replace_config(cfg, microbatches=64))
    assert more["bubble"] / more["compute"] < parts["bubble"] / parts["compute"]
    slow = plan.step_time(model, cfg, hardware=plan.Hardware(inter_node_gbs=2.5))
    assert slow["dp_comm"] == pytest.approx(10 * parts["dp_comm"], rel=0.01)
    assert (
        plan.step_time(model, plan.replace_config(cfg, recompute="full"))["compute"]
        > (parts["compute"])
    )


# --------------------------------------------------------------------------- search


def test_search_ranks_by_step_time_and_explains_every_rejection():
    model = plan.MODEL_PRESETS["13B"]
    result = plan.search(model, 16, 64, plan.Hardware(gpu_memory_gib=40))
    feasible, rejected = result["feasible"], result["rejected"]
    assert feasible and rejected
    times = [e.time["total"] for e in feasible]
    assert times == sorted(times)
    assert all(e.memory["total"] <= 40 * plan.GIB for e in feasible)
    assert all(isinstance(r, str) and len(r) > 10 for _, r in rejected)
    assert {e.config.gpus for e in feasible} == {16}


def test_70b_does_not_fit_on_8_gpus_of_80_gib_but_does_on_16():
    model = plan.MODEL_PRESETS["70B"]
    eight = plan.search(model, 8, 256)
    assert eight["feasible"] == []
    reasons = [r for _, r in eight["rejected"]]
    assert any("even with ZeRO-3" in r for r in reasons)
    # 16 bytes x 70e9 / 8 GPUs = 140 GB (130.4 GiB) of model states per GPU, whatever layout
    assert any(r.startswith("model states 130.4 GiB > 80 GiB even with ZeRO-3") for r in reasons)
    sixteen = plan.search(model, 16, 256)
    assert sixteen["feasible"]
    best = sixteen["feasible"][0]
    assert best.memory["total"] <= 80 * plan.GIB


def test_widget_arithmetic_and_text_fallback():
    est = plan.estimate_from_sliders("30B", 8, 8, 1, 1, "1f1b", 1, "selective", "bf16-mixed", 64)
    assert est.config.dp == 1 and est.config.microbatches == 64
    text = plan.describe(est)
    assert "parameters" in text and "compute" in text and "GiB" in text
    with pytest.raises(CourseInputError, match="tp x pp"):
        plan.estimate_from_sliders("30B", 8, 4, 4, 1, "1f1b", 0, "none", "bf16-mixed")


def test_draw_plan_has_labelled_charts():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    est = plan.estimate_from_sliders("6.7B", 8, 2, 2, 1, "1f1b", 1, "none", "bf16-mixed", 64)
    fig = plan.draw_plan(est)
    for ax in fig.axes:
        assert ax.get_title() and ax.get_legend() is not None
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
    assert set(data) == {"parameters", "gradients", "optimizer", "activations", "total"}
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
    ],
)  # fmt: skip
def test_cli_bad_input_exits_2_with_one_line(cli, args, word):
    out = cli(*args)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert word in out.stderr


def test_cli_smoke_in_a_subprocess():
    ok = run_module("plan", "memory", "--params", "7.5e9", "--dp", "64", "--zero", "3", timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "zero=3" in ok.stdout and re.search(r"^total +1\.75 GiB$", ok.stdout, re.M)
    bad = run_module("plan", "memory", "--params", "lots", timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "--params" in bad.stderr


def test_import_does_not_import_torch():
    code = "import sys, course_utils.plan; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
