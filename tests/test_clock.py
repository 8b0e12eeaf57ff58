"""The virtual clock: recorded streams replayed over emulated links (threads/trace, clock)."""

from __future__ import annotations

import math
import os

import pytest
import torch

from course_utils.actions import Action
from course_utils.errors import CourseInputError, WorkerError
from course_utils.threads.clock import fastest, replay, timeline
from course_utils.threads.collectives import ThreadGroup
from course_utils.threads.devices import DeviceThreads
from course_utils.threads.links import Links, cluster_links, instant_links, machine_flops
from course_utils.threads.trace import CPU, Recorder, check_clock, on

MS = 1_000_000  # nanoseconds
F = Action(0, "F", 0)


def links(bandwidth: float = 1e6, latency: float = 0.0, per_node: int = 8, inter=None) -> Links:
    return Links(per_node, bandwidth, inter or bandwidth, latency)


def burst(stream, ms: float) -> None:
    """A compute bar of exactly `ms` milliseconds of CPU time (written into the trace)."""
    index = stream._begin(F, None)
    stream.ops.append((CPU, int(ms * MS)))
    stream._end(index)


def test_a_transfer_beside_compute_takes_the_longer_of_the_two_not_the_sum():
    rec = Recorder()
    a, b = rec.stream(0), rec.stream(1)
    a.send("x", 1, 10_000, Action(0, "SEND_F", 0))  # 10 ms on a 1 MB/s link
    burst(a, 4.0)  # device 0 computes meanwhile
    b.recv("x")
    burst(b, 1.0)
    t = timeline(rec, "virtual", links())
    compute = [e for e in t.events if e.action.is_compute]
    send = next(e for e in t.events if e.action.kind == "SEND_F")
    assert (send.start, send.end) == pytest.approx((0.0, 0.010))
    assert compute[0].end == pytest.approx(0.004)  # not delayed by its own send
    assert [e.start for e in compute if e.device == 1] == pytest.approx([0.010])
    assert t.makespan == pytest.approx(0.011)  # max(4, 10) + 1, not 4 + 10 + 1


def test_two_messages_through_one_port_go_one_after_the_other():
    rec = Recorder()
    a, b, c = rec.stream(0), rec.stream(1), rec.stream(2)
    a.send("to1", 1, 5_000)
    a.send("to2", 2, 5_000)  # same send port: waits for the first
    b.recv("to1")
    c.recv("to2")
    result = replay(rec.streams, links())
    assert [t for x in result.transfers for t in (x.start, x.end)] == pytest.approx(
        [0.0, 0.005, 0.005, 0.010]
    )
    # ... and two senders into one receive port serialize too
    rec = Recorder()
    a, b, c = rec.stream(0), rec.stream(1), rec.stream(2)
    a.send("x", 2, 5_000)
    b.send("y", 2, 5_000)
    c.recv("x")
    c.recv("y")
    assert replay(rec.streams, links()).end == pytest.approx(0.010)


def test_ports_serve_messages_in_virtual_time_order_not_in_recording_order():
    # Device 1 sends at t=6 ms, device 2 at t=1 ms, both to device 0; device 1's stream
    # comes first in the list (as if its thread had reached the port first in real time).
    rec = Recorder()
    late, early, sink = rec.stream(1), rec.stream(2), rec.stream(0)
    burst(late, 6.0)
    late.send("late", 0, 3_000)
    burst(early, 1.0)
    early.send("early", 0, 3_000)
    sink.recv("late")
    sink.recv("early")
    transfers = sorted((x.start, x.end, x.src) for x in replay(rec.streams, links()).transfers)
    assert [x[2] for x in transfers] == [2, 1]  # the earlier send first, wherever it was listed
    assert [t for x in transfers for t in x[:2]] == pytest.approx([0.001, 0.004, 0.006, 0.009])


