"""ZeRO 1/2/3 on threads: same training as one device, exact bytes, exact memory, a plan
that prefetches what it should, and a simulator that predicts the timeline."""

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from course_utils.errors import CourseInputError, WorkerError
from course_utils.models import MLP
from course_utils.parallel.data_parallel import max_param_diff
from course_utils.parallel.fsdp import (
    FSDPCosts,
    ShardedDataParallel,
    adam_update,
    costs_from_timeline,
    dp_traffic_bytes,
    fsdp_program,
    fsdp_traffic_bytes,
    gathered_bytes_bound,
    padded_shard_numels,
    simulate_fsdp,
    single_device_steps,
    zero_memory_bytes,
)


def tiny_model(dtype=torch.float64, seed=0, depth=3):
    torch.manual_seed(seed)
    return MLP(6, 10, 4, depth=depth).to(dtype)  # layers of 70, 110, 110, 44 parameters


def batches(n, batch=12, dtype=torch.float64, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(batch, 6, generator=gen, dtype=dtype),
            torch.randint(4, (batch,), generator=gen),
        )
        for _ in range(n)
    ]


# -- the same training as one device --------------------------------------------------------------


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_each_stage_matches_one_device_with_uneven_shards(stage):
    model, data = tiny_model(), batches(3, batch=11)
    reference, _ = single_device_steps(model, data, lr=0.02)
    with ShardedDataParallel(model, 3, stage=stage, prefetch=1, microbatches=2, lr=0.02) as fsdp:
        for x, y in data:
            fsdp.step(x, y)
        assert max_param_diff(reference, fsdp.to_model()) < 1e-5


@settings(max_examples=5, deadline=None)
@given(
    stage=st.sampled_from([1, 2, 3]),
    workers=st.integers(1, 3),
    prefetch=st.integers(0, 3),
    microbatches=st.integers(1, 2),
    batch=st.integers(6, 13),
)
def test_parameters_match_one_device_after_several_adam_steps(
    stage, workers, prefetch, microbatches, batch
):
    model, data = tiny_model(), batches(3, batch)
    reference, losses = single_device_steps(model, data, lr=0.02)
    with ShardedDataParallel(
        model, workers, stage=stage, prefetch=prefetch, microbatches=microbatches, lr=0.02
    ) as fsdp:
        results = [fsdp.step(x, y) for x, y in data]
        assert max_param_diff(reference, fsdp.to_model()) < 1e-5
    for result, loss in zip(results, losses, strict=True):
        assert math.isclose(result.loss, loss, rel_tol=1e-9)


def test_float32_matches_too():
    model, data = tiny_model(torch.float32), batches(4, dtype=torch.float32)
    reference, _ = single_device_steps(model, data, lr=0.01)
    with ShardedDataParallel(model, 3, stage=3, prefetch=1, lr=0.01) as fsdp:
        for x, y in data:
            fsdp.step(x, y)
        assert max_param_diff(reference, fsdp.to_model()) < 1e-5


def test_adam_on_slices_is_adam_on_the_whole():
    gen = torch.Generator().manual_seed(0)
    p, g = torch.randn(10, generator=gen, dtype=torch.float64), torch.randn(10, generator=gen)
    whole = nn.Parameter(p.clone())
    opt = torch.optim.Adam([whole], lr=0.1)
    pieces = [p[:3].clone(), p[3:].clone()]
    states = [(torch.zeros(3), torch.zeros(3)), (torch.zeros(7), torch.zeros(7))]
    states = [(a.double(), b.double()) for a, b in states]
    for step in (1, 2):
        whole.grad = g.double() * step
        opt.step()
        for piece, (m, v), grad in zip(pieces, states, (g[:3], g[3:]), strict=True):
            adam_update(piece, grad.double() * step, m, v, step, 0.1, (0.9, 0.999), 1e-8)
    assert torch.allclose(torch.cat(pieces), whole.detach(), atol=1e-15, rtol=0)


