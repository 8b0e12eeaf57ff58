"""Emulated links: the network a run on threads pretends to have, scaled to this machine.

On the virtual clock (`course_utils.threads.clock`) a message of b bytes from device i to
device j arrives `latency + b / bandwidth` after its links are free, where the bandwidth is
the fast one (NVLink) when i and j sit in the same node (`device // gpus_per_node`) and the
slow one (InfiniBand) otherwise. The numbers are the planner's hardware presets
(`course_utils.plan.HARDWARE_PRESETS`), so one cluster model serves the whole course.

Scaled to this machine. One CPU thread computes about a thousand times slower than a GPU.
With a real NVLink's 300 GB/s, messages would look free next to the CPU's compute. So the
bandwidths are multiplied by

    scale = this thread's FLOP rate / the GPU's FLOP rate  (peak bf16 x efficiency)

and a byte costs as many FLOPs of this machine's compute as it costs on the cluster: the
ratio of communication to compute is the real cluster's, on any laptop. Ratios (speed-ups,
overlap gains) then carry over from machine to machine; absolute times do not.

Costed as the cluster's bf16. The cluster the threads stand in for trains in bf16 mixed
precision, as the planner assumes (`plan.inputs.PRECISIONS["bf16-mixed"]`: weights,
gradients and activations 2 bytes an element), and a CPU float32 FLOP already stands for a
GPU bf16 FLOP. The threads send float32, 4 bytes an element; on the emulated links each
element costs the cluster's 2 bytes (`WIRE_FACTOR`: the bandwidths are doubled), so a
gradient all-reduce costs what the same model's bf16 all-reduce costs on the cluster.

Latency is not scaled: the tiny models stand in for models whose steps last 10^4 times
longer, so a scaled latency (5 us -> 50 ms) would dominate as it never does for the real
model. It stays the preset's microseconds, a small per-message cost.

What this model leaves out: contention inside a GPU (NCCL's kernels use SMs), congestion
in the network beyond each device's own ports, and topology beyond two levels.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import asdict, dataclass, replace

from course_utils import validation
from course_utils.errors import CourseInputError

# Bytes of an element the threads send (float32) over the cluster's (bf16): see above.
THREAD_ELEMENT_BYTES, CLUSTER_ELEMENT_BYTES = 4, 2
WIRE_FACTOR = THREAD_ELEMENT_BYTES / CLUSTER_ELEMENT_BYTES


@dataclass(frozen=True)
class Links:
    """Per-device links of a two-level cluster, in bytes per second of this machine's time.

    `intra_bandwidth` joins devices of one node, `inter_bandwidth` devices of different
    nodes; `latency` is seconds per message. `scale` is what the preset's bandwidths were
    multiplied by for this machine's compute rate (1.0: unscaled) and `wire` for the size of
    an element (2.0: a thread's float32 costed as the cluster's bf16; 1.0: bytes as sent).
    `name` and `hardware_gbs` say where they came from, and `compute_rate` the FLOP/s of
    one thread that `scale` was taken for (None: not scaled to a thread).
    """

    gpus_per_node: int
    intra_bandwidth: float
    inter_bandwidth: float
    latency: float = 0.0
    scale: float = 1.0
    wire: float = 1.0
    name: str = "custom"
    hardware_gbs: tuple[float, float] | None = None  # the preset's (intra, inter) GB/s
    compute_rate: float | None = None  # the thread FLOP/s the bandwidths were scaled to

    def __post_init__(self) -> None:
        g = self.gpus_per_node
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise CourseInputError(f"gpus_per_node must be an integer >= 1, got {g!r}")
        for key in ("intra_bandwidth", "inter_bandwidth", "scale", "wire"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise CourseInputError(f"{key} must be a number > 0 (or inf), got {value!r}")
        lat = self.latency
        if isinstance(lat, bool) or not isinstance(lat, int | float) or not 0 <= lat < math.inf:
            raise CourseInputError(f"latency must be a finite number of seconds >= 0, got {lat!r}")

    def node(self, device: int) -> int:
        return device // self.gpus_per_node

    def bandwidth(self, src: int, dst: int) -> float:
        same = self.node(src) == self.node(dst)
        return self.intra_bandwidth if same else self.inter_bandwidth

    def ring_bandwidth(self, workers: int) -> float:
        """The slowest link of a ring over devices 0..workers-1 (it leaves the node when
        the ring is longer than a node)."""
        return self.intra_bandwidth if workers <= self.gpus_per_node else self.inter_bandwidth

    def transfer_time(self, src: int, dst: int, nbytes: int) -> float:
        """Seconds a message of `nbytes` holds the sender's and receiver's ports."""
        return self.latency + nbytes / self.bandwidth(src, dst)

    def at_rate(self, rate: float) -> Links:
        """The same cluster scaled to a thread that computes `rate` FLOP/s (these links
        unchanged where they were not scaled to a thread, or cost nothing)."""
        rate = validation.number(rate, "rate", strict=True)  # FLOP/s
        if self.compute_rate is None or self.instant or rate == self.compute_rate:
            return self
        f = rate / self.compute_rate
        return replace(
            self,
            intra_bandwidth=self.intra_bandwidth * f,
            inter_bandwidth=self.inter_bandwidth * f,
            scale=self.scale * f,
            compute_rate=rate,
        )

    @property
    def instant(self) -> bool:
        return math.isinf(self.intra_bandwidth) and self.latency == 0

    def describe(self) -> str:
        """One line for chart titles: "emulated links: A100-80GB, 300 GB/s in a node ..."."""
        if self.instant:
            return "links at their fastest (no transfer time)"
        intra, inter = _rate(self.intra_bandwidth), _rate(self.inter_bandwidth)
        lat = f"{self.latency * 1e6:g} us"
        if self.hardware_gbs is None:
            return (
                f"emulated links: {intra} in a node of {self.gpus_per_node}, {inter} between, {lat}"
            )
        hw_intra, hw_inter = self.hardware_gbs
        bf16 = " (a float32 element costed as bf16's 2 bytes)" if self.wire == WIRE_FACTOR else ""
        return (
            f"emulated links: {self.name}, {hw_intra:g} GB/s in a node of {self.gpus_per_node}, "
            f"{hw_inter:g} GB/s between nodes, {lat}; scaled to this machine{bf16}: "
            f"{intra}, {inter}"
        )

    def to_dict(self) -> dict:
        data = asdict(self)
        for key in ("intra_bandwidth", "inter_bandwidth"):
            if math.isinf(data[key]):
                data[key] = None  # JSON has no infinity
        return data


def _rate(bytes_per_s: float) -> str:
    if math.isinf(bytes_per_s):
        return "unlimited"
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= size:
            return f"{bytes_per_s / size:.3g} {unit}"
    return f"{bytes_per_s:.3g} B/s"


def instant_links(gpus_per_node: int = 8) -> Links:
    """Links that cost nothing: the virtual clock then shows compute alone."""
    return Links(gpus_per_node, math.inf, math.inf, 0.0, name="instant")


@functools.cache
def machine_flops() -> float:
    """FLOP/s of one thread of this machine, in its own CPU time (measured once per process).

    The best of 25 rounds of `probe_flops` (about 0.1 s): thread CPU time does not count the
    time other programs take the core, and the best of many short rounds skips those slowed
    by a neighbour sharing the core's caches (best of five varied 56-85 GFLOP/s between
    processes beside other work; best of 25, 85-93). On a shared host the core's own speed
    drifts too, by 15-30% for a few hundred milliseconds at a time: a measurement that must
    not depend on the moment probes in turns with its steps (`measure.timing.compare`).
    """
    return probe_flops(25)


def probe_flops(rounds: int = 1) -> float:
    """FLOP/s of the calling thread now, in its CPU time: the best of `rounds` rounds of
    eight 256 x 256 float32 matrix products on one intra-op thread (about 3 ms a round)."""
    import torch

    from course_utils.models import single_thread

    n, repeats = 256, 8
    with single_thread():
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b  # first call: allocation and dispatch set-up
        best = math.inf
        for _ in range(rounds):
            start = time.thread_time_ns()
            for _ in range(repeats):
                a @ b
            best = min(best, (time.thread_time_ns() - start) / 1e9)
    return 2 * n**3 * repeats / max(best, 1e-9)


def cluster_links(
    gpu: str | None = None,
    gpus_per_node: int | None = None,
    intra_node_gbs: float | None = None,
    inter_node_gbs: float | None = None,
    latency_us: float | None = None,
    compute_rate: float | None = None,
) -> Links:
    """The emulated links of a planner preset (default the planner's default GPU), with
    bandwidths scaled by `compute_rate` (default: `machine_flops()`) / the GPU's FLOP rate,
    and by `WIRE_FACTOR` (a thread's float32 element costs the cluster's bf16 2 bytes).

    The keyword arguments change the preset as the planner's flags do.
    """
    from course_utils.plan.inputs import DEFAULT_GPU, hardware

    changes: dict = {}
    for key, value in (
        ("gpus_per_node", gpus_per_node),
        ("intra_node_gbs", intra_node_gbs),
        ("inter_node_gbs", inter_node_gbs),
        ("latency_us", latency_us),
    ):
        if value is not None:
            changes[key] = value
    hw = hardware(gpu or DEFAULT_GPU, **changes)
    rate = machine_flops() if compute_rate is None else compute_rate
    rate = validation.number(rate, "compute_rate", strict=True)  # FLOP/s
    gpu_rate = hw.peak_tflops_bf16 * 1e12 * hw.efficiency
    scale = rate / gpu_rate
    return Links(
        gpus_per_node=hw.gpus_per_node,
        intra_bandwidth=hw.intra_node_gbs * 1e9 * scale * WIRE_FACTOR,
        inter_bandwidth=hw.inter_node_gbs * 1e9 * scale * WIRE_FACTOR,
        latency=hw.latency_us * 1e-6,
        scale=scale,
        wire=WIRE_FACTOR,
        name=hw.name or "custom",
        hardware_gbs=(hw.intra_node_gbs, hw.inter_node_gbs),
        compute_rate=rate,
    )