def test_latency_and_the_two_levels_of_links():
    two = Links(2, 1e6, 1e5, latency=1e-4)  # devices 0-1 share a node, 2-3 the next
    assert two.transfer_time(0, 1, 1000) == pytest.approx(1e-4 + 1e-3)
    assert two.transfer_time(1, 2, 1000) == pytest.approx(1e-4 + 1e-2)
    rec = Recorder()
    a, b = rec.stream(0), rec.stream(0, "communication")  # two streams of one device
    a.send("token", 0, 10**9)  # stays on the device: no link, no time
    b.recv("token")
    burst(b, 2.0)
    assert replay(rec.streams, two).end == pytest.approx(0.002)


def test_a_receive_without_its_send_is_reported_not_hung():
    rec = Recorder()
    rec.stream(3).recv(("act", 1, 0))
    with pytest.raises(WorkerError, match="device 3 .*waits for message \\('act', 1, 0\\)"):
        replay(rec.streams, links())


def test_a_collective_inside_compute_cuts_the_compute_bar():
    rec = Recorder()
    s = rec.stream(0)
    with s.compute(F):
        with s.span(Action(0, "ALL_REDUCE"), "g"):
            pass
    kinds = [e.action.kind for e in timeline(rec, "virtual", links()).events]
    assert kinds == ["F", "ALL_REDUCE", "F"]


@pytest.mark.parametrize("workers, per_node", [(4, 8), (16, 8)])
def test_ring_all_reduce_on_threads_takes_the_formula_time(workers, per_node):
    """2(N-1) steps, each one chunk of S/N bytes over the slowest link of the ring."""
    nbytes, latency = 4 * 262_144, 2e-4
    net = Links(per_node, 50e6, 10e6, latency)
    with DeviceThreads(workers) as pool:
        group = ThreadGroup(workers, abort=pool.abort)
        data = [torch.randn(nbytes // 4) for _ in range(workers)]
        rec = Recorder()
        streams = [rec.stream(r) for r in range(workers)]

        def work(r: int):
            def run():
                with streams[r].span(Action(0, "REDUCE_GRAD")):
                    group.comm(r).all_reduce(data[r])

            return on(streams[r], run)

        with rec:
            pool.run([work(r) for r in range(workers)])
    bandwidth = net.inter_bandwidth if workers > per_node else net.intra_bandwidth
    formula = 2 * (workers - 1) * (latency + nbytes / (workers * bandwidth))
    measured = timeline(rec, "virtual", net).makespan
    assert measured == pytest.approx(formula, rel=0.02)  # the additions are all that is left
    assert torch.allclose(data[0], data[-1])


def test_cluster_links_scale_the_preset_to_this_machine():
    fast = cluster_links("A100-80GB", compute_rate=1e11)
    assert fast.scale == pytest.approx(1e11 / (312e12 * 0.5))
    # and a thread's float32 element costs the cluster's bf16 2 bytes: twice the bandwidth
    assert fast.wire == 2.0
    assert fast.intra_bandwidth == pytest.approx(300e9 * fast.scale * 2)
    assert fast.inter_bandwidth == pytest.approx(25e9 * fast.scale * 2)
    assert fast.latency == pytest.approx(5e-6)  # not scaled (see the module docstring)
    assert "A100-80GB" in fast.describe() and "scaled to this machine" in fast.describe()
    assert "costed as bf16's 2 bytes" in fast.describe()
    changed = cluster_links("H100-80GB", gpus_per_node=4, inter_node_gbs=12.5, compute_rate=1e11)
    assert changed.gpus_per_node == 4 and changed.hardware_gbs == (450.0, 12.5)
    assert 1e9 < machine_flops() < 1e14
    assert math.isinf(instant_links().intra_bandwidth)


def test_links_rescaled_to_another_compute_rate_keep_the_cluster():
    # A core measured 30% faster moves data 30% faster too: a byte keeps its cost in FLOPs.
    base = cluster_links("A100-80GB", compute_rate=1e11)
    assert base.compute_rate == 1e11
    faster = base.at_rate(1.3e11)
    assert faster.compute_rate == 1.3e11 and faster.scale == pytest.approx(1.3 * base.scale)
    assert faster.intra_bandwidth == pytest.approx(1.3 * base.intra_bandwidth)
    assert faster.inter_bandwidth == pytest.approx(1.3 * base.inter_bandwidth)
    assert (faster.latency, faster.gpus_per_node, faster.wire) == (
        base.latency,
        base.gpus_per_node,
        base.wire,
    )
    back = faster.at_rate(1e11)
    assert back.intra_bandwidth == pytest.approx(base.intra_bandwidth)
    assert back.at_rate(1e11) is back  # already at that rate
    assert instant_links().at_rate(1e12) == instant_links()  # nothing to scale
    custom = Links(8, 1e9, 1e8)
    assert custom.at_rate(1e12) == custom  # not scaled to a thread: kept as given
    with pytest.raises(CourseInputError, match="rate must be a finite number"):
        base.at_rate(0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: check_clock("cpu"), "clock must be one of virtual, wall"),
        (lambda: Links(0, 1.0, 1.0), "gpus_per_node"),
        (lambda: Links(8, -1.0, 1.0), "intra_bandwidth"),
        (lambda: Links(8, 1.0, 1.0, latency=math.inf), "latency"),
        (lambda: cluster_links(compute_rate=0), "compute_rate"),
        (lambda: cluster_links("V100"), "GPU must be one of"),
    ],
)
def test_bad_clock_and_link_settings_are_one_line_errors(call, message):
    with pytest.raises(CourseInputError, match=message):
        call()


