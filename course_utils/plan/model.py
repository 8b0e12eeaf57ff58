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

from dataclasses import dataclass, field

from course_utils import validation
from course_utils.plan.gpu_memory import _bubble, _memory, _model_states, memory
from course_utils.plan.inputs import (
    GIB,
    MAX_PARAMS,
    RECOMPUTE,
    Config,
    Hardware,
    ModelShape,
    Precision,
    check_config,
    check_layout,
    check_sizes,
    get_precision,
)
from course_utils.plan.network import Traffic, _communication, data_parallel_collectives

# --------------------------------------------------------------------------- FLOPs


def _flops_per_token(model: ModelShape | int, recompute: str, cp: int = 1) -> tuple[float, float]:
    """(forward FLOPs per token, extra FLOPs per token that recomputation adds).

    With context parallelism the ring rebuilds each block's attention probabilities in the
    backward (it keeps no scores), so the attention core is recomputed even with "none".
    """
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
    if not isinstance(model, ModelShape):
        validation.number(model, "model (a ModelShape or a parameter count)", 1, MAX_PARAMS)
    tokens = validation.number(tokens, "tokens", 0, MAX_TOKENS)
    validation.choice(recompute, "recompute", RECOMPUTE)
    check_sizes(cp=cp)
    return _training_flops(model, tokens, recompute, cp)


def _training_flops(model: ModelShape | int, tokens: float, recompute: str, cp: int) -> float:
    forward, extra = _flops_per_token(model, recompute, cp)
    return tokens * (3 * forward + extra)


# --------------------------------------------------------------------------- time per step

MAX_TOKENS = 1e18  # tokens of one step (10^8 sequences of 10^7 tokens, the planner's limits)
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
    check_inputs(model, config, hardware)
    return _step_time(model, config, prec, hardware, _communication(model, config, prec))


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
    bubble_frac = _bubble(config.schedule, config.pp, config.microbatches, config.chunks)
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
    check_inputs(model, config, hardware)
    seconds = validation.number(seconds, "seconds", 1e-9, 1e12)
    return _utilisation(model, config, seconds, prec, hardware)


def _utilisation(
    model: ModelShape, config: Config, seconds: float, prec: Precision, hardware: Hardware
) -> dict[str, float]:
    tokens = config.global_batch * model.seq
    capacity = config.gpus * hardware.peak_flops(prec) * seconds
    return {
        "mfu": _training_flops(model, tokens, "none", 1) / capacity,
        "hfu": _training_flops(model, tokens, config.recompute, config.cp) / capacity,
    }


def check_inputs(model: object, config: object, hardware: object) -> None:
    """A ModelShape, a Config that can be built for it, and a Hardware, else one line."""
    validation.instance(model, "model", ModelShape)
    check_config(model, config)  # type: ignore[arg-type]  # it checks that it is a Config
    validation.instance(hardware, "hardware", Hardware)


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
    check_inputs(model, config, hardware)
    return _estimate(model, config, prec, hardware, memory(model, config, prec))


def fit_or_reason(
    model: ModelShape,
    config: Config,
    precision: str | Precision = "bf16-mixed",
    hardware: Hardware = Hardware(),
) -> Estimate | str:
    """`evaluate`'s Estimate for a layout that fits; for one that does not, only the reason,
    without its traffic and step time (most of the layouts a search tries do not fit). For
    the search, which checked `model` and `hardware` and built `config`: only the layout's
    rules are checked (`check_layout`)."""
    prec = get_precision(precision)
    check_layout(model, config)
    states = _model_states(model, config, prec)  # states alone too big: no pipeline to size
    if sum(states.values()) > hardware.usable_gib * GIB:
        return str(_why_not({**states, "total": sum(states.values())}, config, hardware))
    mem = _memory(model, config, prec)
    reason = _why_not(mem, config, hardware)
    return reason if reason is not None else _estimate(model, config, prec, hardware, mem)


def _estimate(
    model: ModelShape, config: Config, prec: Precision, hardware: Hardware, mem: dict[str, float]
) -> Estimate:
    comm = _communication(model, config, prec)
    time = _step_time(model, config, prec, hardware, comm)
    use = _utilisation(model, config, time["total"], prec, hardware)
    sent = {kind: c.bytes for kind, c in comm.items()}
    return Estimate(config, mem, time, _why_not(mem, config, hardware), sent, use)
