"""Plan a training run before renting the GPUs: will it fit, how fast will it go, what to change.

Everything here is a formula a learner can read, with the paper it comes from:

- model states per GPU (weights, gradients, Adam states), sharded by ZeRO stage 0-3
  (Rajbhandari et al. 2020, arXiv 1910.02054) and split by tensor and pipeline degrees;
- activations per transformer layer (Korthikanti et al. 2022, arXiv 2205.05198), times the
  layers a pipeline stage holds and the micro-batches it keeps in flight for its schedule;
- step time = compute (about 6 x parameters x tokens FLOPs; Kaplan et al. 2020,
  arXiv 2001.08361; Narayanan et al. 2021, arXiv 2104.04473) at a fraction of peak, plus the
  schedule's pipeline bubble (from the course's simulator), ring all-reduces for data and
  tensor parallelism (Patarasuk & Yuan 2009) and pipeline sends;
- `search` enumerates (TP, PP, DP, micro-batch size, micro-batches, schedule, ZeRO stage,
  recomputation), ranks what fits by estimated step time and says why the rest does not.

Placement follows Megatron-LM (Narayanan et al. 2021): TP innermost (inside a node), then PP,
then DP outermost. The model is deliberately simple: no overlap of communication with
compute, embeddings and logits ignored in the activation count, uniform layers.

This module never imports torch: it only does arithmetic (and asks the simulator, which does
not import torch either, for bubbles).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import re
from dataclasses import asdict, dataclass, replace

from course_utils.errors import CourseInputError

GIB = 2**30
SCHEDULES = ("gpipe", "1f1b", "interleaved", "breadth-first", "zb-h1")
LOOPING = ("interleaved", "breadth-first")  # schedules with several chunks per device
RECOMPUTE = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)
MICROBATCH_SIZES = (1, 2, 4, 8)
SEARCH_CHUNKS = 2  # virtual stages per device tried for the looping schedules


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter for weights, gradients and Adam states, and per activation value."""

    name: str
    weight_bytes: int
    grad_bytes: int
    optimizer_bytes: int  # Adam: fp32 master copy (mixed only) + momentum + variance
    activation_bytes: int
    peak_key: str  # which peak FLOP rate of the GPU applies


# ZeRO paper, Section 3.1: mixed-precision Adam keeps 2 + 2 + K bytes per parameter with K = 12
# (fp32 master weights, momentum, variance). Plain fp32 Adam: 4 + 4 + 8. Both are 16 bytes.
PRECISIONS = {
    "bf16-mixed": Precision("bf16-mixed", 2, 2, 12, 2, "bf16"),
    "fp32": Precision("fp32", 4, 4, 8, 4, "fp32"),
}


def get_precision(precision: str | Precision) -> Precision:
    if isinstance(precision, Precision):
        return precision
    if precision not in PRECISIONS:
        raise CourseInputError(
            f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}"
        )
    return PRECISIONS[precision]


_SUFFIX = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_count(text: str | int | float, what: str = "params") -> int:
    """Read a count like 7500000000, 7.5e9, 30B, 70B or 175B (K, M, B/G, T suffixes)."""
    if isinstance(text, bool):
        raise CourseInputError(f"{what} must be a positive number like 7.5e9 or 70B, got {text!r}")
    if isinstance(text, int | float):
        value = float(text)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtT]?)\s*", text)
        if not match:
            raise CourseInputError(
                f"{what} must be a positive number like 7500000000, 7.5e9, 30B or 70B, got {text!r}"
            )
        value = float(match.group(1)) * _SUFFIX[match.group(2).upper()]
    if not math.isfinite(value) or value < 1:
        raise CourseInputError(f"{what} must be a positive number like 7.5e9 or 70B, got {text!r}")
    return int(round(value))


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer: parameter count and the shape the activations depend on."""

    params: int
    layers: int
    hidden: int
    heads: int
    seq: int = 2048


# Shapes in the style of GPT-3 (Brown et al. 2020, arXiv 2005.14165, Table 2.1); the 30B and
# 70B rows are the course's own round shapes (about 12 * layers * hidden^2 parameters).
MODEL_PRESETS = {
    "1.3B": ModelShape(1_300_000_000, 24, 2048, 16),
    "6.7B": ModelShape(6_700_000_000, 32, 4096, 32),
    "13B": ModelShape(13_000_000_000, 40, 5120, 40),
    "30B": ModelShape(30_000_000_000, 48, 7168, 56),
    "70B": ModelShape(70_000_000_000, 80, 8192, 64),
    "175B": ModelShape(175_000_000_000, 96, 12288, 96),
}


@dataclass(frozen=True)
class Config:
    """One way to lay a run out on GPUs. `microbatches` is per data-parallel replica."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    microbatch_size: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    chunks: int = 1  # virtual stages per device (interleaved, breadth-first)
    zero: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def global_batch(self) -> int:
        return self.dp * self.microbatches * self.microbatch_size

    def short(self) -> str:
        sched = self.schedule + (f"(v={self.chunks})" if self.chunks > 1 else "")
        sp = "+sp" if self.sequence_parallel and self.tp > 1 else ""
        return (
            f"tp={self.tp}{sp} pp={self.pp} dp={self.dp} b={self.microbatch_size} "
            f"m={self.microbatches} {sched} zero={self.zero} recompute={self.recompute}"
        )


