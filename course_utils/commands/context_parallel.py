"""`python -m course_utils context-parallel --workers N --seq L`: ring attention on N threads.

Splits a random (heads, seq, dim) attention problem over N threads (plain or zig-zag
split, causal or not), runs the ring forward and backward, and reports: the largest
difference from single-device attention in the output and in dq, dk, dv; the bytes each
worker sent (and the formula's prediction); the work each worker did (block products and
attention scores, and the closed forms); measured compute time per worker; the measured
step time and the one `simulate_ring` predicts from costs calibrated on this run.

With `--ulysses` the same problem runs as DeepSpeed-Ulysses instead (all-to-all over heads,
Jacobs et al. 2023, arXiv 2309.14509): the differences from one device, the bytes each
worker sent in its all-to-alls against the formula, and the ring's formula beside them.

Every argument is checked before torch is imported, so bad input fails at once.
"""

from __future__ import annotations

import argparse
import json
import math

from course_utils.commands.common import (
    add_json_and_clock_arguments,
    check_trace,
    fastest_run,
    int_flag,
    links_from_args,
    printed_as_json,
    write_trace,
)
from course_utils.errors import CourseInputError

HELP = "ring attention (context parallelism) on threads vs one device"
MAX_WORKERS = 8
MAX_HEADS = 16
MAX_DIM = 128
# The single-device reference builds heads x seq x seq score matrices (a few of them, for
# autograd), and so does the ring, a block at a time: at 2**21 scores a run peaks at about
# 0.6 GB (tests/test_limits.py keeps every corner under 1 GB).
MAX_SCORES = 2**21
MAX_SEQ = math.isqrt(MAX_SCORES)  # 1448: one head (16 heads: up to 362)
REPEATS = 3  # timed runs after one warm-up; the fastest is reported
DTYPES = ("float64", "float32")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"{HELP}. Limits: at most {MAX_WORKERS} workers, {MAX_HEADS} heads of {MAX_DIM} dims, "
        f"heads x seq^2 <= {MAX_SCORES:,} (a sequence of {MAX_SEQ} with one head, "
        f"{math.isqrt(MAX_SCORES // MAX_HEADS)} with {MAX_HEADS}); memory stays under 1 GB."
    )
    parser.add_argument(
        "--workers", type=int, default=4, help=f"context-parallel threads, 1 to {MAX_WORKERS}"
    )
    parser.add_argument(
        "--seq",
        type=int,
        default=256,
        help=f"sequence length, a multiple of workers (2 x workers with --zigzag); "
        f"heads x seq^2 <= {MAX_SCORES:,}, so up to {MAX_SEQ} with one head (keeps memory "
        "under 1 GB)",
    )
    parser.add_argument("--heads", type=int, default=4, help=f"attention heads, 1 to {MAX_HEADS}")
    parser.add_argument("--dim", type=int, default=32, help=f"head dimension, 1 to {MAX_DIM}")
    parser.add_argument(
        "--zigzag", action="store_true", help="load-balanced split: worker i holds chunks i, 2N-1-i"
    )
    parser.add_argument("--causal", action="store_true", help="causal mask (decoder attention)")
    parser.add_argument(
        "--ulysses",
        action="store_true",
        help="Ulysses instead of the ring: all-to-all over heads (--workers must divide --heads)",
    )
    parser.add_argument("--dtype", default="float64", help=f"one of {', '.join(DTYPES)}")
    add_json_and_clock_arguments(parser)


def check_arguments(args: argparse.Namespace) -> None:
    """One-line CourseInputError naming the flag, before any torch work."""
    workers = int_flag(args, "--workers", 1, MAX_WORKERS)
    seq = int_flag(args, "--seq", 1, MAX_SCORES)  # the heads x seq^2 rule below is the limit
    heads = int_flag(args, "--heads", 1, MAX_HEADS)
    int_flag(args, "--dim", 1, MAX_DIM)
    if args.ulysses and args.zigzag:
        raise CourseInputError(
            "--zigzag does not apply to --ulysses: Ulysses gives every worker whole sequences "
            "of its heads, so a causal mask costs every worker the same"
        )
    if args.ulysses and heads % workers:
        raise CourseInputError(
            f"--workers must divide --heads for --ulysses (each worker computes whole heads), "
            f"got {workers} workers and {heads} heads"
        )
    chunks = 2 * workers if args.zigzag else workers
    if seq % chunks:
        what = f"2 x --workers = {chunks} with --zigzag" if args.zigzag else f"--workers = {chunks}"
        raise CourseInputError(f"--seq must be a multiple of {what}, got {seq}")
    if heads * seq * seq > MAX_SCORES:
        raise CourseInputError(
            f"--heads x --seq^2 must be <= {MAX_SCORES:,} to keep memory under 1 GB, "
            f"got {heads} x {seq}^2 = {heads * seq * seq:,}"
        )
    if args.dtype not in DTYPES:
        raise CourseInputError(f"--dtype must be one of {', '.join(DTYPES)}, got {args.dtype!r}")


