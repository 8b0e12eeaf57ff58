"""The planner's inputs: precisions, model shapes, a parallel layout (`Config`), hardware.

Also `check_config`, which says in one line why a layout cannot be built for a model, and
the named GPU presets (`HARDWARE_PRESETS`) lessons 07, 12 and 13 share.
Nothing here imports torch.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field, fields, replace

from course_utils import validation
from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import RECOMMENDED
from course_utils.pipeline.schedules import SCHEDULES as REGISTRY

GIB = 2**30  # the planner's memory unit (GPU memory is sold and reported in GiB)
GB = 1e9  # the papers' unit (the ZeRO paper's 120 / 31.4 / 16.6 / 1.9 GB are 10^9 bytes)
# The planner's schedules: every registered schedule that splits the batch into micro-batches.
PLANNED_SCHEDULES = tuple(name for name, info in REGISTRY.items() if info.microbatched)
LOOPING = tuple(name for name in PLANNED_SCHEDULES if REGISTRY[name].uses_chunks)  # v > 1 allowed
RECOMPUTE = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)
MICROBATCH_SIZES = (1, 2, 4, 8)
SEARCH_CHUNKS = 2  # virtual stages per device tried for the looping schedules
# Context parallelism is searched only while every GPU keeps at least this many tokens of a
# sequence: with shorter blocks a ring step's compute (quadratic in the block) no longer
# hides the K/V transfer (linear in it), the condition of Liu et al. 2023 (arXiv 2310.01889).
MIN_CP_TOKENS = 1024

# What the planner computes with, bounded so that every figure it derives stays finite (and a
# search stays a second or two): no model over a quadrillion parameters, no dimension over
# ten million, no layout's degree over the GPUs a search may use.
MAX_PARAMS = 10**15
MAX_SHAPE = 10**7  # layers, hidden, heads, seq, vocab, experts, ffn_hidden, head_dim
MAX_MICROBATCH_SIZE = 10**4  # sequences per micro-batch
MAX_MICROBATCHES = 10**8  # micro-batches per replica (a global batch of at most 10^8)
MAX_CHUNKS = 64  # virtual stages per device
MAX_PP = 1024  # pipeline stages a search tries (and `plan memory --pp` allows)
MAX_SIMULATED = 200_000  # actions of a pipeline the planner simulates (where no formula holds)
# The integer arguments of the planner's functions and their ranges (`check_sizes`).
SIZES = {
    "seq": (1, MAX_SHAPE), "hidden": (1, MAX_SHAPE), "heads": (1, MAX_SHAPE),
    "head_dim": (1, MAX_SHAPE), "layers": (1, MAX_SHAPE), "vocab": (1, MAX_SHAPE),
    "experts": (1, MAX_SHAPE), "top_k": (1, MAX_SHAPE), "ffn_hidden": (0, MAX_SHAPE),
    "tp": (1, validation.MAX_GPUS), "cp": (1, validation.MAX_GPUS),
    "pp": (1, validation.MAX_GPUS), "dp": (1, validation.MAX_GPUS),
    "ep": (1, validation.MAX_GPUS), "gpus": (1, validation.MAX_GPUS),
    "microbatch_size": (1, MAX_MICROBATCH_SIZE), "batch": (1, MAX_MICROBATCH_SIZE),
    "microbatches": (1, MAX_MICROBATCHES), "chunks": (1, MAX_CHUNKS),
    "global_batch": (1, MAX_MICROBATCHES), "bytes_per_value": (1, 8),
}  # fmt: skip


def check_sizes(**values: object) -> None:
    """Each keyword an integer in its range of `SIZES`, else one line naming it."""
    for name, value in values.items():
        validation.integer(value, name, *SIZES[name])


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
# With gradient accumulation over micro-batches Megatron-LM sums the gradients of its bf16
# weights in an fp32 `main_grad` buffer and keeps fp32 master weights in the optimizer: a
# gradient costs 4 bytes, 2 + 4 + 12 = 18 in all ("bf16-mixed-fp32-grads"). FSDP2 is not that
# case: `fully_shard` keeps each sharded parameter in its original dtype and the optimizer
# steps on it, so fp32 parameters with MixedPrecisionPolicy(param_dtype=bfloat16,
# reduce_dtype=float32) hold 4 + 4 + 8 = 16 bytes per parameter, with no separate master copy
# (the bf16 copy lives only while a layer is gathered; tests/test_distributed.py measures it).
PRECISIONS = {
    "bf16-mixed": Precision("bf16-mixed", 2, 2, 12, 2, "bf16"),
    "bf16-mixed-fp32-grads": Precision("bf16-mixed-fp32-grads", 2, 4, 12, 2, "bf16"),
    "fp32": Precision("fp32", 4, 4, 8, 4, "fp32"),
}


def get_precision(precision: str | Precision) -> Precision:
    if isinstance(precision, Precision):
        return precision
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise CourseInputError(
            f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}"
        )
    return PRECISIONS[precision]


_SUFFIX = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_count(text: str | int | float, what: str = "params") -> int:
    """Read a count like 7500000000, 7.5e9, 30B, 70B or 175B (K, M, B/G, T suffixes), from 1 to
    `MAX_PARAMS` (a number of any kind: int, float, numpy's)."""
    allowed = f"a positive number up to {MAX_PARAMS:.0e} like 7.5e9 or 70B"
    if isinstance(text, bool) or not isinstance(text, numbers.Real | str):
        raise CourseInputError(f"{what} must be {allowed}, got {validation.shown(text)}")
    if isinstance(text, numbers.Real):
        value = float(text)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtT]?)\s*", text)
        if not match:
            raise CourseInputError(
                f"{what} must be a positive number like 7500000000, 7.5e9, 30B or 70B, got {text!r}"
            )
        value = float(match.group(1)) * _SUFFIX[match.group(2).upper()]
    if not math.isfinite(value) or not 1 <= value <= MAX_PARAMS:
        raise CourseInputError(f"{what} must be {allowed}, got {validation.shown(text)}")
    return int(round(value))


