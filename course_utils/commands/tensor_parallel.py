"""`python -m course_utils tensor-parallel --workers N`: the Megatron-split MLP on N threads
against the unsplit MLP: outputs, gradients, bytes each worker sends, and the step timed on
the virtual (or wall) clock beside the simulator's prediction."""

from __future__ import annotations

import argparse

from course_utils.commands.common import (
    add_allreduce_argument,
    add_json_and_clock_arguments,
    allreduce_from_args,
    check_trace,
    clock_words,
    fastest_run,
    int_flag,
    links_from_args,
    printed_as_json,
    write_trace,
)
from course_utils.errors import CourseInputError
from course_utils.validation import MAX_WORKERS  # threads on a laptop

HELP = "tensor-parallel MLP on threads vs unsplit"
MAX_D_MODEL, MAX_TOKENS = 1024, 4096  # an MLP of d -> 4d -> d on at most this many tokens
# Activations (and each worker's copy of the output and input gradient) grow with tokens x d:
# at 2**20 a run on 8 workers peaks under 1 GB, at 2**21 at 1.3 GB (tests/test_limits.py).
MAX_TOKEN_DIMS = 2**20
D_MODEL, TOKENS = 64, 512


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"{HELP}. Limits: at most {MAX_WORKERS} workers, --d-model {MAX_D_MODEL} and "
        f"{MAX_TOKENS} tokens, --tokens x --d-model <= {MAX_TOKEN_DIMS:,} (under 1 GB)."
    )
    parser.add_argument(
        "--workers", type=int, default=2, help=f"tensor-parallel devices (limit: 1-{MAX_WORKERS})"
    )
    add_allreduce_argument(parser)
    parser.add_argument(
        "--d-model",
        type=int,
        default=D_MODEL,
        help=f"the MLP is d -> 4d -> d, 1 to {MAX_D_MODEL} (default {D_MODEL})",
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=TOKENS,
        help=f"tokens in the batch, 1 to {MAX_TOKENS} (default {TOKENS})",
    )
    add_json_and_clock_arguments(parser)


def compare(
    workers: int,
    algorithm: str = "ring",
    seed: int = 0,
    d_model: int = D_MODEL,
    tokens: int = TOKENS,
    clock: str = "virtual",
    links=None,
) -> dict:
    """Run an MLP d -> 4d -> d split over `workers` threads vs unsplit; time both."""
    import torch
    from torch import nn

    from course_utils.parallel.tensor_parallel import (
        TensorParallelMLP,
        max_diff,
        simulated_step_s,
        unsplit_forward_backward,
        unsplit_step_s,
    )

    hidden = 4 * d_model
    torch.manual_seed(seed)
    linear1, linear2 = nn.Linear(d_model, hidden), nn.Linear(hidden, d_model)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(tokens, d_model, generator=gen)
    dy = torch.randn(tokens, d_model, generator=gen)
    y_ref, dx_ref, grads_ref = unsplit_forward_backward(linear1, linear2, x, dy)
    with TensorParallelMLP(
        linear1, linear2, workers, algorithm=algorithm, clock=clock, links=links
    ) as tp:
        result = fastest_run(lambda: tp.forward_backward(x, dy))
    out_diff = max(max_diff(y, y_ref) for y in result.outputs)
    grad_diffs = [max_diff(dx, dx_ref) for dx in result.input_grads]
    grad_diffs += [max_diff(result.grads[k], g) for k, g in grads_ref.items()]
    unsplit = unsplit_step_s(linear1, linear2, x, dy, clock=clock)
    assert result.timeline is not None
    measured = result.timeline.makespan
    return {
        "workers": workers,
        "allreduce": algorithm,
        "tokens": tokens,
        "d_model": d_model,
        "hidden": hidden,
        "max_output_diff": out_diff,
        "max_grad_diff": max(grad_diffs),
        "bytes_forward_per_worker": result.bytes_forward,
        "bytes_backward_per_worker": result.bytes_backward,
        "measured_step_s": measured,
        "simulated_step_s": simulated_step_s(result, links if clock == "virtual" else None),
        "unsplit_step_s": unsplit,
        "speedup": unsplit / measured,
        "timeline": result.timeline,  # the command writes it to --trace, then drops it
    }


def run(args: argparse.Namespace) -> int:
    workers = int_flag(args, "--workers", 1, MAX_WORKERS)
    algorithm = allreduce_from_args(args)
    d_model = int_flag(args, "--d-model", 1, MAX_D_MODEL)
    tokens = int_flag(args, "--tokens", 1, MAX_TOKENS)
    if tokens * d_model > MAX_TOKEN_DIMS:
        raise CourseInputError(
            f"--tokens x --d-model must be <= {MAX_TOKEN_DIMS:,} to keep memory under 1 GB, "
            f"got {tokens} x {d_model} = {tokens * d_model:,}"
        )
    check_trace(args)
    links = links_from_args(args)
    result = compare(
        workers, algorithm, d_model=d_model, tokens=tokens, clock=args.clock, links=links
    )
    write_trace(args, result.pop("timeline"), f"tensor-parallel, {workers} workers")
    if printed_as_json(args, links, result):
        return 0
    d = result["d_model"]
    print(
        f"tensor-parallel MLP {d} -> {result['hidden']} -> {d} on {result['workers']} threads, "
        f"{result['tokens']} tokens, {result['allreduce']} all-reduce"
    )
    print(f"  max |output diff| vs unsplit:   {result['max_output_diff']:.2e}")
    print(f"  max |gradient diff| vs unsplit: {result['max_grad_diff']:.2e}")
    fwd = ", ".join(str(x) for x in result["bytes_forward_per_worker"])
    bwd = ", ".join(str(x) for x in result["bytes_backward_per_worker"])
    print(f"  bytes sent per worker: forward [{fwd}], backward [{bwd}]")
    print(
        f"  forward + backward: {1e3 * result['measured_step_s']:.2f} ms vs "
        f"{1e3 * result['unsplit_step_s']:.2f} ms unsplit -> speed-up {result['speedup']:.2f}x; "
        f"simulated {1e3 * result['simulated_step_s']:.2f} ms"
    )
    print(f"  ({clock_words(args, links)})")
    return 0
