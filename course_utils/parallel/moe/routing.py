"""Routing and capacity: which expert each token goes to, and the counts a lesson grades.

Gates. Top-1 uses gate = p_e itself (Switch Transformer, Fedus et al. 2021, arXiv
2101.03961, eq. 2): multiplying by p is what gives the router a gradient. Top-2 uses
GShard's renormalised gates g_j = p_{e_j} / (p_{e_1} + p_{e_2}) (Lepikhin et al. 2020,
arXiv 2006.16668, Algorithm 1), computed before capacity is applied, so when one of the
two assignments is dropped the other keeps its gate (DeepSpeed renormalises after
dropping instead; Mixtral renormalises and never drops). The second expert is simply
the second largest p: GShard's random dispatch of the second expert and DeepSpeed's
Gumbel noise are left out, so every run is reproducible.

Capacity. Each expert takes at most

    capacity = ceil(capacity_factor x tokens x k / E)

tokens per group (Switch eq. 3 states it without rounding and some code truncates with
int(); we round up like DeepSpeed's `_capacity`, which also multiplies the factor by k
for top-2, so a group with any tokens never gets zero slots). Slots are filled
first-come-first-served, all first choices before any second choice (GShard Algorithm
1, DeepSpeed `top2gating`). An assignment past the capacity is dropped: the expert does
not see the token and the residual carries x through unchanged. `dropped` counts
dropped assignments (for k = 1, dropped tokens).

Groups. GShard splits the tokens into G groups and applies capacity per group; under
expert parallelism every worker is one group: it routes its own tokens against its own
capacity without asking anybody.

Load balancing. Without help a router collapses onto a few experts (the favoured ones
learn fastest). Switch adds alpha x aux with

    aux = E x sum_i f_i x P_i

where f_i is the fraction of tokens whose first choice is expert i and P_i the mean
router probability of expert i (Switch eq. 4-6; GShard uses the first choice too). It is
1 for a perfectly even router and E when everything goes to one expert. With groups it
is computed per group and averaged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from course_utils import validation
from course_utils.errors import CourseInputError
from course_utils.parallel.moe.limits import (
    MAX_EXPERTS,
    MAX_TOKENS,
    check_capacity_factor,
    check_top_k,
)
from course_utils.threads.ring import all_to_all_bytes

# -- counts a lesson grades against -------------------------------------------------------


def capacity(tokens: int, experts: int, capacity_factor: float | None, top_k: int = 1) -> int:
    """Slots per expert: ceil(capacity_factor x tokens x top_k / experts).

    None means "never drop": every token fits (capacity = tokens, as top-k experts of a
    token are distinct). Float round-off is ignored when rounding up: 1.1 x 10 tokens
    on 1 expert is 11 slots, not 12.
    """
    validation.integer(tokens, "tokens", 0, MAX_TOKENS * 16)
    validation.integer(experts, "experts", 1, MAX_EXPERTS)
    check_top_k(top_k, experts)
    if capacity_factor is None:
        return tokens
    check_capacity_factor(capacity_factor)
    exact = capacity_factor * tokens * top_k / experts
    return math.ceil(exact - 1e-9 * max(1.0, exact))


def tokens_per_expert(
    expert_index: torch.Tensor | Sequence[Sequence[int]],
    experts: int,
    kept: torch.Tensor | None = None,
) -> list[int]:
    """How many assignments each expert got: `expert_index[t, j]` is token t's j-th choice.

    With `kept` (a bool tensor of the same shape) only the assignments within capacity
    are counted, i.e. the tokens each expert really computes.
    """
    index = torch.as_tensor(expert_index, dtype=torch.long)
    if index.numel() and (index.min() < 0 or index.max() >= experts):
        raise CourseInputError(f"expert_index must hold experts 0..{experts - 1}")
    if kept is not None:
        index = index[kept]
    return torch.bincount(index.reshape(-1), minlength=experts).tolist()


def dropped_tokens(tokens_per_expert: Sequence[int], capacity: int) -> int:
    """Assignments over capacity in one group: sum over experts of max(0, n_e - capacity)."""
    validation.integer(capacity, "capacity", 0)
    return sum(max(0, int(n) - capacity) for n in tokens_per_expert)


def experts_of_worker(worker: int, experts: int, workers: int) -> list[int]:
    """The experts worker `worker` holds: a contiguous block of E/N (DeepSpeed, Megatron)."""
    per = experts // workers
    return list(range(worker * per, (worker + 1) * per))


def all_to_all_bytes_per_worker(
    routed: Sequence[Sequence[int]],
    d_model: int,
    workers: int,
    element_size: int = 4,
    phase: str = "dispatch",
) -> list[int]:
    """Bytes each worker sends in the dispatch (or combine) all-to-all of one forward.

    `routed[w][e]` is how many tokens worker w sends to expert e (after capacity). A token
    is d_model numbers; tokens for an expert on the sender's own worker stay home. The
    combine sends every token back, so a worker sends in the combine what it received in
    the dispatch. The backward's two all-to-alls move the same amounts in reverse.
    """
    if len(routed) != workers:
        raise CourseInputError(
            f"routed must have one row per worker ({workers}), got {len(routed)}"
        )
    experts = len(routed[0]) if routed else 0
    if any(len(row) != experts for row in routed) or experts % workers:
        raise CourseInputError(
            f"routed must be {workers} rows of E counts, E a multiple of workers ({workers})"
        )
    if phase not in ("dispatch", "combine"):
        raise CourseInputError(f"phase must be 'dispatch' or 'combine', got {phase!r}")
    per = experts // workers
    numel = [
        [sum(routed[s][e] for e in range(w * per, (w + 1) * per)) * d_model for w in range(workers)]
        for s in range(workers)
    ]
    return all_to_all_bytes(
        numel, element_size, direction="sent" if phase == "dispatch" else "received"
    )


def expert_params(
    d_model: int, hidden: int, experts: int, ep: int = 1, top_k: int = 1
) -> dict[str, int]:
    """Parameter counts of one MoE layer and how they shard over `ep` expert-parallel workers.

    Experts (fc1: d x hidden + hidden, fc2: hidden x d + d each) are split E/ep per
    worker; the router (d x E + E) and LayerNorm (2d) are replicated on every worker.
    `active_per_token` is what one token actually uses: k experts plus the shared part.
    """
    validation.integer(d_model, "d_model")
    validation.integer(hidden, "hidden")
    validation.integer(experts, "experts")
    validation.integer(ep, "ep")
    check_top_k(top_k, experts)
    if experts % ep:
        raise CourseInputError(f"ep must divide experts ({experts}), got {ep}")
    per_expert = 2 * d_model * hidden + hidden + d_model
    replicated = d_model * experts + experts + 2 * d_model
    return {
        "per_expert": per_expert,
        "experts_total": experts * per_expert,
        "replicated": replicated,
        "total": experts * per_expert + replicated,
        "experts_per_worker": experts // ep,
        "per_worker": experts // ep * per_expert + replicated,
        "active_per_token": top_k * per_expert + replicated,
    }


# -- routing -------------------------------------------------------------------------------


@dataclass
class Routing:
    """The router's decisions for one group of T tokens.

    `expert[t, j]` is token t's j-th choice, `gate[t, j]` its weight (carries autograd),
    `slot[t, j]` its place in the expert's queue and `kept[t, j]` whether slot < capacity.
    """

    probs: torch.Tensor  # (T, E) softmax of the router logits
    expert: torch.Tensor  # (T, k) long
    gate: torch.Tensor  # (T, k)
    slot: torch.Tensor  # (T, k) long
    kept: torch.Tensor  # (T, k) bool
    capacity: int

    @property
    def experts(self) -> int:
        return self.probs.shape[1]

    def assignments(self, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(token indices, gates) of the kept assignments to `expert`, in slot order."""
        token, choice = torch.nonzero((self.expert == expert) & self.kept, as_tuple=True)
        order = torch.argsort(self.slot[token, choice])
        token, choice = token[order], choice[order]
        return token, self.gate[token, choice]

    def counts(self) -> list[int]:
        """Assignments per expert before capacity."""
        return tokens_per_expert(self.expert, self.experts)

    def kept_counts(self) -> list[int]:
        """Assignments per expert within capacity (what the experts compute)."""
        return tokens_per_expert(self.expert, self.experts, self.kept)

    @property
    def dropped(self) -> int:
        return int((~self.kept).sum())

    def balancing_loss(self) -> torch.Tensor:
        """Switch's auxiliary loss E x sum_i f_i P_i for this group (1.0 when even)."""
        return load_balancing_loss(self.probs, self.expert[:, 0])


