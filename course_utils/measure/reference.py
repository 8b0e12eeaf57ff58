"""Reference recordings: what each measured experiment of the course gave on an idle machine.

A learner's measurement is the truth about their machine right now: on Binder's single core
or beside a busy browser, a pipeline on threads cannot beat 1x. So every measured chart of
the course is drawn beside its *reference twin*, the same experiment recorded on an idle
2-core machine, with the date, core count, CPU model and torch version it ran on. The learner
sees both, each labelled, and the lesson's printed conclusions say which is which.

In a lesson, after measuring:

    ref = reference.twin("02-naive-vs-gpipe", timelines={"naive": a, "gpipe": b},
                         figures={"speedup": s}, capacity=capacity)
    ref.timelines["gpipe"], ref.figures["speedup"], ref.describe()

Normally `twin` loads the stored recording. Run with COURSE_RECORD_REFERENCE=1 (what
`make record-reference` does, on an idle machine), it stores the measurement just made as
the new reference instead, and returns it. Recordings are small JSON files in
course_utils/data/reference/.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from course_utils.errors import CourseInputError
from course_utils.measure.headline import Headline
from course_utils.timeline import Timeline

FOLDER = Path(__file__).resolve().parents[1] / "data" / "reference"
RECORD_ENV = "COURSE_RECORD_REFERENCE"


def recording() -> bool:
    """True while `make record-reference` runs the lessons to store new references."""
    return os.environ.get(RECORD_ENV, "") not in ("", "0")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def this_machine(capacity=None) -> dict:
    """Where and when a measurement ran: date, cores, CPU, torch and Python versions."""
    import torch

    from course_utils.measure.capacity import available_cores

    info = {
        "date": datetime.date.today().isoformat(),
        "cores": available_cores(),
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if capacity is not None:
        info["capacity"] = capacity.speedup
    return info


@dataclass
class Recording:
    """One experiment's measurement: its timelines, its figures (numbers and curves), and
    the machine it ran on."""

    name: str
    machine: dict
    timelines: dict[str, Timeline] = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    clock: str = "wall"  # recordings made before the virtual clock were timed on the wall
    headline: dict | None = None  # Headline.to_dict() of the section's one ratio

    def describe(self) -> str:
        """'reference: idle 2-core machine (Intel ..., torch 2.13.0), recorded 2026-11-23'."""
        m = self.machine
        capacity = (  # what the cores gave matters to the wall clock only
            f"; 2 threads ran {m['capacity']:.2f}x as fast as 1"
            if "capacity" in m and self.clock == "wall"
            else ""
        )
        return (
            f"reference: {m.get('cores', '?')}-core machine ({m.get('cpu', '?')}, torch "
            f"{m.get('torch', '?')}), recorded {m.get('date', '?')}{capacity}"
        )

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "machine": self.machine,
            "clock": self.clock,
            "headline": self.headline,
            "timelines": {k: t.to_dict() for k, t in self.timelines.items()},
            "figures": self.figures,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Recording:
        timelines = {k: Timeline.from_dict(t) for k, t in data.get("timelines", {}).items()}
        return cls(
            data["name"],
            data.get("machine", {}),
            timelines,
            data.get("figures", {}),
            clock=data.get("clock", "wall"),
            headline=data.get("headline"),
        )


def path(name: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise CourseInputError(f"reference name must be a plain word like '02-gpipe', got {name!r}")
    return FOLDER / f"{name}.json"


def load(name: str) -> Recording | None:
    """The stored reference `name`, or None if none was recorded yet."""
    file = path(name)
    if not file.exists():
        return None
    return Recording.from_dict(json.loads(file.read_text()))


def save(recording_: Recording) -> Path:
    file = path(recording_.name)
    file.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(recording_.to_dict(), indent=1, allow_nan=False)
    file.write_text(text + "\n")
    return file


def twin(
    name: str,
    timelines: dict[str, Timeline] | None = None,
    figures: dict | None = None,
    capacity=None,
    headline: Headline | None = None,
    clock: str | None = None,
) -> Recording | None:
    """The reference twin of the measurement just made (see the module docstring).

    When recording, the measurement becomes the reference and is returned; otherwise the
    stored reference is returned (None if there is none, so a lesson still runs). The
    section's `headline` is stored with it (and logged for the tests: `Headline.log`).
    `clock` names the clock of figures recorded without timelines or headline ("virtual":
    CPU time, as the virtual clock counts compute); otherwise it is read off them.
    """
    if headline is not None:
        headline.log(name)
    if recording():
        rec = Recording(
            name,
            this_machine(capacity),
            dict(timelines or {}),
            dict(figures or {}),
            clock=clock or (headline.clock if headline is not None else _clock_of(timelines)),
            headline=headline.to_dict() if headline is not None else None,
        )
        save(rec)
        return rec
    return load(name)


def _clock_of(timelines: dict[str, Timeline] | None) -> str:
    clocks = {t.meta.get("clock", "wall") for t in (timelines or {}).values()}
    return clocks.pop() if len(clocks) == 1 else "wall"
