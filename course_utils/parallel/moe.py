"""Mixture of experts (MoE) and expert parallelism on CPU threads.

An MoE layer replaces the one MLP of a transformer block by E small MLPs, the experts,
and a router that sends every token to only k of them (Shazeer et al. 2017, arXiv
1701.06538). The parameters grow E-fold, the compute per token only k-fold. Here the
layer is the block's feed-forward half, pre-norm with a residual connection:

    h = LayerNorm(x)
    p = softmax(router(h))                      one probability per expert and token
    e_1..e_k = the k largest p                  top-1 (Switch) or top-2 (GShard)
    y = x + sum_j gate_j * expert_{e_j}(h)      a dropped assignment adds nothing

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
capacity without asking anybody. `MoE.forward(x, groups=N)` is therefore exactly what N
expert-parallel workers compute, dropped tokens included.

Load balancing. Without help a router collapses onto a few experts (the favoured ones
learn fastest). Switch adds alpha x aux with

    aux = E x sum_i f_i x P_i

where f_i is the fraction of tokens whose first choice is expert i and P_i the mean
router probability of expert i (Switch eq. 4-6; GShard uses the first choice too). It is
1 for a perfectly even router and E when everything goes to one expert. With groups it
is computed per group and averaged.

Expert parallelism (GShard; DeepSpeed-MoE; Megatron-LM's token dispatcher). N workers
each hold E/N experts (worker w holds experts w x E/N ... (w+1) x E/N - 1) and a copy of
the router and norm. One step on worker w:

    route its tokens -> dispatch all-to-all (each token to its expert's worker)
    -> the local experts run -> combine all-to-all (results back to the token's worker)
    -> weighted sum and residual
    backward: the same two all-to-alls in reverse order carry the gradients back, then
    an all-reduce sums the router and norm gradients (they are replicated).

The backward is written out: every worker runs autograd only on its own graph pieces and
gradients cross between workers only as messages. `ExpertParallel` records a measured
`Timeline`, and `simulate_moe` predicts one from token counts and a cost model, so a
lesson can show a skewed router turning one worker into the straggler.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.actions import Action
from course_utils.errors import CourseInputError, WorkerError
from course_utils.threads.collectives import ThreadGroup, all_to_all_bytes, chunk_bounds
from course_utils.threads.devices import Aborted, DeviceThreads
from course_utils.timeline import Event, Timeline

# Sizes are checked against these before any work starts (threads are tiny CPU devices).
MAX_D_MODEL = 1024
MAX_HIDDEN = 4096
MAX_EXPERTS = 64
MAX_TOKENS = 16384
MAX_WORKERS = 16
MAX_CAPACITY_FACTOR = 64.0
MAX_SKEW = 20.0


# -- counts a lesson grades against -------------------------------------------------------


def capacity(tokens: int, experts: int, capacity_factor: float | None, top_k: int = 1) -> int:
    """Slots per expert: ceil(capacity_factor x tokens x top_k / experts).

    None means "never drop": every token fits (capacity = tokens, as top-k experts of a
    token are distinct). Float round-off is ignored when rounding up: 1.1 x 10 tokens
    on 1 expert is 11 slots, not 12.
    """
    _check_int("tokens", tokens, 0, MAX_TOKENS * 16)
    _check_int("experts", experts, 1, MAX_EXPERTS)
    _check_top_k(top_k, experts)
    if capacity_factor is None:
        return tokens
    _check_capacity_factor(capacity_factor)
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
    _check_int("capacity", capacity, 0, None)
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
    _check_int("d_model", d_model, 1, None)
    _check_int("hidden", hidden, 1, None)
    _check_int("experts", experts, 1, None)
    _check_int("ep", ep, 1, None)
    _check_top_k(top_k, experts)
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


# -- the single-device reference -----------------------------------------------------------


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
        _check_int("d_model", d_model, 1, MAX_D_MODEL)
        _check_int("hidden", hidden, 1, MAX_HIDDEN)
        _check_int("experts", experts, 1, MAX_EXPERTS)
        _check_top_k(top_k, experts)
        if capacity_factor is not None:
            _check_capacity_factor(capacity_factor)
        _check_float("skew", skew, -MAX_SKEW, MAX_SKEW)
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
        tokens = _check_tokens(x, self.d_model, groups, "groups")
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
            tokens_per_expert=_sum_lists([r.counts() for r in routings]),
            kept_per_expert=_sum_lists([r.kept_counts() for r in routings]),
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
    _check_float("aux_weight", aux_weight, 0.0, 1e6)
    x = x.detach().clone().requires_grad_(True)
    out = moe(x, groups=groups)
    dy = _grad_output(grad_output, out.output)
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


# -- expert parallelism on threads ---------------------------------------------------------


@dataclass
class _Shard:
    """What one worker holds: copies of the norm and router, and its own E/N experts."""

    norm: nn.LayerNorm
    router: nn.Linear
    experts: nn.ModuleList
    expert_ids: list[int]


class ExpertParallel:
    """The experts of `moe` spread over `workers` threads (E/N each); see the module docstring.

    `moe` is copied, not modified. `step(x, grad_output, aux_weight)` splits the tokens
    into N consecutive groups (worker w routes group w) and returns a `MoEStep` equal to
    `reference_step(moe, x, grad_output, aux_weight, groups=workers)`. Use as a context
    manager, or call `close()`, to stop the threads.
    """

    def __init__(self, moe: MoE, workers: int, timeout: float = 60.0) -> None:
        _check_int("workers", workers, 1, MAX_WORKERS)
        if moe.num_experts % workers:
            raise CourseInputError(
                f"workers must divide the number of experts ({moe.num_experts}), got {workers}"
            )
        _check_float("timeout", timeout, 1e-3, 3600.0)
        self.workers = workers
        self.num_experts = moe.num_experts
        self.d_model, self.top_k = moe.d_model, moe.top_k
        self.capacity_factor = moe.capacity_factor
        self.shards = []
        for w in range(workers):
            ids = experts_of_worker(w, moe.num_experts, workers)
            self.shards.append(
                _Shard(
                    norm=copy.deepcopy(moe.norm),
                    router=copy.deepcopy(moe.router),
                    experts=nn.ModuleList(copy.deepcopy(moe.experts[e]) for e in ids),
                    expert_ids=ids,
                )
            )
        self.threads = DeviceThreads(workers, name="ep worker")
        self.group = ThreadGroup(workers, abort=self.threads.abort, timeout=timeout)

    def step(
        self, x: torch.Tensor, grad_output: torch.Tensor | None = None, aux_weight: float = 0.0
    ) -> MoEStep:
        """Forward and explicit backward on all workers.

        The gradients land in the shards' .grad (replacing the previous step's), ready for
        one optimizer per worker over `parameters(worker)`.
        """
        tokens = _check_tokens(x, self.d_model, self.workers, "workers")
        _check_float("aux_weight", aux_weight, 0.0, 1e6)
        flat = x.detach().reshape(tokens, self.d_model)
        dy = _grad_output(grad_output, x).reshape(tokens, self.d_model)
        bounds = chunk_bounds(tokens, self.workers)
        for shard in self.shards:
            for p in _shard_params(shard):
                p.grad = None
        self.group.reset_counters()
        t0 = time.perf_counter_ns()
        jobs = [
            _WorkerStep(self, w, flat[lo:hi], dy[lo:hi], aux_weight / self.workers, t0)
            for w, (lo, hi) in enumerate(bounds)
        ]
        try:
            results = self.threads.run([job.run for job in jobs])
        except Exception:
            self.group.reset()  # drop half-delivered messages so the next step starts clean
            raise
        return self._gather(results, x.shape)

    def _gather(self, results: list[dict], shape: torch.Size) -> MoEStep:
        events = [e for r in results for e in r["events"]]
        routed = [r["routed"] for r in results]
        timeline = Timeline(
            events,
            self.workers,
            name=f"expert parallel: {self.num_experts} experts on {self.workers} workers",
            source="measured",
            unit="s",
            meta={"received_per_expert": _sum_lists(routed), "routed": routed},
        )
        phases = results[0]["bytes"].keys()
        return MoEStep(
            output=torch.cat([r["output"] for r in results]).reshape(shape),
            input_grad=torch.cat([r["input_grad"] for r in results]).reshape(shape),
            grads=self.gathered_grads(),
            aux_loss=sum(r["aux"] for r in results) / self.workers,
            tokens_per_expert=_sum_lists([r["counts"] for r in results]),
            kept_per_expert=_sum_lists(routed),
            dropped=sum(r["dropped"] for r in results),
            capacity=[r["capacity"] for r in results],
            routed=routed,
            bytes_sent={p: [r["bytes"][p] for r in results] for p in phases},
            timeline=timeline,
        )

    def gathered_grads(self) -> dict[str, torch.Tensor]:
        """The workers' gradients under the reference module's parameter names.

        Norm and router gradients were all-reduced, so worker 0's copy is the total.
        """
        first = self.shards[0]
        grads = {f"norm.{n}": p.grad for n, p in first.norm.named_parameters()}
        grads.update({f"router.{n}": p.grad for n, p in first.router.named_parameters()})
        for shard in self.shards:
            for e, expert in zip(shard.expert_ids, shard.experts, strict=True):
                for n, p in expert.named_parameters():
                    grads[f"experts.{e}.{n}"] = torch.zeros_like(p) if p.grad is None else p.grad
        return grads

    def parameters(self, worker: int) -> list[nn.Parameter]:
        """What worker `worker` trains: its norm and router copies and its own experts.

        Give each worker its own optimizer over these; the replicated gradients were
        all-reduced, so the copies receive the same update and stay identical.
        """
        _check_int("worker", worker, 0, self.workers - 1)
        return _shard_params(self.shards[worker])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The parameters put back together, loadable with `MoE.load_state_dict`."""
        first = self.shards[0]
        state = {f"norm.{n}": p.detach() for n, p in first.norm.named_parameters()}
        state.update({f"router.{n}": p.detach() for n, p in first.router.named_parameters()})
        for shard in self.shards:
            for e, expert in zip(shard.expert_ids, shard.experts, strict=True):
                state.update({f"experts.{e}.{n}": p.detach() for n, p in expert.named_parameters()})
        return state

    def max_replica_diff(self) -> float:
        """Largest difference between worker 0's router/norm gradients and any other's."""
        worst = 0.0
        for shard in self.shards[1:]:
            for a, b in zip(_replicated(self.shards[0]), _replicated(shard), strict=True):
                worst = max(worst, (a.grad - b.grad).abs().max().item())
        return worst

    def close(self) -> None:
        self.threads.close()

    def __enter__(self) -> ExpertParallel:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class _WorkerStep:
    """One worker's part of one step, written top to bottom as the phases happen."""

    def __init__(self, ep: ExpertParallel, rank: int, x, dy, aux_weight: float, t0: int):
        self.ep, self.rank, self.t0 = ep, rank, t0
        self.x, self.dy, self.aux_weight = x, dy, aux_weight
        self.shard = ep.shards[rank]
        self.comm = ep.group.comm(rank)
        self.events: list[Event] = []
        self.bytes: dict[str, int] = {}

    @contextmanager
    def phase(self, kind: str, label: str, expert: int | None = None):
        """Time a phase as one Event, and name the phase in the error if it fails."""
        start = time.perf_counter_ns()
        try:
            yield
        except (Aborted, CourseInputError):
            raise  # a peer failed first, or bad input: the message already says what
        except Exception as exc:
            doing = {"F": "forward", "B": "backward"}.get(kind, "communication")
            raise WorkerError(
                f"device {self.rank} failed during {label} ({doing}): {type(exc).__name__}: {exc}"
            ) from exc
        end = time.perf_counter_ns()
        action = Action(0, kind, expert) if kind in ("F", "B") else Action(0, kind)
        self.events.append(
            Event(self.rank, action, (start - self.t0) / 1e9, (end - self.t0) / 1e9, label)
        )

    def all_to_all(self, label: str, chunks: list[torch.Tensor]) -> list[torch.Tensor]:
        """`comm.all_to_all`, adding the bytes this worker sent to `self.bytes[label]`."""
        before = self.ep.group.bytes_sent[self.rank]  # only this rank adds to its entry
        received = self.comm.all_to_all(chunks)
        sent = self.ep.group.bytes_sent[self.rank] - before
        self.bytes[label] = self.bytes.get(label, 0) + sent
        return received

    def run(self) -> dict:
        ep, shard, n = self.ep, self.shard, self.ep.workers
        experts_on = [experts_of_worker(d, ep.num_experts, n) for d in range(n)]

        # 1. Route this worker's tokens (its group); line them up by destination worker,
        # each destination's experts one after the other, each expert's queue in slot order.
        with self.phase("F", "router"):
            x = self.x.clone().requires_grad_(True)
            h = shard.norm(x)
            h_in = h.detach().requires_grad_(True)  # the graph is cut here: see step 9
            routing = route(shard.router(h_in), ep.top_k, ep.capacity_factor)
            aux = routing.balancing_loss()
            picks = [routing.assignments(e) for e in range(ep.num_experts)]
            token_to = [torch.cat([picks[e][0] for e in experts_on[d]]) for d in range(n)]
            gate_to = [torch.cat([picks[e][1] for e in experts_on[d]]) for d in range(n)]
            count_to = [torch.tensor([len(picks[e][0]) for e in experts_on[d]]) for d in range(n)]
            send = [h_in.detach()[token_to[d]] for d in range(n)]

        # 2. Dispatch: first how many tokens go to each expert (the receiver must know where
        # one expert's tokens end; Megatron exchanges these counts too), then the tokens.
        with self.phase("ALL_TO_ALL", "dispatch"):
            counts = [c.tolist() for c in self.all_to_all("counts", count_to)]  # [s][i]
            received = self.all_to_all("dispatch", send)
        local = range(len(shard.expert_ids))
        # Where local expert i's tokens from source s sit: in s's message, and in i's batch.
        in_message = [_spans(counts[s]) for s in range(n)]  # [s][i]
        in_batch = [_spans([counts[s][i] for s in range(n)]) for i in local]  # [i][s]

        # 3. The local experts, each on one batch of all the tokens sent to it.
        inputs, outputs = [], []
        for i, e, expert in zip(local, shard.expert_ids, shard.experts, strict=True):
            with self.phase("F", f"expert {e}", expert=e):
                batch = torch.cat([_rows(received[s], in_message[s][i]) for s in range(n)])
                batch.requires_grad_(True)  # a leaf: its gradient goes back as a message
                inputs.append(batch)
                outputs.append(expert(batch))

        # 4. Combine: every token's expert output goes back to the worker that owns the
        # token, laid out as that worker sent it (so it knows which token is which).
        back = [
            torch.cat([_rows(outputs[i].detach(), in_batch[i][s]) for i in local]) for s in range(n)
        ]
        with self.phase("ALL_TO_ALL", "combine"):
            returned = self.all_to_all("combine", back)  # returned[d] lines up with send[d]

        # 5. Weighted sum of the expert outputs, plus the residual.
        with self.phase("F", "weighted sum"):
            expert_out = torch.cat(returned).requires_grad_(True)
            token, gate = torch.cat(token_to), torch.cat(gate_to)
            y = x + torch.zeros_like(x).index_add(0, token, gate[:, None] * expert_out)

        # 6. Backward of this worker's own graph for L = sum(y * dy) + aux_weight * aux:
        # dL/dx (residual), router grads and dL/dh (gates, aux), dL/d(expert outputs).
        with self.phase("B", "weighted sum"):
            weight = torch.tensor(self.aux_weight, dtype=aux.dtype)
            torch.autograd.backward([y, aux], [self.dy, weight])
            grad_out = list(expert_out.grad.split([len(t) for t in token_to]))

        # 7. The combine in reverse: each output's gradient to the worker of its expert.
        with self.phase("ALL_TO_ALL", "combine grad"):
            # grad_back[s] lines up with received[s]
            grad_back = self.all_to_all("combine grad", grad_out)

        # 8. Expert backward: weight gradients stay here, input gradients go home.
        for i, e, out in zip(local, shard.expert_ids, outputs, strict=True):
            with self.phase("B", f"expert {e}", expert=e):
                out.backward(torch.cat([_rows(grad_back[s], in_message[s][i]) for s in range(n)]))
        grad_in = [
            torch.cat([_rows(inputs[i].grad, in_batch[i][s]) for i in local]) for s in range(n)
        ]

        # 9. The dispatch in reverse: dL/dh of every token sent comes back to its owner,
        # is added to the gate path's dL/dh, and goes on through the norm to x.
        with self.phase("ALL_TO_ALL", "dispatch grad"):
            grad_sent = self.all_to_all("dispatch grad", grad_in)  # lines up with send
        with self.phase("B", "router"):
            grad_h = h_in.grad if h_in.grad is not None else torch.zeros_like(h_in)
            h.backward(grad_h.index_add(0, token, torch.cat(grad_sent)))

        # 10. Router and norm are replicated: sum their gradients over the workers.
        with self.phase("REDUCE_GRAD", "all-reduce"):
            before = self.ep.group.bytes_sent[self.rank]
            self.comm.all_reduce([_grad(p) for p in _replicated(shard)], op="sum")
            self.bytes["all-reduce"] = self.ep.group.bytes_sent[self.rank] - before

        return {
            "output": y.detach(),
            "input_grad": x.grad,
            "aux": aux.item(),
            "counts": routing.counts(),
            "routed": [len(p[0]) for p in picks],
            "dropped": routing.dropped,
            "capacity": routing.capacity,
            "events": self.events,
            "bytes": self.bytes,
        }


