"""Answers as data: what crosses from a learner's kernel to the grader.

The grader never trusts a verdict computed next to the learner's code. It asks the learner's
kernel for the answers themselves, as data, and judges them in its own process with the
same check functions the notebook uses. `encode` turns an answer into JSON-safe data (numbers,
text, lists, dicts, arrays and tensors with their dtype and shape, fractions, the course's
actions and schedules); `decode` turns it back in the grader. A learner's *function* cannot
cross: the kernel calls it on the inputs the grader chose (`capture`) and only the results
cross, which `Replay` then plays back to the check as if it were the function.

This module is imported in both places; it imports neither torch nor numpy unless the
answer holds one of their values.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

TAG = "__course_type__"
# The trials of per-rank programs and of worker files, by class name: the module that
# defines each (only these are ever made from data).
CASES = {
    "ProgramCase": "course_utils.checks.programs",
    "ShardCase": "course_utils.checks.programs",
    "AttentionCase": "course_utils.checks.programs",
    "DispatchCase": "course_utils.checks.programs",
    "VCase": "course_utils.checks.pipeline_cases",
    "VSplitCase": "course_utils.checks.pipeline_cases",
    "GridCase": "course_utils.checks.pipeline_cases",
    "BudgetCase": "course_utils.checks.pipeline_cases",
    "AccumCase": "course_utils.checks.pipeline_cases",
    "SplitCase": "course_utils.checks.pipeline_cases",
    "RingCase": "course_utils.checks.rank_cases",
    "DDPCase": "course_utils.checks.rank_cases",
    "TPCase": "course_utils.checks.rank_cases",
    "ColumnCase": "course_utils.checks.rank_cases",
    "ZeroCase": "course_utils.checks.rank_cases",
    "PrefetchCase": "course_utils.checks.recorded_cases",
    "GroupsCase": "course_utils.checks.rank_cases",
    "ZigzagCase": "course_utils.checks.rank_cases",
    "CapacityCase": "course_utils.checks.rank_cases",
    "HierarchyCase": "course_utils.checks.rank_cases",
    "BiasCase": "course_utils.checks.rank_cases",
    "UlyssesCase": "course_utils.checks.recorded_cases",
    "SequenceCase": "course_utils.checks.rank_cases",
    "WorkerRingCase": "course_utils.checks.processes",  # a worker file on real processes
    "WorkerDDPCase": "course_utils.checks.processes",
}


def encode(value: Any, depth: int = 0) -> Any:
    """`value` as JSON-safe data (raises TypeError for what cannot cross, e.g. a module)."""
    if depth > 20:
        raise TypeError("nested too deeply")
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {TAG: "float", "value": repr(value)}  # nan, inf: JSON has no literal for them
    if isinstance(value, Fraction):
        return {TAG: "Fraction", "value": [value.numerator, value.denominator]}
    if isinstance(value, list | tuple):
        items = [encode(v, depth + 1) for v in value]
        return items if isinstance(value, list) else {TAG: "tuple", "value": items}
    if isinstance(value, dict):
        return {
            TAG: "dict",
            "value": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()],
        }
    if type(value) is Ellipsis.__class__:
        return {TAG: "Ellipsis"}
    kind = type(value).__module__.split(".")[0]
    name = type(value).__name__
    if kind == "torch" and name in ("Tensor", "Parameter"):
        return {
            TAG: "tensor",
            "dtype": str(value.dtype).removeprefix("torch."),
            "value": encode(value.detach().cpu().tolist(), depth + 1),
        }
    if kind == "numpy":
        if hasattr(value, "shape") and getattr(value, "ndim", 0) > 0:
            return {
                TAG: "ndarray",
                "dtype": str(value.dtype),
                "value": encode(value.tolist(), depth + 1),
            }
        return encode(value.item(), depth + 1)  # numpy scalar
    if kind == "course_utils" and name == "Action":
        return {TAG: "Action", "value": str(value)}
    if kind == "course_utils" and name in CASES:  # a trial of a rank program or a worker
        return {TAG: name, "value": encode(vars(value), depth + 1)}
    if kind == "course_utils" and name == "Schedule":
        return {
            TAG: "Schedule",
            "name": value.name,
            "stages": value.stages,
            "microbatches": value.microbatches,
            "batch_scale": value.batch_scale,
            "devices": [[str(a) for a in actions] for actions in value.devices],
        }
    if isinstance(value, set | frozenset):
        return {TAG: "set", "value": [encode(v, depth + 1) for v in value]}
    raise TypeError(f"a {name} cannot be graded as data")


def decode(data: Any) -> Any:
    """The value `encode` wrote (tensors come back as torch tensors, arrays as numpy)."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    kind = data.get(TAG)
    if kind == "float":
        return float(data["value"])
    if kind == "Fraction":
        return Fraction(*data["value"])
    if kind == "tuple":
        return tuple(decode(v) for v in data["value"])
    if kind == "dict":
        return {_hashable(decode(k)): decode(v) for k, v in data["value"]}
    if kind == "set":
        return {_hashable(decode(v)) for v in data["value"]}
    if kind == "Ellipsis":
        return ...
    if kind == "tensor":
        import torch

        return torch.tensor(decode(data["value"]), dtype=getattr(torch, data["dtype"]))
    if kind == "ndarray":
        import numpy as np

        return np.array(decode(data["value"]), dtype=data["dtype"])
    if kind == "Action":
        from course_utils.actions import Action

        return Action.parse(data["value"])
    if kind in CASES:
        import importlib

        case = getattr(importlib.import_module(CASES[kind]), kind)
        return case(**decode(data["value"]))
    if kind == "Schedule":
        from course_utils.actions import Action, Schedule

        devices = tuple(tuple(Action.parse(a) for a in acts) for acts in data["devices"])
        return Schedule(
            data["name"], data["stages"], data["microbatches"], devices, data["batch_scale"]
        )
    raise ValueError(f"unknown encoded value {kind!r}")


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


