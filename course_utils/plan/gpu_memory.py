"""Memory per GPU of one layout: model states by ZeRO stage, activations term by term, the
micro-batches a pipeline keeps in flight, short-lived buffers (see `plan.model` for the
sources of every formula, and tests/test_plan.py, which checks each against its module)."""

import functools

from course_utils import validation
from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import SCHEDULES as REGISTRY
from course_utils.pipeline.schedules import Case, count_actions, make_schedule
from course_utils.pipeline.simulate import CostModel, simulate
from course_utils.plan.inputs import (
    MAX_PARAMS,
    MAX_SHAPE,
    MAX_SIMULATED,
    PLANNED_SCHEDULES,
    RECOMPUTE,
    ZERO_STAGES,
    Config,
    ModelShape,
    Precision,
    check_config,
    check_sizes,
    get_precision,
)
from course_utils.validation import MAX_ACTIONS

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
    params = validation.number(params, "params", 0, MAX_PARAMS)
    if isinstance(zero, bool) or zero not in ZERO_STAGES:
        raise CourseInputError(f"zero must be 0, 1, 2 or 3, got {validation.shown(zero)}")
    check_sizes(dp=dp, tp=tp, pp=pp)
    return _state_bytes(params / (tp * pp), prec, zero, dp)


def _state_bytes(psi: float, prec: Precision, zero: int, dp: int) -> dict[str, float]:
    return {
        "parameters": prec.weight_bytes * psi / (dp if zero >= 3 else 1),
        "gradients": prec.grad_bytes * psi / (dp if zero >= 2 else 1),
        "optimizer": prec.optimizer_bytes * psi / (dp if zero >= 1 else 1),
    }


def weight_shard_groups(model: ModelShape, config: Config) -> list[tuple[float, int]]:
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
    validation.instance(model, "model", ModelShape)
    check_config(model, config)
    return _model_states(model, config, get_precision(precision))


def _model_states(model: ModelShape, config: Config, precision: Precision) -> dict[str, float]:
    out = {"parameters": 0.0, "gradients": 0.0, "optimizer": 0.0}
    for psi, group in weight_shard_groups(model, config):
        for key, value in _state_bytes(psi, precision, config.zero, group).items():
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
    validation.choice(recompute, "recompute", RECOMPUTE)
    check_sizes(seq=seq, microbatch_size=microbatch_size, hidden=hidden, heads=heads, tp=tp,
                bytes_per_value=bytes_per_value, cp=cp)  # fmt: skip
    if ffn_hidden is not None:
        check_sizes(ffn_hidden=ffn_hidden)
    validation.instance(sequence_parallel, "sequence_parallel", bool)
    moe_factor = validation.number(moe_factor, "moe_factor", 1.0, 64.0 * MAX_SHAPE)
    return _activation_terms(
        seq, microbatch_size, hidden, heads, tp, sequence_parallel, recompute, bytes_per_value,
        cp, ffn_hidden, moe_factor,
    )  # fmt: skip


def _activation_terms(
    seq: int,
    microbatch_size: int,
    hidden: int,
    heads: int,
    tp: int,
    sequence_parallel: bool,
    recompute: str,
    bytes_per_value: int,
    cp: int,
    ffn_hidden: int | None,
    moe_factor: float,
) -> dict[str, float]:
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
    seq: int,
    cp: int,
    heads: int,
    head_dim: int,
    bytes_per_value: int = 2,
    batch: int = 1,
    kv_heads: int | None = None,
) -> float:
    """Peak bytes of one attention layer on one GPU of a context-parallel ring.

    With t = seq / cp tokens, H heads of size D: q, k, v and the output (4 t H D, kept for
    the backward), the log-sum-exp (t H), the next K/V block arriving (2 t H D) and one block
    of scores and probabilities (2 t^2 H): e b H (6 t D + t + 2 t^2), the formula of
    `parallel.context_parallel.attention_activation_bytes`. With grouped-query attention the
    arriving block has only the `kv_heads` K/V heads: 2 t H_kv D. The first part is already
    in `activation_terms`; `buffers` adds the rest.
    """
    check_sizes(seq=seq, cp=cp, heads=heads, head_dim=head_dim, bytes_per_value=bytes_per_value,
                batch=batch)  # fmt: skip
    if kv_heads is not None:
        validation.integer(kv_heads, "kv_heads (None: as many as heads)", 1, heads)
    kv = heads if kv_heads is None else kv_heads
    return _ring_bytes(seq, cp, heads, head_dim, bytes_per_value, batch, kv)