# A shape's parameter count may differ from its layers' count (embeddings, biases, rounding)
# by at most this factor; beyond it, one of the two numbers is a typo.
PARAMS_TOLERANCE = 2.0


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer: parameter count and the shape the activations depend on.

    Dense by default: every layer has attention (4 h^2 weights) and an MLP of hidden size
    `ffn_hidden` (0 means 4 h; 2 h f weights), 12 h^2 per layer in all. With `experts` E > 1
    every layer's MLP is a mixture of E experts of that size, each token routed to `top_k` of
    them (Shazeer et al. 2017, arXiv 1701.06538; counted like `parallel.moe.expert_params`),
    and `capacity_factor` pads each expert's token buffer (Switch, arXiv 2101.03961).
    `kv_heads` is the number of key/value heads (0 means `heads`: multi-head attention; fewer
    is grouped-query attention, Ainslie et al. 2023, arXiv 2305.13245): it sets the size of
    the ring's K/V blocks and the Ulysses limit. Its few K/V weights are not counted apart
    (4 h^2 per layer stays the attention's count, a safe side). `params` counts everything
    (all experts); it must agree with the shape within 2x.
    """

    params: int
    layers: int
    hidden: int
    heads: int
    seq: int = 2048
    vocab: int = 51200  # GPT-2's 50257 padded to a multiple of 1024, as Megatron-LM does
    experts: int = 1
    top_k: int = 1
    ffn_hidden: int = 0
    capacity_factor: float = 1.0
    kv_heads: int = 0  # 0: as many as `heads` (multi-head attention)

    def __post_init__(self) -> None:
        names = ("layers", "hidden", "heads", "seq", "vocab", "experts", "top_k", "ffn_hidden")
        check_sizes(**{name: getattr(self, name) for name in names})
        if self.hidden % self.heads:
            raise CourseInputError(f"heads ({self.heads}) must divide hidden ({self.hidden})")
        validation.integer(self.kv_heads, "kv_heads (0: as many as heads)", 0, self.heads)
        if self.kv_heads and self.heads % self.kv_heads:
            raise CourseInputError(f"kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        if self.top_k > self.experts:
            raise CourseInputError(
                f"top_k ({self.top_k}) cannot exceed the number of experts ({self.experts})"
            )
        cf = self.capacity_factor
        if isinstance(cf, bool) or not isinstance(cf, int | float) or not 1 <= cf <= 64:
            raise CourseInputError(f"capacity_factor must be a number from 1 to 64, got {cf!r}")
        p = validation.number(self.params, "params", 1, MAX_PARAMS)
        if problem := params_disagree(p, self):
            raise CourseInputError(problem)

    @property
    def ffn(self) -> int:
        """The MLP's (each expert's) hidden size f."""
        return self.ffn_hidden or 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def key_value_heads(self) -> int:
        """The K/V heads: `kv_heads`, or all `heads` for multi-head attention."""
        return self.kv_heads or self.heads

    def kv_heads_per_gpu(self, tp: int) -> int:
        """K/V heads one tensor-parallel GPU holds: kv_heads / tp, or 1 when tp is a multiple
        of kv_heads (each K/V head copied to tp / kv_heads GPUs); else a one-line error."""
        kv = self.key_value_heads
        if kv % tp == 0:
            return kv // tp
        if tp % kv == 0:
            return 1
        raise CourseInputError(
            f"tp={tp} must divide the {kv} K/V heads or be a multiple of them (each "
            "tensor-parallel GPU holds whole K/V heads)"
        )

    def ulysses_problem(self, tp: int, cp: int) -> str | None:
        """Why Ulysses cannot run over cp GPUs after tensor parallelism tp, or None.

        The course's Ulysses gives each GPU of the all-to-all an equal share of whole heads,
        so cp must divide the K/V heads of a tensor-parallel GPU (and so its query heads):
        with grouped-query attention the K/V heads are the limit, as lesson 09 shows.
        """
        kv = self.kv_heads_per_gpu(tp)
        if kv % cp == 0:
            return None
        what = ("K/V " if self.key_value_heads < self.heads else "") + "head" + "s" * (kv > 1)
        return (
            f"cp={cp} must divide the {kv} {what} of a tensor-parallel GPU for Ulysses (each "
            "GPU of the all-to-all computes whole heads)"
        )

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @property
    def expert_params_per_layer(self) -> int:
        """One layer's experts: E x (2 h f + f + h), `parallel.moe.expert_params`'s
        `experts_total` with d_model = h. Zero for a dense model (its MLP is dense)."""
        if not self.is_moe:
            return 0
        h, f = self.hidden, self.ffn
        return self.experts * (2 * h * f + f + h)

    @property
    def expert_params(self) -> int:
        """All experts of all layers: the parameters expert parallelism shards."""
        return self.layers * self.expert_params_per_layer

    @property
    def dense_params(self) -> float:
        """Everything else (attention, norms, router, embeddings): replicated over `ep`."""
        return self.params - self.expert_params

    @property
    def active_params(self) -> float:
        """Parameters one token uses: the dense part and `top_k` of the E experts."""
        if not self.is_moe:
            return self.params
        return self.dense_params + self.top_k * self.expert_params / self.experts

    def layer_params(self) -> float:
        """What the layer weights alone add up to: L (4 h^2 + 2 h f) for a dense model, i.e.
        12 L h^2 with f = 4 h (Narayanan et al. 2021, arXiv 2104.04473, Section 5.1, without
        the embedding and the small terms); MoE: L (4 h^2 + E (2 h f + f + h) + h E + E)."""
        h = self.hidden
        per_layer = 4 * h * h
        if self.is_moe:
            per_layer += self.expert_params_per_layer + h * self.experts + self.experts
        else:
            per_layer += 2 * h * self.ffn
        return self.layers * per_layer


def params_disagree(params: float, shape: ModelShape) -> str | None:
    """Why `params` cannot be this shape's parameter count (off by more than 2x), or None."""
    params = validation.number(params, "params", 1, MAX_PARAMS)
    validation.instance(shape, "shape", ModelShape)
    expected = shape.layer_params()
    if params / expected <= PARAMS_TOLERANCE and expected / params <= PARAMS_TOLERANCE:
        return None
    L, h = shape.layers, shape.hidden
    formula = (
        f"12 x L x h^2 = 12 x {L} x {h}^2 = {expected / 1e9:.3g}B"
        if not shape.is_moe and shape.ffn == 4 * h
        else f"the layers' weights add up to {expected / 1e9:.3g}B"
    )
    return (
        f"params {params / 1e9:.4g}B disagrees with the shape: {formula}, "
        f"{max(params / expected, expected / params):.1f}x apart (more than "
        f"{PARAMS_TOLERANCE:g}x); check params, layers and hidden"
    )


