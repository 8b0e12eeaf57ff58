"""`python -m course_utils plan memory|search ...`: memory per GPU of one layout, or every
layout of a model on some GPUs ranked by estimated step time. Never imports torch."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict

from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import RECOMMENDED
from course_utils.plan import (
    GIB,
    PRECISIONS,
    RECOMPUTE,
    SCHEDULES,
    ZERO_STAGES,
    Config,
    Hardware,
    ModelShape,
    format_memory,
    memory,
    parse_count,
    search,
    search_to_dict,
)
from course_utils.plan.inputs import _positive_int

HELP = "memory and throughput planner for a training run"


def _add_model_args(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("--params", required=True, help="parameter count: 7.5e9, 30B, 70B ...")
    parser.add_argument("--layers", type=int, required=required, help="transformer layers L")
    parser.add_argument("--hidden", type=int, required=required, help="hidden size h")
    parser.add_argument("--heads", type=int, required=required, help="attention heads a")
    parser.add_argument("--seq", type=int, required=required, help="sequence length s")
    parser.add_argument("--precision", choices=list(PRECISIONS), default="bf16-mixed")
    parser.add_argument("--json", action="store_true", help="print JSON (bytes, seconds)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"{HELP}. Limits: at most {MAX_GPUS:,} GPUs to search, {MAX_PP} pipeline stages and "
        f"{MAX_SIMULATED:,} simulated actions."
    )
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
    mem.add_argument("--schedule", choices=SCHEDULES, default=RECOMMENDED)
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
        raise CourseInputError(f"{what} must be a finite positive number, got {value!r}")
    return value


# Limits that keep a plan to a second on a laptop: GPUs searched, pipeline stages simulated.
MAX_GPUS, MAX_PP, MAX_SIMULATED = 65_536, 1024, 200_000


def _limited(value: int, flag: str, top: int) -> int:
    _positive_int(value, flag)
    if value > top:
        raise CourseInputError(
            f"{flag} must be an integer from 1 to {top} (the limit), got {value}"
        )
    return value


def run(args) -> int:
    model = _shape_from_args(args)
    if args.what == "memory":
        pp = _limited(args.pp, "--pp", MAX_PP)
        if args.gpu_memory_gib is not None:
            _positive(args.gpu_memory_gib, "--gpu-memory-gib")
        m = args.microbatches or pp
        if 3 * pp * m * args.chunks > MAX_SIMULATED:
            raise CourseInputError(
                f"--pp {pp} x --microbatches {m} is too big a pipeline to simulate (limit "
                f"{MAX_SIMULATED:,} actions): use fewer stages or micro-batches"
            )
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
            print(json.dumps({"bytes": mem, "config": asdict(config)}, indent=2, allow_nan=False))
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
    gpus = _limited(args.gpus, "--gpus", MAX_GPUS)
    batch = _positive_int(args.global_batch, "--global-batch")
    result = search(model, gpus, batch, hardware, args.precision)
    if args.json:
        print(json.dumps(search_to_dict(result), allow_nan=False))
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
