"""Reading a learner's answers: `as_number`, `as_int`, `as_choice`, `as_sequence`, ...

Each `as_*` takes the answer and its name as the learner wrote it, returns it in the form a
check compares (a float, a list, an action, a tensor) or fails with a message naming what
is wrong with its type: text for a number, NaN, a string for a list, a missing key.
`check_function` wraps a learner's function so that its own errors come back as a message
naming the call that broke.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from course_utils.checks.feedback import CheckFailed, NotAnswered, fail, require


def _describe(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{text} (a {type(value).__name__})"


def as_number(value: Any, what: str) -> float:
    """`value` as a finite float. Accepts int, float, Fraction, numpy scalars and one-element
    arrays/tensors; a string, bool, NaN or infinity gets a message instead."""
    require(value, what)
    if isinstance(value, bool):
        fail(f"`{what}` should be a number, not {value!r}.")
    if isinstance(value, str):
        fail(
            f"`{what}` should be a number, but it is the text {value!r}. "
            "Write the number (or a formula) without quotes."
        )
    # numpy scalars, 0-d or one-element arrays and torch tensors all have .item();
    # asking for it avoids importing either library here.
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, int | float):
        size = getattr(value, "size", 1)
        size = size() if callable(size) else size  # torch: .size() is a method
        count = math.prod(size) if isinstance(size, tuple) else size
        if count != 1:
            fail(f"`{what}` should be one number, but it holds {count} values.")
        value = value.item()
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        fail(f"`{what}` should be a number, but it is {_describe(value)}.")
    if math.isnan(number):
        fail(f"`{what}` is NaN (not a number). Look for a 0/0 or an undefined step in the formula.")
    if math.isinf(number):
        fail(f"`{what}` is infinite. Look for a division by zero in your formula.")
    return number


def as_int(value: Any, what: str) -> int:
    """`value` as an int (3.0 is fine, 2.5 is not)."""
    number = as_number(value, what)
    if not number.is_integer():
        fail(f"`{what}` should be a whole number, but it is {number:g}.")
    return int(number)


def as_choice(value: Any, choices: Iterable[Any], what: str) -> Any:
    """`value` as one of `choices` (text is compared ignoring case and outer spaces);
    returns the matching choice as spelled in `choices`."""
    require(value, what)
    options = list(choices)
    listed = ", ".join(repr(c) for c in options)
    if isinstance(value, str):
        wanted = value.strip().casefold()
        for option in options:
            if isinstance(option, str) and option.strip().casefold() == wanted:
                return option
    else:
        for option in options:
            if not isinstance(option, str) and value == option and type(value) is not bool:
                return option
    fail(f"`{what}` should be one of {listed}, but it is {_describe(value)}.")


def as_sequence(
    value: Any,
    what: str,
    length: int | None = None,
    item: Callable[[Any, str], Any] | None = None,
) -> list[Any]:
    """`value` as a list (from a list, tuple, range, array...; not from a string or a dict).

    `length` demands exactly that many items; `item(x, name)` converts each item, e.g.
    `as_sequence(order, "order", item=as_int)`, so item errors name `order[2]`.
    """
    require(value, what)
    if isinstance(value, str | bytes | dict) or not isinstance(value, Iterable):
        fail(f"`{what}` should be a list, but it is {_describe(value)}.")
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays / tensors
        items = value.tolist()
        items = items if isinstance(items, list) else [items]
    else:
        items = list(value)
    if length is not None and len(items) != length:
        fail(f"`{what}` should have {length} items, but it has {len(items)}.")
    if item is not None:
        items = [item(x, f"{what}[{i}]") for i, x in enumerate(items)]
    return items


def as_dict(value: Any, what: str, keys: Sequence[str]) -> dict:
    """`value` as a dict that holds every one of `keys`."""
    require(value, what)
    listed = ", ".join(repr(k) for k in keys)
    if not isinstance(value, dict):
        fail(f"`{what}` should be a dict with the keys {listed}, but it is {_describe(value)}.")
    missing = [k for k in keys if k not in value]
    if missing:
        fail(f"`{what}` has no key {missing[0]!r}: give it all of {listed}.")
    return value


def _short(value: Any) -> str:
    """A call argument as a learner should read it: tensors and arrays by their shape."""
    shape = getattr(value, "shape", None)
    if shape == () and hasattr(value, "item"):  # numpy / torch scalar: show the number
        return repr(value.item())
    if shape is not None and hasattr(value, "dtype") and getattr(value, "ndim", 0) > 0:
        kind = "tensor" if type(value).__module__.startswith("torch") else "array"
        return f"{kind}(shape={tuple(shape)})"
    if isinstance(value, list | tuple) and value and all(hasattr(v, "shape") for v in value):
        inner = ", ".join(_short(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    return repr(value)


def format_call(what: str, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    parts = [_short(a) for a in args] + [f"{k}={_short(v)}" for k, v in kwargs.items()]
    call = f"{what}({', '.join(parts)})"
    return call if len(call) <= 120 else call[:117] + "..."


def check_function(fn: Any, what: str) -> Callable[..., Any]:
    """Check that `fn` is a function and return a safe caller for it.

    The caller runs `fn(*args, **kwargs)`; if the learner's code raises, the error becomes a
    CheckFailed naming the call that broke (or NotAnswered if the body is still the
    `raise NotImplementedError()` stub), so the learner never sees the checker's internals.
    """
    require(fn, what)
    if not callable(fn):
        fail(f"`{what}` should be a function (define it with `def`), but it is {_describe(fn)}.")

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except NotImplementedError:
            raise NotAnswered(
                f"`{what}` still raises NotImplementedError. Replace the "
                "`raise NotImplementedError()` line with your code and run that cell again."
            ) from None
        except CheckFailed:
            raise
        except Exception as exc:  # the learner's bug: report it, not our stack
            raise CheckFailed(
                f"{format_call(what, args, kwargs)} raised {type(exc).__name__}: {exc}\n"
                "Try that call yourself in a new cell to see where it goes wrong."
            ) from None

    call.__name__ = what
    return call


def as_action(value: Any, what: str) -> Any:
    """`value` as a pipeline action (`course_utils.actions.Action`), read from text like '1F0'."""
    from course_utils.actions import Action
    from course_utils.errors import CourseInputError

    require(value, what)
    try:
        return Action.parse(value)
    except CourseInputError:
        fail(
            f"`{what}` is {_describe(value)}, which is not an action. Write it as text like "
            "'1F0' (stage 1, forward, micro-batch 0) or '0B1'."
        )


def as_placement(value: Any, what: str, devices: int, stages: int) -> list[list[int]]:
    """`value` as the stages each of `devices` holds: every stage 0..stages-1 dealt out once,
    each device's in increasing order."""
    rows = as_sequence(value, what)
    if len(rows) != devices:
        fail(
            f"`{what}` has {len(rows)} entries; it needs one per device ({devices}), each the "
            "list of the stages that device holds."
        )
    got = [as_sequence(row, f"{what}[{d}]", item=as_int) for d, row in enumerate(rows)]
    if sorted(s for row in got for s in row) != list(range(stages)):
        fail(
            f"`{what}` = {got} does not hand out each of the {stages} stages 0..{stages - 1} "
            "exactly once."
        )
    if any(row != sorted(row) for row in got):
        fail(f"`{what}` = {got}: list each device's stages in increasing order.")
    return got


def as_tensor(value: Any, what: str, shape: Sequence[int] | None = None) -> Any:
    """`value` as a float32 torch tensor (of `shape`, if given); torch is imported only here."""
    import torch

    require(value, what)
    try:
        tensor = torch.as_tensor(value, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        fail(f"`{what}` should be a tensor, but it is {_describe(value)}.")
    if shape is not None and tuple(tensor.shape) != tuple(shape):
        fail(f"`{what}` has shape {tuple(tensor.shape)}; it should be {tuple(shape)}.")
    return tensor
