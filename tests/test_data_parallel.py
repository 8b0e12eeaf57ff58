"""Data parallelism on threads equals one worker on the whole batch; timelines and the model."""

import json

import pytest
import torch
from conftest import run_module
from torch import nn

from course_utils.actions import Action
from course_utils.errors import CourseInputError, WorkerError
from course_utils.parallel.data_parallel import (
    DataParallel,
    dp_speedup_model,
    max_param_diff,
    shard_sizes,
    single_worker_steps,
)
from course_utils.threads.collectives import naive_bytes_per_rank, ring_bytes_per_rank

D_IN, CLASSES = 12, 5


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(D_IN, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, CLASSES)
    )


def make_batches(batch: int, steps: int, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch, D_IN, generator=gen), torch.randint(CLASSES, (batch,), generator=gen))
        for _ in range(steps)
    ]


@pytest.mark.parametrize("algorithm", ["ring", "naive"])
@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_same_weights_as_one_worker_on_the_whole_batch(workers, algorithm):
    model, batches = make_model(), make_batches(batch=24, steps=4)
    reference, ref_losses = single_worker_steps(model, batches)
    with DataParallel(model, workers, algorithm) as dp:
        losses = [dp.step(x, y).loss for x, y in batches]
        assert max_param_diff(dp.replicas[0], reference) <= 1e-5
        assert dp.max_replica_diff() == 0.0  # replicas stay bit-identical
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    # the model passed in is left alone
    assert max_param_diff(model, make_model()) == 0.0
    assert max_param_diff(model, reference) > 1e-3  # ...and training really changed weights


@pytest.mark.parametrize("workers, microbatches", [(1, 4), (2, 3), (3, 2)])
def test_accumulating_micro_batches_equals_one_worker_on_the_whole_batch(workers, microbatches):
    # The fair single-device baseline for N workers is DataParallel(model, 1, microbatches=N):
    # the same forward and backward passes, one after another, gradients accumulated.
    model, batches = make_model(), make_batches(batch=24, steps=3)
    reference, ref_losses = single_worker_steps(model, batches)
    with DataParallel(model, workers, microbatches=microbatches) as dp:
        results = [dp.step(x, y) for x, y in batches]
        assert max_param_diff(dp.replicas[0], reference) <= 1e-5
    assert [r.loss for r in results] == pytest.approx(ref_losses, abs=1e-5)
    kinds = [e.action for e in results[-1].timeline.device_events(0) if e.action.is_compute]
    assert kinds == [Action(0, k, mb) for mb in range(microbatches) for k in "FB"]


def test_a_shard_smaller_than_its_micro_batches_is_refused():
    with DataParallel(make_model(), 2, microbatches=4) as dp:
        x, y = make_batches(batch=6, steps=1)[0]
        with pytest.raises(CourseInputError, match="at least one sample per micro-batch"):
            dp.step(x, y)
    with pytest.raises(CourseInputError, match="microbatches must be an integer"):
        DataParallel(make_model(), 1, microbatches=0)


def test_uneven_shards_are_weighted_exactly():
    # 10 samples over 4 workers: shards of 3, 3, 2, 2
    assert shard_sizes(10, 4) == [3, 3, 2, 2]
    model, batches = make_model(), make_batches(batch=10, steps=3)
    reference, _ = single_worker_steps(model, batches)
    with DataParallel(model, 4, "ring") as dp:
        for x, y in batches:
            result = dp.step(x, y)
        assert result.timeline.meta["shard_sizes"] == [3, 3, 2, 2]
        assert max_param_diff(dp.replicas[0], reference) <= 1e-5


def test_adam_and_mse_loss_match_too():
    def adam(params):
        return torch.optim.Adam(params, lr=1e-2)

    model = make_model()
    gen = torch.Generator().manual_seed(3)
    batches = [(torch.randn(8, D_IN, generator=gen), torch.randn(8, CLASSES, generator=gen))]
    batches = batches * 3
    mse = nn.functional.mse_loss
    reference, _ = single_worker_steps(model, batches, loss_fn=mse, optimizer=adam)
    with DataParallel(model, 2, "naive", loss_fn=mse, optimizer=adam) as dp:
        for x, y in batches:
            dp.step(x, y)
        assert max_param_diff(dp.replicas[1], reference) <= 1e-5