# -- predicting the timeline --------------------------------------------------------------


@dataclass(frozen=True)
class MoECosts:
    """How long the pieces of an expert-parallel step take (any unit; seconds if fitted).

    Compute costs are per token: `router` (norm + router + sorting, per token a worker
    routes), `expert_forward` / `expert_backward` (per token an expert computes),
    `combine` (weighted sum, per assignment a worker gets back). `latency` is paid once per
    exchange (the dispatch has two: counts, then tokens) and `per_byte` per byte of the
    larger of what a worker sends and receives.
    """

    router: float = 0.1
    router_backward: float = 0.2
    expert_forward: float = 1.0
    expert_backward: float = 2.0
    combine: float = 0.05
    combine_backward: float = 0.1
    latency: float = 0.0
    per_byte: float = 0.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            _check_float(name, value, 0.0, 1e12)


def simulate_moe(
    tokens_per_expert: Sequence[int] | Sequence[Sequence[int]],
    workers: int,
    costs: MoECosts | None = None,
    d_model: int = 16,
    top_k: int = 1,
    element_size: int = 4,
    replicated_bytes: int = 0,
    unit: str = "units",
    tokens_per_worker: Sequence[int] | None = None,
) -> Timeline:
    """Predict one expert-parallel step (the phases `ExpertParallel.step` measures).

    `tokens_per_expert` is either E counts (the tokens each expert computes, assumed to
    come evenly from all workers) or a workers x E matrix `routed[w][e]` (as in
    `MoEStep.routed`). Each worker runs its phases in order; an all-to-all or all-reduce
    ends for worker w only after the last worker has arrived:

        end_w = max over workers of arrival + latency + per_byte x max(sent_w, received_w)

    so a worker whose experts got more tokens makes everybody else wait (the straggler).
    The all-reduce of `replicated_bytes` costs the ring's 2(N-1)/N x bytes x per_byte +
    2(N-1) x latency (Patarasuk and Yuan 2009). The router runs on every token of a
    worker, dropped or not: `tokens_per_worker` (default: assignments / top_k).
    """
    _check_int("workers", workers, 1, MAX_WORKERS)
    costs = costs or MoECosts()
    _check_int("d_model", d_model, 1, MAX_D_MODEL)
    _check_int("replicated_bytes", replicated_bytes, 0, None)
    routed = _routed_matrix(tokens_per_expert, workers)
    experts = len(routed[0])
    _check_top_k(top_k, experts)
    per = experts // workers
    computed = [sum(routed[s][e] for s in range(workers)) for e in range(experts)]
    assignments = [sum(row) for row in routed]  # what each worker sends and gets back
    if tokens_per_worker is None:
        routed_tokens = [a / top_k for a in assignments]
    else:
        if len(tokens_per_worker) != workers:
            raise CourseInputError(f"tokens_per_worker needs one count per worker ({workers})")
        for t in tokens_per_worker:
            _check_int("tokens_per_worker", t, 0, MAX_TOKENS)
        routed_tokens = list(tokens_per_worker)
    # Token bytes per (source, destination worker), for the all-to-alls.
    size = d_model * element_size
    matrix = [
        [
            sum(routed[s][e] for e in experts_of_worker(d, experts, workers)) * size
            for d in range(workers)
        ]
        for s in range(workers)
    ]
    out_bytes = [sum(matrix[s][d] for d in range(workers) if d != s) for s in range(workers)]
    in_bytes = [sum(matrix[s][d] for s in range(workers) if s != d) for d in range(workers)]
    traffic = [max(a, b) for a, b in zip(out_bytes, in_bytes, strict=True)]

    clock = [0.0] * workers
    events: list[Event] = []

    def compute(kind: str, cost: list[float], labels: list[str], ids: list | None = None) -> None:
        for w in range(workers):
            action = Action(0, kind, None if ids is None else ids[w])
            events.append(Event(w, action, clock[w], clock[w] + cost[w], labels[w]))
            clock[w] += cost[w]

    def collective(kind: str, label: str, cost: list[float]) -> None:
        ready = max(clock)  # nobody finishes before the last one has arrived
        for w in range(workers):
            events.append(Event(w, Action(0, kind), clock[w], ready + cost[w], label))
            clock[w] = ready + cost[w]

    def same(label: str) -> list[str]:
        return [label] * workers

    a2a = [costs.latency + costs.per_byte * b for b in traffic]
    compute("F", [costs.router * t for t in routed_tokens], same("router"))
    collective("ALL_TO_ALL", "dispatch", [c + costs.latency for c in a2a])  # counts, tokens
    local = [[w * per + i for w in range(workers)] for i in range(per)]  # [i][w]: an expert
    for ids in local:
        cost = [costs.expert_forward * computed[e] for e in ids]
        compute("F", cost, [f"expert {e}" for e in ids], ids)
    collective("ALL_TO_ALL", "combine", a2a)
    compute("F", [costs.combine * a for a in assignments], same("weighted sum"))
    compute("B", [costs.combine_backward * a for a in assignments], same("weighted sum"))
    collective("ALL_TO_ALL", "combine grad", a2a)
    for ids in local:
        cost = [costs.expert_backward * computed[e] for e in ids]
        compute("B", cost, [f"expert {e}" for e in ids], ids)
    collective("ALL_TO_ALL", "dispatch grad", a2a)
    compute("B", [costs.router_backward * t for t in routed_tokens], same("router"))
    steps = 2 * (workers - 1)
    ring = steps / workers * replicated_bytes * costs.per_byte + steps * costs.latency
    collective("REDUCE_GRAD", "all-reduce", [ring] * workers)
    return Timeline(
        events,
        workers,
        name=f"expert parallel: {experts} experts on {workers} workers",
        source="simulated",
        unit=unit,
        meta={"received_per_expert": computed, "routed": routed},
    )