def _ring_bytes(
    seq: int, cp: int, heads: int, head_dim: int, e: int, batch: int, kv_heads: int
) -> float:
    t = -(-seq // cp)
    per_head = 4 * t * head_dim + t + 2 * t * t
    return e * batch * (heads * per_head + kv_heads * 2 * t * head_dim)


def ulysses_attention_bytes(
    seq: int, cp: int, heads: int, head_dim: int, bytes_per_value: int = 2, batch: int = 1
) -> float:
    """Peak bytes of one attention layer on one GPU of a Ulysses group of cp GPUs.

    With t = seq / cp tokens, H heads of size D: q, k, v and the output of its tokens
    (4 t H D), the same in the head split while attention runs (4 t H D), the log-sum-exp
    (t H) and the scores and probabilities of its H / cp heads over the whole sequence
    (2 cp t^2 H): e b H (8 t D + t + 2 cp t^2), the formula of
    `parallel.context_parallel.ulysses_activation_bytes`.
    """
    check_sizes(seq=seq, cp=cp, heads=heads, head_dim=head_dim, bytes_per_value=bytes_per_value,
                batch=batch)  # fmt: skip
    return _ulysses_bytes(seq, cp, heads, head_dim, bytes_per_value, batch)


def _ulysses_bytes(seq: int, cp: int, heads: int, head_dim: int, e: int, batch: int) -> float:
    t = -(-seq // cp)
    return e * batch * heads * (8 * t * head_dim + t + 2 * cp * t * t)


# --------------------------------------------------------------------------- pipelines


@functools.lru_cache(maxsize=4096)
def _simulated(schedule: str, pp: int, m: int, v: int) -> tuple[float, float]:
    """(bubble fraction, peak in-flight micro-batches on the busiest device), simulated."""
    actions = count_actions(schedule, pp, m, v)
    if actions > MAX_SIMULATED:
        raise CourseInputError(
            f"{schedule} on pp={pp} x {m} micro-batches is too big a pipeline to simulate "
            f"({actions:,} actions, at most {MAX_SIMULATED:,}): use fewer stages or micro-batches"
        )
    timeline = simulate(make_schedule(schedule, pp, m, v, MAX_ACTIONS), CostModel())
    chunks = REGISTRY[schedule].chunks(v)
    peak = max(timeline.peak_activations or [0]) / chunks  # chunks -> whole-stage micro-batches
    return timeline.bubble_fraction, peak


# Above this many compute actions per device, or this many in all, the registry's closed forms
# are used where they hold (tests/test_registry.py proves them equal to the simulator there),
# which keeps a 64-GPU search well under 2 s and one of 1,024 stages from simulating hundreds
# of long pipelines; elsewhere, and for small schedules, the simulator decides.
SIMULATE_LIMIT = 512
SIMULATE_TOTAL = 20_000


@functools.lru_cache(maxsize=16384)
def _pipeline_figure(which: str, schedule: str, pp: int, m: int, v: int) -> float:
    closed = getattr(REGISTRY[schedule], which)(Case(pp, m, v))  # uniform stages, F=1, B=2
    if closed is not None and (3 * m * v > SIMULATE_LIMIT or 3 * pp * m * v > SIMULATE_TOTAL):
        return closed
    bubble, peak = _simulated(schedule, pp, m, v)
    return bubble if which == "bubble" else peak


def pipeline_bubble(schedule: str, pp: int, microbatches: int, chunks: int = 1) -> float:
    """Fraction of a step a pipeline device sits idle, for uniform stages (F = 1, B = 2)."""
    check_sizes(pp=pp, microbatches=microbatches, chunks=chunks)
    validation.choice(schedule, "schedule", PLANNED_SCHEDULES)
    return _bubble(schedule, pp, microbatches, chunks)


def _bubble(schedule: str, pp: int, microbatches: int, chunks: int) -> float:
    return 0.0 if pp == 1 else _pipeline_figure("bubble", schedule, pp, microbatches, chunks)


def inflight_microbatches(schedule: str, pp: int, microbatches: int, chunks: int = 1) -> float:
    """How many micro-batches of activations the busiest stage holds at once.

    Counted in whole-stage micro-batches (a chunk of a looping schedule counts 1 / chunks).
    With pp = 1 there is no pipeline: plain gradient accumulation holds one micro-batch.
    """
    check_sizes(pp=pp, microbatches=microbatches, chunks=chunks)
    validation.choice(schedule, "schedule", PLANNED_SCHEDULES)
    return _inflight(schedule, pp, microbatches, chunks)


def _inflight(schedule: str, pp: int, microbatches: int, chunks: int) -> float:
    return 1.0 if pp == 1 else _pipeline_figure("peak", schedule, pp, microbatches, chunks)


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
      With cp > 1 the ring holds one K/V block arriving (the GPU's K/V heads), one block of
      scores (t x t for t = s / cp tokens: cp^2 times smaller) and the log-sum-exp:
      `ring_attention_bytes` less the q, k, v and output `activation_terms` already counts
      (the course's ring attention builds each block's scores; a tiled flash-style kernel
      would keep one tile). With Ulysses (cp_kind="ulysses") the head-split q, k, v and
      output and the scores of heads / (tp cp) heads over the whole sequence:
      `ulysses_attention_bytes`, less the same (k and v counted with every query head: a
      safe side under grouped-query attention);
    - "recomputed layer" (full recomputation): one layer's activations, rebuilt from its
      input for its backward.
    The logits live on the last pipeline stage and the activations peak on the first; the
    planner adds them anyway (a safe side for a plan).
    """
    validation.instance(model, "model", ModelShape)
    check_config(model, config)
    return _buffers(model, config, get_precision(precision))


def _buffers(model: ModelShape, config: Config, prec: Precision) -> dict[str, float]:
    t, e, b = config.tp, prec.activation_bytes, config.microbatch_size
    s = model.seq / config.cp
    out = {"gathered layers": 0.0, "logits": 0.0, "attention in flight": 0.0,
           "recomputed layer": 0.0}  # fmt: skip
    if config.zero == 3:
        per_gpu = sum(psi for psi, _ in weight_shard_groups(model, config))
        layer = per_gpu / (model.layers / config.pp)
        out["gathered layers"] = (2 * prec.weight_bytes + prec.grad_bytes) * layer
    out["logits"] = b * s * model.vocab * (e + 4) / t
    heads = model.heads // t
    if config.cp > 1:
        # (the sizes were checked with the model and layout: no check for each layout)
        if config.cp_kind == "ulysses":
            whole = _ulysses_bytes(model.seq, config.cp, heads, model.head_dim, e, b)
        else:  # the arriving K/V block has the GPU's K/V heads
            kv = model.kv_heads_per_gpu(t)
            whole = _ring_bytes(model.seq, config.cp, heads, model.head_dim, e, b, kv)
        kept = e * b * heads * 4 * s * model.head_dim  # q, k, v, output: in the activations
        out["attention in flight"] = whole - kept
    elif config.recompute == "selective":
        out["attention in flight"] = (2 * e + 1) * heads * s * s * b
    if config.recompute == "full":
        out["recomputed layer"] = sum(_activation_terms(
            model.seq, b, model.hidden, model.heads, t, config.sequence_parallel, "none", e,
            config.cp, model.ffn, _moe_factor(model),
        ).values())  # fmt: skip
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
    if (
        isinstance(params, bool)
        or not isinstance(params, int | float)
        or not 1 <= params <= MAX_PARAMS
    ):
        raise CourseInputError(
            f"model must be a ModelShape or a parameter count from 1 to {MAX_PARAMS:.0e}, "
            f"got {validation.shown(model)}"
        )
    check_config(shape, config)
    return _memory(model, config, get_precision(precision))


def _memory(model: ModelShape | int, config: Config, prec: Precision) -> dict[str, float]:
    """`memory` of a model and a config already checked."""
    if not isinstance(model, ModelShape):
        out = model_state_bytes(model, prec, config.zero, config.dp, config.tp, config.pp)
        out.update(activations=0.0, buffers=0.0)
    else:
        out = _model_states(model, config, prec)
        per_layer = sum(_activation_terms(
            model.seq, config.microbatch_size, model.hidden, model.heads, config.tp,
            config.sequence_parallel, config.recompute, prec.activation_bytes, config.cp,
            model.ffn, _moe_factor(model),
        ).values())  # fmt: skip
        inflight = _inflight(config.schedule, config.pp, config.microbatches, config.chunks)
        out["activations"] = per_layer * (model.layers / config.pp) * inflight
        out["buffers"] = sum(_buffers(model, config, prec).values())
    out["total"] = sum(out[key] for key in MEMORY_KEYS)
    return out