# Shapes in the style of GPT-3 (Brown et al. 2020, arXiv 2005.14165, Table 2.1), multi-head
# attention like GPT-3's; the 30B row is the course's own round shape (about 12 * layers *
# hidden^2 parameters). The 70B row has Llama 2 70B's layers, hidden size and attention, 64
# query heads sharing 8 K/V heads (Touvron et al. 2023, arXiv 2307.09288), with the course's
# 4 h MLP. The MoE row is the course's own too: the 6.7B model's shape with 8 experts in place
# of each MLP, 2 per token (Mixtral's pattern, Jiang et al. 2024, arXiv 2401.04088): 36.7B
# parameters (34.4B of them experts), of which 10.9B are used per token.
MODEL_PRESETS = {
    "1.3B": ModelShape(1_300_000_000, 24, 2048, 16),
    "6.7B": ModelShape(6_700_000_000, 32, 4096, 32),
    "13B": ModelShape(13_000_000_000, 40, 5120, 40),
    "30B": ModelShape(30_000_000_000, 48, 7168, 56),
    "70B": ModelShape(70_000_000_000, 80, 8192, 64, kv_heads=8),
    "175B": ModelShape(175_000_000_000, 96, 12288, 96),
    "8x6.7B-MoE": ModelShape(
        36_700_000_000, 32, 4096, 32, experts=8, top_k=2, capacity_factor=1.25
    ),
}


