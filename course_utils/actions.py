"""The vocabulary of pipeline schedules: an action, and a schedule as per-device action lists.

An action is a small immutable value written like PyTorch's pipelining actions
(`torch.distributed.pipelining.schedules._Action`), so a learner's schedule maps 1:1
onto PyTorch's:

    2F0   stage 2, forward of micro-batch 0
    1B3   stage 1, full backward of micro-batch 3
    0I1   stage 0, input-gradient backward of micro-batch 1   (zero-bubble split)
    0W1   stage 0, weight-gradient backward of micro-batch 1  (zero-bubble split)

Communication kinds use PyTorch's names too (`1SEND_F0`, `2RECV_B3`, `0REDUCE_GRAD`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from course_utils.errors import CourseInputError

COMPUTE_KINDS = ("F", "B", "I", "W")
COMM_KINDS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B", "REDUCE_GRAD")
KIND_NAMES = {
    "F": "forward",
    "B": "backward",
    "I": "input-gradient backward",
    "W": "weight-gradient backward",
    "SEND_F": "send activations",
    "RECV_F": "receive activations",
    "SEND_B": "send gradients",
    "RECV_B": "receive gradients",
    "REDUCE_GRAD": "gradient all-reduce",
}

_ACTION_RE = re.compile(r"^\s*(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|REDUCE_GRAD|F|B|I|W)(\d*)\s*$")


@dataclass(frozen=True, order=True)
class Action:
    """One thing a device does: `kind` of `stage` on `microbatch` (None for whole-step actions)."""

    stage: int
    kind: str
    microbatch: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in COMPUTE_KINDS + COMM_KINDS:
            allowed = ", ".join(COMPUTE_KINDS + COMM_KINDS)
            raise CourseInputError(f"action kind must be one of {allowed}, got {self.kind!r}")
        if not isinstance(self.stage, int) or self.stage < 0:
            raise CourseInputError(f"action stage must be an integer >= 0, got {self.stage!r}")
        if self.microbatch is not None and (
            not isinstance(self.microbatch, int) or self.microbatch < 0
        ):
            raise CourseInputError(
                f"action micro-batch must be an integer >= 0 or None, got {self.microbatch!r}"
            )

    def __str__(self) -> str:
        mb = "" if self.microbatch is None else str(self.microbatch)
        return f"{self.stage}{self.kind}{mb}"

    def __repr__(self) -> str:
        return str(self)

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE_KINDS

    @property
    def is_backward(self) -> bool:
        return self.kind in ("B", "I", "W")

    @classmethod
    def parse(cls, text: str | Action) -> Action:
        """`Action.parse("2F0") == Action(2, "F", 0)`; an Action is returned unchanged."""
        if isinstance(text, Action):
            return text
        match = _ACTION_RE.match(str(text))
        if not match:
            raise CourseInputError(
                f"cannot read action {text!r}: write stage, kind, micro-batch like '2F0', "
                "'1B3', '0I1' or '0W1'"
            )
        stage, kind, mb = match.groups()
        return cls(int(stage), kind, int(mb) if mb else None)


def parse_actions(items) -> list[Action]:
    """Parse a list of actions given as strings ('0F1') or Action values."""
    return [Action.parse(item) for item in items]


@dataclass(frozen=True)
class Schedule:
    """Per-device ordered action lists, plus the shape they were made for.

    `devices[d]` is what device `d` runs, in order. `stages` counts pipeline stages
    (devices x chunks with looping placement). `batch_scale` is how many micro-batches'
    worth of data each action processes (the unsplit `naive` schedule runs the whole
    batch as one micro-batch, so its actions cost `microbatches` times more).
    """

    name: str
    stages: int
    microbatches: int
    devices: tuple[tuple[Action, ...], ...]
    batch_scale: int = 1

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def chunks(self) -> int:
        """Stages per device (virtual stages, `v`)."""
        return max(1, self.stages // max(1, self.num_devices))

    def device_of_stage(self) -> dict[int, int]:
        """Which device runs each stage (read off the action lists)."""
        owner: dict[int, int] = {}
        for device, actions in enumerate(self.devices):
            for action in actions:
                if action.is_compute:
                    owner.setdefault(action.stage, device)
        return owner

    def as_strings(self) -> list[list[str]]:
        return [[str(a) for a in actions] for actions in self.devices]

    def __str__(self) -> str:
        lines = [f"{self.name}: {self.stages} stages, {self.microbatches} micro-batches"]
        for d, actions in enumerate(self.devices):
            cells = " ".join(f"{str(a):>5}" for a in actions)
            lines.append(f"device {d}: {cells}")
        return "\n".join(lines)
