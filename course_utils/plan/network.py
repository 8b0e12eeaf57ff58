"""Communication of one layout: the bytes each GPU sends per step for every kind of
parallelism (one direction, links being full duplex) and the collectives data parallelism
runs for each ZeRO stage (see `plan.model` for the sources)."""

from dataclasses import dataclass

from course_utils import validation
from course_utils.pipeline.schedules import SCHEDULES as REGISTRY
from course_utils.plan.gpu_memory import weight_shard_groups
from course_utils.plan.inputs import (
    Config,
    ModelShape,
    Precision,
    check_config,
    get_precision,
)

# --------------------------------------------------------------------------- communication


@dataclass(frozen=True)
class Traffic:
    """What one kind of parallelism makes each GPU send in one optimizer step."""

    bytes: float  # sent by each GPU (one direction; it receives about as much meanwhile)
    messages: float  # messages each GPU sends (each pays the link's latency)
    span: int  # consecutive GPUs the group spans: its slowest link sets the bandwidth


@dataclass(frozen=True)
class Collective:
    """One data-parallel collective of a step, and what compute it may hide behind."""

    what: str
    bytes: float  # sent by each GPU, all repetitions of the step together
    messages: float
    span: int
    overlaps: str  # "last backward", "backward", "compute" or "none"
    pieces: int  # how many parts it comes in (buckets, layers): the last one cannot hide


def data_parallel_collectives(
    model: ModelShape, config: Config, precision: str | Precision = "bf16-mixed"
) -> list[Collective]:
    """The data-parallel collectives of one step, with gradient accumulation over m.

    For a group of N GPUs holding the same Psi parameters (dense weights over dp x cp,
    experts over dp x cp / ep), a ring all-gather or reduce-scatter sends (N-1)/N x Psi x
    bytes per GPU, an all-reduce twice that (`parallel.fsdp.fsdp_traffic_bytes`):
      ZeRO-0  all-reduce the gradients once per step (accumulated over the m micro-batches);
      ZeRO-1  reduce-scatter them once, all-gather the updated weights after the optimizer;
      ZeRO-2  reduce-scatter after every micro-batch (the full gradient is freed), then the
              weights' all-gather once;
      ZeRO-3  (= FSDP) per micro-batch: all-gather every layer for the forward and again for
              the backward, reduce-scatter its gradient: 3 m (N-1)/N Psi (ZeRO paper,
              Section 7.2: 1.5x an all-reduce when m = 1).
    `overlaps` says what compute a collective can run behind: the all-reduce (or
    reduce-scatter) of the last micro-batch's gradients behind its backward, in buckets
    (lesson 06, PyTorch DDP); ZeRO-2's per micro-batch reduce-scatters behind every
    backward; ZeRO-3's gathers and reduce-scatters, prefetched, behind all compute.
    """
    validation.instance(model, "model", ModelShape)
    check_config(model, config)
    return _data_parallel_collectives(model, config, get_precision(precision))


def _data_parallel_collectives(
    model: ModelShape, config: Config, prec: Precision
) -> list[Collective]:
    w, g, m, z = prec.weight_bytes, prec.grad_bytes, config.microbatches, config.zero
    layers = model.layers // config.pp
    out = []
    for index, (psi, n) in enumerate(weight_shard_groups(model, config)):
        if n == 1:
            continue
        kind = "expert " if index else ""
        replicas = config.dp // (config.ep if index else 1)  # data-parallel part of the group
        span = config.gpus if replicas > 1 else config.tp * config.cp
        half = (n - 1) / n * psi  # elements one ring all-gather / reduce-scatter sends
        steps = n - 1
        if z == 0:
            out.append(
                Collective(
                    f"all-reduce {kind}gradients",
                    2 * half * g,
                    2 * steps,
                    span,
                    "last backward",
                    layers,
                )  # fmt: skip
            )
        elif z in (1, 2):
            times = 1 if z == 1 else m
            window = "last backward" if z == 1 else "backward"
            out.append(
                Collective(
                    f"reduce-scatter {kind}gradients",
                    times * half * g,
                    times * steps,
                    span,
                    window,
                    layers * times,
                )  # fmt: skip
            )
            out.append(Collective(f"all-gather {kind}weights", half * w, steps, span, "none", 1))
        else:
            per = m * layers
            out.append(
                Collective(
                    f"all-gather {kind}weights (forward and backward)",
                    2 * m * half * w,
                    2 * per * steps,
                    span,
                    "compute",
                    3 * per,
                )  # fmt: skip
            )
            out.append(
                Collective(
                    f"reduce-scatter {kind}gradients",
                    m * half * g,
                    per * steps,
                    span,
                    "compute",
                    3 * per,
                )  # fmt: skip
            )
    return out