# -- bytes on the wire ----------------------------------------------------------------------------


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("microbatches", [1, 2])
def test_byte_counters_match_the_traffic_formula(stage, microbatches):
    model = tiny_model()
    with ShardedDataParallel(model, 3, stage=stage, microbatches=microbatches) as fsdp:
        x, y = batches(1)[0]
        result = fsdp.step(x, y)
        expected = fsdp_traffic_bytes(fsdp.layer_numels, 3, stage, microbatches, element_size=8)
    assert result.bytes_all_gather == [expected["all_gather"]] * 3
    assert result.bytes_reduce_scatter == [expected["reduce_scatter"]] * 3
    assert result.bytes_sent == [expected["total"]] * 3


def test_stage_3_moves_one_and_a_half_all_reduces():
    layers, n = [400, 800, 1200], 4  # divisible by n: no padding, exact ratios
    dp = dp_traffic_bytes(layers, n)
    assert dp == [2 * (n - 1) * sum(layers) // n * 4] * n
    assert fsdp_traffic_bytes(layers, n, 1)["total"] == dp[0]  # ZeRO paper Section 7
    assert fsdp_traffic_bytes(layers, n, 2)["total"] == dp[0]
    assert fsdp_traffic_bytes(layers, n, 3)["total"] == 1.5 * dp[0]
    # gradient accumulation: stage 3 gathers again for every micro-batch, stage 1 does not
    assert fsdp_traffic_bytes(layers, n, 3, microbatches=4)["total"] == 4 * 1.5 * dp[0]
    assert fsdp_traffic_bytes(layers, n, 2, microbatches=4)["total"] == 2.5 * dp[0]
    assert fsdp_traffic_bytes(layers, n, 1, microbatches=4)["total"] == dp[0]


# -- memory ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_persistent_memory_is_the_zero_formula_plus_padding(stage):
    model = tiny_model()
    with ShardedDataParallel(model, 3, stage=stage) as fsdp:
        result = fsdp.step(*batches(1)[0])
        numels = fsdp.layer_numels
    padded = zero_memory_bytes(numels, 3, stage, element_size=8, padded=True)
    formula = zero_memory_bytes(numels, 3, stage, element_size=8)
    for report in result.memory:
        assert report.persistent == {k: int(v) for k, v in padded.items()}
        assert abs(report.persistent_total / sum(formula.values()) - 1) < 0.10


def test_each_stage_holds_less_than_the_one_before():
    totals = []
    for stage in (1, 2, 3):
        with ShardedDataParallel(tiny_model(), 2, stage=stage) as fsdp:
            totals.append(fsdp.step(*batches(1)[0]).memory[0].persistent_total)
    assert totals[0] > totals[1] > totals[2]


def test_without_prefetch_stage_3_peaks_at_one_gathered_layer_and_its_gradient():
    with ShardedDataParallel(tiny_model(), 2, stage=3, prefetch=0) as fsdp:
        result = fsdp.step(*batches(1)[0])
        largest = max(padded_shard_numels(fsdp.layer_numels, 2)) * 2 * 8
    for report in result.memory:
        assert report.peak["gathered"] == largest
        assert report.peak_total == report.persistent_total + 2 * largest


@pytest.mark.parametrize("prefetch", [1, 2])
def test_prefetching_costs_at_most_k_more_gathered_layers(prefetch):
    with ShardedDataParallel(tiny_model(depth=4), 2, stage=3, prefetch=prefetch) as fsdp:
        result = fsdp.step(*batches(1)[0])
        bound = gathered_bytes_bound(fsdp.layer_numels, 2, prefetch, element_size=8)
        one = gathered_bytes_bound(fsdp.layer_numels, 2, 0, element_size=8)
    for report in result.memory:
        assert one <= report.peak["gathered"] <= bound
        assert report.peak_total > report.persistent_total


# -- the measured timeline ------------------------------------------------------------------------


def test_stage_3_timeline_gathers_before_every_use_and_reduce_scatters_every_backward():
    layers = 4
    with ShardedDataParallel(tiny_model(), 2, stage=3, prefetch=1, microbatches=2) as fsdp:
        timeline = fsdp.step(*batches(1)[0]).timeline
    assert timeline.source == "measured" and timeline.unit == "s"
    for worker in range(2):
        events = timeline.device_events(worker)
        kinds = [e.action.kind for e in events]
        assert kinds.count("F") == kinds.count("B") == layers * 2
        assert kinds.count("UNSHARD") == kinds.count("RESHARD") == 2 * layers * 2
        reduce_scatters = [e for e in events if e.action.kind == "REDUCE_GRAD"]
        assert len(reduce_scatters) == layers * 2
        assert all(e.label.startswith("reduce-scatter") for e in reduce_scatters)
        gathers = [e for e in events if e.action.kind == "UNSHARD"]
        for e in events:
            if e.action.kind in ("F", "B"):  # its layer was gathered, and not freed since
                key = (e.action.stage, e.action.microbatch)
                ready = [g for g in gathers if (g.action.stage, g.action.microbatch) == key]
                assert any(g.end <= e.start for g in ready)
            assert e.end >= e.start


def test_without_prefetch_no_communication_overlaps_compute():
    with ShardedDataParallel(tiny_model(), 2, stage=3, prefetch=0) as fsdp:
        timeline = fsdp.step(*batches(1)[0]).timeline
    for worker in range(2):
        events = timeline.device_events(worker)
        compute = [e for e in events if e.action.is_compute]
        for c in (e for e in events if e.action.kind in ("UNSHARD", "REDUCE_GRAD")):
            assert all(c.end <= e.start or c.start >= e.end for e in compute)


# -- the per-worker program -----------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    layers=st.integers(1, 6),
    prefetch=st.integers(0, 5),
    microbatches=st.integers(1, 3),
)
def test_program_gathers_each_use_once_and_holds_at_most_k_plus_one_layers(
    layers, prefetch, microbatches
):
    program, comms = fsdp_program(layers, 3, prefetch, microbatches)
    gathers = [c for c in comms if c.kind == "UNSHARD"]
    assert len(gathers) == 2 * layers * microbatches
    assert sum(c.kind == "REDUCE_GRAD" for c in comms) == layers * microbatches
    held, done, issued = set(), set(), set()
    for instr in program:
        if instr.op == "issue":
            op = comms[instr.comm]
            if op.kind == "UNSHARD":
                assert op.layer not in held  # never gather into a buffer still in use
                held.add(op.layer)
                assert len(held) <= prefetch + 1
            issued.add(instr.comm)
        elif instr.op == "wait":
            assert instr.comm in issued
            done.add(instr.comm)
        elif instr.op in ("F", "B"):
            assert instr.layer in held
        elif instr.op == "free":
            held.discard(instr.layer)
    assert done == set(range(len(comms)))  # everything waited for before the step ends
    assert program[-1].op == "optimizer"