def fit_costs(measured: MoEStep) -> MoECosts:
    """Per-token costs (seconds) read off a measured step, for `simulate_moe(..., costs)`.

    Each compute cost is total time over total tokens of that phase on all workers. An
    all-to-all's measured time includes waiting for the slowest worker, so the latency is
    taken from the quickest exchange seen (the last worker to arrive hardly waits); on
    threads a message is a memory copy, so per_byte is left at 0.
    """
    timeline = measured.timeline
    if timeline is None or timeline.source != "measured":
        raise CourseInputError(
            "measured must be the MoEStep of ExpertParallel.step (with a timeline)"
        )
    assignments = sum(sum(row) for row in measured.routed)
    tokens = measured.output.numel() // measured.output.shape[-1]
    computed = sum(measured.kept_per_expert)

    def total(kind: str, label: str | None = None, experts: bool = False) -> float:
        return sum(
            e.duration
            for e in timeline.events
            if e.action.kind == kind
            and (e.label == label if label else True)
            and ((e.action.microbatch is not None) == experts)
        )

    def per(seconds: float, count: int) -> float:
        return seconds / count if count else 0.0

    exchanges = [
        e.duration
        for e in timeline.events
        if e.action.kind == "ALL_TO_ALL" and e.label != "dispatch"
    ]
    return MoECosts(
        router=per(total("F", "router"), tokens),
        router_backward=per(total("B", "router"), tokens),
        expert_forward=per(total("F", experts=True), computed),
        expert_backward=per(total("B", experts=True), computed),
        combine=per(total("F", "weighted sum"), assignments),
        combine_backward=per(total("B", "weighted sum"), assignments),
        latency=min(exchanges, default=0.0),
        per_byte=0.0,
    )


