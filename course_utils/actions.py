"""The vocabulary of pipeline schedules: an action, and a schedule as per-device action lists.

An action is a small immutable value written like PyTorch's pipelining actions
(`torch.distributed.pipelining.schedules._Action`), so a learner's schedule maps 1:1
onto PyTorch's:

    2F0   stage 2, forward of micro-batch 0
    1B3   stage 1, full backward of micro-batch 3
    0I1   stage 0, input-gradient backward of micro-batch 1   (zero-bubble split)
    0W1   stage 0, weight-gradient backward of micro-batch 1  (zero-bubble split)

Communication kinds use PyTorch's names too (`1SEND_F0`, `2RECV_B3`, `0REDUCE_GRAD`,
`1UNSHARD`); `KINDS` is the one table of every kind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from course_utils.errors import CourseInputError

# What a pipeline compute action makes for one (stage, micro-batch).
ACTIVATIONS, INPUT_GRAD, WEIGHT_GRAD = "activations", "input gradient", "weight gradient"


@dataclass(frozen=True)
class Kind:
    """One kind of action: its code in an action's name, what a learner calls it, and
    whether it is computation (a device busy with math) or communication.

    A pipeline compute kind also says how it fits backprop, which the simulator, the
    executor and the charts read from here: what it `produces` for its (stage,
    micro-batch), what it `needs` first as (stage offset, product) pairs (offset -1: the
    stage before, +1: the stage after, 0: this stage; a neighbour past either end of the
    pipeline is not needed), how the micro-batches whose activations a device `holds`
    change when it runs (+1 kept, -1 freed), and the point-to-point kind that `sends` its
    product to the neighbouring stage.
    """

    code: str
    name: str
    compute: bool
    backward: bool = False
    p2p: bool = False  # a point-to-point transfer: the sender goes on while it travels
    produces: str | None = None
    needs: tuple[tuple[int, str], ...] = ()
    holds: int = 0
    sends: str | None = None


# The one table of action kinds. Compute kinds and PyTorch's communication kinds print as in
# `torch.distributed.pipelining` ("1SEND_F0", "0REDUCE_GRAD", "2UNSHARD"); the collective
# kinds are the course's own, for data, tensor, sharded and expert parallelism timelines.
# F(s) needs F(s-1); B or I(s) needs F(s) and B/I(s+1); W(s) needs I(s) (Qi et al. 2024,
# arXiv:2401.10241: I and W split B). B frees a micro-batch's activations; with the split
# backward W does, since it still needs what I leaves.
_BACKWARD_NEEDS = ((0, ACTIVATIONS), (1, INPUT_GRAD))
KINDS: dict[str, Kind] = {
    k.code: k
    for k in (
        Kind("F", "forward", True, produces=ACTIVATIONS, needs=((-1, ACTIVATIONS),), holds=1,
             sends="SEND_F"),
        Kind("B", "backward", True, True, produces=INPUT_GRAD, needs=_BACKWARD_NEEDS, holds=-1,
             sends="SEND_B"),
        Kind("I", "input-gradient backward", True, True, produces=INPUT_GRAD,
             needs=_BACKWARD_NEEDS, sends="SEND_B"),
        Kind("W", "weight-gradient backward", True, True, produces=WEIGHT_GRAD,
             needs=((0, INPUT_GRAD),), holds=-1),
        Kind("SEND_F", "send activations", compute=False, p2p=True),
        Kind("RECV_F", "receive activations", compute=False, p2p=True),
        Kind("SEND_B", "send gradients", compute=False, p2p=True),
        Kind("RECV_B", "receive gradients", compute=False, p2p=True),
        Kind("REDUCE_GRAD", "gradient all-reduce", compute=False),
        Kind("UNSHARD", "all-gather of sharded parameters", compute=False),
        Kind("RESHARD", "free gathered parameters", compute=False),
        Kind("ALL_REDUCE", "all-reduce of activations", compute=False),
        Kind("ALL_GATHER", "all-gather", compute=False),
        Kind("REDUCE_SCATTER", "reduce-scatter", compute=False),
        Kind("ALL_TO_ALL", "all-to-all", compute=False),
    )
}  # fmt: skip
COMPUTE_KINDS = tuple(code for code, k in KINDS.items() if k.compute)
COMM_KINDS = tuple(code for code, k in KINDS.items() if not k.compute)
KIND_NAMES = {code: k.name for code, k in KINDS.items()}
PIPELINE_KINDS = tuple(code for code, k in KINDS.items() if k.produces)  # F, B, I, W

# Longest codes first, so "REDUCE_GRAD" is not read as "R..." of a shorter code.
_CODES = "|".join(sorted(KINDS, key=len, reverse=True))
_ACTION_RE = re.compile(rf"^\s*(\d{{1,9}})({_CODES})(\d{{0,9}})\s*$")  # 9 digits: plenty


@dataclass(frozen=True, order=True)
class Action:
    """One thing a device does: `kind` of `stage` on `microbatch` (None for whole-step actions)."""

    stage: int
    kind: str
    microbatch: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in KINDS:
            allowed = ", ".join(KINDS)
            raise CourseInputError(f"action kind must be one of {allowed}, got {self.kind!r}")
        if isinstance(self.stage, bool) or not isinstance(self.stage, int) or self.stage < 0:
            raise CourseInputError(f"action stage must be an integer >= 0, got {self.stage!r}")
        if self.microbatch is not None and (
            isinstance(self.microbatch, bool)
            or not isinstance(self.microbatch, int)
            or self.microbatch < 0
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
        return KINDS[self.kind].compute

    @property
    def is_backward(self) -> bool:
        return KINDS[self.kind].backward

    @property
    def is_p2p(self) -> bool:
        return KINDS[self.kind].p2p

    @classmethod
    def parse(cls, text: str | Action) -> Action:
        """`Action.parse("2F0") == Action(2, "F", 0)`; an Action is returned unchanged."""
        if isinstance(text, Action):
            return text
        match = _ACTION_RE.match(str(text))
        if not match:
            shown = repr(text) if len(repr(text)) <= 40 else repr(text)[:37] + "..."
            raise CourseInputError(
                f"cannot read action {shown}: write stage, kind, micro-batch like '2F0', "
                "'1B3', '0I1' or '0W1' (at most 9 digits each)"
            )
        stage, kind, mb = match.groups()
        return cls(int(stage), kind, int(mb) if mb else None)


@dataclass(frozen=True)
class Schedule:
    """Per-device ordered action lists, plus the shape they were made for.

    `devices[d]` is what device `d` runs, in order. `stages` counts pipeline stages
    (devices x chunks with looping placement). `batch_scale` is how many micro-batches'
    worth of data each action processes (the unsplit `naive` schedule runs the whole
    batch as one micro-batch, so its actions cost `microbatches` times more).

    `send_groups` says when outputs leave a device. None (every schedule but DualPipeV):
    each action's output is sent the moment the action ends. Otherwise, per device, the
    sizes of consecutive runs of its actions whose outputs are sent together when the
    run's last action ends, as DeepSeek's dualpipev.py sends both results of an
    overlapped F&B slot after the slot. A device's own later actions see an output at once.
    """

    name: str
    stages: int
    microbatches: int
    devices: tuple[tuple[Action, ...], ...]
    batch_scale: int = 1
    send_groups: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        """Wrong types are one line naming the field, here, not an AttributeError later in
        the simulator (a list of strings is not a Schedule: see `Action.parse`)."""
        from course_utils import validation

        if not isinstance(self.name, str):
            raise CourseInputError(f"Schedule name must be a string, got {self.name!r}")
        validation.integer(self.stages, "Schedule stages")
        validation.integer(self.microbatches, "Schedule microbatches")
        validation.integer(self.batch_scale, "Schedule batch_scale")
        if not isinstance(self.devices, tuple | list) or not all(
            isinstance(actions, tuple | list) for actions in self.devices
        ):
            raise CourseInputError(
                "Schedule devices must hold one tuple of actions per device, got "
                f"{type(self.devices).__name__}"
            )
        for d, actions in enumerate(self.devices):
            for action in actions:
                if not isinstance(action, Action):
                    raise CourseInputError(
                        f"Schedule devices[{d}] must hold Action values (Action.parse('0F0')), "
                        f"got {action!r}"
                    )
        groups = self.send_groups
        if groups is None:
            return
        if len(groups) != len(self.devices) or any(
            any(not isinstance(n, int) or n < 1 for n in sizes) or sum(sizes) != len(actions)
            for sizes, actions in zip(groups, self.devices, strict=False)
        ):
            raise CourseInputError(
                "send_groups must give, per device, sizes >= 1 that add up to its number of actions"
            )

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def numbered(self) -> int:
        """How many micro-batches the actions number (0 to numbered - 1): `microbatches`,
        or one per `batch_scale` of them (the unsplit naive schedule: 1)."""
        return -(-self.microbatches // self.batch_scale)

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