def _attention_on_one_device(heads: int, seq: int, dim: int, causal: bool, dtype: str, seed: int):
    """Random q, k, v and dL/dout, and attention with its backward on one device: (q, k, v,
    dout, output, [q, k, v] leaves holding the gradients) for the parallel runs to match."""
    import torch

    from course_utils.parallel import context_parallel as cp

    gen = torch.Generator().manual_seed(seed)
    q, k, v, dout = (
        torch.randn(heads, seq, dim, generator=gen, dtype=getattr(torch, dtype)) for _ in range(4)
    )
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    reference = cp.attention(leaves[0], leaves[1], leaves[2], causal=causal)
    reference.backward(dout)
    return q, k, v, dout, reference, leaves


def _differences_from_one_device(result, reference, leaves) -> dict[str, float]:
    """How far a parallel run's output and dq, dk, dv are from `_attention_on_one_device`'s."""

    def diff(a, b) -> float:
        return (a - b).abs().max().item()

    grads = zip((result.dq, result.dk, result.dv), leaves, strict=True)
    return {
        "max_output_diff": diff(result.out, reference.detach()),
        "max_grad_diff": max(diff(g, leaf.grad) for g, leaf in grads),
    }


def compare(
    workers: int,
    seq: int,
    heads: int = 4,
    dim: int = 32,
    zigzag: bool = False,
    causal: bool = False,
    dtype: str = "float64",
    seed: int = 0,
    clock: str = "virtual",
    links=None,
) -> dict:
    """Run ring attention on threads and attention on one device; return the report as a dict."""
    from course_utils.parallel import context_parallel as cp

    q, k, v, dout, reference, leaves = _attention_on_one_device(
        heads, seq, dim, causal, dtype, seed
    )
    with cp.RingAttention(workers, causal=causal, zigzag=zigzag, clock=clock, links=links) as ring:
        result = fastest_run(lambda: ring.forward_backward(q, k, v, dout), REPEATS)
    element_size = q.element_size()
    costs = cp.measured_costs(result, seq, links if clock == "virtual" else None)
    steps = cp.measured_step_costs(result)  # what each step of this run computed
    simulated = {
        overlap: cp.simulate_ring(
            workers,
            zigzag,
            causal,
            backward=True,
            overlap=overlap,
            unit="s",
            step_costs=steps,
            **costs,
        ).makespan
        for overlap in (True, False)
    }
    expected_bytes = cp.ring_bytes_per_worker(seq, workers, heads, dim, element_size)
    return {
        "workers": workers,
        "seq": seq,
        "heads": heads,
        "dim": dim,
        "dtype": dtype,
        "split": "zig-zag" if zigzag else "plain",
        "causal": causal,
        **_differences_from_one_device(result, reference, leaves),
        "bytes_forward_per_worker": result.bytes_forward,
        "bytes_backward_per_worker": result.bytes_backward,
        "bytes_formula": expected_bytes,
        "kv_bytes_per_step": cp.kv_bytes_per_step(seq, workers, heads, dim, element_size),
        "block_products_per_worker": result.products_forward,
        "block_products_formula": (
            cp.causal_work(workers, zigzag) if causal else [workers] * workers
        ),
        "scores_per_worker": result.elements_forward,
        "scores_formula": cp.score_elements(seq, workers, zigzag, causal),
        "compute_s_per_worker": result.compute_seconds,
        "measured_step_s": result.timeline.makespan,
        "simulated_step_s": simulated[True],
        "simulated_step_s_no_overlap": simulated[False],
        "calibrated_costs_s": costs,
        "activation_bytes_per_worker": cp.attention_activation_bytes(
            seq, workers, heads, dim, element_size
        ),
        "timeline": result.timeline,  # the command writes it to --trace, then drops it
    }