def _routed_matrix(tokens_per_expert, workers: int) -> list[list[float]]:
    """Normalise simulate_moe's input to a workers x E matrix of (possibly fractional) counts."""
    rows = list(tokens_per_expert)
    if rows and all(isinstance(r, Sequence) and not isinstance(r, str) for r in rows):
        matrix = [[float(v) for v in r] for r in rows]
        if len(matrix) != workers:
            raise CourseInputError(
                f"tokens_per_expert as a matrix needs one row per worker ({workers}), "
                f"got {len(matrix)}"
            )
    else:
        matrix = [[float(v) / workers for v in rows] for _ in range(workers)]
    experts = len(matrix[0]) if matrix else 0
    if not experts or any(len(r) != experts for r in matrix) or experts % workers:
        raise CourseInputError(
            f"tokens_per_expert must list E counts (E a multiple of workers={workers}) "
            "or be a workers x E matrix"
        )
    if any(not math.isfinite(v) or v < 0 or v > MAX_TOKENS * 16 for r in matrix for v in r):
        raise CourseInputError(f"tokens_per_expert must hold finite counts in 0..{MAX_TOKENS * 16}")
    return matrix


# -- training with and without the balancing loss -----------------------------------------


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
    _check_int("steps", steps, 1, 1000)
    _check_float("aux_weight", aux_weight, 0.0, 1e3)
    _check_int("tokens", tokens, 1, MAX_TOKENS)
    _check_float("lr", lr, 1e-8, 10.0)
    _check_int("seed", seed, 0, 2**32 - 1)
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


