"""`python -m course_utils moe`: expert parallelism on threads, checked against one device.

Builds a small MoE block (d_model 32, expert hidden 128), spreads its experts over
`--workers` threads and runs one forward + backward step there and on one device (routed
in the same groups, so even dropped tokens match). Prints the largest output and gradient
differences, what the router did (tokens per expert, dropped assignments), the bytes each
worker sent in each all-to-all, and the measured step time beside `simulate_moe`'s
prediction from costs fitted to that same measurement.
"""

from __future__ import annotations

import argparse
import math

from course_utils.commands.common import (
    add_json_and_clock_arguments,
    check_trace,
    fastest_run,
    links_from_args,
    printed_as_json,
    write_trace,
)
from course_utils.errors import CourseInputError

HELP = "expert-parallel MoE step on threads vs one device"

D_MODEL, HIDDEN = 32, 128
MAX_WORKERS, MAX_EXPERTS, MAX_TOKENS = 8, 64, 4096
MAX_CAPACITY_FACTOR, MAX_SKEW = 64.0, 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"{HELP}. Limits: at most {MAX_WORKERS} workers, {MAX_EXPERTS} experts, "
        f"{MAX_TOKENS} tokens."
    )
    parser.add_argument(
        "--workers", type=int, default=2, help=f"expert-parallel threads, 1..{MAX_WORKERS}"
    )
    parser.add_argument(
        "--experts",
        type=int,
        default=4,
        help=f"experts, 1..{MAX_EXPERTS}, a multiple of --workers",
    )
    parser.add_argument(
        "--top-k", type=int, default=1, help="experts per token: 1 (Switch) or 2 (GShard)"
    )
    parser.add_argument(
        "--capacity-factor",
        type=float,
        default=None,
        help=f"capacity = ceil(C x tokens x k / experts) per worker, 0 < C <= "
        f"{MAX_CAPACITY_FACTOR:g}; default: never drop",
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=64,
        help=f"tokens in the batch, --workers..{MAX_TOKENS} (split evenly over workers)",
    )
    parser.add_argument(
        "--skew",
        type=float,
        default=0.0,
        help=f"router bias towards expert 0, 0..{MAX_SKEW:g} (2 sends most tokens there)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed, 0..2**31-1")
    add_json_and_clock_arguments(parser)


def validate(args) -> None:
    """Every limit, checked before torch is imported."""

    def integer(name: str, value: int, low: int, high: int) -> None:
        if not low <= value <= high:
            raise CourseInputError(f"--{name} must be in {low}..{high}, got {value}")

    integer("workers", args.workers, 1, MAX_WORKERS)
    integer("experts", args.experts, 1, MAX_EXPERTS)
    if args.experts % args.workers:
        raise CourseInputError(
            f"--experts must be a multiple of --workers ({args.workers}), got {args.experts}"
        )
    if args.top_k not in (1, 2) or args.top_k > args.experts:
        raise CourseInputError(f"--top-k must be 1 or 2 and <= --experts, got {args.top_k}")
    integer("tokens", args.tokens, args.workers, MAX_TOKENS)
    integer("seed", args.seed, 0, 2**31 - 1)
    c = args.capacity_factor
    if c is not None and not (math.isfinite(c) and 0 < c <= MAX_CAPACITY_FACTOR):
        raise CourseInputError(
            f"--capacity-factor must be a finite number in (0, {MAX_CAPACITY_FACTOR:g}], got {c}"
        )
    if not (math.isfinite(args.skew) and 0 <= args.skew <= MAX_SKEW):
        raise CourseInputError(
            f"--skew must be a finite number in 0..{MAX_SKEW:g}, got {args.skew}"
        )


def model_and_inputs(args):
    """The command's MoE layer and its tokens and output gradient, from its flags."""
    import torch

    from course_utils.parallel.moe import MoE

    torch.manual_seed(args.seed)
    moe = MoE(D_MODEL, HIDDEN, args.experts, args.top_k, args.capacity_factor, args.skew)
    gen = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(args.tokens, D_MODEL, generator=gen)
    dy = torch.randn(args.tokens, D_MODEL, generator=gen)
    return moe, x, dy


