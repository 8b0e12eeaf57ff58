"""`python -m course_utils tensor-parallel --workers N`: the Megatron-split MLP on N threads
against the unsplit MLP: outputs, gradients and bytes each worker sends."""

from __future__ import annotations

import argparse
import json

from course_utils.commands.common import int_flag
from course_utils.errors import CourseInputError
from course_utils.parallel.costs import ALGORITHMS

HELP = "tensor-parallel MLP on threads vs unsplit"
SHAPE = (64, 256, 4, 16)  # d_model, hidden, batch, sequence


MAX_WORKERS = 8  # threads on a laptop


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workers", type=int, default=2, help=f"tensor-parallel devices (limit: 1-{MAX_WORKERS})"
    )
    parser.add_argument(
        "--allreduce", default="ring", help=f"all-reduce algorithm: {', '.join(ALGORITHMS)}"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def compare(workers: int, algorithm: str = "ring", seed: int = 0) -> dict:
    """Run a GPT-sized-down MLP (64 -> 256 -> 64) split over `workers` threads vs unsplit."""
    import torch
    from torch import nn

    from course_utils.parallel.tensor_parallel import (
        TensorParallelMLP,
        max_diff,
        unsplit_forward_backward,
    )

    d_model, hidden, batch, seq = SHAPE
    torch.manual_seed(seed)
    linear1, linear2 = nn.Linear(d_model, hidden), nn.Linear(hidden, d_model)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, seq, d_model, generator=gen)
    dy = torch.randn(batch, seq, d_model, generator=gen)
    y_ref, dx_ref, grads_ref = unsplit_forward_backward(linear1, linear2, x, dy)
    with TensorParallelMLP(linear1, linear2, workers, algorithm=algorithm) as tp:
        result = tp.forward_backward(x, dy)
    out_diff = max(max_diff(y, y_ref) for y in result.outputs)
    grad_diffs = [max_diff(dx, dx_ref) for dx in result.input_grads]
    grad_diffs += [max_diff(result.grads[k], g) for k, g in grads_ref.items()]
    return {
        "workers": workers,
        "allreduce": algorithm,
        "shape": [batch, seq, d_model],
        "hidden": hidden,
        "max_output_diff": out_diff,
        "max_grad_diff": max(grad_diffs),
        "bytes_forward_per_worker": result.bytes_forward,
        "bytes_backward_per_worker": result.bytes_backward,
    }


def run(args: argparse.Namespace) -> int:
    workers = int_flag(args, "--workers", 1, MAX_WORKERS)
    if args.allreduce not in ALGORITHMS:
        raise CourseInputError(
            f"--allreduce must be one of {', '.join(ALGORITHMS)}, got {args.allreduce!r}"
        )
    result = compare(workers, args.allreduce)
    if args.json:
        print(json.dumps(result, indent=2, allow_nan=False))
        return 0
    b, s, d = result["shape"]
    print(
        f"tensor-parallel MLP {d} -> {result['hidden']} -> {d} on {result['workers']} threads, "
        f"input {b}x{s}x{d}, {result['allreduce']} all-reduce"
    )
    print(f"  max |output diff| vs unsplit:   {result['max_output_diff']:.2e}")
    print(f"  max |gradient diff| vs unsplit: {result['max_grad_diff']:.2e}")
    fwd = ", ".join(str(x) for x in result["bytes_forward_per_worker"])
    bwd = ", ".join(str(x) for x in result["bytes_backward_per_worker"])
    print(f"  bytes sent per worker: forward [{fwd}], backward [{bwd}]")
    return 0