# How context parallelism moves attention's data (lesson 09): the ring passes K/V blocks
# (Liu et al. 2023, arXiv 2310.01889); Ulysses turns the sequence split into a head split
# with all-to-alls (Jacobs et al. 2023, arXiv 2309.14509).
CP_KINDS = ("ring", "ulysses")


@dataclass(frozen=True)
class Config:
    """One way to lay a run out on GPUs. `microbatches` is per data-parallel replica.

    GPUs are numbered tensor-parallel innermost, then context-parallel, then pipeline, then
    data-parallel outermost (Megatron-LM's placement, Narayanan et al. 2021): tp x cp
    neighbours share a node first. Expert parallelism (`ep`) splits each MoE layer's experts
    over `ep` of the data-parallel replicas, so ep must divide dp.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    microbatch_size: int = 1
    microbatches: int = 1
    schedule: str = RECOMMENDED
    chunks: int = 1  # virtual stages per device (interleaved, breadth-first)
    zero: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    cp: int = 1  # context parallelism: each sequence split over cp GPUs
    cp_kind: str = "ring"  # how attention crosses them: "ring" (K/V blocks) or "ulysses"
    ep: int = 1  # expert parallelism: each MoE layer's experts split over ep GPUs
    dp_overlap: bool = False  # data-parallel collectives overlapped with compute (buckets)

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def global_batch(self) -> int:
        return self.dp * self.microbatches * self.microbatch_size

    def short(self) -> str:
        sched = self.schedule + (f"(v={self.chunks})" if self.chunks > 1 else "")
        sp = "+sp" if self.sequence_parallel and self.tp > 1 else ""
        cp = f" cp={self.cp}" if self.cp > 1 else ""
        cp += "(ulysses)" if self.cp > 1 and self.cp_kind == "ulysses" else ""
        ep = f" ep={self.ep}" if self.ep > 1 else ""
        overlap = " overlap" if self.dp_overlap and self.dp * self.cp > 1 else ""
        return (
            f"tp={self.tp}{sp}{cp} pp={self.pp} dp={self.dp}{ep} b={self.microbatch_size} "
            f"m={self.microbatches} {sched} zero={self.zero} recompute={self.recompute}{overlap}"
        )


# The reserve: memory a real training process uses beyond what the formulas count. A CUDA
# context with cuBLAS/cuDNN workspaces and NCCL's communication buffers take a fixed amount;
# PyTorch's caching allocator loses a share of the memory to fragmentation. The course's
# stated default: 2 GiB + 5% of the GPU's memory (6 GiB on an 80 GiB GPU, 4 GiB on 40 GiB);
# set `reserve_gib` (CLI: --reserve-gib) from a real run's nvidia-smi / memory_stats.
RESERVE_FIXED_GIB = 2.0
RESERVE_FRACTION = 0.05


# What each number of a `Hardware` may be (the planner's and the runners' flags share these):
# ranges that keep every figure derived from them finite, e.g. no subnormal bandwidth (a
# transfer would last inf seconds) and no efficiency so small that a step never ends.
HARDWARE_RANGES: dict[str, tuple[float, float]] = {
    "gpu_memory_gib": (0.01, 1e6),
    "gpus_per_node": (1, 1024),
    "peak_tflops_bf16": (1e-3, 1e9),
    "peak_tflops_fp32": (1e-3, 1e9),
    "efficiency": (1e-3, 1.0),
    "intra_node_gbs": (1e-3, 1e6),
    "inter_node_gbs": (1e-3, 1e6),
    "latency_us": (0.0, 1e6),
    "reserve_gib": (0.0, 1e6),
}


@dataclass(frozen=True)
class Hardware:
    """A GPU cluster. The defaults are an A100-80GB node (8 GPUs, NVSwitch, one 200 Gb/s
    InfiniBand NIC per GPU); `HARDWARE_PRESETS` names it and others.

    Bandwidths are per GPU and per direction (links are full duplex: a GPU receives as much
    at the same time), the convention of all the planner's traffic: bytes a GPU *sends*.
    `efficiency` is the share of the peak FLOP rate the GPU reaches on the FLOPs it really
    executes, recomputation included: the hardware FLOP utilisation (HFU). The model FLOP
    utilisation (MFU) the planner reports counts only the model's own FLOPs (Chowdhery et al.
    2022, PaLM, arXiv 2204.02311, Appendix B), so with recomputation MFU < HFU.
    """

    gpu_memory_gib: float = 80.0
    gpus_per_node: int = 8
    peak_tflops_bf16: float = 312.0  # dense bf16 tensor-core peak of an A100
    peak_tflops_fp32: float = 19.5  # plain fp32 (no TF32) on the same GPU
    efficiency: float = 0.5  # HFU: share of peak the executed FLOPs reach
    intra_node_gbs: float = 300.0  # GB/s per GPU per direction inside a node (NVLink 3)
    inter_node_gbs: float = 25.0  # GB/s per GPU per direction between nodes (200 Gb/s NIC)
    latency_us: float = 5.0  # per message
    reserve_gib: float | None = None  # None: RESERVE_FIXED_GIB + RESERVE_FRACTION x memory
    name: str = field(default="", compare=False)  # the preset's name, if any

    def __post_init__(self) -> None:
        for key, (low, high) in HARDWARE_RANGES.items():
            if key == "gpus_per_node":
                validation.integer(self.gpus_per_node, key, int(low), int(high))
            elif key != "reserve_gib" or self.reserve_gib is not None:
                validation.number(getattr(self, key), key, low, high)
        if self.reserve_gib is not None and self.reserve_gib >= self.gpu_memory_gib:
            raise CourseInputError(
                f"reserve_gib must be below the GPU's {self.gpu_memory_gib:g} GiB, "
                f"got {self.reserve_gib!r}"
            )
        if self.usable_gib <= 0:
            raise CourseInputError(
                f"gpu_memory_gib {self.gpu_memory_gib:g} leaves nothing usable after the "
                f"default reserve of {self.reserve:.2f} GiB (2 GiB + 5%): give more memory "
                "or a smaller reserve_gib"
            )

    @property
    def reserve(self) -> float:
        """GiB per GPU kept free for what the formulas do not count (see RESERVE_*)."""
        if self.reserve_gib is not None:
            return float(self.reserve_gib)
        return RESERVE_FIXED_GIB + RESERVE_FRACTION * self.gpu_memory_gib

    @property
    def usable_gib(self) -> float:
        """GiB per GPU a plan may fill: the GPU's memory minus the reserve."""
        return self.gpu_memory_gib - self.reserve

    def peak_flops(self, precision: Precision) -> float:
        tflops = self.peak_tflops_bf16 if precision.peak_key == "bf16" else self.peak_tflops_fp32
        return tflops * 1e12

    def bandwidth(self, group_span: int) -> float:
        """Bytes/s of the slowest link of a group spanning `group_span` consecutive GPUs."""
        gbs = self.intra_node_gbs if group_span <= self.gpus_per_node else self.inter_node_gbs
        return gbs * 1e9

    def describe(self) -> str:
        """Every assumption about the hardware, in one paragraph (the planner echoes it)."""
        default = "" if self.reserve_gib is not None else " (default: 2 GiB + 5% of memory)"
        return (
            f"GPU {self.name or 'custom'}: {self.gpu_memory_gib:g} GiB, {self.gpus_per_node} per "
            f"node; peak {self.peak_tflops_bf16:g} TFLOP/s bf16, {self.peak_tflops_fp32:g} fp32; "
            f"efficiency (HFU) {self.efficiency:g}; links per GPU per direction "
            f"{self.intra_node_gbs:g} GB/s inside a node, {self.inter_node_gbs:g} GB/s between "
            f"nodes, {self.latency_us:g} us per message; reserve {self.reserve:.1f} GiB{default}, "
            f"so {self.usable_gib:.1f} GiB usable"
        )


