"""A timeline: what each device did and when. Simulated and measured runs share this type.

The simulator (`course_utils.pipeline.simulate`) fills it with predicted times in cost units;
the thread executor (`course_utils.pipeline.executor`) fills it with real `perf_counter_ns`
timestamps converted to seconds. Both renderers draw it the same way: the Gantt charts of
`course_utils.charts.gantt` (matplotlib) and the explorer's fast raster painter
(`course_utils.charts.raster`), which reads it as `lanes()`, one per device;
`write_chrome_trace` saves it for Perfetto and chrome://tracing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from course_utils.actions import Action


@dataclass(frozen=True)
class Event:
    """Device `device` ran `action` from `start` to `end` (same unit as the timeline)."""

    device: int
    action: Action
    start: float
    end: float
    label: str | None = None  # shown instead of str(action) when set (e.g. "bucket 2")

    @property
    def duration(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict:
        d = {
            "device": self.device,
            "action": str(self.action),
            "start": self.start,
            "end": self.end,
        }
        if self.label is not None:
            d["label"] = self.label
        return d


Lane = tuple[list[Action], list[float], list[float]]  # one device: actions, starts, ends


@dataclass
class Timeline:
    """Events on `num_devices` devices, plus what is known about memory and shape.

    `unit` is "units" for the simulator's cost units or "s" for measured seconds.
    `peak_activations[d]` is the most micro-batch chunks device d held at once
    (forwarded but not yet backwarded), when known. A pipeline's timeline also says its
    shape: `stages`, `microbatches` and `chunks` (stages per device). `meta` holds figures
    a particular timeline adds (e.g. when a data-parallel step's compute ended).
    """

    events: list[Event]
    num_devices: int
    name: str = ""
    source: str = "simulated"  # or "measured"
    unit: str = "units"
    peak_activations: list[int] | None = None
    meta: dict = field(default_factory=dict)
    stages: int | None = None
    microbatches: int | None = None
    chunks: int = 1

    @classmethod
    def from_lanes(cls, lanes: list[Lane], **fields) -> Timeline:
        """A timeline from per-device (actions, starts, ends) lists, as the simulator makes."""
        events = [
            Event(d, a, s, e)
            for d, (actions, starts, ends) in enumerate(lanes)
            for a, s, e in zip(actions, starts, ends, strict=True)
        ]
        return cls(events, len(lanes), **fields)

    def lanes(self) -> list[Lane]:
        """Per device, its events' actions, starts and ends in time order (what painters read)."""
        per_device: list[list[Event]] = [[] for _ in range(self.num_devices)]
        for e in self.events:
            if 0 <= e.device < self.num_devices:
                per_device[e.device].append(e)
        lanes = []
        for events in per_device:
            events.sort(key=lambda e: e.start)
            lanes.append(
                ([e.action for e in events], [e.start for e in events], [e.end for e in events])
            )
        return lanes

    @property
    def start(self) -> float:
        return min((e.start for e in self.events), default=0.0)

    @property
    def makespan(self) -> float:
        """Time from the first start to the last end."""
        if not self.events:
            return 0.0
        return max(e.end for e in self.events) - self.start

    def device_events(self, device: int) -> list[Event]:
        return sorted((e for e in self.events if e.device == device), key=lambda e: e.start)

    def busy(self, device: int) -> float:
        """Time `device` spent computing (communication does not count as busy)."""
        return sum(e.duration for e in self.events if e.device == device and e.action.is_compute)

    def busy_per_device(self) -> list[float]:
        """`busy(d)` for every device, in one pass over the events."""
        busy = [0.0] * self.num_devices
        for e in self.events:
            if e.action.is_compute and 0 <= e.device < self.num_devices:
                busy[e.device] += e.duration
        return busy

    def idle(self, device: int) -> float:
        return self.makespan - self.busy(device)

    @property
    def bubble_fraction(self) -> float:
        """Idle compute time over devices x makespan: 0 is perfect, 1 - 1/p is naive."""
        total = self.num_devices * self.makespan
        if total <= 0:
            return 0.0
        return (total - sum(self.busy_per_device())) / total

    def to_dict(self) -> dict:
        makespan, busy = self.makespan, self.busy_per_device()
        return {
            "name": self.name,
            "source": self.source,
            "unit": self.unit,
            "events": [e.to_dict() for e in sorted(self.events, key=lambda e: (e.start, e.device))],
            "makespan": makespan,
            "bubble_fraction": self.bubble_fraction,
            "busy": busy,
            "idle": [makespan - b for b in busy],
            "peak_activations": self.peak_activations,
            "num_devices": self.num_devices,
            "stages": self.stages,
            "microbatches": self.microbatches,
            "chunks": self.chunks,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Timeline:
        """The timeline `to_dict` wrote (figures it derived, like makespan, are recomputed)."""
        events = [
            Event(e["device"], Action.parse(e["action"]), e["start"], e["end"], e.get("label"))
            for e in data["events"]
        ]
        devices = data.get("num_devices") or 1 + max((e.device for e in events), default=0)
        return cls(
            events,
            devices,
            name=data.get("name", ""),
            source=data.get("source", "simulated"),
            unit=data.get("unit", "units"),
            peak_activations=data.get("peak_activations"),
            stages=data.get("stages"),
            microbatches=data.get("microbatches"),
            chunks=data.get("chunks") or 1,
        )

    def write_chrome_trace(self, path, title: str | None = None):
        """Write this timeline as a Chrome trace (JSON) that Perfetto and chrome://tracing
        open: a track per device and per communication stream, events named by action, the
        clock named (`course_utils.chrome_trace`). Returns the path."""
        from course_utils.chrome_trace import write_chrome_trace

        return write_chrome_trace(self, path, title)

    def summary(self) -> str:
        return (
            f"{self.name or 'timeline'} ({self.source}): makespan {self.makespan:.4g} {self.unit}, "
            f"bubble {100 * self.bubble_fraction:.1f}%"
        )