# -- the commands that run threads: one clock flag, one set of JSON keys ----------------------

TIMED = {
    "run": ["gpipe", "--devices", "2", "--microbatches", "2"],
    "data-parallel": ["--workers", "2", "--batch", "64", "--steps", "1"],
    "tensor-parallel": ["--workers", "2", "--tokens", "32"],
    "fsdp": ["--workers", "2", "--steps", "2"],
    "context-parallel": ["--workers", "2", "--seq", "16", "--heads", "1", "--dim", "4"],
    "moe": ["--workers", "2", "--tokens", "32"],
}


@pytest.mark.parametrize("command", TIMED)
@pytest.mark.parametrize("clock", ["virtual", "wall"])
def test_every_timed_command_reports_the_same_keys_on_either_clock(run_cli, command, clock):
    import json

    out = run_cli(command, *TIMED[command], "--clock", clock, "--json", "--gpus-per-node", "4")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["clock"] == clock
    assert data["measured_step_s"] > 0 and data["simulated_step_s"] > 0
    if clock == "virtual":
        assert data["links"]["gpus_per_node"] == 4 and data["links"]["name"] == "A100-80GB"
    else:
        assert data["links"] is None
    for old in ("measured_makespan_s", "step_time_measured_s", "step_time_s"):
        assert old not in data


@pytest.mark.parametrize("command", TIMED)
@pytest.mark.parametrize(
    "flags, named",
    [
        (["--clock", "cpu"], "--clock"),
        (["--gpus-per-node", "0"], "--gpus-per-node"),
        (["--intra-node-gbs", "-1"], "--intra-node-gbs"),
        (["--latency-us", "nan"], "--latency-us"),
        (["--gpu", "V100"], "--gpu"),
    ],
)
def test_clock_and_network_flags_are_checked_in_one_line(run_cli, command, flags, named):
    out = run_cli(command, *TIMED[command], *flags)
    assert out.returncode == 2 and named in out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no thread affinity here")
@pytest.mark.parametrize("one_core", [True, False])
def test_virtual_clock_devices_take_turns_on_one_core(one_core):
    # Threads computing side by side on this 2-vCPU machine each measured 20-35% more CPU
    # time for the same work: the virtual clock's devices are pinned to one core instead.
    mine = os.sched_getaffinity(0)
    with DeviceThreads(3, one_core=one_core) as pool:
        seen = pool.run([lambda: os.sched_getaffinity(0)] * 3)
    if one_core:  # all on one core of ours: the one the caller ran on (see _one_cpu)
        assert len(seen[0]) == 1 and seen[0] <= mine and seen == [seen[0]] * 3
    else:
        assert seen == [mine] * 3
    assert os.sched_getaffinity(0) == mine  # the caller's own thread is never moved


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no thread affinity here")
def test_each_process_pins_its_devices_to_the_core_it_runs_on(monkeypatch):
    # Two graders' kernels (grade -j 2) must not pile their devices onto core 0 together:
    # two processes running at once run on two cores, and each takes its own.
    from course_utils.threads import devices

    mine = os.sched_getaffinity(0)
    assert devices._current_cpu() in mine  # glibc says where this thread runs now
    for core in mine:
        devices._forget_process_core()  # as in a new process
        monkeypatch.setattr(devices, "_current_cpu", lambda core=core: core)
        assert devices._one_cpu() == {core}
    devices._forget_process_core()
    monkeypatch.setattr(devices, "_current_cpu", lambda: -1)  # unknown: the lowest we may use
    assert devices._one_cpu() == {min(mine)}
    devices._forget_process_core()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no thread affinity here")