@dataclass(frozen=True)
class Hardware:
    """A GPU cluster. Defaults are in the range of an 8 x 80 GiB NVLink node with InfiniBand."""

    gpu_memory_gib: float = 80.0
    gpus_per_node: int = 8
    peak_tflops_bf16: float = 312.0  # dense bf16 tensor-core peak of an A100
    peak_tflops_fp32: float = 19.5  # plain fp32 (no TF32) on the same GPU
    efficiency: float = 0.5  # fraction of peak the matmuls really reach (MFU)
    intra_node_gbs: float = 300.0  # GB/s per GPU inside a node (NVLink)
    inter_node_gbs: float = 25.0  # GB/s per GPU between nodes (one 200 Gb/s NIC per GPU)
    latency_us: float = 5.0  # per message

    def peak_flops(self, precision: Precision) -> float:
        tflops = self.peak_tflops_bf16 if precision.peak_key == "bf16" else self.peak_tflops_fp32
        return tflops * 1e12

    def bandwidth(self, group_span: int) -> float:
        """Bytes/s of the slowest link of a group spanning `group_span` consecutive GPUs."""
        gbs = self.intra_node_gbs if group_span <= self.gpus_per_node else self.inter_node_gbs
        return gbs * 1e9


def replace_config(config: Config, **changes) -> Config:
    """A copy of `config` with some fields changed: `replace_config(c, recompute="full")`."""
    return replace(config, **changes)


def _positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CourseInputError(f"{what} must be an integer >= 1, got {value!r}")
    return value


def check_config(model: ModelShape | None, config: Config) -> None:
    """Raise CourseInputError (one line) if `config` cannot be built for `model`."""
    for name in ("tp", "pp", "dp", "microbatch_size", "microbatches", "chunks"):
        _positive_int(getattr(config, name), name)
    if config.schedule not in SCHEDULES:
        raise CourseInputError(
            f"schedule must be one of {', '.join(SCHEDULES)}, got {config.schedule!r}"
        )
    if config.zero not in ZERO_STAGES:
        raise CourseInputError(f"zero must be 0, 1, 2 or 3, got {config.zero!r}")
    if config.recompute not in RECOMPUTE:
        raise CourseInputError(
            f"recompute must be one of {', '.join(RECOMPUTE)}, got {config.recompute!r}"
        )
    if config.chunks > 1 and config.schedule not in LOOPING:
        raise CourseInputError(
            f"chunks > 1 needs a looping schedule ({', '.join(LOOPING)}), "
            f"got schedule {config.schedule!r}"
        )
    if config.schedule == "interleaved" and config.pp > 1 and config.microbatches % config.pp:
        # the same rule as course_utils.schedules (and Megatron-LM)
        raise CourseInputError(
            f"interleaved needs microbatches ({config.microbatches}) to be a multiple of "
            f"pp ({config.pp})"
        )
    if model is None:
        return
    if model.heads % config.tp:
        raise CourseInputError(f"tp={config.tp} must divide the number of heads ({model.heads})")
    if model.layers % (config.pp * config.chunks):
        raise CourseInputError(
            f"pp x chunks = {config.pp * config.chunks} must divide the number of layers "
            f"({model.layers})"
        )


# --------------------------------------------------------------------------- memory