def load_balancing_loss(probs: torch.Tensor, first_choice: torch.Tensor) -> torch.Tensor:
    """E x sum_i f_i x P_i (Fedus et al. 2021, eq. 4): f_i = share of tokens whose first
    choice is i (no gradient: it counts), P_i = mean probability of i (differentiable)."""
    experts = probs.shape[1]
    f = torch.bincount(first_choice, minlength=experts).to(probs.dtype) / probs.shape[0]
    return experts * torch.sum(f * probs.mean(dim=0))


def route(logits: torch.Tensor, top_k: int, capacity_factor: float | None) -> Routing:
    """Top-k routing of one group of tokens with capacity (see the module docstring)."""
    tokens, experts = logits.shape
    probs = torch.softmax(logits, dim=-1)
    top_p, expert = torch.topk(probs, top_k, dim=-1)
    # Switch (k=1): the gate is p itself. GShard (k=2): renormalised over the two choices.
    gate = top_p if top_k == 1 else top_p / top_p.sum(dim=-1, keepdim=True)
    # Queue position: all first choices in token order, then all second choices.
    choice_major = expert.t().reshape(-1)  # (k*T,)
    one_hot = F.one_hot(choice_major, experts)
    position = (torch.cumsum(one_hot, dim=0) - 1).gather(1, choice_major[:, None])
    slot = position.reshape(top_k, tokens).t()
    cap = capacity(tokens, experts, capacity_factor, top_k)
    return Routing(probs, expert, gate, slot, slot < cap, cap)