# Named GPUs, from the vendors' data sheets: dense (not sparse) tensor-core peaks, NVLink
# per direction (A100: NVLink 3, 600 GB/s both ways; H100 SXM: NVLink 4, 900 GB/s both ways,
# through NVSwitch: every GPU reaches every other at full speed), one InfiniBand NIC per GPU
# (HDR 200 Gb/s = 25 GB/s in DGX A100; NDR 400 Gb/s = 50 GB/s in DGX H100). The efficiency
# (HFU) 0.5 is the planner's assumption, in the 40-55% that well-tuned runs report
# (Narayanan et al. 2021; Chowdhery et al. 2022).
HARDWARE_PRESETS = {
    "A100-80GB": Hardware(80.0, 8, 312.0, 19.5, 0.5, 300.0, 25.0, name="A100-80GB"),
    "A100-40GB": Hardware(40.0, 8, 312.0, 19.5, 0.5, 300.0, 25.0, name="A100-40GB"),
    "H100-80GB": Hardware(80.0, 8, 989.0, 67.0, 0.5, 450.0, 50.0, name="H100-80GB"),
}
DEFAULT_GPU = "A100-80GB"


def hardware(name: str = DEFAULT_GPU, **changes) -> Hardware:
    """A named preset, optionally changed: `plan.hardware("H100-80GB", gpus_per_node=4)`."""
    validation.choice(name, "GPU", HARDWARE_PRESETS)
    for key in changes:
        validation.choice(key, "a change", [f.name for f in fields(Hardware)])
    return replace(HARDWARE_PRESETS[name], **changes)