def test_prefetch_issues_the_next_gathers_before_computing():
    program, comms = fsdp_program(3, 3, prefetch=2)
    first_compute = next(i for i, instr in enumerate(program) if instr.op == "F")
    issued_before = [comms[i.comm].layer for i in program[:first_compute] if i.op == "issue"]
    assert issued_before == [0, 1, 2]
    program, comms = fsdp_program(3, 3, prefetch=0)
    first_compute = next(i for i, instr in enumerate(program) if instr.op == "F")
    assert [i.op for i in program[:first_compute]] == ["issue", "wait"]


# -- the simulator --------------------------------------------------------------------------------


def costs(collective=0.5, layers=2, workers=2):
    shard_bytes = 100 * 4 // workers
    return FSDPCosts(
        forward=(1.0,) * layers,
        backward=(2.0,) * layers,
        layer_numels=(100,) * layers,
        bandwidth=(workers - 1) * shard_bytes / collective,
    )


def test_simulated_makespans_by_hand():
    # prefetch 0: G0 F0 G1 F1 G1' B1 (RS1) G0' B0 RS0 -> 4 x 0.5 waits + 6 compute + 2 x 0.5
    assert simulate_fsdp(costs(), 2, 3, prefetch=0).makespan == pytest.approx(9.0)
    # prefetch 1: only the first gather, the backward turn and the last reduce-scatter show
    assert simulate_fsdp(costs(), 2, 3, prefetch=1).makespan == pytest.approx(7.5)
    # no communication cost: pure compute
    free = FSDPCosts((1.0, 1.0), (2.0, 2.0), (100, 100), bandwidth=math.inf)
    assert simulate_fsdp(free, 2, 3, prefetch=0).makespan == pytest.approx(6.0)


