"""Today's ways to keep an MoE router healthy: DeepSeek-V3's bias balancing and ST-MoE's z-loss.

Balancing without an auxiliary loss (DeepSeek-V3 report, DeepSeek-AI 2024, arXiv
2412.19437, Section 2.1.2; Wang et al. 2024, arXiv 2408.15664). Every expert i has a bias
b_i that is added to its score s_i only to *choose* a token's top-k experts; the gate that
weighs the chosen expert's output is the score itself, without the bias. After each step
the bias moves by a fixed amount gamma (DeepSeek-V3's "bias update speed"): down for an
expert that got more than its share of the tokens, up for one that got less. No gradient
flows through b, so balancing never pulls against the language-modelling loss, as an
auxiliary loss does. (DeepSeek-V3's scores are sigmoid affinities, and its `Gate` in
inference/model.py renormalises the chosen experts' gates to sum to 1 only for sigmoid
scores; it also limits each token to the experts of 4 of its 8 groups, the report's
node-limited routing. The bias rule is the same for the course's softmax router.)

The router z-loss (ST-MoE, Zoph et al. 2022, arXiv 2202.08906, eq. 5), added with a small
weight (0.001 in the paper):

    L_z = (1 / B) sum over tokens of (log sum_j exp(x_j))^2

keeps the router's logits x small: large logits make its softmax round badly in low
precision, one of the instabilities ST-MoE traced. It is smallest (0) where a token's
log-sum-exp is 0, e.g. E equal logits of -log E, not where the logits are 0 (log E there).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from course_utils.errors import CourseInputError


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE's router z-loss: the mean over tokens of logsumexp(logits)^2 (a scalar tensor).

    `logits` is (tokens, experts); differentiable."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        raise CourseInputError("logits must be a floating-point tensor (tokens, experts)")
    return torch.logsumexp(logits, dim=-1).pow(2).mean()


def biased_choice(
    scores: torch.Tensor, bias: torch.Tensor, top_k: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """(experts, gates): each token's top-k experts by score + bias, and their gates, the
    scores without the bias, renormalised over the k chosen when k > 1 like GShard's top-2
    gates (DeepSeek-V3 renormalises too, but only because its scores are sigmoids; its code
    leaves softmax scores as they are).

    `scores` is (tokens, experts), `bias` (experts,)."""
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2:
        raise CourseInputError("scores must be a tensor (tokens, experts)")
    if not isinstance(bias, torch.Tensor) or bias.shape != scores.shape[-1:]:
        raise CourseInputError(
            f"bias must be a tensor of {scores.shape[-1]} values, one per expert"
        )
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= scores.shape[-1]:
        raise CourseInputError(
            f"top_k must be an integer from 1 to {scores.shape[-1]}, got {top_k!r}"
        )
    experts = (scores + bias).topk(top_k, dim=-1).indices
    gates = scores.gather(-1, experts)
    if top_k > 1:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    return experts, gates


def update_bias(
    load: Sequence[int] | torch.Tensor, bias: torch.Tensor, gamma: float
) -> torch.Tensor:
    """DeepSeek-V3's update after a step: b_i - gamma where expert i got more than the mean
    load, b_i + gamma where it got less, unchanged where exactly the mean."""
    load_t = torch.as_tensor(load, dtype=bias.dtype)
    if load_t.shape != bias.shape:
        raise CourseInputError(f"load must give one count per expert ({bias.numel()})")
    if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not gamma > 0:
        raise CourseInputError(f"gamma must be a number > 0, got {gamma!r}")
    return bias - gamma * torch.sign(load_t - load_t.mean())


def expert_load(experts: torch.Tensor, num_experts: int) -> list[int]:
    """Tokens (assignments) each expert got: the counts `update_bias` reads."""
    return torch.bincount(experts.flatten(), minlength=num_experts).tolist()
