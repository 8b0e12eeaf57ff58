"""The thread pipeline executor: same numbers as the unsplit model, honest timelines, clean
failures (errors, deadlocks, Ctrl-C) and a usable executor afterwards."""

import _thread
import copy
import json
import threading
import time

import pytest
import torch
from conftest import run_module
from torch import nn

from course_utils.actions import Action, Schedule
from course_utils.errors import CourseInputError, ScheduleError, WorkerError
from course_utils.models import (
    MLP,
    CharTokenizer,
    GPTConfig,
    TinyGPT,
    load_text,
    loss_fn,
    partition,
    single_thread,
)
from course_utils.pipeline.executor import PipelineExecutor, simulated_from_measured
from course_utils.pipeline.schedules import make_schedule
from course_utils.threads.devices import ABORT_GRACE_S

# (name, chunks) for every schedule the course teaches
ALL = [
    ("naive", 1),
    ("gpipe", 1),
    ("1f1b", 1),
    ("interleaved", 2),
    ("breadth-first", 2),
    ("zb-h1", 1),
]
P, M = 2, 4


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


def make_model(kind: str, num_stages: int) -> nn.Module:
    torch.manual_seed(0)
    if kind == "mlp":
        return MLP(16, 32, 5, depth=max(3, num_stages))
    vocab = CharTokenizer(load_text()).vocab_size
    cfg = GPTConfig(vocab_size=vocab, block_size=8, n_layer=max(2, num_stages), d_model=32)
    return TinyGPT(cfg)


def reference(model, x, y):
    ref = copy.deepcopy(model)
    loss = loss_fn(ref(x), y)
    loss.backward()
    return ref, loss.item()


def max_grad_diff(a: nn.Module, b: nn.Module) -> float:
    return max(
        (p.grad - q.grad).abs().max().item()
        for p, q in zip(a.parameters(), b.parameters(), strict=True)
    )


