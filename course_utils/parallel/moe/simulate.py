"""Predicting an expert-parallel step: a cost model, a simulator, costs fitted to a run.

`simulate_moe` lays out the phases `ExpertParallel.step` measures from token counts and
`MoECosts`, with every all-to-all a barrier: nobody leaves it before the last worker has
arrived. So a worker whose experts got more tokens makes everybody else wait, and the
simulator shows the straggler a skewed router makes without running anything.
`fit_costs` reads per-token costs off a measured step, so measured and simulated
timelines can be drawn on the same time axis. Nothing here runs a model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from course_utils import validation
from course_utils.actions import Action
from course_utils.errors import CourseInputError
from course_utils.parallel.moe.block import MoEStep
from course_utils.parallel.moe.limits import (
    MAX_D_MODEL,
    MAX_TOKENS,
    MAX_WORKERS,
    check_top_k,
)
from course_utils.parallel.moe.routing import experts_of_worker
from course_utils.threads.links import Links
from course_utils.timeline import Event, Timeline


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
            validation.number(value, name, 0.0, 1e12)


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
    expert_seconds: Sequence[tuple[float, float]] | None = None,
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

    `expert_seconds` (one (forward, backward) pair per expert, e.g. `measured_expert_seconds`
    of a run) replaces per-token cost x tokens for the experts: a per-token cost averaged
    over experts overstates the busy expert, whose larger matrix multiply does more work
    per second, and so overstates the straggler.
    """
    validation.integer(workers, "workers", 1, MAX_WORKERS)
    costs = costs or MoECosts()
    validation.integer(d_model, "d_model", 1, MAX_D_MODEL)
    validation.integer(replicated_bytes, "replicated_bytes", 0)
    routed = _routed_matrix(tokens_per_expert, workers)
    experts = len(routed[0])
    check_top_k(top_k, experts)
    per = experts // workers
    if expert_seconds is not None:
        pairs = [tuple(pair) for pair in expert_seconds]
        if len(pairs) != experts or any(len(pair) != 2 for pair in pairs):
            raise CourseInputError(
                f"expert_seconds needs one (forward, backward) pair per expert ({experts})"
            )
        for pair in pairs:
            for seconds in pair:
                validation.number(seconds, "expert_seconds", 0.0, 1e12)
        expert_seconds = [(float(f), float(b)) for f, b in pairs]
    computed = [sum(routed[s][e] for s in range(workers)) for e in range(experts)]
    assignments = [sum(row) for row in routed]  # what each worker sends and gets back
    if tokens_per_worker is None:
        routed_tokens = [a / top_k for a in assignments]
    else:
        if len(tokens_per_worker) != workers:
            raise CourseInputError(f"tokens_per_worker needs one count per worker ({workers})")
        for t in tokens_per_worker:
            validation.integer(t, "tokens_per_worker", 0, MAX_TOKENS)
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

    def expert_cost(e: int, direction: int, per_token: float) -> float:
        if expert_seconds is None:
            return per_token * computed[e]
        return expert_seconds[e][direction]

    def same(label: str) -> list[str]:
        return [label] * workers

    a2a = [costs.latency + costs.per_byte * b for b in traffic]
    compute("F", [costs.router * t for t in routed_tokens], same("router"))
    collective("ALL_TO_ALL", "dispatch", [c + costs.latency for c in a2a])  # counts, tokens
    local = [[w * per + i for w in range(workers)] for i in range(per)]  # [i][w]: an expert
    for ids in local:
        cost = [expert_cost(e, 0, costs.expert_forward) for e in ids]
        compute("F", cost, [f"expert {e}" for e in ids], ids)
    collective("ALL_TO_ALL", "combine", a2a)
    compute("F", [costs.combine * a for a in assignments], same("weighted sum"))
    compute("B", [costs.combine_backward * a for a in assignments], same("weighted sum"))
    collective("ALL_TO_ALL", "combine grad", a2a)
    for ids in local:
        cost = [expert_cost(e, 1, costs.expert_backward) for e in ids]
        compute("B", cost, [f"expert {e}" for e in ids], ids)
    collective("ALL_TO_ALL", "dispatch grad", a2a)
    compute("B", [costs.router_backward * t for t in routed_tokens], same("router"))
    steps = 2 * (workers - 1)
    ring = steps / workers * replicated_bytes * costs.per_byte + steps * costs.latency
    collective("REDUCE_GRAD", "all-reduce", [ring] * workers)
    return Timeline(
        events,
        workers,
        name=f"expert parallel: E={experts} experts on p={workers} workers",
        source="simulated",
        unit=unit,
        meta={"received_per_expert": computed, "routed": routed},
    )


def fit_costs(measured: MoEStep, links: Links | None = None) -> MoECosts:
    """Per-token costs (seconds) read off a measured step, for `simulate_moe(..., costs)`.

    Each compute cost is total time over total tokens of that phase on all workers. With
    `links` (a run on the virtual clock) an exchange costs what the emulated links charge:
    a worker's N-1 messages leave one after the other through its port, each paying the
    latency, so latency = (N-1) x the link's and per_byte = 1 / the slowest link's
    bandwidth. Without links (the wall clock) an all-to-all's measured time includes
    waiting for the slowest worker, so the latency is taken from the quickest exchange
    seen (the last worker to arrive hardly waits), and per_byte is 0: on threads a message
    is a memory copy.
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
    latency, per_byte = min(exchanges, default=0.0), 0.0
    if links is not None:
        workers = timeline.num_devices
        latency = (workers - 1) * links.latency
        per_byte = 1.0 / links.ring_bandwidth(workers)
    return MoECosts(
        router=per(total("F", "router"), tokens),
        router_backward=per(total("B", "router"), tokens),
        expert_forward=per(total("F", experts=True), computed),
        expert_backward=per(total("B", experts=True), computed),
        combine=per(total("F", "weighted sum"), assignments),
        combine_backward=per(total("B", "weighted sum"), assignments),
        latency=latency,
        per_byte=per_byte,
    )


def measured_expert_seconds(measured: MoEStep) -> list[tuple[float, float]]:
    """Each expert's measured (forward, backward) seconds in a step, for `simulate_moe`."""
    timeline = measured.timeline
    if timeline is None or timeline.source != "measured":
        raise CourseInputError(
            "measured must be the MoEStep of ExpertParallel.step (with a timeline)"
        )
    seconds = [[0.0, 0.0] for _ in measured.kept_per_expert]
    for event in timeline.events:
        e = event.action.microbatch
        if e is not None and event.action.kind in ("F", "B"):
            seconds[e][event.action.kind == "B"] += event.duration
    return [(f, b) for f, b in seconds]


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