def simulation(got, moe, workers: int, links=None):
    """`simulate_moe`'s step for a measured one (`ExpertParallel.step`), from its own costs;
    `links`: the run's emulated links (virtual clock)."""
    from course_utils.parallel.moe import fit_costs, measured_expert_seconds, simulate_moe
    from course_utils.threads.ring import chunk_bounds

    replicated = sum(
        p.numel() * p.element_size() for p in (*moe.norm.parameters(), *moe.router.parameters())
    )
    tokens = len(got.output)
    return simulate_moe(
        got.routed,
        workers,
        fit_costs(got, links),
        moe.d_model,
        moe.top_k,
        replicated_bytes=replicated,
        unit="s",
        tokens_per_worker=[hi - lo for lo, hi in chunk_bounds(tokens, workers)],
        expert_seconds=measured_expert_seconds(got),
    )


def compare(args, links=None) -> dict:
    """Run the step on threads and on one device; return the figures the command prints."""
    from course_utils.parallel.moe import (
        ExpertParallel,
        all_to_all_bytes_per_worker,
        reference_step,
    )

    moe, x, dy = model_and_inputs(args)
    aux_weight = 0.01  # Switch's alpha
    ref = reference_step(moe, x, dy, aux_weight, groups=args.workers)
    clock = getattr(args, "clock", "virtual")
    with ExpertParallel(moe, args.workers, clock=clock, links=links) as ep:
        got = fastest_run(lambda: ep.step(x, dy, aux_weight))
    grad_diff = max((got.grads[n] - g).abs().max().item() for n, g in ref.grads.items())
    grad_diff = max(grad_diff, (got.input_grad - ref.input_grad).abs().max().item())
    simulated = simulation(got, moe, args.workers, links if clock == "virtual" else None)
    measured = got.timeline
    assert measured is not None  # the run above was recorded
    return {
        "workers": args.workers,
        "experts": args.experts,
        "top_k": args.top_k,
        "capacity_factor": args.capacity_factor,
        "tokens": args.tokens,
        "skew": args.skew,
        "max_output_diff": (got.output - ref.output).abs().max().item(),
        "max_grad_diff": grad_diff,
        "dropped": got.dropped,
        "dropped_one_device": ref.dropped,
        "capacity_per_worker": got.capacity,
        "tokens_per_expert": got.tokens_per_expert,
        "kept_per_expert": got.kept_per_expert,
        "bytes_sent_per_worker": got.bytes_sent,
        "dispatch_bytes_predicted": all_to_all_bytes_per_worker(got.routed, D_MODEL, args.workers),
        "measured_step_s": measured.makespan,
        "simulated_step_s": simulated.makespan,
        "measured_busy_s": measured.busy_per_device(),
        "simulated_busy_s": simulated.busy_per_device(),
        "timeline": measured,  # the command writes it to --trace, then drops it
    }


def run(args) -> int:
    validate(args)
    check_trace(args)
    links = links_from_args(args)
    result = compare(args, links)
    write_trace(args, result.pop("timeline"), f"MoE, {args.workers} workers")
    if printed_as_json(args, links, result):
        return 0
    cf = result["capacity_factor"]
    print(
        f"MoE block d_model {D_MODEL}, {result['experts']} experts (hidden {HIDDEN}), "
        f"top-{result['top_k']}, capacity factor {cf if cf is not None else 'none (never drop)'}, "
        f"{result['tokens']} tokens on {result['workers']} workers"
    )
    print(f"  max |output diff| vs one device:   {result['max_output_diff']:.2e}")
    print(f"  max |gradient diff| vs one device: {result['max_grad_diff']:.2e}")
    print(f"  tokens per expert (routed):   {result['tokens_per_expert']}")
    print(f"  tokens per expert (computed): {result['kept_per_expert']}")
    print(
        f"  dropped assignments: {result['dropped']} (one device: "
        f"{result['dropped_one_device']}), capacity per worker {result['capacity_per_worker']}"
    )
    for phase, sent in result["bytes_sent_per_worker"].items():
        print(f"  bytes sent per worker, {phase + ':':<14} {sent}")
    measured = ", ".join(f"{b * 1e3:.2f}" for b in result["measured_busy_s"])
    simulated = ", ".join(f"{b * 1e3:.2f}" for b in result["simulated_busy_s"])
    print(
        f"  step time: measured {result['measured_step_s'] * 1e3:.2f} ms, "
        f"simulated {result['simulated_step_s'] * 1e3:.2f} ms"
    )
    print(f"  compute per worker (ms): measured [{measured}], simulated [{simulated}]")
    return 0
