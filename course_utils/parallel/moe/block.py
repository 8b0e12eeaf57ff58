"""The MoE block on one device, and the single-device step expert parallelism must equal.

An MoE layer replaces the one MLP of a transformer block by E small MLPs, the experts,
and a router that sends every token to only k of them (Shazeer et al. 2017, arXiv
1701.06538). The parameters grow E-fold, the compute per token only k-fold. Here the
layer is the block's feed-forward half, pre-norm with a residual connection:

    h = LayerNorm(x)
    p = softmax(router(h))                      one probability per expert and token
    e_1..e_k = the k largest p                  top-1 (Switch) or top-2 (GShard)
    y = x + sum_j gate_j * expert_{e_j}(h)      a dropped assignment adds nothing

`MoE.forward(x, groups=N)` routes N consecutive groups of tokens each against its own
capacity, which is exactly what N expert-parallel workers compute, dropped tokens
included; `reference_step` is the forward + backward `ExpertParallel.step` reproduces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from course_utils import validation
from course_utils.errors import CourseInputError
from course_utils.parallel.moe.limits import (
    MAX_D_MODEL,
    MAX_EXPERTS,
    MAX_HIDDEN,
    MAX_SKEW,
    check_capacity_factor,
    check_tokens,
    check_top_k,
)
from course_utils.parallel.moe.routing import route
from course_utils.threads.ring import chunk_bounds
from course_utils.timeline import Timeline


class Expert(nn.Module):
    """One expert: the usual transformer MLP, d_model -> hidden -> d_model with GELU."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, hidden)
        self.fc2 = nn.Linear(hidden, d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(h)))


@dataclass
class MoEOutput:
    """What `MoE.forward` returns: the output and what the router did.

    `routed[g][e]` counts group g's kept assignments to expert e (the tokens group g
    would send to e under expert parallelism); `capacity[g]` is group g's capacity.
    """

    output: torch.Tensor
    aux_loss: torch.Tensor
    tokens_per_expert: list[int]  # assignments before capacity, summed over groups
    kept_per_expert: list[int]
    dropped: int
    capacity: list[int]
    routed: list[list[int]]


class MoE(nn.Module):
    """A pre-norm MoE feed-forward block on one device: y = x + sum_j gate_j expert_j(LN(x)).

    `skew` is added to the router bias of expert 0, so a lesson can start from a router
    that sends most tokens to one expert (the bias is otherwise 0; Switch's router has
    no bias, ours has one only for this).
    """

    def __init__(
        self,
        d_model: int,
        hidden: int,
        experts: int,
        top_k: int = 1,
        capacity_factor: float | None = 1.25,
        skew: float = 0.0,
    ) -> None:
        super().__init__()
        validation.integer(d_model, "d_model", 1, MAX_D_MODEL)
        validation.integer(hidden, "hidden", 1, MAX_HIDDEN)
        validation.integer(experts, "experts", 1, MAX_EXPERTS)
        check_top_k(top_k, experts)
        if capacity_factor is not None:
            check_capacity_factor(capacity_factor)
        validation.number(skew, "skew", -MAX_SKEW, MAX_SKEW)
        self.d_model, self.hidden, self.top_k = d_model, hidden, top_k
        self.capacity_factor = capacity_factor
        self.norm = nn.LayerNorm(d_model)
        self.router = nn.Linear(d_model, experts)
        self.experts = nn.ModuleList(Expert(d_model, hidden) for _ in range(experts))
        with torch.no_grad():
            self.router.bias.zero_()
            self.router.bias[0] = skew

    @property
    def num_experts(self) -> int:
        return len(self.experts)

    def forward(self, x: torch.Tensor, groups: int = 1) -> MoEOutput:
        """x: (..., d_model). Routing and capacity per group of consecutive tokens."""
        tokens = check_tokens(x, self.d_model, groups, "groups")
        flat = x.reshape(tokens, self.d_model)
        bounds = chunk_bounds(tokens, groups)
        hs, routings = [], []
        for lo, hi in bounds:  # route each group on its own, exactly as a worker would
            h = self.norm(flat[lo:hi])
            hs.append(h)
            routings.append(route(self.router(h), self.top_k, self.capacity_factor))
        h = torch.cat(hs)
        mixed = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            picks = [r.assignments(e) for r in routings]
            token = torch.cat([t + lo for (t, _), (lo, _) in zip(picks, bounds, strict=True)])
            if token.numel():  # one batch per expert, like the expert's worker sees it
                gate = torch.cat([g for _, g in picks])
                mixed = mixed.index_add(0, token, gate[:, None] * expert(h[token]))
        aux = torch.stack([r.balancing_loss() for r in routings]).mean()
        return MoEOutput(
            output=(flat + mixed).reshape(x.shape),
            aux_loss=aux,
            tokens_per_expert=column_sums([r.counts() for r in routings]),
            kept_per_expert=column_sums([r.kept_counts() for r in routings]),
            dropped=sum(r.dropped for r in routings),
            capacity=[r.capacity for r in routings],
            routed=[r.kept_counts() for r in routings],
        )


