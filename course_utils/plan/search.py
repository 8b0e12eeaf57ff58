"""Search every layout of a model on a number of GPUs: what fits, fastest first, and why the
rest does not; the fewest GPUs on which anything fits. Also the planner's text output.
Nothing here imports torch."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import asdict

from course_utils import validation
from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import RECOMMENDED
from course_utils.pipeline.schedules import SCHEDULES as REGISTRY
from course_utils.plan.gpu_memory import model_states
from course_utils.plan.inputs import (
    CP_KINDS,
    GB,
    GIB,
    HARDWARE_RANGES,
    LOOPING,
    MAX_PP,
    MICROBATCH_SIZES,
    MIN_CP_TOKENS,
    PLANNED_SCHEDULES,
    RECOMPUTE,
    SEARCH_CHUNKS,
    ZERO_STAGES,
    Config,
    Hardware,
    ModelShape,
    Precision,
    check_sizes,
    get_precision,
)
from course_utils.plan.model import Estimate, fit_or_reason
from course_utils.validation import MAX_GPUS


def _divisors(n: int) -> list[int]:
    """The divisors of n, ascending (trying up to its square root only)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def context_degrees(model: ModelShape, gpus: int, cp_kind: str = "ring") -> list[int]:
    """The cp values the search tries: dividing the GPUs, at least MIN_CP_TOKENS tokens of a
    sequence per GPU, and 2 cp dividing the sequence for the ring (the zig-zag split) or cp
    dividing it for Ulysses (whose head limit `search` checks with tp)."""
    validation.instance(model, "model", ModelShape)
    check_sizes(gpus=gpus)
    validation.choice(cp_kind, "cp_kind", CP_KINDS)
    split = 1 if cp_kind == "ulysses" else 2
    return [
        c
        for c in _divisors(gpus)
        if c == 1 or (model.seq % (split * c) == 0 and model.seq // c >= MIN_CP_TOKENS)
    ]


def search(
    model: ModelShape,
    gpus: int,
    global_batch: int,
    hardware: Hardware = Hardware(),
    precision: str | Precision = "bf16-mixed",
    dp_overlap: bool = False,
    first_fit: bool = False,
    cp_kind: str = "ring",
) -> dict[str, list]:
    """Enumerate layouts of `model` on `gpus` GPUs for `global_batch` sequences per step.

    Returns {"feasible": [Estimate, ...] fastest first, "rejected": [(Config | dict, reason)]}.
    Every layout tried lands in exactly one list. Tried: tp (dividing the heads, inside a
    node), cp (`context_degrees`), pp (dividing the layers), dp (the rest), ep (MoE models:
    dividing the experts and dp), micro-batch size, schedule, ZeRO stage, recomputation and
    sequence parallelism on and off (always on for MoE with tp > 1). With pp = 1 the schedule
    does not matter (plain gradient accumulation), so only the recommended one is tried;
    with dp x cp = 1 only ZeRO-0. `dp_overlap` applies to every layout. `first_fit` stops at
    the first layout that fits (what `min_gpus` needs). `cp_kind` is how context
    parallelism crosses its GPUs: "ring" or "ulysses" (cp must then divide the K/V heads of
    a tensor-parallel GPU, `ModelShape.ulysses_problem`).
    """
    validation.instance(model, "model", ModelShape)
    check_sizes(gpus=gpus, global_batch=global_batch)  # the plan command's limits
    validation.instance(hardware, "hardware", Hardware)
    prec = get_precision(precision)
    validation.choice(cp_kind, "cp_kind", CP_KINDS)
    for name, flag in (("dp_overlap", dp_overlap), ("first_fit", first_fit)):
        validation.instance(flag, name, bool)
    feasible: list[Estimate] = []
    rejected: list[tuple[Config | dict[str, int], str]] = []
    for tp in _divisors(gpus):
        if model.heads % tp:
            rejected.append(({"tp": tp}, f"tp={tp} does not divide heads={model.heads}"))
            continue
        try:
            model.kv_heads_per_gpu(tp)
        except CourseInputError as exc:
            rejected.append(({"tp": tp}, str(exc)))
            continue
        if tp > hardware.gpus_per_node:
            rejected.append(
                (
                    {"tp": tp},
                    f"tp={tp} > {hardware.gpus_per_node} GPUs per node: tensor parallelism "
                    "needs the fast links inside a node",
                )
            )
            continue
        for cp in context_degrees(model, gpus // tp, cp_kind):
            if cp_kind == "ulysses" and (problem := model.ulysses_problem(tp, cp)):
                rejected.append(({"tp": tp, "cp": cp}, problem))
                continue
            for pp in _divisors(gpus // (tp * cp)):
                dp = gpus // (tp * cp * pp)
                where = {"tp": tp, "cp": cp, "pp": pp, "dp": dp}
                if model.layers % pp:
                    rejected.append((where, f"pp={pp} does not divide layers={model.layers}"))
                    continue
                if pp > MAX_PP:
                    rejected.append((where, f"pp={pp} > the planner's {MAX_PP} pipeline stages"))
                    continue
                if global_batch % dp:
                    rejected.append((where, f"dp={dp} does not divide global batch={global_batch}"))
                    continue
                eps = [e for e in _divisors(math.gcd(dp, model.experts))] if model.is_moe else [1]
                sps = (True,) if tp == 1 or model.is_moe else (True, False)
                for ep, b in itertools.product(eps, MICROBATCH_SIZES):
                    if (global_batch // dp) % b:
                        rejected.append(
                            (
                                {**where, "ep": ep, "microbatch_size": b},
                                f"micro-batch size {b} does not divide the {global_batch // dp} "
                                "sequences per replica",
                            )
                        )
                        continue
                    m = global_batch // (dp * b)
                    schedules = PLANNED_SCHEDULES if pp > 1 else (RECOMMENDED,)
                    zeros = ZERO_STAGES if dp * cp > 1 else (0,)
                    for schedule, zero, recompute, sp in itertools.product(
                        schedules, zeros, RECOMPUTE, sps
                    ):
                        v = SEARCH_CHUNKS if schedule in LOOPING else 1
                        config = Config(
                            tp, pp, dp, b, m, schedule, v, zero, recompute,
                            sequence_parallel=sp and tp > 1, cp=cp, ep=ep, dp_overlap=dp_overlap,
                            cp_kind=cp_kind,
                        )  # fmt: skip
                        chunks = REGISTRY[schedule].chunks(v)
                        if model.layers % (pp * chunks):
                            rejected.append(
                                (
                                    config,
                                    f"{schedule} with {chunks} chunks per device needs layers "
                                    f"divisible by {pp * chunks}",
                                )
                            )
                            continue
                        try:
                            estimate = fit_or_reason(model, config, prec, hardware)
                        except CourseInputError as exc:  # e.g. the schedule's own rules on m
                            rejected.append((config, str(exc)))
                            continue
                        if isinstance(estimate, str):  # it does not fit: the reason
                            rejected.append((config, estimate))
                            continue
                        feasible.append(estimate)
                        if first_fit:
                            return {"feasible": feasible, "rejected": rejected}
    feasible.sort(key=lambda e: (e.time["total"], e.memory["total"]))
    return {"feasible": feasible, "rejected": rejected}


def states_lower_bound(
    model: ModelShape, hardware: Hardware = Hardware(), precision: str | Precision = "bf16-mixed"
) -> int:
    """Fewest GPUs whose usable memory could hold the fully sharded model states (ZeRO-3 over
    all of them): a bound no layout can beat, before activations and buffers."""
    validation.instance(hardware, "hardware", Hardware)
    states = sum(model_states(model, Config(), precision).values())
    return max(1, math.ceil(states / (hardware.usable_gib * GIB)))


def gpu_counts(start: int, gpus_per_node: int, limit: int) -> list[int]:
    """The GPU counts a cluster is rented in, from `start` up to `limit`: 1, 2, 4 ... below
    a node, then whole nodes."""
    validation.integer(start, "start", 1)
    low, high = HARDWARE_RANGES["gpus_per_node"]
    validation.integer(gpus_per_node, "gpus_per_node", int(low), int(high))
    validation.integer(limit, "limit", 1, MAX_GPUS)
    small = [2**k for k in range(gpus_per_node.bit_length()) if 2**k < gpus_per_node]
    counts = [n for n in small if start <= n <= limit]
    first = max(1, math.ceil(start / gpus_per_node))
    return counts + [k * gpus_per_node for k in range(first, limit // gpus_per_node + 1)]


def min_gpus(
    model: ModelShape,
    global_batch: int,
    hardware: Hardware = Hardware(),
    precision: str | Precision = "bf16-mixed",
    limit: int = 4096,
    budget_s: float = 20.0,
) -> int | None:
    """The fewest GPUs on which some layout fits: None if none up to `limit` GPUs, or if
    `budget_s` seconds of searching found none.

    Tries `gpu_counts` from `states_lower_bound` upwards, each with a search that stops at
    the first layout that fits (a count whose layouts cannot divide the layers or the batch
    is rejected at once).
    """
    validation.instance(model, "model", ModelShape)
    check_sizes(global_batch=global_batch)
    validation.integer(limit, "limit", 1, MAX_GPUS)
    validation.number(budget_s, "budget_s", 0, 3600, strict=True)
    began = time.perf_counter()
    start = states_lower_bound(model, hardware, precision)
    for n in gpu_counts(start, hardware.gpus_per_node, limit):
        if search(model, n, global_batch, hardware, precision, first_fit=True)["feasible"]:
            return n
        if time.perf_counter() - began > budget_s:
            return None
    return None


def search_to_dict(result: dict[str, list], limit: int | None = None) -> dict[str, object]:
    """The JSON shape of `python -m course_utils plan search --json`."""
    validation.instance(result, "result", dict, "search()'s result")
    for key in ("feasible", "rejected"):
        validation.instance(result.get(key), f"result[{key!r}]", list, "a list (search()'s)")
    if limit is not None:
        validation.integer(limit, "limit", 1)

    def config_dict(config) -> dict:
        return asdict(config) if isinstance(config, Config) else dict(config)

    feasible = result["feasible"][:limit] if limit else result["feasible"]
    return {
        "feasible": [e.to_dict() for e in feasible],
        "rejected": [{"config": config_dict(c), "reason": r} for c, r in result["rejected"]],
    }


def format_bytes(nbytes: float) -> str:
    """'31.4 GB (29.24 GiB)': the papers' unit (10^9 bytes) and the GPUs' (2^30 bytes)."""
    nbytes = validation.number(nbytes, "nbytes", 0)
    return f"{nbytes / GB:.1f} GB ({nbytes / GIB:.2f} GiB)"


def format_memory(
    mem: dict[str, float], limit_gib: float | None = None, hardware: Hardware | None = None
) -> str:
    """One line per part in GB and GiB, and with a GPU (`hardware`, or just its `limit_gib`)
    the verdict against its usable memory (the GPU's minus the reserve)."""
    _parts(mem, "mem")
    if limit_gib is not None:
        validation.number(limit_gib, "limit_gib", *HARDWARE_RANGES["gpu_memory_gib"])
    if hardware is not None:
        validation.instance(hardware, "hardware", Hardware)
    lines = [f"{key:<12} {mem[key] / GB:9.2f} GB {mem[key] / GIB:9.2f} GiB" for key in mem]
    if hardware is None and limit_gib is not None:
        hardware = Hardware(gpu_memory_gib=limit_gib)
    if hardware is not None:
        usable = hardware.usable_gib
        verdict = "fits" if mem["total"] <= usable * GIB else "does NOT fit"
        lines.append(
            f"{'GPU memory':<12} {hardware.gpu_memory_gib:9.2f} GiB - reserve "
            f"{hardware.reserve:.2f} GiB = {usable:.2f} GiB usable -> {verdict}"
        )
    return "\n".join(lines)


def format_time(parts: dict[str, float]) -> str:
    """One line per part of a step's time (`step_time`'s), with its share of the total."""
    _parts(parts, "parts")
    total = parts["total"]
    return "\n".join(
        f"{key:<8} {value:9.3f} s" + (f"  ({100 * value / total:4.1f}%)" if key != "total" else "")
        for key, value in parts.items()
    )


def _parts(parts: object, name: str) -> None:
    """A dict of finite numbers >= 0 with a "total" (what `memory` and `step_time` return)."""
    validation.instance(parts, name, dict, "a dict of numbers with a 'total'")
    assert isinstance(parts, dict)
    if "total" not in parts:
        raise CourseInputError(f"{name} must have a 'total', got keys {list(parts)[:5]}")
    for key, value in parts.items():
        validation.number(value, f"{name}[{key!r}]", 0)