def model_state_bytes(
    params: int,
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


def _closed_form_bubble(schedule: str, pp: int, m: int, v: int, weight_fraction: float) -> float:
    """Idle fraction for uniform stages, forward 1 and backward 2 per device share.

    GPipe and 1F1B: (p - 1) / (m + p - 1) (Huang et al. 2019, arXiv 1811.06965; 1F1B with a
    flush: Narayanan et al. 2021, PipeDream-2BW, arXiv 2006.09503). Interleaved and
    breadth-first with v chunks: the warm-up shrinks by v, (p - 1) / (v m + p - 1)
    (Narayanan et al. 2021, arXiv 2104.04473; Lamy-Poirier 2022, arXiv 2211.05953).
    ZB-H1 (Qi et al. 2023, arXiv 2401.10241): the bubble per device falls from
    (p - 1)(F + B) to (p - 1)(F + B - 2 W) with W the weight-gradient part of B.
    These hold once every device has work (m >= p); below that the simulator is used.
    """
    if pp == 1:
        return 0.0
    f, b = 1.0, 2.0
    if schedule in ("gpipe", "1f1b"):
        idle = (pp - 1) * (f + b)
    elif schedule in LOOPING:
        idle = (pp - 1) * (f + b) / v
    else:  # zb-h1
        w = b * weight_fraction
        idle = (pp - 1) * (f + b - 2 * w) if w <= f else (pp - 1) * (b - w)
    busy = m * (f + b)
    return idle / (busy + idle)


@functools.lru_cache(maxsize=4096)
def _simulated(schedule: str, pp: int, m: int, v: int) -> tuple[float, float] | None:
    """(bubble fraction, peak in-flight micro-batches on the busiest device) from the simulator.

    None if the simulator is not available or cannot build this schedule.
    """
    try:
        from course_utils.schedules import make_schedule
        from course_utils.simulate import CostModel, simulate
    except ImportError:
        return None
    timeline = simulate(make_schedule(schedule, pp, m, v), CostModel())
    peak = max(timeline.peak_activations or [0]) / v  # chunks -> whole-stage micro-batches
    return timeline.bubble_fraction, peak


# Above this many compute actions per device we trust the closed forms (they agree with the
# simulator where both run; see tests/test_plan.py) to keep a 64-GPU search well under 2 s.
SIMULATE_LIMIT = 512


def _use_simulator(pp: int, m: int, v: int) -> bool:
    # the closed forms need m >= p, so smaller m is always simulated (it is cheap then)
    return pp > 1 and (3 * m * v <= SIMULATE_LIMIT or m < pp)


def pipeline_bubble(schedule: str, pp: int, microbatches: int, chunks: int = 1) -> float:
    """Fraction of a step a pipeline device sits idle, for uniform stages (F = 1, B = 2).

    Simulated with `course_utils.simulate` when available (and small enough), else the
    closed forms of `_closed_form_bubble`.
    """
    if schedule not in SCHEDULES:
        raise CourseInputError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if _use_simulator(pp, microbatches, chunks):
        result = _simulated(schedule, pp, microbatches, chunks)
        if result is not None:
            return result[0]
    return _closed_form_bubble(schedule, pp, microbatches, chunks, 0.5)


def _closed_form_inflight(schedule: str, pp: int, m: int, v: int) -> float:
    """Micro-batches (whole-stage equivalents) the first stage holds at its peak.

    GPipe keeps all m. 1F1B and ZB-H1 keep min(p, m) (arXiv 2006.09503; Qi et al. 2023).
    Interleaved keeps p (1 + (p - 1) / (p v)) (Korthikanti et al. 2022, Section 4.2.3).
    Breadth-first runs all forwards of a chunk before the next, so it keeps all m like GPipe.
    """
    if schedule == "gpipe" or schedule == "breadth-first":
        return float(m)
    if schedule == "interleaved":
        return min(float(m), pp + (pp - 1) / v)
    return float(min(pp, m))


def inflight_microbatches(schedule: str, pp: int, microbatches: int, chunks: int = 1) -> float:
    """How many micro-batches of activations the busiest stage holds at once.

    Counted in whole-stage micro-batches (a chunk of a looping schedule counts 1 / chunks).
    With pp = 1 there is no pipeline: plain gradient accumulation holds one micro-batch.
    """
    if schedule not in SCHEDULES:
        raise CourseInputError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if pp == 1:
        return 1.0
    if _use_simulator(pp, microbatches, chunks):
        result = _simulated(schedule, pp, microbatches, chunks)
        if result is not None:
            return result[1]
    return _closed_form_inflight(schedule, pp, microbatches, chunks)


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


def ring_allreduce_time(
    nbytes: float, workers: int, bandwidth_bytes_per_s: float, latency_s: float = 0.0
) -> float:
    """Ring all-reduce: 2 (N - 1) / N x bytes / bandwidth + 2 (N - 1) x latency.

    Reduce-scatter then all-gather, each N - 1 steps of 1/N of the data (Patarasuk & Yuan
    2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations").
    """
    try:  # the simulator owns the course's copy of this formula; use it once it is there
        from course_utils.simulate import ring_allreduce_time as shared
    except ImportError:
        shared = None
    if shared is not None:
        return shared(nbytes, workers, bandwidth_bytes_per_s, latency_s)
    if workers <= 1:
        return 0.0
    n = workers
    return 2 * (n - 1) / n * nbytes / bandwidth_bytes_per_s + 2 * (n - 1) * latency_s


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
    params = shape.params if shape else model
    attention = 4 * shape.layers * shape.hidden * shape.seq if shape else 0.0  # forward only
    forward = 2 * params + attention
    extra = {"none": 0.0, "selective": attention, "full": forward}[recompute]
    return tokens * (3 * forward + extra)


def step_time(
    model: ModelShape,
    config: Config,
    precision: str | Precision = "bf16-mixed",
    hardware: Hardware = Hardware(),
) -> dict[str, float]:
    """Seconds per optimizer step, split into compute, bubble, dp_comm, tp_comm, pp_comm, total.

    Nothing overlaps (a pessimistic but readable choice). The bubble is the schedule's idle
    fraction f applied to the per-device work W: idle = W f / (1 - f).
    """
    check_config(model, config)
    prec = get_precision(precision)
    e = prec.activation_bytes
    tokens = config.global_batch * model.seq
    flops = training_flops(model, tokens, config.recompute)
    compute = flops / config.gpus / (hardware.peak_flops(prec) * hardware.efficiency)
    lat = hardware.latency_us * 1e-6

    # Tensor parallel (Shoeybi et al. 2019, arXiv 1909.08053): 2 all-reduces of the b s h
    # activations per layer forward and 2 backward (sequence parallelism swaps each for a
    # reduce-scatter + all-gather of the same volume); full recomputation repeats the forward 2.
    per_op = ring_allreduce_time(
        config.microbatch_size * model.seq * model.hidden * e,
        config.tp,
        hardware.bandwidth(config.tp),
        lat,
    )
    ops_per_layer = 6 if config.recompute == "full" else 4
    layers_here = model.layers / config.pp
    tp_comm = ops_per_layer * layers_here * config.microbatches * per_op

    # Pipeline: each micro-batch sends its activations forward and gradients back once per
    # chunk boundary (b s h / t values with Megatron's scatter-gather across TP ranks).
    pp_comm = 0.0
    if config.pp > 1:
        message = config.microbatch_size * model.seq * model.hidden * e / config.tp
        bw = hardware.bandwidth(config.tp * config.pp)
        pp_comm = 2 * config.microbatches * config.chunks * (message / bw + lat)

    bubble_frac = pipeline_bubble(config.schedule, config.pp, config.microbatches, config.chunks)
    work = compute + tp_comm + pp_comm
    bubble = work * bubble_frac / (1 - bubble_frac)

    # Data parallel: ring all-reduce of this GPU's gradient shard (ZeRO-1/2 reduce-scatter +
    # all-gather move the same bytes; ZeRO-3 also all-gathers weights again: 1.5x, ZeRO paper
    # Section 7.2).
    grad_bytes = model.params / (config.tp * config.pp) * prec.grad_bytes
    dp_comm = ring_allreduce_time(grad_bytes, config.dp, hardware.bandwidth(config.gpus), lat)
    if config.zero == 3:
        dp_comm *= 1.5
    parts = {
        "compute": compute,
        "bubble": bubble,
        "dp_comm": dp_comm,
        "tp_comm": tp_comm,
        "pp_comm": pp_comm,
    }
    parts["total"] = sum(parts.values())
    return parts


# --------------------------------------------------------------------------- search


@dataclass
class Estimate:
    """One configuration with its memory and time per step, and why it fails (if it does)."""

    config: Config
    memory: dict[str, float]
    time: dict[str, float]
    reason: str | None = None

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
    return Estimate(config, mem, time, reason)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def search(
    model: ModelShape,
    gpus: int,
    global_batch: int,
    hardware: Hardware = Hardware(),
    precision: str | Precision = "bf16-mixed",
) -> dict[str, list]:
    """Enumerate layouts of `model` on `gpus` GPUs for `global_batch` sequences per step.

    Returns {"feasible": [Estimate, ...] fastest first, "rejected": [(Config | dict, reason)]}.
    Every layout tried lands in exactly one list. With pp = 1 the schedule does not matter
    (plain gradient accumulation), so only "1f1b" is tried; with dp = 1 only ZeRO-0.
    """
    _positive_int(gpus, "gpus")
    _positive_int(global_batch, "global_batch")
    prec = get_precision(precision)
    feasible: list[Estimate] = []
    rejected: list[tuple[object, str]] = []
    for tp in _divisors(gpus):
        for pp in _divisors(gpus // tp):
            dp = gpus // (tp * pp)
            where = {"tp": tp, "pp": pp, "dp": dp}
            if model.heads % tp:
                rejected.append((where, f"tp={tp} does not divide heads={model.heads}"))
                continue
            if tp > hardware.gpus_per_node:
                rejected.append(
                    (
                        where,
                        f"tp={tp} > {hardware.gpus_per_node} GPUs per node: tensor parallelism "
                        "needs the fast links inside a node",
                    )
                )
                continue
            if model.layers % pp:
                rejected.append((where, f"pp={pp} does not divide layers={model.layers}"))
                continue
            if global_batch % dp:
                rejected.append((where, f"dp={dp} does not divide global batch={global_batch}"))
                continue
            for b in MICROBATCH_SIZES:
                if (global_batch // dp) % b:
                    rejected.append(
                        (
                            {**where, "microbatch_size": b},
                            f"micro-batch size {b} does not divide the {global_batch // dp} "
                            "sequences per replica",
                        )
                    )
                    continue
                m = global_batch // (dp * b)
                schedules = SCHEDULES if pp > 1 else ("1f1b",)
                for schedule, zero, recompute in itertools.product(
                    schedules, ZERO_STAGES if dp > 1 else (0,), RECOMPUTE
                ):
                    v = SEARCH_CHUNKS if schedule in LOOPING else 1
                    config = Config(
                        tp, pp, dp, b, m, schedule, v, zero, recompute, sequence_parallel=tp > 1
                    )
                    if model.layers % (pp * v):
                        rejected.append(
                            (
                                config,
                                f"{schedule} with {v} chunks needs layers divisible by {pp * v}",
                            )
                        )
                        continue
                    try:
                        estimate = evaluate(model, config, prec, hardware)
                    except CourseInputError as exc:  # e.g. the schedule's own rules on m
                        rejected.append((config, str(exc)))
                        continue
                    if estimate.fits:
                        feasible.append(estimate)
                    else:
                        rejected.append((config, estimate.reason))
    feasible.sort(key=lambda e: (e.time["total"], e.memory["total"]))
    return {"feasible": feasible, "rejected": rejected}


def search_to_dict(result: dict[str, list], limit: int | None = None) -> dict[str, list]:
    """The JSON shape of `python -m course_utils plan search --json`."""

    def config_dict(config) -> dict:
        return asdict(config) if isinstance(config, Config) else dict(config)

    feasible = result["feasible"][:limit] if limit else result["feasible"]
    return {
        "feasible": [e.to_dict() for e in feasible],
        "rejected": [{"config": config_dict(c), "reason": r} for c, r in result["rejected"]],
    }


# --------------------------------------------------------------------------- text and charts


def format_memory(mem: dict[str, float], limit_gib: float | None = None) -> str:
    lines = [f"{key:<12} {mem[key] / GIB:9.2f} GiB" for key in mem]
    if limit_gib is not None:
        verdict = "fits" if mem["total"] <= limit_gib * GIB else "does NOT fit"
        lines.append(f"{'GPU memory':<12} {limit_gib:9.2f} GiB  -> {verdict}")
    return "\n".join(lines)


def format_time(parts: dict[str, float]) -> str:
    total = parts["total"]
    return "\n".join(
        f"{key:<8} {value:9.3f} s" + (f"  ({100 * value / total:4.1f}%)" if key != "total" else "")
        for key, value in parts.items()
    )


MEMORY_PARTS = ("parameters", "gradients", "optimizer", "activations")
TIME_PARTS = ("compute", "bubble", "dp_comm", "tp_comm", "pp_comm")


def draw_plan(estimate: Estimate, hardware: Hardware = Hardware(), title: str | None = None):
    """Two charts: stacked memory bar against the GPU's memory, and the step-time breakdown."""
    import matplotlib.pyplot as plt

    fig, (ax_mem, ax_time) = plt.subplots(1, 2, figsize=(10, 3.6))
    bottom = 0.0
    for part in MEMORY_PARTS:
        value = estimate.memory[part] / GIB
        ax_mem.bar(["per GPU"], [value], bottom=bottom, label=part)
        bottom += value
    ax_mem.axhline(hardware.gpu_memory_gib, color="black", ls="--", label="GPU memory")
    ax_mem.set_ylabel("GiB")
    ax_mem.set_title("Memory per GPU")
    ax_mem.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax_mem.set_ylim(0, max(bottom, hardware.gpu_memory_gib) * 1.15)

    left = 0.0
    for part in TIME_PARTS:
        value = estimate.time[part]
        ax_time.barh(["step"], [value], left=left, label=part)
        left += value
    ax_time.set_xlabel("seconds per step")
    ax_time.set_title(f"Step time {estimate.time['total']:.2f} s")
    ax_time.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=5)
    verdict = "fits" if estimate.fits else "does not fit"
    fig.suptitle(title or f"{estimate.config.short()}  ({verdict})", fontsize=10)
    fig.tight_layout()
    return fig


def describe(estimate: Estimate, hardware: Hardware = Hardware()) -> str:
    """The text fallback of the widget: memory and time breakdowns, and the verdict."""
    lines = [estimate.config.short(), "", format_memory(estimate.memory, hardware.gpu_memory_gib)]
    lines += ["", format_time(estimate.time)]
    if estimate.reason:
        lines += ["", f"does not fit: {estimate.reason}"]
    return "\n".join(lines)


def planner_widget(global_batch: int = 512, hardware: Hardware = Hardware()):
    """Sliders for model size, GPUs and parallel degrees; a stacked memory bar and step time.

    Prints the same numbers as text, so the notebook reads well without a widget frontend.
    """
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    from course_utils.display import WithFallback

    try:
        from course_utils.style import use_course_style

        use_course_style()
    except ImportError:
        pass

    style = {"description_width": "110px"}
    size = widgets.SelectionSlider(
        options=list(MODEL_PRESETS), value="30B", description="model", style=style
    )
    gpus = widgets.SelectionSlider(
        options=[8, 16, 32, 64, 128, 256, 512], value=8, description="GPUs", style=style
    )
    tp = widgets.SelectionSlider(options=[1, 2, 4, 8], value=8, description="tensor (tp)")
    pp = widgets.SelectionSlider(options=[1, 2, 4, 8, 16], value=1, description="pipeline (pp)")
    b = widgets.SelectionSlider(options=list(MICROBATCH_SIZES), value=1, description="micro-batch")
    schedule = widgets.Dropdown(options=list(SCHEDULES), value="1f1b", description="schedule")
    zero = widgets.IntSlider(value=1, min=0, max=3, description="ZeRO stage")
    recompute = widgets.Dropdown(
        options=list(RECOMPUTE), value="selective", description="recompute"
    )
    precision = widgets.Dropdown(
        options=list(PRECISIONS), value="bf16-mixed", description="precision"
    )
    for w in (tp, pp, b, schedule, zero, recompute, precision):
        w.style = style
    out = widgets.Output()

    def update(*_) -> None:
        with out:
            out.clear_output(wait=True)
            try:
                estimate = estimate_from_sliders(
                    size.value, gpus.value, tp.value, pp.value, b.value, schedule.value,
                    zero.value, recompute.value, precision.value, global_batch, hardware,
                )  # fmt: skip
            except CourseInputError as exc:
                print(f"not a valid layout: {exc}")
                return
            fig = draw_plan(estimate, hardware)
            plt.show(fig)
            print(describe(estimate, hardware))

    controls = (size, gpus, tp, pp, b, schedule, zero, recompute, precision)
    for w in controls:
        w.observe(update, names="value")
    ui = widgets.VBox([widgets.HBox([widgets.VBox(controls[:5]), widgets.VBox(controls[5:])]), out])
    display(WithFallback(ui, _planner_fallback_text(controls, global_batch, hardware)))
    update()
    return ui


def _planner_fallback_text(controls, global_batch: int, hardware: Hardware) -> str:
    """What the planner widget shows at its starting values, as text."""
    try:
        estimate = estimate_from_sliders(*(c.value for c in controls), global_batch, hardware)
    except CourseInputError as exc:
        return f"Planner (widgets not shown here): not a valid layout: {exc}"
    return "Planner at its starting values (widgets not shown here):\n" + describe(
        estimate, hardware
    )


def estimate_from_sliders(
    size: str,
    gpus: int,
    tp: int,
    pp: int,
    microbatch_size: int,
    schedule: str,
    zero: int,
    recompute: str,
    precision: str,
    global_batch: int = 512,
    hardware: Hardware = Hardware(),
) -> Estimate:
    """The widget's arithmetic, callable without widgets (dp = gpus / (tp pp))."""
    if size not in MODEL_PRESETS:
        raise CourseInputError(f"size must be one of {', '.join(MODEL_PRESETS)}, got {size!r}")
    if gpus % (tp * pp):
        raise CourseInputError(f"tp x pp = {tp * pp} must divide gpus={gpus}")
    dp = gpus // (tp * pp)
    if global_batch % (dp * microbatch_size):
        raise CourseInputError(
            f"dp x micro-batch size = {dp * microbatch_size} must divide the global batch "
            f"({global_batch})"
        )
    m = global_batch // (dp * microbatch_size)
    chunks = SEARCH_CHUNKS if schedule in LOOPING and pp > 1 else 1
    config = Config(tp, pp, dp, microbatch_size, m, schedule, chunks, zero, recompute, tp > 1)
    return evaluate(MODEL_PRESETS[size], config, precision, hardware)


# --------------------------------------------------------------------------- command line


def _add_model_args(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("--params", required=True, help="parameter count: 7.5e9, 30B, 70B ...")
    parser.add_argument("--layers", type=int, required=required, help="transformer layers L")
    parser.add_argument("--hidden", type=int, required=required, help="hidden size h")
    parser.add_argument("--heads", type=int, required=required, help="attention heads a")
    parser.add_argument("--seq", type=int, required=required, help="sequence length s")
    parser.add_argument("--precision", choices=list(PRECISIONS), default="bf16-mixed")
    parser.add_argument("--json", action="store_true", help="print JSON (bytes, seconds)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="what", required=True, metavar="{memory,search}")
    mem = sub.add_parser("memory", help="memory per GPU of one configuration")
    _add_model_args(mem, required=False)
    mem.add_argument("--microbatch-size", type=int, default=1, help="sequences per micro-batch b")
    mem.add_argument("--microbatches", type=int, default=None, help="per replica (default: pp)")
    mem.add_argument("--tp", type=int, default=1)
    mem.add_argument("--pp", type=int, default=1)
    mem.add_argument("--dp", type=int, default=1)
    mem.add_argument("--zero", type=int, choices=ZERO_STAGES, default=0)
    mem.add_argument("--recompute", choices=RECOMPUTE, default="none")
    mem.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    mem.add_argument("--chunks", type=int, default=1, help="virtual stages per device")
    mem.add_argument("--sequence-parallel", action="store_true", help="shard LayerNorm/dropout")
    mem.add_argument("--gpu-memory-gib", type=float, default=None, help="say whether it fits")

    srch = sub.add_parser("search", help="rank every layout that fits, explain the rest")
    _add_model_args(srch, required=True)
    srch.add_argument("--global-batch", type=int, required=True, help="sequences per step")
    srch.add_argument("--gpus", type=int, required=True)
    srch.add_argument("--gpu-memory-gib", type=float, required=True)
    srch.add_argument("--gpus-per-node", type=int, default=Hardware.gpus_per_node)
    srch.add_argument("--peak-tflops", type=float, default=Hardware.peak_tflops_bf16)
    srch.add_argument("--efficiency", type=float, default=Hardware.efficiency)
    srch.add_argument("--intra-node-gbs", type=float, default=Hardware.intra_node_gbs)
    srch.add_argument("--inter-node-gbs", type=float, default=Hardware.inter_node_gbs)
    srch.add_argument("--top", type=int, default=10, help="feasible rows to print (text mode)")


def _shape_from_args(args) -> ModelShape | int:
    params = parse_count(args.params, "--params")
    given = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "seq")}
    if all(v is None for v in given.values()):
        return params
    missing = [f"--{k}" for k, v in given.items() if v is None]
    if missing:
        raise CourseInputError(
            f"activations need --layers, --hidden, --heads and --seq together; missing "
            f"{', '.join(missing)}"
        )
    for key, value in given.items():
        _positive_int(value, f"--{key}")
    if args.hidden % args.heads:
        raise CourseInputError(f"--heads ({args.heads}) must divide --hidden ({args.hidden})")
    return ModelShape(params, args.layers, args.hidden, args.heads, args.seq)


def _positive(value: float, what: str) -> float:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise CourseInputError(f"{what} must be a positive number, got {value!r}")
    return value


def run(args) -> int:
    model = _shape_from_args(args)
    if args.what == "memory":
        pp = _positive_int(args.pp, "--pp")
        config = Config(
            tp=_positive_int(args.tp, "--tp"),
            pp=pp,
            dp=_positive_int(args.dp, "--dp"),
            microbatch_size=_positive_int(args.microbatch_size, "--microbatch-size"),
            microbatches=_positive_int(args.microbatches or pp, "--microbatches"),
            schedule=args.schedule,
            chunks=_positive_int(args.chunks, "--chunks"),
            zero=args.zero,
            recompute=args.recompute,
            sequence_parallel=args.sequence_parallel,
        )
        mem = memory(model, config, args.precision)
        if args.json:
            print(json.dumps({"bytes": mem, "config": asdict(config)}, indent=2))
        else:
            print(config.short() + f" precision={args.precision}")
            if not isinstance(model, ModelShape):
                print("(activations not estimated: give --layers --hidden --heads --seq)")
            print(format_memory(mem, args.gpu_memory_gib))
        return 0

    if not isinstance(model, ModelShape):  # argparse makes the shape required for search
        raise CourseInputError("search needs --layers, --hidden, --heads and --seq")
    hardware = Hardware(
        gpu_memory_gib=_positive(args.gpu_memory_gib, "--gpu-memory-gib"),
        gpus_per_node=_positive_int(args.gpus_per_node, "--gpus-per-node"),
        peak_tflops_bf16=_positive(args.peak_tflops, "--peak-tflops"),
        efficiency=_positive(args.efficiency, "--efficiency"),
        intra_node_gbs=_positive(args.intra_node_gbs, "--intra-node-gbs"),
        inter_node_gbs=_positive(args.inter_node_gbs, "--inter-node-gbs"),
    )
    if hardware.efficiency > 1:
        raise CourseInputError(f"--efficiency must be in (0, 1], got {args.efficiency}")
    gpus = _positive_int(args.gpus, "--gpus")
    batch = _positive_int(args.global_batch, "--global-batch")
    result = search(model, gpus, batch, hardware, args.precision)
    if args.json:
        print(json.dumps(search_to_dict(result)))
        return 0
    feasible, rejected = result["feasible"], result["rejected"]
    tokens = batch * model.seq
    print(f"{len(feasible)} layouts fit, {len(rejected)} do not ({gpus} GPUs).")
    for rank, est in enumerate(feasible[: args.top], 1):
        print(
            f"{rank:3d}. {est.config.short():<72} {est.memory['total'] / GIB:6.1f} GiB "
            f"{est.time['total']:8.3f} s/step {tokens / est.time['total']:10.0f} tokens/s"
        )
    if rejected:
        print("examples of rejected layouts:")
        seen: set[str] = set()
        for config, reason in rejected:
            kind = reason.split(" ")[0] + reason.split(" ")[-1]
            if kind in seen:
                continue
            seen.add(kind)
            label = config.short() if isinstance(config, Config) else str(config)
            print(f"  {label}: {reason}")
            if len(seen) >= 6:
                break
    return 0