def _spans(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive (start, end) ranges of the given sizes."""
    spans, start = [], 0
    for size in sizes:
        spans.append((start, start + size))
        start += size
    return spans


def _rows(t: torch.Tensor, span: tuple[int, int]) -> torch.Tensor:
    return t[span[0] : span[1]]


def _replicated(shard: _Shard) -> list[nn.Parameter]:
    return [*shard.norm.parameters(), *shard.router.parameters()]


def _shard_params(shard: _Shard) -> list[nn.Parameter]:
    return [*_replicated(shard), *shard.experts.parameters()]


def _grad(p: nn.Parameter) -> torch.Tensor:
    # Every worker must all-reduce the same buffers, even one whose router saw no token.
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    return p.grad


def _grad_output(grad_output: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    if grad_output is None:
        return torch.ones_like(like)
    if not isinstance(grad_output, torch.Tensor) or grad_output.shape != like.shape:
        raise CourseInputError(f"grad_output must be a tensor of shape {tuple(like.shape)}")
    if not torch.isfinite(grad_output).all():
        raise CourseInputError("grad_output must be finite (no NaN or inf)")
    return grad_output.detach().to(like.dtype)


def _sum_lists(rows: Sequence[Sequence[int]]) -> list[int]:
    return [sum(col) for col in zip(*rows, strict=True)]


# -- input checks (one line each, naming the parameter) ---------------------------------------


def _check_int(name: str, value, low: int, high: int | None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if not ok or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in {low}..{high}"
        raise CourseInputError(f"{name} must be an integer {allowed}, got {value!r}")


def _check_float(name: str, value, low: float, high: float) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not low <= value <= high:
        raise CourseInputError(
            f"{name} must be a finite number in [{low:g}, {high:g}], got {value!r}"
        )


def _check_top_k(top_k, experts: int) -> None:
    if top_k not in (1, 2) or isinstance(top_k, bool):
        raise CourseInputError(f"top_k must be 1 (Switch) or 2 (GShard), got {top_k!r}")
    if top_k > experts:
        raise CourseInputError(f"top_k must be <= experts ({experts}), got {top_k}")


def _check_capacity_factor(value) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not 0 < value <= MAX_CAPACITY_FACTOR:
        raise CourseInputError(
            f"capacity_factor must be a finite number in (0, {MAX_CAPACITY_FACTOR:g}] "
            f"or None (never drop), got {value!r}"
        )


def _check_tokens(x, d_model: int, groups: int, name: str) -> int:
    """Validate a token tensor (..., d_model); return the number of tokens."""
    _check_int(name, groups, 1, MAX_WORKERS if name == "workers" else MAX_TOKENS)
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