# -- one step's results, from the reference or from the threads ----------------------------


@dataclass
class MoEStep:
    """One forward + backward of L = sum(y x grad_output) + aux_weight x aux.

    `grads` is keyed like `MoE.named_parameters()`. `bytes_sent[phase][w]` is what worker
    w sent in each phase ("counts", "dispatch", "combine", "combine grad",
    "dispatch grad", "all-reduce"); empty for the reference.
    """

    output: torch.Tensor
    input_grad: torch.Tensor
    grads: dict[str, torch.Tensor]
    aux_loss: float
    tokens_per_expert: list[int]
    kept_per_expert: list[int]
    dropped: int
    capacity: list[int]
    routed: list[list[int]]
    bytes_sent: dict[str, list[int]] = field(default_factory=dict)
    timeline: Timeline | None = None
    trace: Any = None  # the recording behind the timeline (draws it on the other clock)


def reference_step(
    moe: MoE,
    x: torch.Tensor,
    grad_output: torch.Tensor | None = None,
    aux_weight: float = 0.0,
    groups: int = 1,
) -> MoEStep:
    """The single-device forward + backward that `ExpertParallel.step` must reproduce.

    The module's own .grad fields are left alone (gradients come from autograd.grad).
    """
    validation.number(aux_weight, "aux_weight", 0.0, 1e6)
    x = x.detach().clone().requires_grad_(True)
    out = moe(x, groups=groups)
    dy = checked_grad_output(grad_output, out.output)
    loss = (out.output * dy).sum() + aux_weight * out.aux_loss
    names, params = zip(*moe.named_parameters(), strict=True)
    grads = torch.autograd.grad(loss, [x, *params], allow_unused=True)
    return MoEStep(
        output=out.output.detach(),
        input_grad=grads[0],
        grads={
            n: torch.zeros_like(p) if g is None else g
            for n, p, g in zip(names, params, grads[1:], strict=True)
        },
        aux_loss=out.aux_loss.item(),
        tokens_per_expert=out.tokens_per_expert,
        kept_per_expert=out.kept_per_expert,
        dropped=out.dropped,
        capacity=out.capacity,
        routed=out.routed,
    )


def checked_grad_output(grad_output: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """`grad_output` checked against `like` (ones like it if None), detached, in its dtype."""
    if grad_output is None:
        return torch.ones_like(like)
    if not isinstance(grad_output, torch.Tensor) or grad_output.shape != like.shape:
        raise CourseInputError(f"grad_output must be a tensor of shape {tuple(like.shape)}")
    if not torch.isfinite(grad_output).all():
        raise CourseInputError("grad_output must be finite (no NaN or inf)")
    return grad_output.detach().to(like.dtype)


def column_sums(rows: Sequence[Sequence[int]]) -> list[int]:
    """Element-wise sum of equally long rows: per-expert counts summed over groups."""
    return [sum(col) for col in zip(*rows, strict=True)]