def replace_config(config: Config, **changes) -> Config:
    """A copy of `config` with some fields changed: `replace_config(c, recompute="full")`."""
    validation.instance(config, "config", Config)
    for key in changes:
        validation.choice(key, "a change", [f.name for f in fields(Config)])
    return replace(config, **changes)


def check_config(model: ModelShape | None, config: Config) -> None:
    """Raise CourseInputError (one line) if `config` cannot be built for `model`."""
    if model is not None:
        validation.instance(model, "model", ModelShape)
    validation.instance(config, "config", Config)
    names = ("tp", "pp", "dp", "microbatch_size", "microbatches", "chunks", "cp", "ep")
    check_sizes(**{name: getattr(config, name) for name in names})
    validation.choice(config.cp_kind, "cp_kind", CP_KINDS)
    validation.choice(config.schedule, "schedule", PLANNED_SCHEDULES)
    if isinstance(config.zero, bool) or config.zero not in ZERO_STAGES:
        raise CourseInputError(f"zero must be 0, 1, 2 or 3, got {validation.shown(config.zero)}")
    validation.choice(config.recompute, "recompute", RECOMPUTE)
    for name in ("sequence_parallel", "dp_overlap"):
        validation.instance(getattr(config, name), name, bool)
    check_layout(model, config)


