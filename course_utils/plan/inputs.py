"""The planner's inputs: precisions, model shapes, a parallel layout (`Config`), hardware.

Also `check_config`, which says in one line why a layout cannot be built for a model.
Nothing here imports torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import RECOMMENDED
from course_utils.pipeline.schedules import SCHEDULES as REGISTRY

GIB = 2**30
# The planner's schedules: every registered schedule that splits the batch into micro-batches.
SCHEDULES = tuple(name for name, info in REGISTRY.items() if info.microbatched)
LOOPING = tuple(name for name in SCHEDULES if REGISTRY[name].uses_chunks)  # v > 1 allowed
RECOMPUTE = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)
MICROBATCH_SIZES = (1, 2, 4, 8)
SEARCH_CHUNKS = 2  # virtual stages per device tried for the looping schedules


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
    schedule: str = RECOMMENDED
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
    if config.pp > 1 and (
        problem := REGISTRY[config.schedule].shape_rule(
            config.pp, config.microbatches, config.chunks
        )
    ):
        raise CourseInputError(problem.replace("devices", "pp"))
    if model is None:
        return
    if model.heads % config.tp:
        raise CourseInputError(f"tp={config.tp} must divide the number of heads ({model.heads})")
    chunks = REGISTRY[config.schedule].chunks(config.chunks)
    if model.layers % (config.pp * chunks):
        raise CourseInputError(
            f"pp x chunks = {config.pp * chunks} must divide the number of layers ({model.layers})"
        )
