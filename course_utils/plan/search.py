"""Search every layout of a model on a number of GPUs: what fits, fastest first, and why the
rest does not. Also the planner's text output. Nothing here imports torch."""

from __future__ import annotations

import itertools
from dataclasses import asdict

from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import RECOMMENDED
from course_utils.pipeline.schedules import SCHEDULES as REGISTRY
from course_utils.plan.inputs import (
    GIB,
    LOOPING,
    MICROBATCH_SIZES,
    RECOMPUTE,
    SCHEDULES,
    SEARCH_CHUNKS,
    ZERO_STAGES,
    Config,
    Hardware,
    ModelShape,
    Precision,
    _positive_int,
    get_precision,
)
from course_utils.plan.model import Estimate, evaluate


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
    (plain gradient accumulation), so only the recommended one is tried; with dp = 1 only
    ZeRO-0.
    """
    _positive_int(gpus, "gpus")
    _positive_int(global_batch, "global_batch")
    prec = get_precision(precision)
    feasible: list[Estimate] = []
    rejected: list[tuple[Config | dict[str, int], str]] = []
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
                schedules = SCHEDULES if pp > 1 else (RECOMMENDED,)
                for schedule, zero, recompute in itertools.product(
                    schedules, ZERO_STAGES if dp > 1 else (0,), RECOMPUTE
                ):
                    v = SEARCH_CHUNKS if schedule in LOOPING else 1
                    config = Config(
                        tp, pp, dp, b, m, schedule, v, zero, recompute, sequence_parallel=tp > 1
                    )
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
                        estimate = evaluate(model, config, prec, hardware)
                    except CourseInputError as exc:  # e.g. the schedule's own rules on m
                        rejected.append((config, str(exc)))
                        continue
                    if estimate.reason is None:  # it fits
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
