"""ZeRO on paper: bytes sent and held per worker, and a simulator of one step's timeline.

`simulate_fsdp` runs `program.fsdp_program` with per-layer compute times and collective
times from bytes / bandwidth; `costs_from_timeline` reads those costs off a measured run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from course_utils import plan, validation
from course_utils.actions import Action
from course_utils.errors import CourseInputError
from course_utils.parallel.fsdp.program import STAGES, check_one_of, fsdp_program
from course_utils.parallel.fsdp.shards import padded_shard_numels
from course_utils.threads.links import Links
from course_utils.threads.ring import ring_bytes_per_rank
from course_utils.timeline import Event, Timeline

# -- formulas: traffic and memory per worker ---------------------------------------------------


def fsdp_traffic_bytes(
    layer_numels: Sequence[int],
    workers: int,
    stage: int,
    microbatches: int = 1,
    element_size: int = 4,
) -> dict[str, int]:
    """Bytes every worker sends in one step (ring collectives on padded shards).

    One ring all-gather or reduce-scatter of a layer sends (N-1) x shard bytes per worker,
    shard = ceil(numel / N) elements. ZeRO (arXiv 1910.02054, Section 7): stages 1 and 2
    reduce-scatter the gradients and all-gather the updated parameters, 2 Psi in all, the
    same as the all-reduce of plain data parallelism; stage 3 all-gathers the parameters
    twice (forward and backward) and reduce-scatters once: 3 Psi, 1.5x. With m
    micro-batches, stage 3 repeats all three per micro-batch and stage 2 its
    reduce-scatter; stage 1 (full gradients kept) and plain data parallelism accumulate
    locally and communicate once.
    """
    check_one_of(stage, "stage", STAGES)
    validation.integer(workers, "workers", 1, 10**6)
    validation.integer(microbatches, "microbatches", 1, 10**6)
    per_pass = sum(
        (workers - 1) * s * element_size for s in padded_shard_numels(layer_numels, workers)
    )
    gathers = {1: 1, 2: 1, 3: 2 * microbatches}[stage]
    reduce_scatters = {1: 1, 2: microbatches, 3: microbatches}[stage]
    return {
        "all_gather": gathers * per_pass,
        "reduce_scatter": reduce_scatters * per_pass,
        "total": (gathers + reduce_scatters) * per_pass,
    }


def dp_traffic_bytes(layer_numels: Sequence[int], workers: int, element_size: int = 4) -> list[int]:
    """Bytes each worker sends per step in plain data parallelism: one ring all-reduce of
    all gradients (`course_utils.parallel.data_parallel`), 2 (N-1)/N x Psi x element_size."""
    return ring_bytes_per_rank(sum(layer_numels), workers, element_size)


def precision_for(element_size: int) -> plan.Precision:
    """The planner's byte counts for Adam at this width: fp32 is 4 + 4 + 8, fp64 8 + 8 + 16."""
    validation.integer(element_size, "element_size", 1, 16)
    if element_size == 4:
        return plan.get_precision("fp32")
    return plan.Precision(
        "fp64", element_size, element_size, 2 * element_size, element_size, "fp32"
    )


def zero_memory_bytes(
    layer_numels: Sequence[int],
    workers: int,
    stage: int,
    element_size: int = 4,
    padded: bool = False,
) -> dict[str, float]:
    """`plan.model_state_bytes` for these layers: parameters, gradients, Adam state per worker.

    With `padded=True` every layer counts its zero padding too (numel rounded up to a
    multiple of N), which is what the threads really hold.
    """
    numels = layer_numels
    if padded:
        numels = [s * workers for s in padded_shard_numels(layer_numels, workers)]
    return plan.model_state_bytes(sum(numels), precision_for(element_size), zero=stage, dp=workers)


def gathered_bytes_bound(
    layer_numels: Sequence[int], workers: int, prefetch: int, element_size: int = 4
) -> int:
    """Most bytes of gathered layers a stage-3 worker can hold at once: the k + 1 largest
    padded layers (the one computing plus k prefetched). The price of prefetching."""
    sizes = sorted(
        (s * workers * element_size for s in padded_shard_numels(layer_numels, workers)),
        reverse=True,
    )
    return sum(sizes[: prefetch + 1])


# -- FSDP in practice: when gathers hide, hybrid sharding, resharding -----------------------------


