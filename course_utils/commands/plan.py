"""`python -m course_utils plan memory|search ...`: memory per GPU of one layout, or every
layout of a model on some GPUs ranked by estimated step time. Never imports torch.

Every input is checked (and the model's shape against its parameter count) before any
work; the output echoes every assumption the numbers rest on."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from typing import Any

from course_utils import validation
from course_utils.commands.common import (
    add_network_arguments,
    flag_value,
    hardware_flag,
    network_changes,
)
from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import RECOMMENDED
from course_utils.plan import (
    CP_KINDS,
    DEFAULT_GPU,
    GIB,
    HARDWARE_PRESETS,
    PLANNED_SCHEDULES,
    PRECISIONS,
    RECOMPUTE,
    ZERO_STAGES,
    Config,
    Hardware,
    ModelShape,
    check_config,
    format_memory,
    memory,
    min_gpus,
    parse_count,
    search,
    search_to_dict,
    states_lower_bound,
)
from course_utils.plan.inputs import (
    MAX_CHUNKS,
    MAX_MICROBATCH_SIZE,
    MAX_MICROBATCHES,
    MAX_PP,
    MAX_SHAPE,
    MAX_SIMULATED,
    RESERVE_FIXED_GIB,
    RESERVE_FRACTION,
)
from course_utils.validation import MAX_GPUS

HELP = "memory and throughput planner for a training run"

# Limits that keep `plan memory` to a second on a laptop and `plan search` to seconds at its
# corner (65,536 GPUs, 1,024 layers and heads: about 160,000 layouts); pipeline stages and
# simulated actions are course_utils.plan.inputs's, which the search respects too.
MAX_DEGREE = 4096  # tp, cp, dp, ep of one layout


def _add_model_args(parser: argparse.ArgumentParser, required: bool) -> None:
    model = parser.add_argument_group(
        "the model", "a dense transformer by default; --experts E > 1 makes every MLP a "
        "mixture of E experts"
    )  # fmt: skip
    model.add_argument(
        "--params", required=True,
        help="parameter count: 7.5e9, 30B, 70B ... With a shape it must agree with the layers' "
        "weights (12 L h^2 for a dense model) within 2x",
    )  # fmt: skip
    model.add_argument("--layers", type=int, required=required, help="transformer layers L")
    model.add_argument("--hidden", type=int, required=required, help="hidden size h")
    model.add_argument("--heads", type=int, required=required, help="attention heads a")
    model.add_argument(
        "--kv-heads", type=int, default=0,
        help="key/value heads, dividing --heads: fewer than --heads is grouped-query attention "
        "(default: as many as --heads). Sets the ring's K/V bytes and the Ulysses limit",
    )  # fmt: skip
    model.add_argument("--seq", type=int, required=required, help="sequence length s (tokens)")
    model.add_argument(
        "--vocab", type=int, default=ModelShape.vocab,
        help=f"vocabulary size V, for the logits (default {ModelShape.vocab})",
    )  # fmt: skip
    model.add_argument("--ffn-hidden", type=int, default=0,
                       help="MLP (each expert's) hidden size f (default 4 h)")  # fmt: skip
    model.add_argument("--experts", type=int, default=1, help="experts per MoE layer (1: dense)")
    model.add_argument("--top-k", type=int, default=1, help="experts each token is routed to")
    model.add_argument("--capacity-factor", type=float, default=1.0,
                       help="expert buffer padding: the busiest expert holds up to this many "
                       "times the average tokens (memory only; default 1)")  # fmt: skip
    model.add_argument("--precision", choices=list(PRECISIONS), default="bf16-mixed")
    parser.add_argument("--json", action="store_true", help="print JSON (bytes, seconds)")


def _add_hardware_args(parser: argparse.ArgumentParser) -> None:
    hw = parser.add_argument_group(
        "the hardware", f"a named GPU (default {DEFAULT_GPU}); any flag below overrides one "
        "of its numbers"
    )  # fmt: skip
    add_network_arguments(hw)  # --gpu, --gpus-per-node, the links (shared with the runners)
    hw.add_argument("--gpu-memory-gib", type=float, default=None, help="GiB per GPU")
    hw.add_argument(
        "--reserve-gib", type=float, default=None,
        help=f"GiB per GPU kept for what the formulas do not count: CUDA context, NCCL buffers, "
        f"allocator fragmentation (default {RESERVE_FIXED_GIB:g} GiB + "
        f"{100 * RESERVE_FRACTION:g}%% of the GPU's memory)",
    )  # fmt: skip
    hw.add_argument("--peak-tflops", type=float, default=None,
                    help="dense bf16 peak TFLOP/s per GPU")  # fmt: skip
    hw.add_argument(
        "--efficiency", type=float, default=None,
        help="share of peak reached on all FLOPs executed (HFU), in (0, 1]",
    )  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"{HELP}. Traffic is counted as bytes each GPU sends (one direction). Limits: at most "
        f"{MAX_GPUS:,} GPUs to search, {MAX_PP} pipeline stages and {MAX_SIMULATED:,} "
        "simulated actions."
    )
    sub = parser.add_subparsers(dest="what", required=True, metavar="{memory,search}")
    mem = sub.add_parser("memory", help="memory per GPU of one configuration, and whether it fits")
    _add_model_args(mem, required=False)
    layout = mem.add_argument_group("the layout")
    layout.add_argument("--microbatch-size", type=int, default=1, help="sequences per micro-batch")
    layout.add_argument("--microbatches", type=int, default=None, help="per replica (default: pp)")
    layout.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    layout.add_argument("--cp", type=int, default=1,
                        help="context-parallel degree: sequences split over cp GPUs")  # fmt: skip
    layout.add_argument(
        "--cp-kind", choices=CP_KINDS, default="ring",
        help="how attention crosses the cp GPUs: ring (K/V blocks passed round) or ulysses "
        "(all-to-all over heads; cp divides the K/V heads / tp)",
    )  # fmt: skip
    layout.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree")
    layout.add_argument("--dp", type=int, default=1, help="data-parallel degree")
    layout.add_argument("--ep", type=int, default=1,
                        help="expert-parallel degree (MoE): divides dp and --experts")  # fmt: skip
    layout.add_argument("--zero", type=int, choices=ZERO_STAGES, default=0)
    layout.add_argument("--recompute", choices=RECOMPUTE, default="none")
    layout.add_argument("--schedule", choices=PLANNED_SCHEDULES, default=RECOMMENDED)
    layout.add_argument("--chunks", type=int, default=1, help="virtual stages per device")
    layout.add_argument("--sequence-parallel", action="store_true",
                        help="shard LayerNorm/dropout activations over tp")  # fmt: skip
    _add_hardware_args(mem)

    srch = sub.add_parser("search", help="rank every layout that fits, explain the rest")
    _add_model_args(srch, required=True)
    srch.add_argument("--global-batch", type=int, required=True, help="sequences per step")
    srch.add_argument("--gpus", type=int, required=True, help=f"GPUs (at most {MAX_GPUS:,})")
    srch.add_argument("--overlap-dp", action="store_true",
                      help="overlap data-parallel collectives with compute (DDP buckets, FSDP "
                      "prefetch); default: nothing overlaps")  # fmt: skip
    srch.add_argument("--cp-kind", choices=CP_KINDS, default="ring",
                      help="context parallelism the search tries: ring or ulysses")  # fmt: skip
    srch.add_argument("--top", type=int, default=10, help="feasible rows to print (text mode)")
    _add_hardware_args(srch)


def _limited(value: int, flag: str, top: int) -> int:
    return validation.integer(value, flag, 1, top)


def _shape_from_args(args) -> ModelShape | int:
    params = parse_count(args.params, "--params")
    given = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "seq")}
    extra = {"--experts": args.experts != 1, "--top-k": args.top_k != 1,
             "--ffn-hidden": args.ffn_hidden != 0, "--kv-heads": args.kv_heads != 0}  # fmt: skip
    if all(v is None for v in given.values()):
        if any(extra.values()):
            flag = next(f for f, used in extra.items() if used)
            raise CourseInputError(f"{flag} needs the shape: --layers, --hidden, --heads, --seq")
        return params
    missing = [f"--{k}" for k, v in given.items() if v is None]
    if missing:
        raise CourseInputError(
            f"activations need --layers, --hidden, --heads and --seq together; missing "
            f"{', '.join(missing)}"
        )
    for key in ("layers", "hidden", "heads", "seq", "vocab", "experts", "top_k"):
        _limited(getattr(args, key), f"--{key.replace('_', '-')}", MAX_SHAPE)
    validation.integer(args.ffn_hidden, "--ffn-hidden", 0, MAX_SHAPE)
    if args.hidden % args.heads:
        raise CourseInputError(f"--heads ({args.heads}) must divide --hidden ({args.hidden})")
    validation.integer(args.kv_heads, "--kv-heads", 0, args.heads)
    if args.kv_heads and args.heads % args.kv_heads:
        raise CourseInputError(f"--kv-heads ({args.kv_heads}) must divide --heads ({args.heads})")
    if args.top_k > args.experts:
        raise CourseInputError(f"--top-k ({args.top_k}) cannot exceed --experts ({args.experts})")
    validation.number(args.capacity_factor, "--capacity-factor", 1, 64)
    try:
        return ModelShape(
            params, args.layers, args.hidden, args.heads, args.seq, args.vocab, args.experts,
            args.top_k, args.ffn_hidden, args.capacity_factor, args.kv_heads,
        )  # fmt: skip
    except CourseInputError as exc:
        raise CourseInputError(f"--params: {exc}") from None


def _hardware_from_args(args) -> Hardware:
    preset = HARDWARE_PRESETS[args.gpu]
    changes: dict[str, Any] = network_changes(args)
    for flag, key in (
        ("--gpu-memory-gib", "gpu_memory_gib"),
        ("--peak-tflops", "peak_tflops_bf16"),
        ("--efficiency", "efficiency"),
        ("--reserve-gib", "reserve_gib"),
    ):
        if flag_value(args, flag) is not None:
            changes[key] = hardware_flag(args, flag, key)
    if changes:
        changes["name"] = f"{preset.name} (changed)"
    try:
        return replace(preset, **changes)
    except CourseInputError as exc:  # the memory against the reserve: name the flags
        words = {"reserve_gib": "--reserve-gib", "gpu_memory_gib": "--gpu-memory-gib"}
        message = str(exc)
        for key, flag in words.items():
            message = message.replace(key, flag)
        raise CourseInputError(message) from None


def _assumptions(model, hardware: Hardware, precision: str, overlap: bool | None) -> list[str]:
    lines = ["assumed: " + hardware.describe()]
    if isinstance(model, ModelShape):
        moe = (
            f", {model.experts} experts of f={model.ffn}, top-{model.top_k}, capacity factor "
            f"{model.capacity_factor:g} ({model.active_params / 1e9:.3g}B parameters per token)"
            if model.is_moe
            else f", f={model.ffn}"
        )
        kv = f" ({model.key_value_heads} K/V)" if model.kv_heads else ""
        lines.append(
            f"model: {model.params / 1e9:.4g}B parameters, L={model.layers}, h={model.hidden}, "
            f"a={model.heads}{kv}, s={model.seq}, V={model.vocab}{moe}; {precision}"
        )
    else:
        lines.append(f"model: {model / 1e9:.4g}B parameters (no shape: model states only); "
                     f"{precision}")  # fmt: skip
    if overlap is not None:
        lines.append(
            "data-parallel collectives "
            + ("overlap compute (buckets, prefetch)" if overlap else "do not overlap compute")
            + "; all other communication is exposed; traffic = bytes each GPU sends"
        )
    return lines


def run(args) -> int:
    model = _shape_from_args(args)
    hardware = _hardware_from_args(args)
    if args.what == "memory":
        pp = _limited(args.pp, "--pp", MAX_PP)
        degrees = {flag: _limited(getattr(args, flag[2:]), flag, MAX_DEGREE)
                   for flag in ("--tp", "--cp", "--dp", "--ep")}  # fmt: skip
        m = _limited(
            pp if args.microbatches is None else args.microbatches, "--microbatches", 10**6
        )
        b = _limited(args.microbatch_size, "--microbatch-size", MAX_MICROBATCH_SIZE)
        chunks = _limited(args.chunks, "--chunks", MAX_CHUNKS)
        if 3 * pp * m * chunks > MAX_SIMULATED:
            raise CourseInputError(
                f"--pp {pp} x --microbatches {m} is too big a pipeline to simulate (limit "
                f"{MAX_SIMULATED:,} actions): use fewer stages or micro-batches"
            )
        config = Config(
            tp=degrees["--tp"], pp=pp, dp=degrees["--dp"], microbatch_size=b, microbatches=m,
            schedule=args.schedule, chunks=chunks, zero=args.zero, recompute=args.recompute,
            sequence_parallel=args.sequence_parallel, cp=degrees["--cp"], ep=degrees["--ep"],
            cp_kind=args.cp_kind,
        )  # fmt: skip
        check_config(model if isinstance(model, ModelShape) else None, config)
        mem = memory(model, config, args.precision)
        fits = mem["total"] <= hardware.usable_gib * GIB
        if args.json:
            out = {"bytes": mem, "config": asdict(config), "fits": fits,
                   "hardware": {**asdict(hardware), "reserve_gib": hardware.reserve,
                                "usable_gib": hardware.usable_gib}}  # fmt: skip
            print(json.dumps(out, indent=2, allow_nan=False))
            return 0
        print(config.short() + f" precision={args.precision}")
        if not isinstance(model, ModelShape):
            print("(activations and buffers not estimated: give --layers --hidden --heads --seq)")
        print(format_memory(mem, hardware=hardware))
        for line in _assumptions(model, hardware, args.precision, None):
            print(line)
        return 0

    if not isinstance(model, ModelShape):  # argparse makes the shape required for search
        raise CourseInputError("search needs --layers, --hidden, --heads and --seq")
    gpus = _limited(args.gpus, "--gpus", MAX_GPUS)
    batch = _limited(args.global_batch, "--global-batch", MAX_MICROBATCHES)
    top = _limited(args.top, "--top", 10**6)
    result = search(
        model, gpus, batch, hardware, args.precision, dp_overlap=args.overlap_dp,
        cp_kind=args.cp_kind,
    )  # fmt: skip
    feasible, rejected = result["feasible"], result["rejected"]
    fewest = None
    if not feasible:
        fewest = min_gpus(model, batch, hardware, args.precision)
    if args.json:
        data: dict[str, Any] = dict(search_to_dict(result))
        data["assumptions"] = _assumptions(model, hardware, args.precision, args.overlap_dp)
        data["min_gpus"] = fewest if not feasible else None
        print(json.dumps(data, allow_nan=False))
        return 0
    tokens = batch * model.seq
    print(f"{len(feasible)} layouts fit, {len(rejected)} do not ({gpus} GPUs).")
    for rank, est in enumerate(feasible[:top], 1):
        print(
            f"{rank:3d}. {est.config.short():<78} {est.memory['total'] / GIB:6.1f} GiB "
            f"{est.time['total']:8.3f} s/step {tokens / est.time['total']:10.0f} tokens/s "
            f"MFU {est.utilisation['mfu']:5.1%}"
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
    if not feasible:
        states = states_lower_bound(model, hardware, args.precision)
        if fewest is None:
            print(
                "No layout found on up to 4,096 GPUs of this kind within 20 s of searching "
                f"(model states alone, fully sharded, need at least {states})."
            )
        else:
            print(
                f"Nothing fits on {gpus} GPUs. The fewest GPUs on which a layout fits: {fewest} "
                f"(model states alone, fully sharded, need at least {states})."
            )
    for line in _assumptions(model, hardware, args.precision, args.overlap_dp):
        print(line)
    return 0
