"""The one-line input errors of context parallelism, shared by its modules."""

from __future__ import annotations

import torch

from course_utils.errors import CourseInputError

MAX_WORKERS = 16


# -- input checks -------------------------------------------------------------------------


def _check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CourseInputError(f"{name} must be an integer >= 1, got {value!r}")


def _check_workers(workers) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise CourseInputError(
            f"workers must be an integer from 1 to {MAX_WORKERS}, got {workers!r}"
        )


def _check_seq(seq, workers, zigzag: bool) -> None:
    _check_workers(workers)
    chunks = 2 * workers if zigzag else workers
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < chunks or seq % chunks:
        split = f"2 x workers = {chunks} (zig-zag split)" if zigzag else f"workers = {chunks}"
        raise CourseInputError(f"seq must be a positive multiple of {split}, got {seq!r}")


def _check_tensors(tensors: dict[str, torch.Tensor]) -> None:
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() < 2:
            raise CourseInputError(f"{name} must be a floating-point tensor (..., seq, dim)")
        if not torch.isfinite(t).all():
            raise CourseInputError(f"{name} must be finite (no NaN or inf)")


def _check_same_shape(tensors: dict[str, torch.Tensor]) -> None:
    _check_tensors(tensors)
    first_name, first = next(iter(tensors.items()))
    for name, t in tensors.items():
        if t.shape != first.shape or t.dtype != first.dtype:
            raise CourseInputError(
                f"{name} must have {first_name}'s shape {tuple(first.shape)} and dtype "
                f"{first.dtype}, got {tuple(t.shape)} {t.dtype}"
            )


def check_ring_inputs(tensors: dict[str, torch.Tensor], workers: int, zigzag: bool) -> None:
    """q, k, v (and dout): finite float tensors of one shape (..., seq, d), seq splittable."""
    _check_same_shape(tensors)
    _check_seq(next(iter(tensors.values())).shape[-2], workers, zigzag)