def check_layout(model: ModelShape | None, config: Config) -> None:
    """`check_config`'s rules of a layout, for a model and a config already checked (what
    the search asks of each layout it builds)."""
    if config.chunks > 1 and config.schedule not in LOOPING:
        raise CourseInputError(
            f"chunks > 1 needs a looping schedule ({', '.join(LOOPING)}), "
            f"got schedule {config.schedule!r}"
        )
    if config.dp % config.ep:
        raise CourseInputError(
            f"ep={config.ep} must divide dp={config.dp}: expert parallelism splits the experts "
            "over data-parallel replicas"
        )
    if config.pp > 1 and (
        problem := REGISTRY[config.schedule].shape_rule(
            config.pp, config.microbatches, config.chunks
        )
    ):
        raise CourseInputError(problem.replace("devices", "pp"))
    if model is None:
        if config.cp > 1 or config.ep > 1:
            raise CourseInputError("cp and ep need the model's shape (layers, hidden, heads, seq)")
        return
    if model.heads % config.tp:
        raise CourseInputError(f"tp={config.tp} must divide the number of heads ({model.heads})")
    model.kv_heads_per_gpu(config.tp)
    chunks = REGISTRY[config.schedule].chunks(config.chunks)
    if model.layers % (config.pp * chunks):
        raise CourseInputError(
            f"pp x chunks = {config.pp * chunks} must divide the number of layers ({model.layers})"
        )
    if config.cp > 1 and config.cp_kind == "ulysses":
        if problem := model.ulysses_problem(config.tp, config.cp):
            raise CourseInputError(problem)
        if model.seq % config.cp:
            raise CourseInputError(f"cp={config.cp} must divide the sequence length ({model.seq})")
    elif model.seq % (2 * config.cp) and config.cp > 1:
        raise CourseInputError(
            f"2 x cp = {2 * config.cp} must divide the sequence length ({model.seq}): the "
            "load-balanced (zig-zag) split cuts each sequence into 2 cp chunks"
        )
    if config.ep > 1 and not model.is_moe:
        raise CourseInputError(f"ep={config.ep} needs a mixture-of-experts model (experts > 1)")
    if model.experts % config.ep:
        raise CourseInputError(
            f"ep={config.ep} must divide the number of experts ({model.experts})"
        )
    if model.is_moe and config.tp > 1 and not config.sequence_parallel:
        raise CourseInputError(
            "a mixture-of-experts model with tp > 1 needs sequence_parallel=True (as in "
            "Megatron-Core: each tensor-parallel GPU routes its own share of the tokens)"
        )