def compare_ulysses(
    workers: int,
    seq: int,
    heads: int = 4,
    dim: int = 32,
    causal: bool = False,
    dtype: str = "float64",
    seed: int = 0,
) -> dict:
    """Run Ulysses on threads and attention on one device; return the report as a dict."""
    from course_utils.parallel import context_parallel as cp

    q, k, v, dout, reference, leaves = _attention_on_one_device(
        heads, seq, dim, causal, dtype, seed
    )
    with cp.UlyssesAttention(workers, causal=causal) as ulysses:
        result = fastest_run(lambda: ulysses.forward_backward(q, k, v, dout), REPEATS)
    element_size = q.element_size()
    return {
        "method": "ulysses",
        "workers": workers,
        "seq": seq,
        "heads": heads,
        "dim": dim,
        "dtype": dtype,
        "causal": causal,
        "heads_per_worker": result.heads_per_worker,
        **_differences_from_one_device(result, reference, leaves),
        "bytes_all_to_all_per_worker": {
            "forward": result.bytes_forward,
            "backward": result.bytes_backward,
        },
        "bytes_formula": cp.ulysses_bytes_per_worker(seq, workers, heads, dim, element_size),
        "ring_bytes_formula": cp.ring_bytes_per_worker(seq, workers, heads, dim, element_size),
        "compute_s_per_worker": result.compute_seconds,
        "measured_step_s": result.timeline.makespan,
        "activation_bytes_per_worker": cp.ulysses_activation_bytes(
            seq, workers, heads, dim, element_size
        ),
        "ring_activation_bytes_per_worker": cp.attention_activation_bytes(
            seq, workers, heads, dim, element_size
        ),
        "timeline": result.timeline,  # the command writes it to --trace, then drops it
    }


def _run_ulysses(args: argparse.Namespace) -> int:
    result = compare_ulysses(args.workers, args.seq, args.heads, args.dim, args.causal, args.dtype)
    write_trace(args, result.pop("timeline"), f"Ulysses, {args.workers} workers")
    if args.json:
        print(json.dumps(result, indent=2, allow_nan=False))
        return 0
    n, mask = result["workers"], "causal" if result["causal"] else "full"
    sent, formula = result["bytes_all_to_all_per_worker"], result["bytes_formula"]
    ring = result["ring_bytes_formula"]
    print(
        f"Ulysses on {n} threads ({result['heads_per_worker']} of {result['heads']} heads each), "
        f"{mask} mask, {result['seq']} tokens x {result['dim']} dims ({args.dtype})"
    )
    print(f"  max |output diff| vs one device:   {result['max_output_diff']:.2e}")
    print(f"  max |dq, dk, dv diff| vs one device: {result['max_grad_diff']:.2e}")
    print(
        f"  all-to-all bytes sent per worker: forward {sent['forward']} (formula "
        f"{formula['forward']}), backward {sent['backward']} (formula {formula['backward']})"
    )
    print(
        f"  the ring would send forward {ring['forward']}, backward {ring['backward']} bytes "
        f"per worker (ring_bytes_per_worker)"
    )
    print(
        f"  attention activations per worker: {result['activation_bytes_per_worker'] / 1e6:.3f} "
        f"MB (the ring: {result['ring_activation_bytes_per_worker'] / 1e6:.3f} MB)"
    )
    print(f"  step time (forward + backward): measured {1e3 * result['measured_step_s']:.2f} ms")
    return 0


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    check_trace(args)
    if args.ulysses:
        return _run_ulysses(args)
    links = links_from_args(args)
    result = compare(
        args.workers,
        args.seq,
        args.heads,
        args.dim,
        args.zigzag,
        args.causal,
        args.dtype,
        clock=args.clock,
        links=links,
    )
    write_trace(args, result.pop("timeline"), f"ring attention, {args.workers} workers")
    if printed_as_json(args, links, result):
        return 0
    n = result["workers"]
    mask = "causal" if result["causal"] else "full"
    print(
        f"ring attention on {n} threads: {result['split']} split, {mask} mask, "
        f"{result['heads']} heads x {result['seq']} tokens x {result['dim']} dims ({args.dtype})"
    )
    print(f"  max |output diff| vs one device:   {result['max_output_diff']:.2e}")
    print(f"  max |dq, dk, dv diff| vs one device: {result['max_grad_diff']:.2e}")

    def row(values, fmt="{}") -> str:
        return "[" + ", ".join(fmt.format(x) for x in values) + "]"

    formula = result["bytes_formula"]
    print(
        f"  bytes sent per worker: forward {row(result['bytes_forward_per_worker'])} "
        f"(formula {formula['forward']}), backward {row(result['bytes_backward_per_worker'])} "
        f"(formula {formula['backward']})"
    )
    print(
        f"  block products per worker: {row(result['block_products_per_worker'])} "
        f"(formula {row(result['block_products_formula'])})"
    )
    print(
        f"  attention scores per worker: {row(result['scores_per_worker'])} "
        f"(formula {row(result['scores_formula'])})"
    )
    ms = [1e3 * s for s in result["compute_s_per_worker"]]
    print(f"  measured compute per worker (ms): {row(ms, '{:.2f}')}")
    print(
        f"  step time (forward + backward): measured {1e3 * result['measured_step_s']:.2f} ms; "
        f"simulated {1e3 * result['simulated_step_s']:.2f} ms with overlap, "
        f"{1e3 * result['simulated_step_s_no_overlap']:.2f} ms without"
    )
    print(
        f"  attention activations per worker: "
        f"{result['activation_bytes_per_worker'] / 1e6:.3f} MB (see attention_activation_bytes)"
    )
    return 0