def test_unused_parameters_get_zero_gradients():
    class WithSpare(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Linear(D_IN, CLASSES)
            self.spare = nn.Linear(3, 3)  # never called: no .grad after backward

        def forward(self, x):
            return self.used(x)

    torch.manual_seed(0)
    model, batches = WithSpare(), make_batches(batch=6, steps=2)
    reference, _ = single_worker_steps(model, batches)
    with DataParallel(model, 3) as dp:
        for x, y in batches:
            dp.step(x, y)
        assert max_param_diff(dp.replicas[2], reference) <= 1e-5


@pytest.mark.parametrize("algorithm", ["ring", "naive"])
def test_measured_timeline_and_bytes(algorithm):
    model, (batch,) = make_model(), make_batches(batch=16, steps=1)
    workers = 3
    with DataParallel(model, workers, algorithm) as dp:
        result = dp.step(*batch)
        numel = dp.param_bytes // 4
    tl = result.timeline
    assert tl.source == "measured" and tl.unit == "s" and tl.num_devices == workers
    for d in range(workers):
        events = tl.device_events(d)
        assert [str(e.action) for e in events] == ["0F0", "0B0", "0REDUCE_GRAD"]
        assert events[2].action == Action(0, "REDUCE_GRAD") and events[2].label == "all-reduce"
        for prev, nxt in zip(events, events[1:], strict=False):
            assert prev.end <= nxt.start
        assert all(e.end > e.start >= 0 for e in events)
    assert tl.makespan < 60  # seconds, not nanoseconds
    expected = ring_bytes_per_rank if algorithm == "ring" else naive_bytes_per_rank
    assert result.bytes_sent == expected(numel, workers)


def test_gantt_draws_the_measured_timeline():
    """Every measured forward and backward is a bar in its worker's row, at its measured time
    (milliseconds from the step's start) and in its micro-batch's colour; every all-reduce a
    thin communication bar at its own measured time."""
    from collections import Counter

    from test_gantt import bar_key, bars, chart, event_key

    model, (batch,) = make_model(), make_batches(batch=8, steps=1)
    with DataParallel(model, 2) as dp:
        timeline = dp.step(*batch).timeline
    ax = chart(timeline).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["dev 0", "dev 1"]
    passes = [e for e in timeline.events if e.action.kind in ("F", "B")]
    assert len(passes) == 4 and not Counter(
        event_key(e, timeline.start, 1000.0, 3) for e in passes
    ) - Counter(bar_key(b, 3) for b in bars(ax, "compute"))
    reduces = [e for e in timeline.events if e.label == "all-reduce"]
    assert sorted(
        (b["device"], round(b["x0"], 3), round(b["x1"], 3)) for b in bars(ax, "comm")
    ) == (
        sorted(
            (
                e.device,
                round((e.start - timeline.start) * 1e3, 3),
                round((e.end - timeline.start) * 1e3, 3),
            )
            for e in reduces
        )
    )
    assert len(reduces) == 2  # one per worker


def test_speedup_model_explains_sixteen_workers():
    # the docstring's ResNet-50 example: about 9.9x on 16 workers, not 16x
    s = dp_speedup_model(16, compute_time=4.0, grad_bytes=102.4e6, bandwidth=1.25e9, latency=50e-6)
    assert s == pytest.approx(4.0 / (0.25 + 2 * 15 / 16 * 102.4e6 / 1.25e9 + 30 * 50e-6))
    assert 9.5 < s < 10.5
    assert dp_speedup_model(1, 4.0, 102.4e6, 1.25e9) == pytest.approx(1.0)
    # free communication gives the ideal; full overlap hides it
    assert dp_speedup_model(8, 1.0, 0.0, 1e9) == pytest.approx(8.0)
    assert dp_speedup_model(8, 1.0, 1e9, 1e9, overlap=1.0) == pytest.approx(8.0)
    # more workers always help less and less
    speedups = [dp_speedup_model(n, 4.0, 102.4e6, 1.25e9) for n in (2, 4, 8, 16, 32)]
    gains = [b / a for a, b in zip(speedups, speedups[1:], strict=False)]
    assert all(g2 < g1 for g1, g2 in zip(gains, gains[1:], strict=False))


def test_bad_input():
    model = make_model()
    with pytest.raises(CourseInputError, match="workers must be an integer from 1 to 16"):
        DataParallel(model, 0)
    with pytest.raises(CourseInputError, match="algorithm must be one of ring, naive"):
        DataParallel(model, 2, "tree")
    with DataParallel(model, 4) as dp:
        x, y = make_batches(batch=3, steps=1)[0]
        with pytest.raises(CourseInputError, match="batch size must be >= workers"):
            dp.step(x, y)
    with pytest.raises(CourseInputError, match="overlap"):
        dp_speedup_model(2, 1.0, 1.0, 1.0, overlap=2.0)


@pytest.fixture
def _cli(run_cli):
    """`python -m course_utils data-parallel ARGS...` here: (returncode, stdout, stderr)."""
    return lambda *args: run_cli("data-parallel", *args)


@pytest.mark.parametrize(
    "args, message",
    [(["--workers", "0"], "workers"), (["--allreduce", "tree"], "allreduce")],
)
def test_cli_bad_input_is_one_line_exit_2(_cli, args, message):
    proc = _cli(*args)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_json(_cli):
    proc = _cli("--workers", "2", "--allreduce", "naive", "--batch", "64", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in ("workers", "max_param_diff", "speedup", "bytes_sent_per_worker", "param_bytes"):
        assert key in out
    assert out["workers"] == 2 and out["max_param_diff"] <= 1e-5 and out["speedup"] > 0
    assert out["bytes_sent_per_worker"] == [out["param_bytes"]] * 2  # naive, 2 workers
    assert {e["action"] for e in out["events"]} == {"0F0", "0B0", "0REDUCE_GRAD"}


@pytest.mark.slow
def test_cli_smoke_in_a_subprocess():
    ok = run_module("data-parallel", "--workers", "2", "--batch", "32", "--steps", "1")
    assert ok.returncode == 0, ok.stderr
    assert "data parallel: 2 workers, ring all-reduce, batch 32" in ok.stdout
    assert "max |param diff| vs one worker on the whole batch" in ok.stdout
    assert "speed-up" in ok.stdout and "sent per worker (MB)" in ok.stdout
    bad = run_module("data-parallel", "--workers", "0")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "--workers" in bad.stderr


def test_tiny_gpt_data_parallel_matches_one_worker():
    from course_utils import models

    torch.manual_seed(0)
    cfg = models.GPTConfig(vocab_size=20, block_size=8, n_layer=2, n_head=2, d_model=16)
    model = models.TinyGPT(cfg)
    gen = torch.Generator().manual_seed(5)
    batches = [model.example_batch(6, generator=gen) for _ in range(3)]
    reference, _ = single_worker_steps(model, batches, loss_fn=models.loss_fn)
    with DataParallel(model, 3, "ring", loss_fn=models.loss_fn) as dp:
        for x, y in batches:
            dp.step(x, y)
        assert max_param_diff(dp.replicas[0], reference) <= 1e-5
        assert dp.max_replica_diff() == 0.0


def test_a_failing_replica_raises_and_the_next_step_still_works():
    class Flaky(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(D_IN, CLASSES)
            self.fail = False

        def forward(self, x):
            if self.fail:
                raise RuntimeError("replica broke")
            return self.lin(x)

    torch.manual_seed(0)
    model, batches = Flaky(), make_batches(batch=8, steps=2)
    reference, _ = single_worker_steps(model, batches[1:])
    with DataParallel(model, 2) as dp:
        dp.replicas[1].fail = True
        with pytest.raises(WorkerError, match="device 1 failed: RuntimeError: replica broke"):
            dp.step(*batches[0])
        # undo the half-step: replica 0 never reached its optimizer step (it was waiting)
        assert max_param_diff(dp.replicas[0], model) == 0.0
        dp.replicas[1].fail = False
        dp.step(*batches[1])
        assert max_param_diff(dp.replicas[0], reference) <= 1e-5
