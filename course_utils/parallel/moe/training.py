"""Training a skewed MoE with and without the auxiliary load-balancing loss.

A router that starts out favouring one expert keeps favouring it: that expert gets the
tokens, learns, and wins the next tokens too. Switch's balancing loss (Fedus et al. 2021,
arXiv 2101.03961, eq. 4) pulls the router back towards an even split; `train_demo`
records tokens per expert step by step so a lesson can draw both runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from course_utils import validation
from course_utils.errors import CourseInputError
from course_utils.parallel.moe.block import MoE
from course_utils.parallel.moe.limits import MAX_TOKENS


@dataclass
class TrainDemo:
    """Per step: tokens each expert was chosen for (before capacity), their spread
    (max - min over experts, as a fraction of all assignments), task and aux losses."""

    tokens_per_expert: list[list[int]]
    spread: list[float]
    losses: list[float]
    aux_losses: list[float]


def spread(counts: Sequence[int]) -> float:
    """(max - min) / total of tokens per expert: 0 when even, 1 when one expert takes all."""
    total = sum(counts)
    return (max(counts) - min(counts)) / total if total else 0.0


def train_demo(
    steps: int = 20,
    aux_weight: float = 1.0,
    skew: float = 2.0,
    seed: int = 0,
    experts: int = 4,
    top_k: int = 1,
    tokens: int = 64,
    d_model: int = 16,
    hidden: int = 32,
    capacity_factor: float | None = None,
    lr: float = 0.01,
    optimizer: str = "adam",
) -> TrainDemo:
    """Train an MoE whose router starts skewed towards expert 0 on a synthetic regression.

    The task: map x ~ N(0, I) to a fixed random two-layer teacher's output (a fresh batch
    every step), loss = mean squared error + aux_weight x aux. With aux_weight > 0 the
    balancing loss pulls the router back to an even split; with 0 nothing does, and the
    favoured expert keeps its tokens (it even gathers the rest: it is the one that learns).
    The default aux_weight 1.0 is far above Switch's 0.01 so that 20 steps are enough to
    see the effect; skew 2.0 starts with nearly every token on expert 0.
    """
    validation.integer(steps, "steps", 1, 1000)
    validation.number(aux_weight, "aux_weight", 0.0, 1e3)
    validation.integer(tokens, "tokens", 1, MAX_TOKENS)
    validation.number(lr, "lr", 1e-8, 10.0)
    validation.integer(seed, "seed", 0, 2**32 - 1)
    if optimizer not in ("adam", "sgd"):
        raise CourseInputError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    torch.manual_seed(seed)
    moe = MoE(d_model, hidden, experts, top_k, capacity_factor, skew)
    teacher = nn.Sequential(nn.Linear(d_model, hidden), nn.Tanh(), nn.Linear(hidden, d_model))
    make = torch.optim.Adam if optimizer == "adam" else torch.optim.SGD
    opt = make(moe.parameters(), lr=lr)
    data = torch.Generator().manual_seed(seed + 1)
    result = TrainDemo([], [], [], [])
    for _ in range(steps):
        x = torch.randn(tokens, d_model, generator=data)
        with torch.no_grad():
            target = teacher(x)
        out = moe(x)
        task = F.mse_loss(out.output, target)
        opt.zero_grad()
        (task + aux_weight * out.aux_loss).backward()
        opt.step()
        result.tokens_per_expert.append(out.tokens_per_expert)
        result.spread.append(spread(out.tokens_per_expert))
        result.losses.append(task.item())
        result.aux_losses.append(out.aux_loss.item())
    return result
