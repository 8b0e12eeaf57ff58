"""The virtual-clock bench's own machinery (`make bench` measures; this only checks that it
runs): every compared set-up is stepped idle and beside its busy loop, in turns, and the
bench leaves neither the loop nor its pinning behind. No figure is judged here (speed is
measured in benchmarks, never in unit tests)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def _bench():
    path = ROOT / "benchmarks" / "bench_virtual_clock.py"
    spec = importlib.util.spec_from_file_location("bench_virtual_clock", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bench_steps_every_set_up_idle_and_beside_its_loop_and_leaves_nothing():
    bench = _bench()
    cores = os.sched_getaffinity(0)
    steps = bench.in_turns(repeats=1)
    names = {"naive", "gpipe", "dp8", "dp16", "fsdp0", "fsdp1", "even", "skewed"}
    assert set(steps) == {"idle", "busy"}
    for where, found in steps.items():
        assert set(found) == names, where
        for name, (measured, simulated, computing) in found.items():
            assert measured > 0 and simulated > 0, (where, name)
            assert 0 < computing, (where, name)  # what the GPipe figure counts its cost by
    assert os.sched_getaffinity(0) == cores
    loops = [p for p in psutil.Process().children() if "while True" in " ".join(p.cmdline())]
    assert loops == []  # the busy loop is gone
    failures: list[str] = []
    bench.pairs(steps["idle"], "idle", failures)  # every ratio it judges can be formed