def hand_schedule(rows, stages=2, microbatches=2, name="hand") -> Schedule:
    devices = tuple(tuple(Action.parse(a) for a in row.split()) for row in rows)
    return Schedule(name, stages, microbatches, devices)


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
@pytest.mark.parametrize("name,chunks", ALL)
def test_one_step_matches_unsplit_model(kind, name, chunks):
    model = make_model(kind, P * chunks)
    x, y = model.example_batch(8, torch.Generator().manual_seed(1))
    ref, ref_loss = reference(model, x, y)
    schedule = make_schedule(name, P, M, chunks)
    with PipelineExecutor(partition(model, P * chunks), P, loss_fn) as ex:
        result = ex.step(schedule, x, y)
    assert abs(result.loss - ref_loss) <= 1e-5
    assert max_grad_diff(model, ref) <= 1e-5
    tl = result.timeline
    assert tl.source == "measured" and tl.unit == "s"
    computed = sorted(str(a) for acts in schedule.devices for a in acts if a.is_compute)
    assert sorted(str(e.action) for e in tl.events if e.action.is_compute) == computed
    for d in range(P):  # each device ran its actions in the schedule's order, one at a time
        events = [e for e in tl.device_events(d) if e.action.is_compute]
        assert [e.action for e in events] == [a for a in schedule.devices[d] if a.is_compute]
        assert all(e.start <= e.end <= f.start for e, f in zip(events, events[1:], strict=False))
    # on the virtual clock every message between devices is a transfer on the links
    owner = schedule.device_of_stage()
    crossings = sum(owner[s] != owner[s + 1] for s in range(schedule.stages - 1))
    sends = [e for e in tl.events if e.action.kind in ("SEND_F", "SEND_B")]
    assert len(sends) == 2 * crossings * -(-M // schedule.batch_scale)
    # memory as the simulator counts it, but measured
    assert tl.peak_activations == simulated_from_measured(result, schedule).peak_activations


@pytest.mark.parametrize("name,chunks", ALL)
@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_training_steps_give_the_same_weights(name, chunks, opt):
    model = make_model("mlp", P * chunks)
    ref = copy.deepcopy(model)

    def optimizer(m):
        if opt == "sgd":
            return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        return torch.optim.Adam(m.parameters(), lr=1e-2)

    opt_pipe, opt_ref = optimizer(model), optimizer(ref)
    gen = torch.Generator().manual_seed(2)
    schedule = make_schedule(name, P, M, chunks)
    with PipelineExecutor(partition(model, P * chunks), P, loss_fn) as ex:
        for _ in range(3):
            x, y = model.example_batch(8, gen)
            ex.step(schedule, x, y, optimizer=opt_pipe)
            opt_ref.zero_grad()
            loss_fn(ref(x), y).backward()
            opt_ref.step()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert (p - q).abs().max().item() <= 1e-5


def test_looping_placement_four_devices_eight_stages():
    model = make_model("gpt", 8)
    x, y = model.example_batch(8)
    ref, ref_loss = reference(model, x, y)
    with PipelineExecutor(partition(model, 8), 4, loss_fn) as ex:
        result = ex.step(make_schedule("interleaved", 4, 4, 2), x, y)
        devices = {e.action.stage: e.device for e in result.timeline.events}
    assert devices == {s: s % 4 for s in range(8)}
    assert abs(result.loss - ref_loss) <= 1e-5 and max_grad_diff(model, ref) <= 1e-5


def test_stage_costs_feed_the_simulator():
    model = make_model("mlp", 2)
    x, y = model.example_batch(8)
    schedule = make_schedule("zb-h1", P, M)
    with PipelineExecutor(partition(model, 2), P, loss_fn) as ex:
        result = ex.step(schedule, x, y)
    costs = result.stage_costs
    assert len(costs.forward) == len(costs.backward) == 2
    assert all(c > 0 for c in costs.forward + costs.backward)
    assert 0 < costs.weight_fraction < 1
    sim = simulated_from_measured(result, schedule)
    assert sim.source == "simulated" and sim.unit == "s"
    assert [str(e.action) for e in sorted(sim.events, key=lambda e: (e.device, e.start))] == [
        str(a) for acts in schedule.devices for a in acts if a.is_compute
    ]
    assert sim.makespan > 0


def test_worker_error_names_device_action_and_executor_recovers():
    model = make_model("mlp", 2)
    x, y = model.example_batch(8)
    stages = partition(model, 2)
    good = stages[1]
    stages[1] = nn.Linear(7, 5)  # wrong input width: a shape error in stage 1's forward
    schedule = make_schedule("gpipe", P, M)
    ex = PipelineExecutor(stages, P, loss_fn)
    try:
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as info:
            ex.step(schedule, x, y)
        assert time.monotonic() - t0 < 2
        msg = str(info.value)
        assert msg.startswith("device 1 failed in 1F0 (stage 1, micro-batch 0, forward): ")
        assert "RuntimeError" in msg and "\n" not in msg
        assert isinstance(info.value.__cause__, WorkerError)

        ex.stages[1] = good  # fix it: the same executor (same threads) works again
        ref, ref_loss = reference(model, x, y)
        result = ex.step(schedule, x, y)
        assert abs(result.loss - ref_loss) <= 1e-5 and max_grad_diff(model, ref) <= 1e-5
    finally:
        ex.close()
    assert not any(t.is_alive() for t in ex.threads._threads)


def test_fail_at_raises_inside_that_action():
    model = make_model("mlp", 2)
    x, y = model.example_batch(8)
    with PipelineExecutor(partition(model, 2), P, loss_fn) as ex:
        with pytest.raises(WorkerError, match=r"device 1 failed in 1F2 \(stage 1, micro-batch 2"):
            ex.step(make_schedule("1f1b", P, M), x, y, fail_at="1F2")
        with pytest.raises(CourseInputError, match="fail_at"):
            ex.step(make_schedule("1f1b", P, M), x, y, fail_at="1F9")
        assert ex.step(make_schedule("1f1b", P, M), x, y).loss > 0


def test_deadlock_is_reported_quickly_with_what_each_device_waits_for():
    model = make_model("mlp", 2)
    x, y = model.example_batch(4)
    # device 1 wants micro-batch 1 first, but device 0 sends it only after 0B0,
    # which needs device 1's 1B0: nobody can move.
    bad = hand_schedule(["0F0 0B0 0F1 0B1", "1F1 1F0 1B0 1B1"])
    with PipelineExecutor(partition(model, 2), P, loss_fn) as ex:
        t0 = time.monotonic()
        with pytest.raises(ScheduleError, match="deadlock") as info:
            ex.step(bad, x, y)
        assert time.monotonic() - t0 < 3
        msg = str(info.value)
        assert "device 0 waits for the input gradient of stage 1 micro-batch 0 for 0B0" in msg
        assert "device 1 waits for the activations of stage 0 micro-batch 1 for 1F1" in msg
        good = hand_schedule(["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"])
        assert ex.step(good, x, y).loss > 0  # usable again


def test_incomplete_or_misplaced_schedules_are_rejected_before_running():
    model = make_model("mlp", 2)
    x, y = model.example_batch(4)
    with PipelineExecutor(partition(model, 2), P, loss_fn) as ex:
        with pytest.raises(ScheduleError, match="1F1 is missing"):
            ex.step(hand_schedule(["0F0 0F1 0B0 0B1", "1F0 1B0 1B1"]), x, y)
        with pytest.raises(ScheduleError, match="stage 0 runs on devices 0 and 1"):
            ex.step(hand_schedule(["0F0 0B0 0B1", "0F1 1F0 1B0 1F1 1B1"]), x, y)
        with pytest.raises(ScheduleError, match="before 1F1"):
            ex.step(hand_schedule(["0F0 0F1 0B0 0B1", "1F0 1B0 1B1 1F1"]), x, y)
        with pytest.raises(CourseInputError, match="divisible"):
            ex.step(make_schedule("gpipe", P, 3), x, y)
        with pytest.raises(CourseInputError, match="3 devices"):
            ex.step(make_schedule("gpipe", 3, 2), x, y)
    with pytest.raises(CourseInputError, match="multiple of num_devices"):
        PipelineExecutor(partition(model, 3), 2)


def test_keyboard_interrupt_stops_the_workers(ctrl_c_delivered):
    class Slow(nn.Linear):
        def forward(self, x):
            time.sleep(0.05)
            return super().forward(x)

    stages = [Slow(16, 16), nn.Linear(16, 5)]
    x, y = torch.randn(16, 16), torch.randint(5, (16,))
    with PipelineExecutor(stages, P, loss_fn) as ex:
        timer = threading.Timer(0.2, _thread.interrupt_main)
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            ex.step(make_schedule("gpipe", P, 16), x, y)
        assert time.monotonic() - t0 < 2  # 16 x 50 ms of work were not all done
        assert ex.step(make_schedule("gpipe", P, 2), x, y).loss > 0


@pytest.fixture
def cli(run_cli):
    """`python -m course_utils run ARGS...` in this process: (returncode, stdout, stderr)."""
    return lambda *args: run_cli("run", *args)


def test_cli_json_figures(cli, tmp_path):
    png = tmp_path / "gantt.png"
    out = cli("1f1b", "--devices", "2", "--microbatches", "4", "--json", "--gantt", str(png))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    for key in ("measured_step_s", "unsplit_step_s", "speedup", "simulated_step_s"):
        assert data[key] > 0
    assert data["clock"] == "virtual"
    assert data["schedule"] == "1f1b"
    assert data["ideal_speedup"] == pytest.approx(2 * 4 / (4 + 2 - 1))
    assert data["max_grad_diff"] <= 1e-5
    assert len([e for e in data["events"] if "SEND" not in e["action"]]) == 16
    assert len([e for e in data["events"] if "SEND" in e["action"]]) == 8  # 4 each way
    assert set(data["events"][0]) == {"device", "action", "start", "end"}
    assert png.stat().st_size > 10_000  # measured vs simulated chart


def test_cli_fail_at_and_bad_input_are_one_line(cli):
    out = cli("gpipe", "--devices", "2", "--microbatches", "4", "--fail-at", "1F2")
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and "1F2" in out.stderr and "Traceback" not in out.stderr
    out = cli("gpipe", "--devices", "2", "--microbatches", "0")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    out = cli("nope", "--devices", "2")
    assert out.returncode == 2 and out.stderr.count("\n") == 1


@pytest.mark.slow
def test_cli_smoke_in_a_subprocess():
    ok = run_module("run", "gpipe", "--devices", "2", "--microbatches", "2", "--model", "mlp")
    assert ok.returncode == 0, ok.stderr
    assert "max gradient difference" in ok.stdout and "speed-up" in ok.stdout
    assert "peak activations per device (micro-batches): [2, 2]" in ok.stdout
    bad = run_module("run", "gpipe", "--devices", "2", "--microbatches", "0")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "--microbatches" in bad.stderr


def test_a_forgotten_executor_stops_its_threads():
    import gc

    model = make_model("mlp", 2)
    x, y = model.example_batch(4)
    ex = PipelineExecutor(partition(model, 2), P, loss_fn)
    ex.step(make_schedule("gpipe", P, 2), x, y)
    threads = list(ex.threads._threads)
    del ex
    gc.collect()
    for t in threads:
        t.join(timeout=5)
    assert not any(t.is_alive() for t in threads)


def test_zero_bubble_split_with_parameters_outside_recorded_modules():
    # A module that owns a parameter but returns a tuple: W falls back to the plain way.
    class ScaleToTuple(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 16))

        def forward(self, x):
            return (x * self.scale,)

    class First(nn.Module):
        def forward(self, pair):
            return pair[0]

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 16), nn.GELU(), ScaleToTuple(), First(), nn.Linear(16, 16), nn.Linear(16, 5)
    )
    stages = [model[:4], model[4:]]
    x, y = torch.randn(8, 16), torch.randint(5, (8,))
    ref, ref_loss = reference(model, x, y)
    with PipelineExecutor(stages, P, loss_fn) as ex:
        result = ex.step(make_schedule("zb-h1", P, M), x, y)
    assert abs(result.loss - ref_loss) <= 1e-5 and max_grad_diff(model, ref) <= 1e-5