def _positive_number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise CourseInputError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def gather_hiding_tokens(
    flops_per_s: float,
    bandwidth: float,
    element_size: int = 2,
    workers: int = 8,
    reduce_element_size: int | None = None,
) -> float:
    """Fewest tokens per GPU (per micro-batch) at which a layer's collectives hide behind its
    compute, with prefetching: T >= (N-1)/N x F max(e, (e + e_r) / 2) / (2 B).

    A layer of Psi parameters computes 2 Psi FLOPs per token forward and 4 Psi backward
    (Kaplan et al. 2020, arXiv 2001.08361): 2 Psi T / F seconds forward on T tokens at F
    FLOP/s. Its ring all-gather moves (N-1)/N Psi e bytes over a link of B bytes/s. The
    backward has twice the compute and sends a gather and a reduce-scatter: twice the
    traffic when the reduce-scatter's element size e_r (`reduce_element_size`, default e)
    is the gather's, and then the same T hides both. Psi cancels: what matters is tokens per
    GPU against the GPU's FLOP rate over its link's bandwidth (the condition lesson 09 gives
    the ring). With bf16 gathers and fp32 reductions (FSDP2's MixedPrecisionPolicy(
    param_dtype=bfloat16, reduce_dtype=float32)) the backward sends 2 + 4 = 6 bytes per
    parameter against the forward's 2: three times, for twice the compute, so it needs 1.5
    times the forward's tokens.
    """
    f = _positive_number(flops_per_s, "flops_per_s")
    b = _positive_number(bandwidth, "bandwidth")
    validation.integer(element_size, "element_size", 1, 64)
    validation.integer(workers, "workers", 1, 10**6)
    e_r = element_size if reduce_element_size is None else reduce_element_size
    validation.integer(e_r, "reduce_element_size", 1, 64)
    # forward: 2 Psi T / F >= (N-1)/N Psi e / B; backward: 4 Psi T / F >= (N-1)/N Psi (e + e_r) / B
    per_token = max(element_size, (element_size + e_r) / 2)
    return (workers - 1) / workers * f * per_token / (2 * b)


def hsdp_bytes(params: float, shard: int, replicas: int, element_size: int = 2) -> dict[str, float]:
    """Hybrid sharding (HSDP; FSDP2's 2D mesh, FSDP1's HYBRID_SHARD) on shard x replicas GPUs:
    model states sharded over the `shard` GPUs of a group (a node), the group replicated.

    Per GPU and step (one micro-batch, `element_size` bytes per parameter on the wire):
    `states` = 16 Psi / shard bytes (Adam, 16 bytes per parameter); `inside` = the ZeRO-3
    gathers and reduce-scatter within the group, 3 (S-1)/S Psi e; `across` = the ring
    all-reduce of this GPU's gradient shard over the replicas, 2 (R-1)/R (Psi / S) e. Full
    sharding over all N = S R GPUs (shard=N, replicas=1) puts all its 3 (N-1)/N Psi e on
    the ring that spans the nodes.
    """
    psi = _positive_number(params, "params")
    validation.integer(shard, "shard", 1, 10**6)
    validation.integer(replicas, "replicas", 1, 10**6)
    validation.integer(element_size, "element_size", 1, 64)
    return {
        "states": 16 * psi / shard,
        "inside": 3 * (shard - 1) / shard * psi * element_size,
        "across": 2 * (replicas - 1) / replicas * psi / shard * element_size,
    }


def reshard_after_forward_costs(
    layer_numels: Sequence[int], workers: int, reshard: bool | int = True, element_size: int = 2
) -> dict[str, float]:
    """What FSDP2's `reshard_after_forward` trades, per GPU and micro-batch:

    - True (the default for inner modules): free each layer after its forward and gather it
      again for the backward: `gathered` (held between forward and backward) 0 bytes, `sent`
      3 (N-1)/N Psi e (two gathers and a reduce-scatter);
    - False: keep every layer gathered from its forward until its backward: no second
      gather, 2 (N-1)/N Psi e sent, but all layers whole at the turn of the step, Psi e held;
    - an int g (a divisor of N, e.g. the GPUs of a node): keep a 1/g shard after the forward,
      so the backward gathers over g GPUs only: Psi e / g held, and the backward's gather
      sends (g-1)/g Psi e, on the fast links of the group.
    """
    validation.integer(workers, "workers", 1, 10**6)
    validation.integer(element_size, "element_size", 1, 64)
    psi = float(sum(layer_numels))
    ring = (workers - 1) / workers * psi * element_size
    if reshard is True:
        return {"gathered": 0.0, "sent": 3 * ring}
    if reshard is False:
        return {"gathered": psi * element_size, "sent": 2 * ring}
    if (
        isinstance(reshard, bool)
        or not isinstance(reshard, int)
        or reshard < 2
        or workers % reshard
    ):
        raise CourseInputError(
            f"reshard must be True, False or a divisor of workers ({workers}) > 1, got {reshard!r}"
        )
    group = (reshard - 1) / reshard * psi * element_size
    return {"gathered": psi * element_size / reshard, "sent": 2 * ring + group}


