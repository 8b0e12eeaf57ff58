"""Attention on one device, and the two pieces ring attention is made of.

`block_attention` gives one block of keys' partial output and log-sum-exp; `merge_partials`
combines two of them exactly (online softmax); `block_attention_backward` rebuilds a
block's probabilities from the final log-sum-exp and returns dQ, dK, dV.
"""

from __future__ import annotations

import torch

from course_utils.errors import CourseInputError
from course_utils.parallel.context_parallel.checks import (
    check_float_tensors,
    check_matching_tensors,
)

# -- attention on one device, and the two pieces ring attention is made of ---------------


def _scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Scaled dot products q k^T / sqrt(d); where `mask` is False the score is -inf."""
    s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    return s if mask is None else s.masked_fill(~mask, float("-inf"))


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """`lse` with -inf (a row that sees no key) replaced by 0, so exp(s - lse) stays 0, not NaN."""
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)


def causal_mask(q_len: int, k_len: int, device=None) -> torch.Tensor:
    """True where query i may look at key j (j <= i), for queries and keys both from position 0."""
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril()


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> torch.Tensor:
    """The single-device reference: softmax(q k^T / sqrt(d)) v, with a causal mask if asked.

    Shapes (..., seq, dim); differentiable with autograd. Builds the whole seq x seq matrix.
    """
    check_matching_tensors({"q": q, "k": k, "v": v})
    mask = causal_mask(q.shape[-2], k.shape[-2], q.device) if causal else None
    return torch.softmax(_scores(q, k, mask), dim=-1) @ v


def block_attention_unchecked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`block_attention` without its input checks, for callers that checked already."""
    s = _scores(q, k, mask)
    lse = torch.logsumexp(s, dim=-1)  # -inf for a row whose keys are all masked (or none)
    p = torch.exp(s - _finite(lse).unsqueeze(-1))
    return p @ v, lse


def block_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of `q` to one block of keys: (partial output, log-sum-exp of the scores).

    `mask` (q_len x k_len, True = may look) is optional. A query that sees no key of this
    block gets output 0 and log-sum-exp -inf, which `merge_partials` gives weight 0.
    """
    check_float_tensors({"q": q, "k": k, "v": v})
    if k.shape != v.shape or q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise CourseInputError(
            f"q, k, v must be (..., q_len, d), (..., k_len, d), (..., k_len, d), got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if mask is not None and (
        mask.dtype != torch.bool or tuple(mask.shape[-2:]) != (q.shape[-2], k.shape[-2])
    ):
        raise CourseInputError(
            f"mask must be a bool tensor of shape ({q.shape[-2]}, {k.shape[-2]}), "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )
    return block_attention_unchecked(q, k, v, mask)


def merge_partials_unchecked(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`merge_partials` without its input checks, for callers that checked already."""
    lse = torch.logaddexp(lse_a, lse_b)
    # e^(l_a - l) = e^l_a / (e^l_a + e^l_b) = sigmoid(l_a - l_b). Written with the difference
    # of the two log-sum-exps, the weights stay exact even when both are large (in float32,
    # l_a - l with l ~ 800 would keep only ~4 digits); a block that saw nothing (-inf)
    # gets weight sigmoid(-inf) = 0 exactly.
    nothing = torch.isneginf(lse)  # neither block had a key these queries may see
    diff = torch.where(nothing, torch.zeros_like(lse), lse_a - lse_b)
    weight_a = torch.sigmoid(diff).unsqueeze(-1)
    weight_b = torch.sigmoid(-diff).unsqueeze(-1)
    out = weight_a * out_a + weight_b * out_b
    return torch.where(nothing.unsqueeze(-1), torch.zeros_like(out), out), lse


def merge_partials(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two blocks' partial attention into the attention over both (exact).

    l = log(e^l_a + e^l_b) and o = e^(l_a - l) o_a + e^(l_b - l) o_b (online softmax,
    Milakov & Gimelshein 2018). The order of merging does not matter, up to rounding.
    """
    if out_a.shape != out_b.shape or lse_a.shape != lse_b.shape or out_a.shape[:-1] != lse_a.shape:
        raise CourseInputError(
            f"out_a, out_b must share a shape (..., q_len, d) and lse_a, lse_b be (..., q_len), "
            f"got {tuple(out_a.shape)}, {tuple(out_b.shape)}, {tuple(lse_a.shape)}, "
            f"{tuple(lse_b.shape)}"
        )
    for name, t in {"out_a": out_a, "out_b": out_b}.items():
        if not torch.isfinite(t).all():
            raise CourseInputError(f"{name} must be finite (no NaN or inf)")
    for name, t in {"lse_a": lse_a, "lse_b": lse_b}.items():
        if torch.isnan(t).any() or (t == float("inf")).any():
            raise CourseInputError(f"{name} must be finite or -inf (no NaN, no +inf)")
    return merge_partials_unchecked(out_a, lse_a, out_b, lse_b)


def block_attention_backward_unchecked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`block_attention_backward` unchecked, given delta = rowsum(dout * out) for its `out`."""
    p = torch.exp(_scores(q, k, mask) - _finite(lse).unsqueeze(-1))  # the forward's P, rebuilt
    dv = p.transpose(-2, -1) @ dout
    dp = dout @ v.transpose(-2, -1)
    ds = p * (dp - delta.unsqueeze(-1))  # softmax backward, row by row
    scale = q.shape[-1] ** -0.5
    return (ds @ k) * scale, (ds.transpose(-2, -1) @ q) * scale, dv


def block_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One key block's share of (dq, dk, dv), given the *final* output and log-sum-exp.

    `out` and `lse` are those of the whole attention (all key blocks merged), `dout` the
    gradient of the loss with respect to `out`. Summing the dq shares over all key blocks
    gives the full dq; dk and dv of this block are complete once every query has been
    through it (Dao et al. 2022, appendix B).
    """
    check_float_tensors({"q": q, "k": k, "v": v, "out": out, "dout": dout})
    if out.shape != q.shape or dout.shape != q.shape or lse.shape != q.shape[:-1]:
        raise CourseInputError(
            f"out and dout must have q's shape {tuple(q.shape)} and lse {tuple(q.shape[:-1])}"
        )
    delta = (dout * out).sum(dim=-1)
    return block_attention_backward_unchecked(q, k, v, dout, lse, delta, mask)