# --------------------------------------------------------------------------- functions


# Both limits derive from BaseException, so a learner's `except Exception:` cannot swallow
# them (and the alarm keeps firing every 50 ms if something does).
class CallTimedOut(BaseException):
    """A learner's function ran past the grader's time limit on one input."""


class CallUsedTooMuchMemory(BaseException):
    """A learner's function grew the kernel past the grader's memory limit on one input."""


MEMORY_LIMIT_BYTES = 1 << 30  # what one call may add to the kernel's memory
_WATCH_EVERY_S = 0.05


def _resident_bytes() -> int | None:
    try:
        import psutil  # type: ignore[import-untyped]  # ipykernel depends on it
    except ImportError:  # pragma: no cover - then only the time limit applies
        return None
    return psutil.Process().memory_info().rss


def call_outcome(
    fn: Callable[..., Any],
    args: Sequence[Any],
    limit_s: float,
    memory_limit: int = MEMORY_LIMIT_BYTES,
) -> dict:
    """Call `fn(*args)` under a time and a memory limit; the outcome as data: its result, or
    what it raised. A function that builds a schedule with a library call on an input of
    10^9 stages would otherwise fill the machine's memory before its time runs out."""
    start = time.perf_counter()
    before = _resident_bytes()
    over = [False]  # the call is over: an alarm still due must not raise in what follows

    def watch(signum, frame):  # noqa: ARG001 - signal handler signature
        if over[0]:
            return
        if time.perf_counter() - start >= limit_s:
            raise CallTimedOut(f"ran past {limit_s:g} s")
        now = _resident_bytes()
        if before is not None and now is not None and now - before > memory_limit:
            raise CallUsedTooMuchMemory(f"used more than {memory_limit / 2**30:g} GiB of memory")

    # A case may say how the answer is called (a `ProgramCase` runs a rank program, a
    # `WorkerRingCase` a worker file on processes), and how long that needs at least (a
    # worker's processes take seconds to start).
    call = getattr(args[0], "__course_call__", None) if len(args) == 1 else None
    if callable(call):
        limit_s = max(limit_s, float(getattr(args[0], "least_call_seconds", 0.0)))
    previous = signal.signal(signal.SIGALRM, watch)
    signal.setitimer(signal.ITIMER_REAL, min(_WATCH_EVERY_S, limit_s), _WATCH_EVERY_S)
    try:
        try:
            result = call(fn) if callable(call) else fn(*args)
        finally:  # first thing once the call has ended, however it ended
            over[0] = True
        signal.setitimer(signal.ITIMER_REAL, 0)  # encoding a big result is not the learner's
        outcome = {"result": encode(result)}
    except CallTimedOut as exc:
        outcome = {"timeout": str(exc)}
    except CallUsedTooMuchMemory as exc:
        outcome = {"memory": str(exc)}
    except MemoryError:
        outcome = {"memory": "ran out of memory"}
    except NotImplementedError:
        outcome = {"raised": "NotImplementedError", "message": ""}
    except Exception as exc:  # the learner's bug: it is the answer's outcome, not ours
        outcome = {"raised": type(exc).__name__, "message": str(exc)}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    outcome["seconds"] = time.perf_counter() - start
    return outcome


class LearnerError(Exception):
    """What a learner's function raised in their kernel, raised again in the grader."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __str__(self) -> str:
        return self.args[0]


def _named(kind: str) -> type[LearnerError]:
    # check_function reports "raised ZeroDivisionError: ..." from the exception's class name
    return type(kind, (LearnerError,), {})


class Replay:
    """Stands in for a learner's function in the grader: it answers exactly the calls the
    check was designed to make, with what the learner's function returned in their kernel."""

    def __init__(self, name: str, cases: Sequence[tuple], outcomes: Sequence[dict]) -> None:
        self.__name__ = name
        self._outcomes = {repr(tuple(c)): o for c, o in zip(cases, outcomes, strict=True)}

    def __call__(self, *args: Any) -> Any:
        outcome = self._outcomes.get(repr(tuple(args)))
        if outcome is None:
            raise LookupError(f"{self.__name__}{args!r} was not among the graded inputs")
        if "result" in outcome:
            return decode(outcome["result"])
        if "timeout" in outcome:
            raise _named("TimeoutError")("TimeoutError", f"it {outcome['timeout']}")
        if "memory" in outcome:
            raise _named("MemoryError")("MemoryError", f"it {outcome['memory']}")
        if outcome["raised"] == "NotImplementedError":
            raise NotImplementedError
        raise _named(outcome["raised"])(outcome["raised"], outcome["message"])