def test_simulated_gathers_overlap_compute_only_with_prefetch():
    def hidden(timeline):
        events = timeline.device_events(0)
        compute = [e for e in events if e.action.is_compute]
        return sum(
            max(0.0, min(g.end, c.end) - max(g.start, c.start))
            for g in events
            if g.action.kind == "UNSHARD"
            for c in compute
        )

    many = costs(collective=0.3, layers=4)
    assert hidden(simulate_fsdp(many, 2, 3, prefetch=0)) == 0
    assert hidden(simulate_fsdp(many, 2, 3, prefetch=1)) > 0
    t0, t1 = (simulate_fsdp(many, 2, 3, prefetch=k).makespan for k in (0, 1))
    assert t1 < t0


def test_costs_read_back_from_a_simulated_timeline():
    original = costs(collective=0.25, layers=3, workers=2)
    timeline = simulate_fsdp(original, 2, 3, prefetch=1)
    recovered = costs_from_timeline(timeline, original.layer_numels, 2)
    assert recovered.forward == pytest.approx(original.forward)
    assert recovered.backward == pytest.approx(original.backward)
    assert recovered.bandwidth == pytest.approx(original.bandwidth)
    again = simulate_fsdp(recovered, 2, 3, prefetch=1)
    assert again.makespan == pytest.approx(timeline.makespan)


def test_simulator_predicts_a_measured_step_from_its_own_costs():
    with ShardedDataParallel(tiny_model(), 2, stage=3, prefetch=1) as fsdp:
        measured = fsdp.step(*batches(1)[0]).timeline
        fitted = costs_from_timeline(measured, fsdp.layer_numels, 2, element_size=8)
    predicted = simulate_fsdp(fitted, 2, 3, prefetch=1)
    kinds = sorted(str(e.action) for e in predicted.device_events(0))
    assert kinds == sorted(str(e.action) for e in measured.device_events(0))
    assert predicted.makespan > 0 and measured.makespan > 0


# -- bad input and faults -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"workers": 0}, "workers"),
        ({"workers": 2, "stage": 4}, "stage"),
        ({"workers": 2, "prefetch": -1}, "prefetch"),
        ({"workers": 2, "microbatches": 0}, "microbatches"),
        ({"workers": 2, "lr": float("nan")}, "lr"),
        ({"workers": 2, "betas": (0.9, 1.0)}, "betas"),
        ({"workers": 2, "betas": (0.9,)}, "a pair"),
    ],
)
def test_bad_settings_are_refused_before_any_thread_starts(kwargs, match):
    with pytest.raises(CourseInputError, match=match):
        ShardedDataParallel(tiny_model(), **kwargs)


def test_a_module_whose_layers_are_a_module_list_is_taken_as_its_layers():
    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(tiny_model().layers())

    wrapped = ShardedDataParallel(Stack(), workers=2)
    try:
        assert len(wrapped.layouts) == len(tiny_model().layers())
    finally:
        wrapped.close()


def test_bad_models_and_batches_are_refused():
    with pytest.raises(CourseInputError, match="buffers"):
        ShardedDataParallel([nn.BatchNorm1d(3)], 2)
    with pytest.raises(CourseInputError, match="float32 or all float64"):
        ShardedDataParallel([nn.Linear(2, 2), nn.Linear(2, 2).double()], 2)
    with ShardedDataParallel(tiny_model(), 2, microbatches=2) as fsdp:
        x, y = batches(1)[0]
        with pytest.raises(CourseInputError, match="finite"):
            fsdp.step(x * float("nan"), y)
        with pytest.raises(CourseInputError, match=">= microbatches x workers = 4"):
            fsdp.step(x[:3], y[:3])
        with pytest.raises(CourseInputError, match="same batch size"):
            fsdp.step(x, y[:5])


