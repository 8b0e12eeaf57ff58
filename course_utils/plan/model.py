"""The planner's model: memory per GPU and time per step of one layout, with the papers.

Memory per GPU
- model states (weights, gradients, Adam states), sharded by ZeRO stage 0-3 (Rajbhandari et
  al. 2019, arXiv 1910.02054, SC 2020) over the GPUs that hold the same weights (data x
  context parallel; for experts, data x context / expert parallel), split by tensor and
  pipeline degrees, experts also by the expert degree (`parallel.fsdp.zero_memory_bytes`);
- activations per transformer layer (Korthikanti et al. 2022, arXiv 2205.05198, term by term
  as `parallel.sequence_parallel.korthikanti_mlp_block_bytes`), each sequence cut into cp
  pieces by context parallelism, times the layers a pipeline stage holds and the
  micro-batches it keeps in flight for its schedule (the registry's closed forms, or the
  simulator);
- buffers the layers need only for a while: ZeRO-3's gathered layers (`parallel.fsdp.
  gathered_bytes_bound`), the logits of the last stage, ring attention's K/V block and
  block of scores (`parallel.context_parallel.attention_activation_bytes`);
- and a reserve the formulas do not see (CUDA context, NCCL buffers, fragmentation):
  `Hardware.reserve`. A plan fits when the parts add up to at most the usable memory.

Time per step
- compute = the FLOPs executed (6 x active parameters x tokens, plus attention and any
  recomputation; Kaplan et al. 2020, arXiv 2001.08361; Narayanan et al. 2021, arXiv
  2104.04473) at `Hardware.efficiency` of peak (the hardware FLOP utilisation);
- the schedule's pipeline bubble;
- communication: bytes each GPU sends (one direction: links are full duplex) over the
  slowest link of its group, plus a latency per message, for tensor parallelism (Shoeybi
  et al. 2019; with sequence parallelism as `parallel.sequence_parallel.sp_comm_bytes`),
  context parallelism (ring attention, `parallel.context_parallel.ring_bytes_per_worker`),
  pipeline sends, expert parallelism's all-to-alls (`parallel.moe.
  all_to_all_bytes_per_worker`) and data parallelism with each ZeRO stage's collectives,
  repeated per micro-batch where the stage needs it (`parallel.fsdp.fsdp_traffic_bytes`).
  Data-parallel traffic can overlap with compute (`Config.dp_overlap`, lesson 06's buckets);
  everything else is counted as exposed.

Placement follows Megatron-LM: TP innermost, then CP, PP, DP outermost. Those `parallel`
modules run on threads and import torch; the planner restates their formulas without it,
and tests/test_plan.py checks every restated formula against its source.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from course_utils.errors import CourseInputError
from course_utils.parallel.costs import ring_allreduce_time
from course_utils.pipeline.schedules import SCHEDULES as REGISTRY
from course_utils.pipeline.schedules import Case, make_schedule
from course_utils.pipeline.simulate import CostModel, simulate
from course_utils.plan.inputs import (
    GIB,
    RECOMPUTE,
    SCHEDULES,
    ZERO_STAGES,
    Config,
    Hardware,
    ModelShape,
    Precision,
    _positive_int,
    check_config,
    get_precision,
)

__all__ = ["ring_allreduce_time"]  # re-exported: lesson 12 computes with plan.ring_allreduce_time

# --------------------------------------------------------------------------- model states


def model_state_bytes(
    params: float,
    precision: str | Precision = "bf16-mixed",
    zero: int = 0,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
) -> dict[str, float]:
    """Bytes per GPU of parameters, gradients and optimizer states.

    ZeRO (Rajbhandari et al. 2019, arXiv 1910.02054, Section 5 and Figure 1), with
    Psi = params / (tp * pp) parameters on this GPU's model-parallel shard and Nd = dp:
      stage 0: (2 + 2 + K) Psi        stage 1 (P_os):     (2 + 2) Psi + K Psi / Nd
      stage 2 (P_os+g): 2 Psi + (2 + K) Psi / Nd        stage 3 (P_os+g+p): (2 + 2 + K) Psi / Nd
    (written for mixed precision, K = 12; fp32 uses 4 + 4 + 8).
    """
    prec = get_precision(precision)
    if zero not in ZERO_STAGES:
        raise CourseInputError(f"zero must be 0, 1, 2 or 3, got {zero!r}")
    for value, what in ((dp, "dp"), (tp, "tp"), (pp, "pp")):
        _positive_int(value, what)
    psi = params / (tp * pp)
    return {
        "parameters": prec.weight_bytes * psi / (dp if zero >= 3 else 1),
        "gradients": prec.grad_bytes * psi / (dp if zero >= 2 else 1),
        "optimizer": prec.optimizer_bytes * psi / (dp if zero >= 1 else 1),
    }


def _shard_groups(model: ModelShape, config: Config) -> list[tuple[float, int]]:
    """(parameters on this GPU before ZeRO, GPUs sharing them) for each kind of weight.

    Dense weights (everything but the experts) are split by tp and pp and replicated over
    the dp x cp GPUs (Megatron-Core reduces gradients over data and context parallel ranks
    together). Experts are also split by ep, so dp x cp / ep GPUs hold the same ones.
    """
    t, p = config.tp, config.pp
    groups = [(model.dense_params / (t * p), config.dp * config.cp)]
    if model.expert_params:
        groups.append(
            (model.expert_params / (t * p * config.ep), config.dp * config.cp // config.ep)
        )
    return groups


def model_states(
    model: ModelShape, config: Config, precision: str | Precision = "bf16-mixed"
) -> dict[str, float]:
    """`model_state_bytes` for a shaped model: dense and expert weights, each over its group."""
    out = {"parameters": 0.0, "gradients": 0.0, "optimizer": 0.0}
    for psi, group in _shard_groups(model, config):
        for key, value in model_state_bytes(psi, precision, config.zero, group).items():
            out[key] += value
    return out


# --------------------------------------------------------------------------- activations


def activation_terms(
    seq: int,
    microbatch_size: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    bytes_per_value: int = 2,
    *,
    cp: int = 1,
    ffn_hidden: int | None = None,
    moe_factor: float = 1.0,
) -> dict[str, float]:
    """Bytes one transformer layer keeps for the backward pass, one micro-batch, term by term.

    Korthikanti et al. 2022 (arXiv 2205.05198, Section 4.1), e bytes per value and 1-byte
    dropout masks, s = seq / cp tokens on this GPU, b = micro-batch size, h = hidden, f = the
    MLP's hidden size (4 h), a = heads, t = tp, and "/sp" meaning / t with sequence
    parallelism. Attention: its LayerNorm's input and the QKV input (e sbh/sp each), Q, K, V
    and the output projection's input (4 e sbh / t), the softmax output, its dropout mask
    and dropout output ((2e + 1) a s^2 b / t), the dropout mask after it (sbh/sp). MLP: its
    LayerNorm's input and first linear's input (e sbh/sp each), the GeLU's and second
    linear's inputs (e sbf/t each), the dropout mask (sbh/sp). At e = 2 and f = 4h that is
    Korthikanti's s b h (34 + 5 a s / h) (sequence parallelism: / t).

    Selective recomputation drops the attention scores (recomputed in the backward); so
    does context parallelism (cp > 1): ring attention keeps the output and log-sum-exp and
    rebuilds each block's probabilities in the backward. Full recomputation keeps only the
    layer's input. A mixture-of-experts MLP keeps its expert terms (input, GeLU, second
    linear) `moe_factor` times: top-k copies of each token, up to the capacity factor.
    """
    if recompute not in RECOMPUTE:
        raise CourseInputError(
            f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}"
        )
    s, b, h, a, t, e = seq / cp, microbatch_size, hidden, heads, tp, bytes_per_value
    f = ffn_hidden or 4 * h
    sp = t if sequence_parallel else 1
    sbh = s * b * h
    if recompute == "full":
        return {"layer input": e * sbh / sp}
    scores = 0.0 if recompute == "selective" or cp > 1 else (2 * e + 1) * a * s * s * b / t
    return {
        "attention layernorm input": e * sbh / sp,
        "qkv input": e * sbh / sp,
        "q, k, v": 3 * e * sbh / t,
        "attention scores": scores,
        "projection input": e * sbh / t,
        "attention dropout mask": sbh / sp,
        "mlp layernorm input": e * sbh / sp,
        "mlp input": moe_factor * e * sbh / sp,
        "gelu input": moe_factor * e * s * b * f / t,
        "second linear input": moe_factor * e * s * b * f / t,
        "mlp dropout mask": sbh / sp,
    }


def activation_bytes_per_layer(
    seq: int,
    microbatch_size: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    bytes_per_value: int = 2,
    *,
    cp: int = 1,
    ffn_hidden: int | None = None,
    moe_factor: float = 1.0,
) -> float:
    """Bytes one transformer layer keeps for the backward pass, for one micro-batch.

    The sum of `activation_terms`. With 16-bit values, s = seq, b = micro-batch size,
    h = hidden, a = heads, t = tp (Korthikanti et al. 2022, Table 2):
      no parallelism              s b h (34 + 5 a s / h)
      tensor parallel             s b h (10 + 24 / t + 5 a s / (h t))
      tensor + sequence parallel  s b h / t (34 + 5 a s / h)
      selective recomputation     drops the 5 a s / h term (attention scores are recomputed)
      full recomputation          2 s b h (only the layer input; / t with sequence parallel)
    Context parallelism divides every s b h term by cp and drops the scores term.
    """
    return sum(
        activation_terms(
            seq, microbatch_size, hidden, heads, tp, sequence_parallel, recompute,
            bytes_per_value, cp=cp, ffn_hidden=ffn_hidden, moe_factor=moe_factor,
        ).values()
    )  # fmt: skip


def ring_attention_bytes(
    seq: int, cp: int, heads: int, head_dim: int, bytes_per_value: int = 2, batch: int = 1
) -> float:
    """Peak bytes of one attention layer on one GPU of a context-parallel ring.

    With t = seq / cp tokens, H heads of size D: q, k, v and the output (4 t H D, kept for
    the backward), the log-sum-exp (t H), the next K/V block arriving (2 t H D) and one block
    of scores and probabilities (2 t^2 H): e b H (6 t D + t + 2 t^2), the formula of
    `parallel.context_parallel.attention_activation_bytes`. The first part is already in
    `activation_terms`; `buffers` adds the rest.
    """
    t = -(-seq // cp)
    return bytes_per_value * batch * heads * (6 * t * head_dim + t + 2 * t * t)


# --------------------------------------------------------------------------- pipelines


@functools.lru_cache(maxsize=4096)
def _simulated(schedule: str, pp: int, m: int, v: int) -> tuple[float, float]:
    """(bubble fraction, peak in-flight micro-batches on the busiest device), simulated."""
    timeline = simulate(make_schedule(schedule, pp, m, v), CostModel())
    chunks = REGISTRY[schedule].chunks(v)
    peak = max(timeline.peak_activations or [0]) / chunks  # chunks -> whole-stage micro-batches
    return timeline.bubble_fraction, peak


# Above this many compute actions per device the registry's closed forms are used where they
# hold (tests/test_registry.py proves them equal to the simulator there), which keeps a
# 64-GPU search well under 2 s; elsewhere, and for small schedules, the simulator decides.
SIMULATE_LIMIT = 512


@functools.lru_cache(maxsize=16384)
def _pipeline_figure(which: str, schedule: str, pp: int, m: int, v: int) -> float:
    if schedule not in SCHEDULES:
        raise CourseInputError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    closed = getattr(REGISTRY[schedule], which)(Case(pp, m, v))  # uniform stages, F=1, B=2
    if closed is not None and 3 * m * v > SIMULATE_LIMIT:
        return closed
    bubble, peak = _simulated(schedule, pp, m, v)
    return bubble if which == "bubble" else peak


def pipeline_bubble(schedule: str, pp: int, microbatches: int, chunks: int = 1) -> float:
    """Fraction of a step a pipeline device sits idle, for uniform stages (F = 1, B = 2)."""
    if pp == 1:
        return 0.0
    return _pipeline_figure("bubble", schedule, pp, microbatches, chunks)


def inflight_microbatches(schedule: str, pp: int, microbatches: int, chunks: int = 1) -> float:
    """How many micro-batches of activations the busiest stage holds at once.

    Counted in whole-stage micro-batches (a chunk of a looping schedule counts 1 / chunks).
    With pp = 1 there is no pipeline: plain gradient accumulation holds one micro-batch.
    """
    if pp == 1:
        if schedule not in SCHEDULES:
            raise CourseInputError(
                f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}"
            )
        return 1.0
    return _pipeline_figure("peak", schedule, pp, microbatches, chunks)


# --------------------------------------------------------------------------- memory per GPU

MEMORY_KEYS = ("parameters", "gradients", "optimizer", "activations", "buffers")


def _moe_factor(model: ModelShape) -> float:
    return model.top_k * model.capacity_factor if model.is_moe else 1.0


def buffers(
    model: ModelShape, config: Config, precision: str | Precision = "bf16-mixed"
) -> dict[str, float]:
    """Bytes per GPU of what the layers hold only for a while, by kind (0 when not used).

    - "gathered layers" (ZeRO-3): the layer computing and the next one prefetched, both
      unsharded (`parallel.fsdp.gathered_bytes_bound` with prefetch 1), and one layer's full
      gradient before its reduce-scatter;
    - "logits": the last stage's b x s x V output in the activation precision, plus the fp32
      copy the loss is computed in (Megatron-LM's vocab-parallel cross entropy), / tp;
    - "attention in flight": the scores one layer builds while it computes attention. Without
      context parallelism, selective recomputation rebuilds the layer's whole s x s scores
      in the backward (Korthikanti's (2e + 1) a s^2 b / t term, for one layer at a time).
      With cp > 1 the ring holds one K/V block arriving, one block of scores (t x t for
      t = s / cp tokens: cp^2 times smaller) and the log-sum-exp: `ring_attention_bytes`
      less the q, k, v and output `activation_terms` already counts (the course's ring
      attention builds each block's scores; a tiled flash-style kernel would keep one tile);
    - "recomputed layer" (full recomputation): one layer's activations, rebuilt from its
      input for its backward.
    The logits live on the last pipeline stage and the activations peak on the first; the
    planner adds them anyway (a safe side for a plan).
    """
    prec = get_precision(precision)
    t, e, b = config.tp, prec.activation_bytes, config.microbatch_size
    s = model.seq / config.cp
    out = {"gathered layers": 0.0, "logits": 0.0, "attention in flight": 0.0,
           "recomputed layer": 0.0}  # fmt: skip
    if config.zero == 3:
        layer = sum(psi for psi, _ in _shard_groups(model, config)) / (model.layers / config.pp)
        out["gathered layers"] = (2 * prec.weight_bytes + prec.grad_bytes) * layer
    out["logits"] = b * s * model.vocab * (e + 4) / t
    heads = model.heads // t
    if config.cp > 1:
        whole = ring_attention_bytes(model.seq, config.cp, heads, model.head_dim, e, b)
        kept = e * b * heads * 4 * s * model.head_dim  # q, k, v, output: in the activations
        out["attention in flight"] = whole - kept
    elif config.recompute == "selective":
        out["attention in flight"] = (2 * e + 1) * heads * s * s * b
    if config.recompute == "full":
        out["recomputed layer"] = activation_bytes_per_layer(
            model.seq, b, model.hidden, model.heads, t, config.sequence_parallel, "none", e,
            cp=config.cp, ffn_hidden=model.ffn, moe_factor=_moe_factor(model),
        )  # fmt: skip
    return out


def memory(
    model: ModelShape | int,
    config: Config = Config(),
    precision: str | Precision = "bf16-mixed",
) -> dict[str, float]:
    """Bytes per GPU: parameters, gradients, optimizer, activations, buffers, total.

    `model` may be a bare parameter count, in which case activations and buffers are not
    estimated (0). Activations are those of the busiest (first) pipeline stage: layers / pp
    layers, times the micro-batches its schedule keeps in flight. The reserve
    (`Hardware.reserve`) is not in the total: `evaluate` compares the total with the
    usable memory.
    """
    shape = model if isinstance(model, ModelShape) else None
    params = shape.params if shape else model
    if isinstance(params, bool) or not isinstance(params, int | float) or not params >= 1:
        raise CourseInputError(f"model must be a ModelShape or a parameter count, got {model!r}")
    check_config(shape, config)
    prec = get_precision(precision)
    if shape is None:
        out = model_state_bytes(params, prec, config.zero, config.dp, config.tp, config.pp)
        out.update(activations=0.0, buffers=0.0)
    else:
        out = model_states(shape, config, prec)
        per_layer = activation_bytes_per_layer(
            shape.seq, config.microbatch_size, shape.hidden, shape.heads, config.tp,
            config.sequence_parallel, config.recompute, prec.activation_bytes, cp=config.cp,
            ffn_hidden=shape.ffn, moe_factor=_moe_factor(shape),
        )  # fmt: skip
        inflight = inflight_microbatches(
            config.schedule, config.pp, config.microbatches, config.chunks
        )
        out["activations"] = per_layer * (shape.layers / config.pp) * inflight
        out["buffers"] = sum(buffers(shape, config, prec).values())
    out["total"] = sum(out[key] for key in MEMORY_KEYS)
    return out


# --------------------------------------------------------------------------- FLOPs


def _flops_per_token(model: ModelShape | int, recompute: str, cp: int = 1) -> tuple[float, float]:
    """(forward FLOPs per token, extra FLOPs per token that recomputation adds).

    With context parallelism the ring rebuilds each block's attention probabilities in the
    backward (it keeps no scores), so the attention core is recomputed even with "none".
    """
    if recompute not in RECOMPUTE:
        raise CourseInputError(
            f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}"
        )
    if isinstance(model, ModelShape):
        params: float = model.active_params
        attention = 4.0 * model.layers * model.hidden * model.seq  # forward only
    else:
        params, attention = model, 0.0
    forward = 2 * params + attention
    extra = {"none": attention if cp > 1 else 0.0, "selective": attention, "full": forward}
    return forward, extra[recompute]


def training_flops(
    model: ModelShape | int, tokens: float, recompute: str = "none", cp: int = 1
) -> float:
    """FLOPs executed in one training step over `tokens` tokens.

    6 N per token (2 forward + 4 backward per parameter; Kaplan et al. 2020, arXiv 2001.08361)
    plus attention scores and context, 12 L h s per token (Narayanan et al. 2021,
    arXiv 2104.04473, eq. 3). N is the parameters a token uses: all of a dense model, the
    dense part and top-k experts of a mixture of experts. Full recomputation repeats the
    forward (2 N + 4 L h s per token); selective recomputation only the attention core
    (4 L h s per token), as does context parallelism (cp > 1: ring attention rebuilds the
    probabilities in the backward). With recompute="none" and cp = 1 this is the model's own
    FLOPs, what MFU counts.
    """
    forward, extra = _flops_per_token(model, recompute, cp)
    return tokens * (3 * forward + extra)


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
    prec = get_precision(precision)
    w, g, m, z = prec.weight_bytes, prec.grad_bytes, config.microbatches, config.zero
    layers = model.layers // config.pp
    out = []
    for index, (psi, n) in enumerate(_shard_groups(model, config)):
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
    - context (ring attention, Liu et al. 2023, arXiv 2310.01889): the K/V block, 2 X / t,
      goes cp-1 steps around the ring forward, and backward cp-1 steps plus cp hops of the
      travelling dK/dV (`parallel.context_parallel.ring_bytes_per_worker`);
    - pipeline: each micro-batch's activations forward and gradients back once per chunk
      boundary (X / t with Megatron's scatter-gather across TP ranks);
    - expert (GShard, Lepikhin et al. 2020, arXiv 2006.16668): per MoE layer, the dispatch and
      combine all-to-alls forward and backward (4), each sending the top-k copies of this
      GPU's b s / (cp t) tokens that go to experts on other GPUs, (ep-1)/ep of them with
      even routing (`parallel.moe.all_to_all_bytes_per_worker`; dropless, as Megatron-Core's
      all-to-all dispatcher);
    - data: `data_parallel_collectives`.
    """
    check_config(model, config)
    prec = get_precision(precision)
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

    kv = 2 * x / t  # this GPU's K/V block: its heads of its tokens
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

    dp = data_parallel_collectives(model, config, prec)
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


# --------------------------------------------------------------------------- time per step

TIME_KEYS = ("compute", "bubble", "dp_comm", "tp_comm", "cp_comm", "pp_comm", "ep_comm")
_COMM_KEY = {"tensor": "tp_comm", "context": "cp_comm", "pipeline": "pp_comm",
             "expert": "ep_comm", "data": "dp_comm"}  # fmt: skip


def step_time(
    model: ModelShape,
    config: Config,
    precision: str | Precision = "bf16-mixed",
    hardware: Hardware = Hardware(),
) -> dict[str, float]:
    """Seconds per optimizer step: compute, bubble, dp_comm, tp_comm, cp_comm, pp_comm,
    ep_comm and total.

    Communication is `communication`'s bytes over the group's slowest link plus a latency
    per message, all exposed except data-parallel collectives when `config.dp_overlap`:
    those hide behind the compute `data_parallel_collectives` names, all but their last
    piece (a bucket or a layer) at least. The bubble is the schedule's idle fraction f
    applied to the per-device work W (compute and the per-micro-batch communication):
    idle = W f / (1 - f).
    """
    prec = get_precision(precision)
    return _step_time(model, config, prec, hardware, communication(model, config, prec))


def _step_time(
    model: ModelShape,
    config: Config,
    prec: Precision,
    hardware: Hardware,
    comm: dict[str, Traffic],
) -> dict[str, float]:
    lat = hardware.latency_us * 1e-6

    def seconds(bytes_: float, messages: float, span: int) -> float:
        return bytes_ / hardware.bandwidth(span) + messages * lat if bytes_ else 0.0

    tokens = config.global_batch * model.seq
    forward, extra = _flops_per_token(model, config.recompute, config.cp)
    compute = tokens * (3 * forward + extra) / config.gpus
    compute /= hardware.peak_flops(prec) * hardware.efficiency
    parts = {"compute": compute}
    for kind, key in _COMM_KEY.items():
        c = comm[kind]
        parts[key] = seconds(c.bytes, c.messages, c.span)
    if config.dp_overlap:
        backward = compute * (2 * forward + extra) / (3 * forward + extra)
        window = {"last backward": backward / config.microbatches, "backward": backward,
                  "compute": compute}  # fmt: skip
        exposed = 0.0
        by_window: dict[str, tuple[float, float]] = {}
        for col in data_parallel_collectives(model, config, prec):
            tau = seconds(col.bytes, col.messages, col.span)
            if col.overlaps == "none":
                exposed += tau
            else:
                total, last = by_window.get(col.overlaps, (0.0, 0.0))
                by_window[col.overlaps] = (total + tau, max(last, tau / col.pieces))
        for where, (total, last) in by_window.items():
            exposed += max(total - window[where], last)
        parts["dp_comm"] = exposed
    bubble_frac = pipeline_bubble(config.schedule, config.pp, config.microbatches, config.chunks)
    work = compute + sum(parts[k] for k in ("tp_comm", "cp_comm", "pp_comm", "ep_comm"))
    parts["bubble"] = work * bubble_frac / (1 - bubble_frac)
    parts = {key: parts[key] for key in TIME_KEYS}
    parts["total"] = sum(parts.values())
    return parts


def utilisation(
    model: ModelShape,
    config: Config,
    seconds: float,
    precision: str | Precision = "bf16-mixed",
    hardware: Hardware = Hardware(),
) -> dict[str, float]:
    """MFU and HFU of a step that takes `seconds` (Chowdhery et al. 2022, Appendix B).

    MFU counts the model's FLOPs only (`training_flops` with recompute="none"); HFU counts
    every FLOP executed, recomputation included. Both over GPUs x peak x seconds.
    """
    prec = get_precision(precision)
    tokens = config.global_batch * model.seq
    capacity = config.gpus * hardware.peak_flops(prec) * seconds
    return {
        "mfu": training_flops(model, tokens, "none") / capacity,
        "hfu": training_flops(model, tokens, config.recompute, config.cp) / capacity,
    }


# --------------------------------------------------------------------------- one layout


@dataclass
class Estimate:
    """One configuration with its memory and time per step, and why it fails (if it does)."""

    config: Config
    memory: dict[str, float]
    time: dict[str, float]
    reason: str | None = None
    traffic: dict[str, float] = field(default_factory=dict)  # bytes sent per GPU per step
    utilisation: dict[str, float] = field(default_factory=dict)  # mfu, hfu

    @property
    def fits(self) -> bool:
        return self.reason is None

    def to_dict(self) -> dict:
        c = self.config
        return {
            "tp": c.tp,
            "cp": c.cp,
            "pp": c.pp,
            "dp": c.dp,
            "ep": c.ep,
            "microbatch_size": c.microbatch_size,
            "microbatches": c.microbatches,
            "schedule": c.schedule,
            "chunks": c.chunks,
            "zero": c.zero,
            "recompute": c.recompute,
            "sequence_parallel": c.sequence_parallel,
            "dp_overlap": c.dp_overlap,
            "memory_bytes": self.memory["total"],
            "step_time_s": self.time["total"],
            "memory": self.memory,
            "time": self.time,
            "traffic_bytes": self.traffic,
            "utilisation": self.utilisation,
        }


def _why_not(mem: dict[str, float], config: Config, hardware: Hardware) -> str | None:
    usable = hardware.usable_gib
    if mem["total"] <= usable * GIB:
        return None
    cap = (
        f"{usable:.1f} GiB usable ({hardware.gpu_memory_gib:g} GiB - {hardware.reserve:.1f} "
        "GiB reserve)"
    )
    states = mem["parameters"] + mem["gradients"] + mem["optimizer"]
    if states > usable * GIB:
        stage = " even with ZeRO-3" if config.zero == 3 else f" with ZeRO-{config.zero}"
        return f"model states {states / GIB:.1f} GiB > {cap}{stage}"
    return (
        f"memory {mem['total'] / GIB:.1f} GiB > {cap}: model states {states / GIB:.1f} GiB + "
        f"activations {mem['activations'] / GIB:.1f} GiB + buffers {mem['buffers'] / GIB:.1f} "
        f"GiB (recompute={config.recompute})"
    )


def evaluate(
    model: ModelShape,
    config: Config,
    precision: str | Precision = "bf16-mixed",
    hardware: Hardware = Hardware(),
) -> Estimate:
    """Memory and step time of one configuration, with a reason if it does not fit.

    It fits when its memory is at most the usable memory: the GPU's minus the reserve.
    """
    prec = get_precision(precision)
    mem = memory(model, config, prec)
    comm = communication(model, config, prec)
    time = _step_time(model, config, prec, hardware, comm)
    use = utilisation(model, config, time["total"], prec, hardware)
    sent = {kind: c.bytes for kind, c in comm.items()}
    return Estimate(config, mem, time, _why_not(mem, config, hardware), sent, use)
