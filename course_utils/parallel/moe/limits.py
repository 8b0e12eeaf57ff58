"""Sizes the MoE code accepts, and the one-line input checks that name the parameter.

Threads are tiny CPU devices: every size is checked against these limits before any work
starts, so a typo gets a sentence instead of a minute of swapping.
"""

from __future__ import annotations

import math

import torch

from course_utils import validation
from course_utils.errors import CourseInputError

MAX_D_MODEL = 1024
MAX_HIDDEN = 4096
MAX_EXPERTS = 64
MAX_TOKENS = 16384
MAX_WORKERS = 16
MAX_CAPACITY_FACTOR = 64.0
MAX_SKEW = 20.0


def check_top_k(top_k: int, experts: int) -> None:
    """Refuse a `top_k` other than 1 or 2, or above the number of `experts`."""
    if top_k not in (1, 2) or isinstance(top_k, bool):
        raise CourseInputError(f"top_k must be 1 (Switch) or 2 (GShard), got {top_k!r}")
    if top_k > experts:
        raise CourseInputError(f"top_k must be <= experts ({experts}), got {top_k}")


def check_capacity_factor(value: float) -> None:
    """Refuse a capacity factor that is not a finite number in (0, MAX_CAPACITY_FACTOR]."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not 0 < value <= MAX_CAPACITY_FACTOR:
        raise CourseInputError(
            f"capacity_factor must be a finite number in (0, {MAX_CAPACITY_FACTOR:g}] "
            f"or None (never drop), got {value!r}"
        )


def check_tokens(x: torch.Tensor, d_model: int, groups: int, name: str) -> int:
    """Validate a token tensor (..., d_model); return the number of tokens."""
    validation.integer(groups, name, 1, MAX_WORKERS if name == "workers" else MAX_TOKENS)
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.shape[-1] != d_model:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise CourseInputError(f"x must be a tensor of shape (..., {d_model}), got {got}")
    tokens = x.numel() // d_model
    if not groups <= tokens <= MAX_TOKENS:
        raise CourseInputError(
            f"x must hold {groups}..{MAX_TOKENS} tokens (at least one per {name[:-1]}), "
            f"got {tokens}"
        )
    if not torch.isfinite(x).all():
        raise CourseInputError("x must be finite (no NaN or inf)")
    return tokens