class Sleepy(nn.Module):
    """A stage that computes nothing for `seconds` in its forward: a slow device."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds, self.scale = seconds, nn.Parameter(torch.ones(1))

    def forward(self, x):
        time.sleep(self.seconds)
        return x * self.scale


@pytest.mark.slow  # seconds of sleeping on the wall clock
def test_a_slow_stage_is_not_a_deadlock():
    # Device 1 waits 6 s for device 0's first message: slow, not stuck (no message is
    # missing for good), so the step completes. (Sleeping takes no CPU time: only the wall
    # clock sees it.)
    stages = [Sleepy(6.0), nn.Linear(4, 2)]
    x, y = torch.randn(2, 4), torch.tensor([0, 1])
    with PipelineExecutor(stages, 2, loss_fn, clock="wall") as ex:
        result = ex.step(make_schedule("gpipe", 2, 1), x, y)
    assert result.loss > 0 and result.timeline.device_events(1)[0].start >= 6.0


@pytest.mark.slow  # seconds of sleeping on the wall clock
def test_the_step_time_limit_bounds_the_step():
    stages = [Sleepy(3.0), nn.Linear(4, 2)]
    x, y = torch.randn(4, 4), torch.tensor([0, 1, 0, 1])
    with PipelineExecutor(stages, 2, loss_fn, step_timeout=1.0) as ex:
        t0 = time.monotonic()
        with pytest.raises(
            WorkerError, match=r"ran past its limit of 1 s \(step_timeout\)"
        ) as info:
            ex.step(make_schedule("gpipe", 2, 2), x, y)
        assert "device 0 was at 0F0" in str(info.value)
        assert time.monotonic() - t0 < 1.0 + ABORT_GRACE_S  # the limit plus the abort grace
    with pytest.raises(CourseInputError, match="step_timeout"):
        PipelineExecutor(stages, 2, loss_fn, step_timeout=float("nan"))


@pytest.mark.slow  # seconds of sleeping on the wall clock
def test_a_bar_ends_when_the_work_does_not_after_the_hand_over(monkeypatch):
    # Posting a message can hand the core to the receiver before the sender reads the
    # clock again (one core, the GIL). Here every hand-over takes 0.3 s: the bars of the
    # tiny stages must not include it, or measured charts would show overlap that is not.
    from course_utils.pipeline import executor as executor_module

    real_put = executor_module.Mailboxes.put

    def slow_put(self, key, value):
        time.sleep(0.3)
        real_put(self, key, value)

    monkeypatch.setattr(executor_module.Mailboxes, "put", slow_put)
    model = make_model("mlp", 2)
    x, y = model.example_batch(8, torch.Generator().manual_seed(1))
    with PipelineExecutor(partition(model, 2), 2, loss_fn) as ex:
        ex.step(make_schedule("gpipe", 2, 2), x, y)  # a thread's first backward starts slowly
        result = ex.step(make_schedule("gpipe", 2, 2), x, y)
    senders = [e for e in result.timeline.events if e.action.kind in "FB"]
    assert len(senders) == 8 and max(e.end - e.start for e in senders) < 0.2, senders
