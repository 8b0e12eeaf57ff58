"""The one-line input errors of context parallelism, shared by its modules."""

from __future__ import annotations

import math

import torch

from course_utils import validation
from course_utils.errors import CourseInputError

MAX_WORKERS = 16


# -- input checks -------------------------------------------------------------------------


def check_timeout(timeout: float) -> None:
    """How long a worker waits for a message: a finite number of seconds > 0."""
    if not isinstance(timeout, int | float) or not 0 < timeout < math.inf:
        raise CourseInputError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")


def check_seq_split(seq: int, workers: int, zigzag: bool) -> None:
    """Refuse a `seq` that the `workers` (twice as many chunks if `zigzag`) cannot split evenly."""
    validation.integer(workers, "workers", 1, MAX_WORKERS)
    chunks = 2 * workers if zigzag else workers
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < chunks or seq % chunks:
        split = f"2 x workers = {chunks} (zig-zag split)" if zigzag else f"workers = {chunks}"
        raise CourseInputError(f"seq must be a positive multiple of {split}, got {seq!r}")


def check_float_tensors(tensors: dict[str, torch.Tensor]) -> None:
    """Each named tensor must be floating-point, (..., seq, dim) and finite."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() < 2:
            raise CourseInputError(f"{name} must be a floating-point tensor (..., seq, dim)")
        if not torch.isfinite(t).all():
            raise CourseInputError(f"{name} must be finite (no NaN or inf)")


def check_matching_tensors(tensors: dict[str, torch.Tensor]) -> None:
    """`check_float_tensors`, and all of one shape and dtype (the first one's)."""
    check_float_tensors(tensors)
    first_name, first = next(iter(tensors.items()))
    for name, t in tensors.items():
        if t.shape != first.shape or t.dtype != first.dtype:
            raise CourseInputError(
                f"{name} must have {first_name}'s shape {tuple(first.shape)} and dtype "
                f"{first.dtype}, got {tuple(t.shape)} {t.dtype}"
            )


def check_ring_inputs(tensors: dict[str, torch.Tensor], workers: int, zigzag: bool) -> None:
    """q, k, v (and dout): finite float tensors of one shape (..., seq, d), seq splittable."""
    check_matching_tensors(tensors)
    check_seq_split(next(iter(tensors.values())).shape[-2], workers, zigzag)
