"""`python -m course_utils distributed`: the course's model on N real processes (gloo on
127.0.0.1) against one process and the threads, in the vocabulary of the torchrun entry point
`course_utils.distributed.train`:

    --parallel ddp        DistributedDataParallel (the default)
    --parallel fsdp       FSDP2 `fully_shard` (ZeRO-3), against the threads' ZeRO-3 too
    --parallel pipeline   a `torch.distributed.pipelining` step: --schedule NAME (PyTorch's
                          class where it has one, else the course's schedule through its CSV
                          export), or --csv FILE (a PyTorch CSV, e.g. the learner's own)
    --ring-attention      the course's ring attention with `dist.isend`/`dist.recv`

Older spellings still work: `--pipeline NAME` is `--parallel pipeline --schedule NAME`,
`--fsdp` is `--parallel fsdp`, and `--csv` without a file runs --schedule's course schedule
through its CSV export even where PyTorch has a class. (`--parallel fsdp+pipeline` needs
nodes: run it with torchrun, see `course_utils.distributed.train`.)
Prints workers, the largest gradient difference and the wall time.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from course_utils import validation
from course_utils.commands.common import exit_on_sigterm, int_flag, number_flag
from course_utils.distributed.job import MAX_BATCH, MAX_MICROBATCHES, MODEL_LAYERS, MODELS
from course_utils.errors import CourseInputError, WorkerError
from course_utils.pipeline.export import MAX_CSV_BYTES
from course_utils.pipeline.schedules import RECOMMENDED, SCHEDULES

HELP = "DDP, FSDP2, ring attention and pipelines on torch.distributed processes vs threads"
# Limits: processes (each imports torch: about 160 MB), steps (each rank returns every step's
# gradients for the comparison: 0.8 MB a step of the GPT), micro-batches, seconds; the
# batch is the model's (`job.MAX_BATCH`: about 0.6 MB a sequence of the GPT, held by the ranks
# and again by the one-process reference). Each corner fits 1.5 GB: tests/test_limits.py.
MAX_WORKERS, MAX_STEPS = validation.MAX_PROCESSES, validation.MAX_COMPARED_STEPS
MAX_TIMEOUT = 3600
PIPELINES = tuple(name for name, info in SCHEDULES.items() if info.pytorch)
PARALLEL = ("ddp", "fsdp", "pipeline")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"{HELP}. Limits: at most {MAX_WORKERS} processes, {MAX_STEPS} steps, "
        f"{MAX_MICROBATCHES} micro-batches, a batch of {MAX_BATCH['gpt']} for gpt and "
        f"{MAX_BATCH['mlp']} for mlp, a --csv of {MAX_CSV_BYTES // validation.MB} MB, "
        f"--timeout from 1 to {MAX_TIMEOUT} s."
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="number of processes (default 2, or --csv's rows)"
    )
    parser.add_argument(
        "--port", type=int, default=None, help="rendezvous port on 127.0.0.1 (default: a free one)"
    )
    parser.add_argument(
        "--parallel",
        default=None,
        help=f"one of {', '.join(PARALLEL)} (default ddp; pipeline with --schedule or --csv)",
    )
    parser.add_argument(
        "--schedule",
        default=None,
        help=f"pipeline schedule, one of {', '.join(SCHEDULES)} (default {RECOMMENDED}): "
        "PyTorch's class where it has one, else the course's schedule through PyTorch's CSV",
    )
    parser.add_argument(
        "--csv",
        nargs="?",
        const=True,
        default=None,
        metavar="FILE",
        help="run this PyTorch CSV schedule (one row per process); without FILE: run "
        "--schedule's course schedule through its CSV export (older spelling)",
    )
    parser.add_argument(
        "--pipeline",
        default=None,
        metavar="NAME",
        help="older spelling of --parallel pipeline --schedule NAME",
    )
    parser.add_argument(
        "--fsdp", action="store_true", help="older spelling of --parallel fsdp (default model mlp)"
    )
    parser.add_argument(
        "--ring-attention",
        action="store_true",
        help="run ring attention (causal, zig-zag split, 64 tokens per process) with "
        "isend/recv instead of DDP, against full attention and the threads' ring",
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="DDP/FSDP training steps (default 1; 2 for fsdp)"
    )
    parser.add_argument("--microbatches", type=int, default=4, help="pipeline micro-batches")
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        help="global batch size (default: 4 per worker for DDP, 2 per micro-batch for pipelines)",
    )
    parser.add_argument("--model", default=None, help=f"one of {', '.join(MODELS)}")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before giving up")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _resolve_aliases(args: argparse.Namespace) -> None:
    """Turn the older spellings into --parallel/--schedule, refusing contradictions."""
    csv_file = args.csv if isinstance(args.csv, str) else None
    if args.ring_attention and (
        args.fsdp or args.pipeline is not None or args.csv or args.parallel or args.schedule
    ):
        raise CourseInputError(
            "--ring-attention runs alone: it cannot go with --fsdp, --pipeline, --parallel, "
            "--schedule or --csv"
        )
    if args.fsdp:
        if args.pipeline is not None or args.csv or args.schedule:
            raise CourseInputError(
                "--fsdp trains data-parallel: it cannot go with --pipeline, --schedule or --csv"
            )
        if args.parallel not in (None, "fsdp"):
            raise CourseInputError(f"--fsdp is --parallel fsdp: not --parallel {args.parallel}")
        args.parallel = "fsdp"
    args.schedule_flag = "--schedule"
    if args.pipeline is not None:
        if args.schedule not in (None, args.pipeline):
            raise CourseInputError("--pipeline NAME is --schedule NAME: give one of them")
        if csv_file:
            raise CourseInputError("give --pipeline NAME or --csv FILE, not both")
        args.schedule, args.schedule_flag = args.pipeline, "--pipeline"
    if args.parallel is None:
        args.parallel = "pipeline" if args.schedule or args.csv else "ddp"
    if args.parallel not in PARALLEL:
        raise CourseInputError(
            f"--parallel must be one of {', '.join(PARALLEL)}, got {args.parallel!r}"
            + (" (it needs nodes: run course_utils.distributed.train with torchrun)"
               if args.parallel == "fsdp+pipeline" else "")
        )  # fmt: skip
    if args.parallel != "pipeline" and (args.schedule or args.csv):
        raise CourseInputError(
            f"--schedule and --csv go with --parallel pipeline, not {args.parallel}"
        )
    if args.csv is True and args.schedule is None:
        raise CourseInputError(
            "--csv without a file needs --schedule NAME (the course schedule to export), "
            "or give the file: --csv FILE"
        )
    if csv_file and args.schedule:
        raise CourseInputError("give --schedule NAME or --csv FILE, not both")


def _check(args: argparse.Namespace) -> None:
    """Every argument, before a process is started or torch imported."""
    _resolve_aliases(args)
    pipeline = args.parallel == "pipeline"
    if args.model is not None and args.model not in MODELS:
        raise CourseInputError(f"--model must be one of {', '.join(MODELS)}, got {args.model!r}")
    model = args.model or ("mlp" if args.parallel == "fsdp" else "gpt")
    if isinstance(args.csv, str):
        from course_utils.pipeline.export import from_pytorch_csv, runnable_problem

        try:
            args.csv_schedule = from_pytorch_csv(args.csv)
            problem = runnable_problem(args.csv_schedule, MAX_MICROBATCHES, MODEL_LAYERS[model])
        except CourseInputError as exc:
            problem = str(exc)
        if problem:
            raise CourseInputError(f"--csv {args.csv}: {problem}") from None
        if args.workers is None:
            args.workers = args.csv_schedule.num_devices
    if args.workers is None:
        args.workers = 2
    int_flag(args, "--workers", 2 if pipeline else 1, MAX_WORKERS)
    if args.steps is None:
        args.steps = 2 if args.parallel == "fsdp" else 1
    int_flag(args, "--steps", 1, MAX_STEPS)
    int_flag(args, "--microbatches", 1, MAX_MICROBATCHES)
    if args.batch is not None:
        int_flag(args, "--batch", 1, MAX_BATCH[model])
    number_flag(args, "--timeout", 1.0, MAX_TIMEOUT)
    if args.port is not None:
        int_flag(args, "--port", 1, 65535)
    else:
        validation.env_port("MASTER_PORT")  # before torch: a typo costs no import
    if not pipeline:
        if args.batch is not None and args.batch % args.workers:
            raise CourseInputError(
                f"--batch must be a multiple of --workers ({args.workers}), got {args.batch}"
            )
        return
    if isinstance(args.csv, str):
        rows = args.csv_schedule.num_devices
        if rows != args.workers:
            raise CourseInputError(
                f"--csv {args.csv} has {rows} rows (one per process), but --workers is "
                f"{args.workers}: export the schedule for {args.workers} devices"
            )
        _check_pipeline_batch(args, args.csv_schedule.microbatches, "the CSV's micro-batches")
        return
    args.schedule = args.schedule or RECOMMENDED
    if args.schedule not in SCHEDULES:
        raise CourseInputError(
            f"{args.schedule_flag} must be one of {', '.join(SCHEDULES)}, got {args.schedule!r}"
        )
    from course_utils.pipeline.schedules import check_shape

    try:
        check_shape(args.schedule, args.workers, args.microbatches)
    except CourseInputError as exc:
        raise CourseInputError(f"{args.schedule_flag} {args.schedule}: {exc}") from None
    stages = args.workers * (2 if SCHEDULES[args.schedule].uses_chunks else 1)
    if stages > MODEL_LAYERS[model]:
        raise CourseInputError(
            f"{args.schedule_flag} {args.schedule} on {args.workers} processes makes {stages} "
            f"stages, but the {model} model has {MODEL_LAYERS[model]} layers to cut: use "
            "fewer --workers"
        )
    _check_pipeline_batch(args, args.microbatches, "--microbatches")


def _check_pipeline_batch(args: argparse.Namespace, microbatches: int, what: str) -> None:
    """--batch (default 2 per micro-batch) must split into the pipeline's micro-batches."""
    if args.batch is not None and args.batch % microbatches:
        raise CourseInputError(
            f"--batch must be a multiple of {what} ({microbatches}), got {args.batch}"
        )


