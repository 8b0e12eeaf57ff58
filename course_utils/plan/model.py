"""The planner's model: memory per GPU and time per step of one layout, with the papers.

- model states per GPU (weights, gradients, Adam states), sharded by ZeRO stage 0-3
  (Rajbhandari et al. 2020, arXiv 1910.02054) and split by tensor and pipeline degrees;
- activations per transformer layer (Korthikanti et al. 2022, arXiv 2205.05198), times the
  layers a pipeline stage holds and the micro-batches it keeps in flight for its schedule
  (the schedule registry's closed forms, or the simulator);
- step time = compute (about 6 x parameters x tokens FLOPs; Kaplan et al. 2020,
  arXiv 2001.08361; Narayanan et al. 2021, arXiv 2104.04473) at a fraction of peak, plus the
  schedule's pipeline bubble, ring all-reduces for data and tensor parallelism (Patarasuk &
  Yuan 2009) and pipeline sends.

Placement follows Megatron-LM (Narayanan et al. 2021): TP innermost (inside a node), then PP,
then DP outermost. The model is deliberately simple: no overlap of communication with
compute, embeddings and logits ignored in the activation count, uniform layers.
Nothing here imports torch.
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

    ZeRO (Rajbhandari et al. 2020, arXiv 1910.02054, Section 5 and Figure 1), with
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


def activation_bytes_per_layer(
    seq: int,
    microbatch_size: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    bytes_per_value: int = 2,
) -> float:
    """Bytes one transformer layer keeps for the backward pass, for one micro-batch.

    Korthikanti et al. 2022 (arXiv 2205.05198, Section 4 and Table 2), 16-bit activations and
    1-byte dropout masks, s = seq, b = micro-batch size, h = hidden, a = heads, t = tp:
      no parallelism              s b h (34 + 5 a s / h)
      tensor parallel             s b h (10 + 24 / t + 5 a s / (h t))
      tensor + sequence parallel  s b h / t (34 + 5 a s / h)
      selective recomputation     drops the 5 a s / h term (attention scores are recomputed)
      full recomputation          2 s b h (only the layer input; / t with sequence parallel)
    The 34 splits into 10 values TP cannot split (two LayerNorm inputs, the inputs of the QKV
    and first MLP matmuls: 4 values x 2 bytes, plus two 1-byte dropout masks) and 24 it can;
    the 5 is the softmax output and its dropout (2 x 2 bytes) plus the dropout mask (1 byte).
    We keep that split so `bytes_per_value=4` (fp32 activations) is counted the same way.
    """
    if recompute not in RECOMPUTE:
        raise CourseInputError(
            f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}"
        )
    s, b, h, a, t, e = seq, microbatch_size, hidden, heads, tp, bytes_per_value
    sbh = s * b * h
    sp = t if sequence_parallel else 1
    if recompute == "full":
        return e * sbh / sp
    unsplit = (4 * e + 2) * sbh  # 10 sbh at 2 bytes: replicated on every TP rank unless SP
    split = 12 * e * sbh  # 24 sbh at 2 bytes: QKV, attention output, MLP hidden, ...
    attention = 0 if recompute == "selective" else (2 * e + 1) * a * s * s * b  # 5 a s^2 b
    return unsplit / sp + split / t + attention / t


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


def memory(
    model: ModelShape | int,
    config: Config = Config(),
    precision: str | Precision = "bf16-mixed",
) -> dict[str, float]:
    """Bytes per GPU: parameters, gradients, optimizer, activations, total.

    `model` may be a bare parameter count, in which case activations are not estimated (0).
    Activations are those of the busiest (first) pipeline stage: layers / pp layers, times the
    micro-batches its schedule keeps in flight.
    """
    shape = model if isinstance(model, ModelShape) else None
    params = shape.params if shape else model
    if isinstance(params, bool) or not isinstance(params, int | float) or not params >= 1:
        raise CourseInputError(f"model must be a ModelShape or a parameter count, got {model!r}")
    check_config(shape, config)
    prec = get_precision(precision)
    out = model_state_bytes(params, prec, config.zero, config.dp, config.tp, config.pp)
    activations = 0.0
    if shape is not None:
        per_layer = activation_bytes_per_layer(
            shape.seq,
            config.microbatch_size,
            shape.hidden,
            shape.heads,
            config.tp,
            config.sequence_parallel,
            config.recompute,
            prec.activation_bytes,
        )
        inflight = inflight_microbatches(
            config.schedule, config.pp, config.microbatches, config.chunks
        )
        activations = per_layer * (shape.layers / config.pp) * inflight
    out["activations"] = activations
    out["total"] = out["parameters"] + out["gradients"] + out["optimizer"] + activations
    return out


# --------------------------------------------------------------------------- time per step


def training_flops(model: ModelShape | int, tokens: float, recompute: str = "none") -> float:
    """FLOPs of one training step over `tokens` tokens.

    6 N per token (2 forward + 4 backward per parameter; Kaplan et al. 2020, arXiv 2001.08361)
    plus attention scores and context, 12 L h s per token (Narayanan et al. 2021,
    arXiv 2104.04473, eq. 3). Full recomputation repeats the forward (2 N + 4 L h s per token);
    selective recomputation repeats only the attention core (4 L h s per token).
    """
    if recompute not in RECOMPUTE:
        raise CourseInputError(
            f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}"
        )
    shape = model if isinstance(model, ModelShape) else None
    params = model.params if isinstance(model, ModelShape) else model
    attention = 4 * shape.layers * shape.hidden * shape.seq if shape else 0.0  # forward only
    forward = 2 * params + attention
    extra = {"none": 0.0, "selective": attention, "full": forward}[recompute]
    return tokens * (3 * forward + extra)


@dataclass(frozen=True)
class Traffic:
    """What one kind of parallelism makes each GPU send in one optimizer step."""

    bytes: float  # sent by each GPU
    messages: float  # messages each GPU sends (each pays the link's latency)
    span: int  # consecutive GPUs the group spans: its slowest link sets the bandwidth


def communication(
    model: ModelShape, config: Config, precision: str | Precision = "bf16-mixed"
) -> dict[str, Traffic]:
    """Per GPU per step: 'tensor', 'pipeline' and 'data' traffic (ring collectives).

    Tensor parallel (Shoeybi et al. 2019, arXiv 1909.08053): 2 all-reduces of the b s h
    activations per layer forward and 2 backward (sequence parallelism swaps each for a
    reduce-scatter + all-gather of the same volume); full recomputation repeats the forward 2.
    A ring all-reduce of S bytes over t GPUs sends 2 (t-1)/t S in 2 (t-1) messages.
    Pipeline: each micro-batch sends its activations forward and gradients back once per
    chunk boundary (b s h / t values with Megatron's scatter-gather across TP ranks).
    Data parallel: a ring all-reduce of this GPU's gradient shard (ZeRO-1/2's reduce-scatter +
    all-gather move the same bytes; ZeRO-3 also all-gathers the weights again: 1.5x, ZeRO
    paper Section 7.2).
    """
    check_config(model, config)
    prec = get_precision(precision)
    t, p, d = config.tp, config.pp, config.dp
    activations = config.microbatch_size * model.seq * model.hidden * prec.activation_bytes
    all_reduces = (6 if config.recompute == "full" else 4) * model.layers / p * config.microbatches
    tensor = Traffic(all_reduces * 2 * (t - 1) / t * activations, all_reduces * 2 * (t - 1), t)
    chunks = REGISTRY[config.schedule].chunks(config.chunks)
    sends = 2 * config.microbatches * chunks if p > 1 else 0
    pipeline = Traffic(sends * activations / t, sends, t * p)
    grads = model.params / (t * p) * prec.grad_bytes
    again = 1.5 if config.zero == 3 else 1.0
    data = Traffic(again * 2 * (d - 1) / d * grads, again * 2 * (d - 1), config.gpus)
    return {"tensor": tensor, "pipeline": pipeline, "data": data}


def traffic(
    model: ModelShape, config: Config, precision: str | Precision = "bf16-mixed"
) -> dict[str, float]:
    """Bytes each GPU sends per step for 'tensor', 'pipeline' and 'data' parallelism."""
    return {kind: c.bytes for kind, c in communication(model, config, precision).items()}


def step_time(
    model: ModelShape,
    config: Config,
    precision: str | Precision = "bf16-mixed",
    hardware: Hardware = Hardware(),
) -> dict[str, float]:
    """Seconds per optimizer step, split into compute, bubble, dp_comm, tp_comm, pp_comm, total.

    Nothing overlaps (a pessimistic but readable choice). Communication is `communication`'s
    bytes over the group's slowest link plus a latency per message. The bubble is the
    schedule's idle fraction f applied to the per-device work W: idle = W f / (1 - f).
    """
    prec = get_precision(precision)
    comm = communication(model, config, prec)
    tokens = config.global_batch * model.seq
    flops = training_flops(model, tokens, config.recompute)
    compute = flops / config.gpus / (hardware.peak_flops(prec) * hardware.efficiency)
    lat = hardware.latency_us * 1e-6

    def seconds(kind: str) -> float:
        c = comm[kind]
        return c.bytes / hardware.bandwidth(c.span) + c.messages * lat

    tp_comm, pp_comm, dp_comm = seconds("tensor"), seconds("pipeline"), seconds("data")
    bubble_frac = pipeline_bubble(config.schedule, config.pp, config.microbatches, config.chunks)
    work = compute + tp_comm + pp_comm
    bubble = work * bubble_frac / (1 - bubble_frac)
    parts = {
        "compute": compute,
        "bubble": bubble,
        "dp_comm": dp_comm,
        "tp_comm": tp_comm,
        "pp_comm": pp_comm,
    }
    parts["total"] = sum(parts.values())
    return parts


# --------------------------------------------------------------------------- one layout


@dataclass
class Estimate:
    """One configuration with its memory and time per step, and why it fails (if it does)."""

    config: Config
    memory: dict[str, float]
    time: dict[str, float]
    reason: str | None = None
    traffic: dict[str, float] = field(default_factory=dict)  # bytes sent per GPU per step

    @property
    def fits(self) -> bool:
        return self.reason is None

    def to_dict(self) -> dict:
        c = self.config
        return {
            "tp": c.tp,
            "pp": c.pp,
            "dp": c.dp,
            "microbatch_size": c.microbatch_size,
            "microbatches": c.microbatches,
            "schedule": c.schedule,
            "chunks": c.chunks,
            "zero": c.zero,
            "recompute": c.recompute,
            "sequence_parallel": c.sequence_parallel,
            "memory_bytes": self.memory["total"],
            "step_time_s": self.time["total"],
            "memory": self.memory,
            "time": self.time,
            "traffic_bytes": self.traffic,
        }


def evaluate(
    model: ModelShape,
    config: Config,
    precision: str | Precision = "bf16-mixed",
    hardware: Hardware = Hardware(),
) -> Estimate:
    """Memory and step time of one configuration, with a reason if it does not fit."""
    mem = memory(model, config, precision)
    time = step_time(model, config, precision, hardware)
    limit = hardware.gpu_memory_gib * GIB
    reason = None
    if mem["total"] > limit:
        states = mem["parameters"] + mem["gradients"] + mem["optimizer"]
        cap = f"{hardware.gpu_memory_gib:g} GiB"
        if states > limit:
            reason = f"model states {states / GIB:.1f} GiB > {cap}" + (
                " even with ZeRO-3" if config.zero == 3 else f" with ZeRO-{config.zero}"
            )
        else:
            reason = (
                f"memory {mem['total'] / GIB:.1f} GiB > {cap}: model states "
                f"{states / GIB:.1f} GiB + activations {mem['activations'] / GIB:.1f} GiB "
                f"(recompute={config.recompute})"
            )
    return Estimate(config, mem, time, reason, traffic(model, config, precision))