def test_every_pool_of_a_process_takes_turns_on_the_same_core(monkeypatch):
    # A command's baseline pool and its workers' pool are compared with each other: on two
    # cores (a new pool's threads push the caller onto the other one) their ratio moved by
    # 15% with the cores' speeds. The first pool chooses; the later ones follow it.
    from course_utils.threads import devices

    mine = sorted(os.sched_getaffinity(0))
    devices._forget_process_core()
    monkeypatch.setattr(devices, "_current_cpu", lambda: mine[0])
    with DeviceThreads(1, one_core=True) as first:
        monkeypatch.setattr(devices, "_current_cpu", lambda: mine[-1])  # the caller moved
        with DeviceThreads(2, one_core=True) as second:
            seen = second.run([lambda: os.sched_getaffinity(0)] * 2)
    assert first.cpus == second.cpus == {mine[0]} and seen == [{mine[0]}] * 2
    if hasattr(os, "fork"):  # a forked child is another process: it chooses again
        assert devices._process_core == mine[0]
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, b"1" if devices._process_core is None else b"0")
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(read, 1) == b"1"
    devices._forget_process_core()


@pytest.mark.parametrize("clock, pinned", [("virtual", True), ("wall", False)])
def test_the_executor_pins_its_devices_only_on_the_virtual_clock(clock, pinned):
    from course_utils.models import MLP, partition
    from course_utils.pipeline.executor import PipelineExecutor

    with PipelineExecutor(partition(MLP(), 2), 2, clock=clock) as ex:
        assert (ex.threads.cpus is not None) == pinned


def _recorded(costs: list[list[float]]) -> Recorder:
    """Device d computes costs[d] (ms, one burst each), then sends to device 0."""
    rec = Recorder()
    streams = [rec.stream(d) for d in range(len(costs))]
    for d, (stream, bursts) in enumerate(zip(streams, costs, strict=True)):
        for ms in bursts:
            burst(stream, ms)
        if d:
            stream.send(("done", d), 0, 1_000)
    for d in range(1, len(costs)):
        streams[0].recv(("done", d))
    return rec


def test_fastest_keeps_each_bursts_least_time_on_its_own_device():
    # Run 1 had device 1's second burst interrupted, run 2 device 0's first: put together,
    # every burst costs its least. Device 2 is slower in every run (a straggler): it stays so.
    runs = [
        _recorded([[1.0, 1.0], [1.0, 9.0], [3.0, 3.0]]),
        _recorded([[7.0, 1.0], [1.0, 1.0], [3.0, 3.1]]),
    ]
    merged = fastest(runs)
    assert merged is not None
    cpu = [[op[1] / MS for op in s.ops if op[0] == CPU] for s in merged.streams]
    assert cpu == [[1.0, 1.0], [1.0, 1.0], [3.0, 3.0]]
    t = timeline(merged, "virtual", links(bandwidth=1e9))
    assert t.busy_per_device() == pytest.approx([0.002, 0.002, 0.006])  # not pooled
    slowest = [timeline(r, "virtual", links(bandwidth=1e9)).makespan for r in runs]
    assert t.makespan < min(slowest)  # each run had one slow burst; together, none


def test_fastest_refuses_runs_that_did_not_record_the_same_operations():
    assert fastest([_recorded([[1.0], [1.0]]), _recorded([[1.0], [1.0, 1.0]])]) is None
    assert fastest([_recorded([[1.0], [1.0]]), _recorded([[1.0], [1.0], [1.0]])]) is None
    assert fastest([]) is None