def _run_from_args(args: argparse.Namespace):
    """Pick and run the comparison the command-line arguments ask for."""
    from course_utils.distributed import course_schedule, run_ddp, run_pipeline

    if args.parallel == "fsdp":
        from course_utils.distributed.fsdp import run_fsdp

        batch = args.batch if args.batch is not None else 4 * args.workers
        model = args.model or "mlp"
        result = run_fsdp(
            args.workers, args.steps, batch, model, port=args.port, timeout=args.timeout
        )
        return result, "FSDP2 (fully_shard)"
    if args.parallel == "ddp":
        batch = args.batch if args.batch is not None else 4 * args.workers
        result = run_ddp(
            args.workers, args.steps, batch, args.model, port=args.port, timeout=args.timeout
        )
        return result, "DDP"
    microbatches = args.microbatches
    if isinstance(args.csv, str):  # the learner's own CSV file
        schedule, what = args.csv_schedule, f"pipeline {args.csv} (CSV)"
        microbatches = args.csv_schedule.microbatches
    elif args.csv or not SCHEDULES[args.schedule].pytorch:  # the course's, through its CSV
        schedule = course_schedule(args.schedule, args.workers, args.microbatches)
        what = f"pipeline {args.schedule} (CSV)"
    else:  # PyTorch's own class
        schedule, what = args.schedule, f"pipeline {args.schedule}"
    result = run_pipeline(
        schedule,
        args.workers,
        args.microbatches,
        args.batch if args.batch is not None else 2 * microbatches,
        args.model,
        port=args.port,
        timeout=args.timeout,
    )
    return result, what