def test_a_failure_inside_a_worker_names_it_and_leaves_no_thread_behind():
    calls = []

    def flaky_loss(output, targets):
        calls.append(1)
        if len(calls) == 2:  # the second worker to get here fails
            raise RuntimeError("loss exploded")
        return torch.nn.functional.cross_entropy(output, targets)

    fsdp = ShardedDataParallel(tiny_model(), 2, stage=3, loss_fn=flaky_loss, timeout=5)
    try:
        with pytest.raises(WorkerError, match="worker [01]: F of layer 3 failed: loss exploded"):
            fsdp.step(*batches(1)[0])
    finally:
        fsdp.close()
    assert all(not t.is_alive() for t in fsdp.threads._threads)


# -- the command line ---------------------------------------------------------------------------


def cli(argv):
    from course_utils.cli import OneLineParser
    from course_utils.commands import fsdp as command

    parser = OneLineParser(prog="x")
    command.add_arguments(parser)
    return command, parser.parse_args(argv)


def test_cli_prints_the_comparison(capsys):
    command, args = cli(["--workers", "2", "--steps", "2"])
    assert command.run(args) == 0
    out = capsys.readouterr().out
    assert "ZeRO-3 (FSDP) on 2 workers" in out
    assert "max |parameter diff| vs one device" in out
    assert "-> 1.50x" in out
    assert "simulated" in out


def test_cli_json_is_valid_and_consistent(capsys):
    import json

    command, args = cli(["--workers", "3", "--stage", "2", "--microbatches", "2", "--json"])
    assert command.run(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["max_param_diff"] < 1e-5
    formula = result["bytes_formula_per_worker"]
    assert result["bytes_all_gather_per_worker"] == [formula["all_gather"]] * 3
    assert result["bytes_reduce_scatter_per_worker"] == [formula["reduce_scatter"]] * 3
    measured = sum(result["memory_measured_per_worker"][0].values())
    assert abs(measured / sum(result["memory_formula_per_worker"].values()) - 1) < 0.10
    assert result["measured_step_s"] > 0 and result["simulated_step_s"] > 0
    assert result["clock"] == "virtual" and result["links"]["gpus_per_node"] == 8


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--workers", "9"], "--workers must be an integer in 1..8"),
        (["--prefetch", "-1"], "--prefetch"),
        (["--steps", "0"], "--steps"),
        (["--microbatches", "99"], "--microbatches"),
        (["--stage", "0"], "--stage must be 1, 2 or 3"),
    ],
)
def test_cli_refuses_bad_input(argv, match):
    command, args = cli(argv)
    with pytest.raises(CourseInputError, match=match):
        command.run(args)


def test_cli_type_errors_exit_2():
    with pytest.raises(SystemExit) as exit_info:
        cli(["--workers", "two"])
    assert exit_info.value.code == 2


def test_cli_validates_without_importing_torch():
    import subprocess
    import sys

    code = (
        "import sys, argparse\n"
        "from course_utils.commands import fsdp\n"
        "p = argparse.ArgumentParser(); fsdp.add_arguments(p)\n"
        "try:\n"
        "    fsdp.run(p.parse_args(['--workers', '0']))\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, 'torch' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root
    )
    assert out.stdout.strip() == "CourseInputError False"


# --------------------------------------------------------------------------- on a real cluster


def _exposed(
    tokens: float,
    layers: int,
    flops: float = 1e12,
    bandwidth: float = 1e9,
    reduce_element_size: int | None = None,
) -> float:
    """Seconds a ZeRO-3 step with prefetch 1 waits beyond its compute, for equal layers."""
    from course_utils.parallel.fsdp import FSDPCosts, simulate_fsdp

    psi, workers, e = 1_000_000, 4, 2
    costs = FSDPCosts(
        forward=(2 * psi * tokens / flops,) * layers,
        backward=(4 * psi * tokens / flops,) * layers,
        layer_numels=(psi,) * layers,
        bandwidth=bandwidth,
        element_size=e,
        reduce_element_size=reduce_element_size,
    )
    timeline = simulate_fsdp(costs, workers, stage=3, prefetch=1)
    return timeline.makespan - timeline.busy_per_device()[0]