# -- the simulator ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FSDPCosts:
    """Seconds per layer per micro-batch shard (`forward[l]`, `backward[l]`), and the link.

    A ring collective of a layer takes (N-1) x (shard bytes / bandwidth + latency):
    N-1 steps, each moving one shard over one link. Gathers move `element_size` bytes per
    parameter, reduce-scatters `reduce_element_size` (None: the same), e.g. bf16 gathers and
    fp32 reductions.
    """

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    layer_numels: tuple[int, ...]
    bandwidth: float  # bytes per second per link
    latency: float = 0.0  # seconds per ring step
    element_size: int = 4
    optimizer: float = 0.0
    reduce_element_size: int | None = None

    def __post_init__(self) -> None:
        n = len(self.layer_numels)
        if n < 1 or len(self.forward) != n or len(self.backward) != n:
            raise CourseInputError("forward, backward and layer_numels need one entry per layer")
        values = [*self.forward, *self.backward, self.latency, self.optimizer]
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise CourseInputError("compute times and latency must be finite and >= 0 seconds")
        if not self.bandwidth > 0:
            raise CourseInputError(f"bandwidth must be > 0 bytes/s, got {self.bandwidth!r}")

    def collective_time(self, layer: int, workers: int, kind: str = "UNSHARD") -> float:
        """Seconds of one ring collective of `layer`: a gather ("UNSHARD") or, with kind
        "REDUCE_GRAD", a reduce-scatter (or all-reduce step) at `reduce_element_size`."""
        shard = padded_shard_numels([self.layer_numels[layer]], workers)[0]
        size = self.element_size
        if kind == "REDUCE_GRAD" and self.reduce_element_size is not None:
            size = self.reduce_element_size
        return (workers - 1) * (shard * size / self.bandwidth + self.latency)


def simulate_fsdp(
    costs: FSDPCosts, workers: int, stage: int = 3, prefetch: int = 1, microbatches: int = 1
) -> Timeline:
    """Predict one step's timeline: the workers' program on a compute and a comm stream.

    The compute stream runs F, B and the optimizer; a "wait" holds it until the collective
    is done. The communication stream runs collectives one at a time in issue order, each
    starting when it is issued or when the previous one ends, whichever is later. All
    workers are alike, so every row of the timeline is the same.
    """
    validation.integer(workers, "workers", 1, 10**6)
    program, comms = fsdp_program(len(costs.layer_numels), stage, prefetch, microbatches)
    clock, comm_free = 0.0, 0.0
    done_at: dict[int, float] = {}
    events: list[tuple[Action, float, float, str | None]] = []
    for instr in program:
        # issue/wait name a collective, F/B/free a layer (fsdp_program builds them so)
        layer, mb, c = instr.layer or 0, instr.microbatch, instr.comm or 0
        if instr.op == "issue":
            op = comms[c]
            start = max(clock, comm_free)
            comm_free = done_at[c] = start + costs.collective_time(op.layer, workers, op.kind)
            events.append((Action(op.layer, op.kind, op.microbatch), start, comm_free, op.label))
        elif instr.op == "wait":
            clock = max(clock, done_at[c])
        elif instr.op in ("F", "B"):
            cost = (costs.forward if instr.op == "F" else costs.backward)[layer]
            events.append((Action(layer, instr.op, mb), clock, clock + cost, f"L{layer}"))
            clock += cost
        elif instr.op == "free":
            events.append((Action(layer, "RESHARD", mb), clock, clock, f"free L{layer}"))
        else:
            clock += costs.optimizer
    return Timeline(
        [Event(d, a, s, e, label) for d in range(workers) for a, s, e, label in events],
        workers,
        name=f"ZeRO-{stage}, {workers} workers, prefetch {prefetch}",
        source="simulated",
        unit="s",
        meta={"microbatches": microbatches, "chunks": 1, "stage": stage},
    )


def costs_from_timeline(
    timeline: Timeline,
    layer_numels: Sequence[int],
    workers: int,
    element_size: int = 4,
    links: Links | None = None,
) -> FSDPCosts:
    """Per-layer compute times read off a measured timeline, and the link they crossed.

    Forward and backward costs are the mean duration of each layer's F and B events. With
    `links` (a run on the virtual clock) the collectives cross the ring's slowest link with
    its latency per step; without, the bandwidth is the collectives' bytes per worker divided
    by their time (which includes waiting for the slowest peer, so it is an effective
    bandwidth, not the link's).
    """
    n = len(layer_numels)
    durations: dict[tuple[str, int], list[float]] = {}
    comm_bytes, comm_time = 0.0, 0.0
    shards = padded_shard_numels(layer_numels, workers)
    for e in timeline.events:
        kind, layer = e.action.kind, e.action.stage
        if kind in ("F", "B"):
            durations.setdefault((kind, layer), []).append(e.duration)
        elif kind in ("UNSHARD", "REDUCE_GRAD"):
            comm_bytes += (workers - 1) * shards[layer] * element_size
            comm_time += e.duration

    def mean(kind: str, layer: int) -> float:
        values = durations.get((kind, layer), [])
        return sum(values) / len(values) if values else 0.0

    bandwidth = comm_bytes / comm_time if comm_bytes > 0 and comm_time > 0 else float("inf")
    latency = 0.0
    if links is not None:
        bandwidth, latency = links.ring_bandwidth(workers), links.latency
    return FSDPCosts(
        forward=tuple(mean("F", i) for i in range(n)),
        backward=tuple(mean("B", i) for i in range(n)),
        layer_numels=tuple(layer_numels),
        bandwidth=bandwidth,
        latency=latency,
        element_size=element_size,
    )