def _ring(args: argparse.Namespace) -> int:
    from course_utils.distributed import HOST
    from course_utils.distributed.ring import run_ring_attention

    try:
        out = run_ring_attention(
            args.workers, seq=64 * args.workers, port=args.port, timeout=args.timeout
        )
    except WorkerError as exc:
        print(f"python -m course_utils distributed: failed: {exc}", file=sys.stderr)
        return 1
    if not _finite(out):
        print(f"python -m course_utils distributed: failed: a difference is not finite: {out}",
              file=sys.stderr)  # fmt: skip
        return 1
    if args.json:
        print(json.dumps(out, allow_nan=False))
        return 0
    print(
        f"ring attention (causal, zig-zag) on {out['workers']} processes (gloo, {HOST}), "
        f"{out['seq']} tokens: {out['seconds']:.3f} s"
    )
    print(
        "  largest difference of output, dq, dk, dv vs full attention on one process: "
        f"{out['max_diff_one_process']:.2e}"
    )
    print(f"  largest difference vs the threads' ring: {out['max_diff_threads']:.2e}")
    print(
        f"  bytes sent per process: forward {out['bytes_forward']}, "
        f"backward {out['bytes_backward']} (threads' forward: {out['threads_bytes_forward']})"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    _check(args)
    exit_on_sigterm()  # the ranks are closed on the way out, none left behind
    if args.ring_attention:
        return _ring(args)
    try:
        result, what = _run_from_args(args)
    except WorkerError as exc:
        # A failure inside a worker process: one line (COURSE_DEBUG=1 adds the traceback).
        print(f"python -m course_utils distributed: failed: {exc}", file=sys.stderr)
        return 1
    from course_utils.distributed import HOST

    out = result.to_dict()
    if args.parallel == "pipeline":
        out["schedule"] = args.csv if isinstance(args.csv, str) else args.schedule
        out["max_loss_diff"] = result.max_loss_diff
        if "executor_max_grad_diff" in result.extra:
            out["executor_max_grad_diff"] = result.extra["executor_max_grad_diff"]
    if args.parallel == "fsdp":
        for key in ("max_param_diff", "threads_max_param_diff", "held_bytes", "model_bytes"):
            if key in result.extra:
                out[key] = result.extra[key]
    if not _finite([out, result.losses, result.reference_losses, result.extra]):
        print(
            "python -m course_utils distributed: failed: a loss or a difference is not a finite "
            f"number ({out}): the run and its reference cannot be compared",
            file=sys.stderr,
        )
        return 1
    if args.json:
        print(json.dumps(out, allow_nan=False))
    else:
        print(f"{what} on {result.workers} processes (gloo, {HOST}): {result.seconds:.2f} s")
        print(f"  loss {result.losses[-1]:.6f}  vs one process {result.reference_losses[-1]:.6f}")
        print(f"  largest gradient difference vs one process: {result.max_grad_diff:.2e}")
        if "max_param_diff" in result.extra:
            extra = result.extra
            print(
                f"  largest parameter difference after {args.steps} Adam steps vs one process: "
                f"{extra['max_param_diff']:.2e}"
            )
            if "threads_max_param_diff" in extra:
                print(
                    "  largest parameter difference vs the threads' ZeRO-3: "
                    f"{extra['threads_max_param_diff']:.2e}"
                )
            print(
                f"  parameter bytes held per rank {extra['held_bytes']} of "
                f"{extra['model_bytes']} for the whole model"
            )
        if "threads_max_grad_diff" in result.extra:
            diff = result.extra["threads_max_grad_diff"]
            print(f"  largest gradient difference vs thread data parallelism: {diff:.2e}")
        if "executor_max_grad_diff" in out:
            diff = out["executor_max_grad_diff"]
            print(f"  largest gradient difference vs thread executor: {diff:.2e}")
        print("  " + result.timeline.summary())
    return 0


def _finite(value: object) -> bool:
    """No NaN or infinity among the numbers in `value` (dicts and lists looked into)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_finite(v) for v in value)
    return True