def test_gathers_hide_behind_compute_from_the_bound_on():
    from course_utils.parallel.fsdp import gather_hiding_tokens

    bound = gather_hiding_tokens(1e12, 1e9, 2, 4)
    assert bound == pytest.approx(3 / 4 * 1e12 * 2 / 2e9)
    # At or above the bound only the step's ends wait: the same however many layers.
    above = [_exposed(bound * 1.05, layers) for layers in (4, 8, 16)]
    assert above[0] == pytest.approx(above[1]) == pytest.approx(above[2])
    # Below it every layer adds a wait.
    below = [_exposed(bound * 0.6, layers) for layers in (4, 8, 16)]
    assert below[0] < below[1] < below[2]


def test_fp32_reduce_scatters_need_one_and_a_half_times_the_tokens_to_hide():
    from course_utils.parallel.fsdp import gather_hiding_tokens

    bf16 = gather_hiding_tokens(1e12, 1e9, 2, 4)
    fp32_reduce = gather_hiding_tokens(1e12, 1e9, 2, 4, reduce_element_size=4)
    # the backward sends 2 + 4 bytes per parameter for twice the forward's compute
    assert fp32_reduce == pytest.approx(1.5 * bf16)
    assert gather_hiding_tokens(1e12, 1e9, 2, 4, reduce_element_size=2) == bf16
    assert gather_hiding_tokens(1e12, 1e9, 4, 4, reduce_element_size=2) == pytest.approx(2 * bf16)
    # the simulator agrees: above the old bound the fp32 reduce-scatters still show, above
    # the new one only the ends of the step wait, however many layers
    below = [_exposed(bf16 * 1.2, n, reduce_element_size=4) for n in (4, 8, 16)]
    assert below[0] < below[1] < below[2]
    above = [_exposed(fp32_reduce * 1.05, n, reduce_element_size=4) for n in (4, 8, 16)]
    assert above[0] == pytest.approx(above[1]) == pytest.approx(above[2])
    with pytest.raises(CourseInputError, match="reduce_element_size"):
        gather_hiding_tokens(1e12, 1e9, 2, 4, reduce_element_size=0)


def test_hybrid_sharding_and_resharding_counts():
    from course_utils.parallel.fsdp import hsdp_bytes, reshard_after_forward_costs

    full, hybrid = hsdp_bytes(8e9, 64, 1), hsdp_bytes(8e9, 8, 8)
    assert full == {"states": 2e9, "inside": 3 * 63 / 64 * 16e9, "across": 0.0}
    assert hybrid["states"] == 16e9 and hybrid["inside"] == pytest.approx(3 * 7 / 8 * 16e9)
    assert hybrid["across"] == pytest.approx(2 * 7 / 8 * 16e9 / 8)
    ring = 63 / 64 * 2e9
    assert reshard_after_forward_costs([1e9], 64, True) == {"gathered": 0.0, "sent": 3 * ring}
    assert reshard_after_forward_costs([1e9], 64, False) == {"gathered": 2e9, "sent": 2 * ring}
    node = reshard_after_forward_costs([1e9], 64, 8)
    assert node == {"gathered": 2e9 / 8, "sent": pytest.approx(2 * ring + 7 / 8 * 2e9)}
    for bad in (1, 3, 64.0):
        with pytest.raises(CourseInputError, match="reshard must be True, False or a divisor"):
            reshard_after_forward_costs([1e9], 64, bad)


def test_fp32_gradient_buffers_add_two_bytes_per_parameter_sharded_like_gradients():
    from course_utils import plan

    for zero, per_gpu in ((0, 2.0), (1, 2.0), (2, 2.0 / 8), (3, 2.0 / 8)):
        a = sum(plan.model_state_bytes(1.0, "bf16-mixed", zero, dp=8).values())
        b = sum(plan.model_state_bytes(1.0, "bf16-mixed-fp32-grads", zero, dp=8).values())
        assert b - a == pytest.approx(per_gpu)
