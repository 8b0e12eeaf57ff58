"""The measuring tools: interleaved timing, the capacity probe, reference recordings."""

from __future__ import annotations

import json
import os

import pytest

from course_utils.errors import CourseInputError
from course_utils.measure import reference
from course_utils.measure.capacity import Capacity, probe
from course_utils.measure.timing import compare, step_time
from course_utils.pipeline import make_schedule, simulate
from course_utils.timeline import Timeline


def test_variants_are_timed_in_turns_after_untimed_warmup():
    calls = []
    timings = compare({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3, 2)
    assert calls == ["a", "b"] * 5  # 2 warm-up rounds, then 3 timed rounds, interleaved
    assert [len(t.samples) for t in timings.values()] == [3, 3]
    assert all(s >= 0 for t in timings.values() for s in t.samples)


def test_the_budget_stops_new_rounds_but_every_variant_runs_once():
    import time

    timings = compare({"slow": lambda: time.sleep(0.05), "x": lambda: 1}, 10, 0, budget_s=0.01)
    assert len(timings["slow"].samples) == 1 and len(timings["x"].samples) == 1


def test_best_spread_and_the_best_runs_result():
    timings = compare({"v": iter([3, 1, 2]).__next__}, repeats=3, warmup=0)
    t = timings["v"]
    t.samples = [0.3, 0.1, 0.2]  # as if measured
    assert t.best == 0.1 and t.median == 0.2 and t.spread == pytest.approx(2.0)
    assert t.best_result == 1


def test_on_the_virtual_clock_a_variants_runs_are_put_together_burst_by_burst():
    import torch

    from course_utils.parallel.data_parallel import DataParallel
    from course_utils.threads.trace import CPU

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    x, y = torch.randn(64, 8), torch.randint(3, (64,))
    with DataParallel(model, 2) as dp:
        t = compare({"dp": lambda: dp.step(x, y)}, repeats=3, time_of=step_time)["dp"]
    assert t.steady is not None and t.best == t.best_result.timeline.makespan
    bursts = [[[op[1] for op in s.ops if op[0] == CPU] for s in r.trace.streams] for r in t.results]
    merged = [[op[1] for op in s.ops if op[0] == CPU] for s in t.best_result.trace.streams]
    # every burst at its least time over the three runs, each on its own device
    assert merged == [
        [min(b) for b in zip(*per_stream, strict=True)] for per_stream in zip(*bursts, strict=True)
    ]
    assert t.best <= min(t.samples) * 1.02  # replayed from shorter bursts: no slower
    wall = compare({"v": lambda: 1}, repeats=2)["v"]
    assert wall.steady is None  # what is not a virtual-clock run keeps its best run


def test_a_probed_comparison_replays_every_variant_over_links_at_the_best_rate_probed(
    monkeypatch,
):
    # The links are scaled to the core's compute rate; probed once per process, that rate and
    # the steps' fastest moments can be two speeds of a drifting core. Probed after every
    # timed call instead, on the devices' core, all variants get the best rate seen then.
    import torch

    from course_utils.measure import timing
    from course_utils.parallel.data_parallel import DataParallel
    from course_utils.threads.clock import default_links
    from course_utils.threads.links import cluster_links

    probed = iter([1e11, 4e11, 2e11, 1e11, 3e11, 1e11] * 10)
    where: list[set[int]] = []

    def fake_probe(rounds: int = 1) -> float:
        if hasattr(os, "sched_getaffinity"):
            where.append(os.sched_getaffinity(0))
        return next(probed)

    monkeypatch.setattr(timing, "probe_flops", fake_probe)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    x, y = torch.randn(64, 8), torch.randint(3, (64,))
    links = cluster_links(gpus_per_node=1, compute_rate=1e11)  # every message leaves its node
    with DataParallel(model, 2, links=links) as one, DataParallel(model, 2, links=links) as two:
        runs = {"a": lambda: one.step(x, y), "b": lambda: two.step(x, y)}
        timed = compare(runs, repeats=3, warmup=1, time_of=step_time, rate_probe=True)
        core = two.threads.cpus
        plain = compare(runs, repeats=3, warmup=1, time_of=step_time)
    assert len(where) == 6  # after every timed call, not the warm-ups
    if core is not None:
        assert where == [core] * 6  # on the devices' core, whichever the caller ran on
    for name in runs:
        t = timed[name]
        used = t.best_result.trace.links
        assert t.rate == 4e11 and used == links.at_rate(4e11)
        # the put-together run replayed over those links, not over the ones probed once:
        # the same bursts, the all-reduce's messages four times faster
        trace = t.best_result.trace
        assert t.best == trace.timeline("virtual", used).makespan
        assert t.best < trace.timeline("virtual", links).makespan
        assert plain[name].rate is None and plain[name].best_result.trace.links == links
    with DataParallel(model, 2, clock="wall") as walled:  # real timestamps: nothing to scale
        wall = compare({"w": lambda: walled.step(x, y)}, 2, 0, time_of=step_time, rate_probe=True)
    assert len(where) == 6 and wall["w"].rate is None
    with DataParallel(model, 2) as own:  # no links given: the course's cluster, at that rate
        probe = compare({"c": lambda: own.step(x, y)}, 1, 0, time_of=step_time, rate_probe=True)
    assert probe["c"].best_result.trace.links == default_links().at_rate(probe["c"].rate)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no thread affinity here")
def test_the_probe_runs_on_the_devices_core_and_gives_the_caller_its_cores_back():
    from course_utils.threads.devices import DeviceThreads, on_the_devices_core

    mine = os.sched_getaffinity(0)
    with DeviceThreads(1, one_core=True) as pool:
        assert on_the_devices_core(lambda: os.sched_getaffinity(0)) == pool.cpus
    assert os.sched_getaffinity(0) == mine


@pytest.mark.parametrize(
    "kwargs, words",
    [({"repeats": 0}, "repeats"), ({"warmup": -1}, "warmup"), ({"budget_s": 0}, "budget_s")],
)
def test_bad_timing_arguments(kwargs, words):
    with pytest.raises(CourseInputError, match=words):
        compare({"a": lambda: None}, **kwargs)
    with pytest.raises(CourseInputError, match="variants"):
        compare({})


def test_capacity_probe_measures_and_names_its_regime():
    capacity = probe(size=64, repeats=5, rounds=1)
    assert capacity.speedup > 0 and capacity.cores >= 1
    assert capacity.regime in ("two free cores", "shared cores", "one core")
    assert f"{capacity.speedup:.2f}x" in capacity.sentence()
    assert Capacity(1.9, 2, 1, 0.5).regime == "two free cores"
    assert Capacity(1.3, 2, 1, 0.7).regime == "shared cores"
    assert Capacity(1.9, 1, 1, 0.5).regime == "one core"  # one core allowed: threads take turns
    assert Capacity(1.0, 2, 1, 1.0).regime == "one core"


def test_timeline_round_trips_through_json():
    tl = simulate(make_schedule("interleaved", 2, 4, 2))
    back = Timeline.from_dict(json.loads(json.dumps(tl.to_dict())))
    assert back.events == sorted(tl.events, key=lambda e: (e.start, e.device))
    assert (back.num_devices, back.stages, back.microbatches, back.chunks) == (2, 4, 4, 2)
    assert back.makespan == tl.makespan and back.bubble_fraction == tl.bubble_fraction


def test_twin_records_when_asked_and_loads_otherwise(tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "FOLDER", tmp_path)
    tl = simulate(make_schedule("gpipe", 2, 2))
    monkeypatch.delenv(reference.RECORD_ENV, raising=False)
    assert reference.twin("99-test", {"gpipe": tl}, {"speedup": 1.5}) is None  # nothing stored
    monkeypatch.setenv(reference.RECORD_ENV, "1")
    capacity = Capacity(1.9, 2, 0.2, 0.105)
    stored = reference.twin("99-test", {"gpipe": tl}, {"speedup": 1.5, "curve": [1, 2]}, capacity)
    assert (tmp_path / "99-test.json").exists()
    assert stored.machine["capacity"] == 1.9 and stored.machine["cores"] >= 1
    monkeypatch.setenv(reference.RECORD_ENV, "0")
    loaded = reference.twin("99-test", {"gpipe": simulate(make_schedule("1f1b", 2, 2))})
    assert loaded.figures == {"speedup": 1.5, "curve": [1, 2]}
    assert loaded.timelines["gpipe"].makespan == tl.makespan  # the stored one, not the new one
    assert "recorded" in loaded.describe() and "1.90x" in loaded.describe()
    with pytest.raises(CourseInputError, match="reference name"):
        reference.load("../etc")