def communication(
    model: ModelShape, config: Config, precision: str | Precision = "bf16-mixed"
) -> dict[str, Traffic]:
    """Per GPU per step: 'tensor', 'context', 'pipeline', 'expert' and 'data' traffic.

    Bytes are what each GPU sends (one direction), with X = b (s / cp) h e, the activations
    of one micro-batch at a layer boundary, and everything per layer per micro-batch, times
    the L / pp layers and m micro-batches of a stage:
    - tensor (Shoeybi et al. 2019, arXiv 1909.08053): 2 all-reduces of X forward and 2
      backward, each 2 (t-1)/t X in 2 (t-1) messages. With sequence parallelism
      (Korthikanti et al. 2022) each block does an all-gather and a reduce-scatter forward,
      and backward the same pair plus the all-gather again (the gathered input is not kept):
      10 (t-1)/t X instead of 8, as `parallel.sequence_parallel.sp_comm_bytes`. Full
      recomputation repeats the forward's;
    - context (ring attention, Liu et al. 2023, arXiv 2310.01889): the K/V block, 2 X / t
      times H_kv / H (the GPU's K/V heads: all its heads with multi-head attention, fewer with
      grouped-query attention, `ModelShape.kv_heads_per_gpu`), goes cp-1 steps around the
      ring forward, and backward cp-1 steps plus cp hops of the travelling dK/dV
      (`parallel.context_parallel.ring_bytes_per_worker` given the K/V heads). With
      cp_kind="ulysses" (Jacobs et al. 2023, arXiv 2309.14509) four all-to-alls forward
      (q, k, v, output) and four backward, each sending (cp-1)/cp of the GPU's tokens of that
      tensor, X / t for q and the output, X / t x H_kv / H for k and v
      (`parallel.context_parallel.ulysses_bytes_per_worker`); full recomputation repeats
      the forward's;
    - pipeline: each micro-batch's activations forward and gradients back once per chunk
      boundary (X / t with Megatron's scatter-gather across TP ranks);
    - expert (GShard, Lepikhin et al. 2020, arXiv 2006.16668): per MoE layer, the dispatch and
      combine all-to-alls forward and backward (4), each sending the top-k copies of this
      GPU's b s / (cp t) tokens that go to experts on other GPUs, (ep-1)/ep of them with
      even routing (`parallel.moe.all_to_all_bytes_per_worker`; dropless, as Megatron-Core's
      all-to-all dispatcher);
    - data: `data_parallel_collectives`.
    """
    validation.instance(model, "model", ModelShape)
    check_config(model, config)
    return _communication(model, config, get_precision(precision))


def _communication(model: ModelShape, config: Config, prec: Precision) -> dict[str, Traffic]:
    """`communication` of a model and a config already checked."""
    t, c, p, ep = config.tp, config.cp, config.pp, config.ep
    e, b, m = prec.activation_bytes, config.microbatch_size, config.microbatches
    full = config.recompute == "full"
    layer_steps = model.layers / p * m  # layer passes per step on this GPU
    x = b * model.seq / c * model.hidden * e
    ring = (t - 1) / t * x  # one all-gather or reduce-scatter of X
    if config.sequence_parallel:
        per_layer = 4 * ring + 6 * ring + (4 * ring if full else 0.0)
        msgs = (4 + 6 + (4 if full else 0)) * (t - 1)
        if full:  # the recomputed forward gathers the input again: no extra all-gather
            per_layer -= 2 * ring
            msgs -= 2 * (t - 1)
    else:
        per_layer = (6 if full else 4) * 2 * ring
        msgs = (6 if full else 4) * 2 * (t - 1)
    tensor = Traffic(layer_steps * per_layer, layer_steps * msgs, t)

    # this GPU's share of K and V against its share of q: its K/V heads over its query heads
    kv_share = model.kv_heads_per_gpu(t) * t / model.heads
    if config.cp_kind == "ulysses":
        a2a = (4 + 4 + (4 if full else 0)) if c > 1 else 0  # all-to-alls per layer
        # of every 4 (q, k, v, output; dO, dQ, dK, dV), 2 carry the query heads, 2 the K/V heads
        per_a2a = (c - 1) / c * x / t * (2 + 2 * kv_share) / 4
        context = Traffic(layer_steps * a2a * per_a2a, layer_steps * a2a * (c - 1), t * c)
    else:
        kv = 2 * x / t * kv_share  # this GPU's K/V block: its K/V heads of its tokens
        hops = (c - 1) + (2 * c - 1 if c > 1 else 0) + ((c - 1) if full else 0)
        context = Traffic(layer_steps * hops * kv, layer_steps * hops, t * c)

    chunks = REGISTRY[config.schedule].chunks(config.chunks)
    sends = 2 * m * chunks if p > 1 else 0
    pipeline = Traffic(sends * x / t, sends, t * c * p)

    expert = Traffic(0.0, 0.0, 1)
    if model.is_moe and ep > 1:
        tokens = b * model.seq / (c * t)
        per_a2a = tokens * model.top_k * model.hidden * e * (ep - 1) / ep
        a2a = 6 if full else 4
        expert = Traffic(layer_steps * a2a * per_a2a, layer_steps * a2a * (ep - 1), t * c * p * ep)

    dp = _data_parallel_collectives(model, config, prec)
    data = Traffic(
        sum(col.bytes for col in dp),
        sum(col.messages for col in dp),
        max((col.span for col in dp), default=1),
    )
    return {"tensor": tensor, "context": context, "pipeline": pipeline, "expert": expert,
            "data": data}  # fmt: skip


def traffic(
    model: ModelShape, config: Config, precision: str | Precision = "bf16-mixed"
) -> dict[str, float]:
    """Bytes each GPU sends per step, by kind of parallelism (one direction)."""
    return {kind: c.bytes for kind, c in communication(model, config, precision).items()}
