"""`python -m course_utils.distributed.train`: the course's model on processes that `torchrun`
starts, the same program on a laptop and on a cluster.

    torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT \\
        -m course_utils.distributed.train --parallel fsdp+pipeline --steps 6 \\
        --checkpoint-dir ckpt --report report.json

(`python -m course_utils.distributed.torchrun` in place of `torchrun`: the same, with these
flags checked before any process starts and a failed rank reported in one line.)

torchrun starts `--nproc-per-node` processes on every node and tells each who it is (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT, TORCHELASTIC_RESTART_COUNT).
Every process then, top to bottom:

1. joins the process group: gloo on CPUs, NCCL on GPU LOCAL_RANK when CUDA is there;
2. checks the launch (world size against the pipeline's stages, a CSV's ranks, files):
   every rank checks, they agree on the verdict, and all stop together with one line;
3. estimates its clock's offset to rank 0's (course_utils.distributed.clocks);
4. builds its part of the model for `--parallel` (course_utils.distributed.parallelize);
5. resumes from the last complete checkpoint in `--checkpoint-dir`, if there is one;
6. trains up to step `--steps` on the course's batches, a sharded checkpoint
   (torch.distributed.checkpoint) every `--checkpoint-every` steps and after the last;
7. sends rank 0 its timestamps and parameters: rank 0 compares them with one process
   training the same steps on the same data, and writes `--report` (JSON).

`--fail-at-step K` makes the last rank kill itself (SIGKILL) at the start of step K, on the
first attempt only (TORCHELASTIC_RESTART_COUNT is 0 and no marker file is in the checkpoint
folder): `torchrun --max-restarts 1` then starts every process again, and they resume from
the last checkpoint.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import socket
import sys
import time
import traceback
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

# Nothing here imports torch at the top: the flags and torchrun's variables are checked first,
# so a typo is one line at once, not after seconds of importing (`main` imports it then).
from course_utils.distributed.job import (
    MAX_BATCH,
    MAX_LR,
    MAX_MICROBATCHES,
    MAX_STEPS,
    MAX_TIMEOUT,
    MODELS,
    MODES,
    OPTIMIZER,
    PROG,
    Place,
    Plan,
    agree,
    check_arguments,
    check_files,
    check_shared,
    env_int,
    first_of_its_node,
    make_plan,
    place_from_env,
)
from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import RECOMMENDED, SCHEDULES
from course_utils.validation import MAX_PROCESSES

if TYPE_CHECKING:
    import torch

    from course_utils.distributed.parallelize import Parallel

DESCRIPTION = (
    "Train the course's model on the processes torchrun starts (ddp, fsdp, pipeline or "
    "fsdp+pipeline), with sharded checkpoints, a restart after a failure and a JSON report. "
    f"Limits: --steps up to {MAX_STEPS}, --microbatches up to {MAX_MICROBATCHES}, a batch of "
    f"{MAX_BATCH['gpt']} for gpt and {MAX_BATCH['mlp']} for mlp (every rank and rank 0's "
    f"one-process reference fit in 1.5 GB), --lr up to {MAX_LR:g}, --timeout from 1 to "
    f"{MAX_TIMEOUT:g} s."
)
# Gloo's messages start with its source file and end with generic advice: keep the middle.
GLOO_NOISE = re.compile(r"\[[^\]]*\.(?:cc|cpp|h):\d+\] | This is typically caused by.*")
PEER_LOST_WAIT_S = 30.0  # how long a rank that lost a peer waits for torchrun to restart it


def parser() -> argparse.ArgumentParser:
    from course_utils.cli import OneLineParser

    class PerNodeParser(OneLineParser):
        """Every rank stops on a usage error; the first of each node says why, in one line."""

        def exit(self, status=0, message=None):
            if message and not first_of_its_node():
                message = None
            super().exit(status, message)

    p = PerNodeParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog="Start it on every node with torchrun, e.g. torchrun --nnodes=2 "
        "--nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT "
        f"-m {PROG} --parallel fsdp+pipeline --checkpoint-dir CKPT --report report.json. "
        f"On one machine (a laptop) at most {MAX_PROCESSES} processes in all fit 1.5 GB. A bad "
        "flag or launch is one line from each node's first rank, before torch is imported "
        "where the flags alone decide; torchrun then reports the failed ranks in its own words.",
    )
    p.add_argument(
        "--parallel",
        choices=MODES,
        default=None,
        help="how the model is laid out (default ddp; pipeline when --schedule or --csv is given)",
    )
    p.add_argument(
        "--schedule",
        default=None,
        help=f"pipeline schedule, one of {', '.join(SCHEDULES)} (default {RECOMMENDED}): "
        "PyTorch's class where it has one, else the course's schedule through PyTorch's CSV",
    )
    p.add_argument(
        "--csv",
        default=None,
        metavar="FILE",
        help="run this compute-only PyTorch CSV schedule instead (one row per pipeline rank), "
        "e.g. one exported with course_utils.pipeline.export.to_pytorch_csv",
    )
    p.add_argument("--steps", type=int, default=6, help="train until this step (default 6)")
    p.add_argument(
        "--batch",
        type=int,
        default=8,
        help=f"global batch, sequences (default 8; at most {MAX_BATCH['gpt']} for gpt, "
        f"{MAX_BATCH['mlp']} for mlp)",
    )
    p.add_argument("--microbatches", type=int, default=4, help="pipeline micro-batches (4)")
    p.add_argument("--model", choices=MODELS, default="gpt", help="the course's TinyGPT or MLP")
    p.add_argument("--lr", type=float, default=0.1, help="learning rate of SGD with momentum")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and batches")
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        metavar="DIR",
        help="folder of the sharded checkpoints, resumed from if it holds some (on a cluster: "
        "storage every node mounts)",
    )
    p.add_argument(
        "--checkpoint-every", type=int, default=2, help="steps between checkpoints (default 2)"
    )
    p.add_argument("--report", default=None, metavar="FILE", help="rank 0 writes JSON here")
    p.add_argument(
        "--fail-at-step",
        type=int,
        default=None,
        metavar="K",
        help="the last rank kills itself (SIGKILL) when step K starts, on the first attempt only",
    )
    p.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="every rank runs its last step under torch.profiler and writes its Chrome trace "
        "to DIR/rank{RANK}.json (course_utils.measure.profiler.read_rank_profiles reads them)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds a rank waits for the others in any collective before giving up",
    )
    return p


# --------------------------------------------------------------------------- the run


def build(plan: Plan, device: torch.device, mesh) -> Parallel:
    from course_utils.distributed import parallelize

    if plan.parallel == "ddp":
        return parallelize.ddp(plan.setup, plan.lr, device)
    if plan.parallel == "fsdp":
        return parallelize.fsdp(plan.setup, plan.lr, device, mesh)
    assert plan.pipeline is not None  # make_plan gives pipelined modes a PipelinePlan
    dp_mesh = mesh["dp"] if plan.parallel == "fsdp+pipeline" else None
    return parallelize.pipeline(
        plan.setup, plan.lr, device, plan.pipeline, mesh["pp"] if dp_mesh else mesh, dp_mesh
    )


class StepError(RuntimeError):
    """A training step failed (its message says which step): most often a peer died."""


class Diverged(RuntimeError):
    """The loss or the parameters are no longer finite numbers (too large a learning rate):
    a comparison with one process would mean nothing."""


def maybe_fail(args, place: Place, step: int) -> None:
    """--fail-at-step: the last rank dies here, once, as a process killed on a real node."""
    if args.fail_at_step != step or place.rank != place.world - 1:
        return
    marker = Path(args.checkpoint_dir) / f"failed-at-step-{step}" if args.checkpoint_dir else None
    if place.restart_count > 0 or (marker is not None and marker.exists()):
        return  # failed once already: this attempt runs through
    if marker is not None:
        marker.write_text(f"rank {place.rank} was killed here on purpose\n")
    print(
        f"{PROG}: rank {place.rank} (node {place.node}): --fail-at-step {step}: "
        "killing myself (SIGKILL)",
        file=sys.stderr,
        flush=True,
    )
    os.kill(os.getpid(), signal.SIGKILL)


def resume_step(args, steps: int) -> int | None:
    """Rank 0 picks the last complete checkpoint; everyone gets its choice."""
    import torch.distributed as dist

    from course_utils.distributed import checkpoint

    choice: list[int | None] = [None]
    if dist.get_rank() == 0 and args.checkpoint_dir is not None:
        choice[0] = checkpoint.latest_step(args.checkpoint_dir, at_most=steps)
    dist.broadcast_object_list(choice, src=0)
    return choice[0]


def profiled_step(par: Parallel, step: int, folder: Path, rank: int):
    """`par.step(step)` under torch.profiler (CPU, and CUDA where this rank has a GPU); its
    Chrome trace goes to folder/rank{rank}.json, one file per rank, opened side by side."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    folder.mkdir(parents=True, exist_ok=True)
    with profile(activities=activities) as prof:
        result = par.step(step)
    prof.export_chrome_trace(str(folder / f"rank{rank}.json"))
    return result


def train(args, plan: Plan, place: Place, device: torch.device, mesh) -> dict:
    import torch
    import torch.distributed as dist

    from course_utils.distributed import checkpoint
    from course_utils.distributed.clocks import clock_offset

    estimate, rtt, same_clock = clock_offset(device)
    par = build(plan, device, mesh)
    state = checkpoint.TrainState(par.parts, par.optimizers)
    resumed = resume_step(args, plan.steps)
    if resumed is not None:
        checkpoint.load(args.checkpoint_dir, resumed, state)
    steps, saves, losses = [], [], []
    for step in range((resumed or 0) + 1, plan.steps + 1):
        maybe_fail(args, place, step)
        t0 = time.time_ns()
        try:
            if args.profile and step == plan.steps:
                loss, count = profiled_step(par, step, Path(args.profile), place.rank)
            else:
                loss, count = par.step(step)
        except Exception as exc:
            raise StepError(f" at step {step}: {type(exc).__name__}: {exc}") from exc
        t1 = time.time_ns()
        total = torch.tensor([loss, count], dtype=torch.float64, device=device)
        dist.all_reduce(total)  # every data-parallel share's loss, for the full batch's
        losses.append(float(total[0] / total[1]))
        if not math.isfinite(losses[-1]):  # the same on every rank: all stop here
            raise Diverged(
                f" at step {step}: the loss is {losses[-1]}: the training diverged "
                f"(--lr {args.lr:g} is too large for it)"
            )
        steps.append((step, t0, t1))
        if args.checkpoint_dir and (step % args.checkpoint_every == 0 or step == plan.steps):
            t2 = time.time_ns()
            checkpoint.save(args.checkpoint_dir, step, state)
            saves.append((step, t2, time.time_ns()))
    return {
        "rank": place.rank,
        "node": place.node,
        "local_rank": place.local_rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "offset": 0 if same_clock else estimate,  # what rank 0 corrects this rank's times by
        "estimate": estimate,
        "rtt": rtt,
        "same_clock": same_clock,
        "records": par.records,
        "steps": steps,
        "saves": saves,
        "losses": losses,
        "resumed": resumed,
        "restart_count": place.restart_count,
        "params": par.full_parameters(),
    }


def report(args, plan: Plan, place: Place, device: torch.device, outs: list[dict]) -> dict:
    """Rank 0: compare with one process, put every rank's times on rank 0's clock."""
    import torch.distributed as dist

    from course_utils.distributed.parallelize import optimizer
    from course_utils.distributed.setup import largest, measured_timeline, one_process_training

    _, _, reference = one_process_training(
        plan.setup, plan.steps, lambda ps: optimizer(ps, plan.lr), grads_of=0
    )
    seen: set[str] = set()
    differences = []
    for out in outs:
        for name, value in out["params"].items():
            seen.add(name)
            differences.append(float((value - reference[name]).abs().max()))
    if seen != set(reference):
        raise RuntimeError(f"no rank holds parameters {sorted(set(reference) - seen)[:3]}")
    max_diff = largest(differences)  # NaN if any is: a NaN is never an equality
    if not math.isfinite(max_diff):
        raise Diverged(
            f": the parameters are not finite (largest difference vs one process {max_diff}): "
            f"the training diverged (--lr {plan.lr:g} is too large for it)"
        )

    def shifted(out: dict, t: int) -> int:
        return t - out["offset"]  # this rank's clock reading, on rank 0's clock

    # Time 0 of the report: the first action any rank recorded, on rank 0's clock (the
    # timeline starts there too).
    origin = min(
        [shifted(o, s) for o in outs for _, _, s, _ in o["records"]]
        or [shifted(o, s) for o in outs for _, s, _ in o["steps"]]
        or [0]
    )

    def spans(key: str) -> list[dict]:
        """Each step (or save): from the first rank starting it to the last one ending it."""
        out = []
        for i, (step, _, _) in enumerate(outs[0][key]):
            start = min(shifted(o, o[key][i][1]) for o in outs) - origin
            end = max(shifted(o, o[key][i][2]) for o in outs) - origin
            out.append({"step": step, "start_s": start / 1e9, "end_s": end / 1e9,
                        "seconds": (end - start) / 1e9})  # fmt: skip
        return out

    per_rank = [
        [(a, lab, shifted(o, s) - origin, shifted(o, e) - origin) for a, lab, s, e in o["records"]]
        for o in outs
    ]
    name = f"{plan.parallel} on {place.world} processes, {place.nodes} nodes"
    timeline = measured_timeline(per_rank, name, {"model": plan.setup.model})
    if plan.pipeline is not None:
        timeline.stages, timeline.microbatches = plan.pipeline.stages, plan.pipeline.microbatches
        timeline.chunks = max(1, plan.pipeline.stages // plan.mesh_shape[0])
    steps = spans("steps")
    resumed = outs[0]["resumed"]
    return {
        "world_size": place.world,
        "nodes": place.nodes,
        "procs_per_node": place.local_world,
        "parallel": plan.parallel,
        "schedule": plan.schedule,
        "mesh": dict(zip(plan.mesh_names, plan.mesh_shape, strict=True)),
        "backend": dist.get_backend(),
        "device": device.type,
        "model": asdict(plan.setup),
        "microbatches": plan.pipeline.microbatches if plan.pipeline else None,
        "optimizer": f"{OPTIMIZER}, lr {plan.lr:g}",
        "steps": plan.steps,
        "steps_done": plan.steps,
        "resumed_from": resumed,
        "restart_count": max(o["restart_count"] for o in outs),
        "max_param_diff": max_diff,
        "step_times_s": [span["seconds"] for span in steps],
        "step_spans": steps,  # on the timeline's clock: where each step is on the chart
        "losses": outs[0]["losses"],
        "first_step": (resumed or 0) + 1,
        "checkpoints": spans("saves"),
        "ranks": [
            {
                "rank": o["rank"],
                "node": o["node"],
                "local_rank": o["local_rank"],
                "host": o["host"],
                "pid": o["pid"],
                "clock_offset_s": o["offset"] / 1e9,  # applied: 0 on rank 0's machine
                "clock_estimate_s": o["estimate"] / 1e9,
                "clock_rtt_s": o["rtt"] / 1e9,
                "same_clock_as_rank_0": o["same_clock"],
            }
            for o in outs
        ],
        "timeline": timeline.to_dict(),
    }


def main(argv: list[str] | None = None) -> int:
    try:
        # torchrun's agent gone (killed) -> this rank goes too. The course's launcher names
        # the agent: it may have died while this process was importing torch.
        agent = env_int("COURSE_AGENT_PID", 1, default=os.getppid())
        args = parser().parse_args(argv)
        place = place_from_env()
        check_arguments(args)
    except CourseInputError as exc:
        if first_of_its_node():  # one line per node
            print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    from course_utils.distributed.cluster import die_with_parent

    die_with_parent(agent)
    if place.max_restarts and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        if place.local_rank == 0 and place.restart_count == 0:
            print(
                f"{PROG}: warning: torchrun shares its rendezvous store with the ranks across "
                "restarts (pytorch/pytorch#135712): a restart may fail to connect; start "
                "torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
                file=sys.stderr,
            )
    try:
        return run(args, place)
    except KeyboardInterrupt:  # Ctrl-C reaches every rank: one line per node, no traceback
        if place.local_rank == 0:
            print(f"{PROG}: interrupted", file=sys.stderr, flush=True)
        return 130


def run(args: argparse.Namespace, place: Place) -> int:
    """Join the process group, check the launch with every rank, train, report."""
    import torch
    import torch.distributed as dist

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # tiny model: more threads per process only add overhead
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", place.local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        timeout=timedelta(seconds=args.timeout),
        device_id=device if cuda else None,
    )
    try:
        plan, problem = None, None
        try:
            plan = make_plan(args, place)
            problem = check_files(args, plan, place)
        except CourseInputError as exc:
            problem = str(exc)
        problem = agree(problem)
        if problem is None:
            assert plan is not None
            problem = agree(check_shared(args, plan, place))
        if problem is not None:
            if place.local_rank == 0:  # one line per node, on every node
                print(f"{PROG}: error: {problem}", file=sys.stderr)
            return 2
        assert plan is not None
        mesh = None
        if plan.parallel != "ddp":
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh(device.type, plan.mesh_shape, mesh_dim_names=plan.mesh_names)
        out = train(args, plan, place, device, mesh)
        gathered: list[dict] | None = [{}] * place.world if place.rank == 0 else None
        dist.gather_object(out, gathered, dst=0)
        if place.rank == 0:
            assert gathered is not None
            result = report(args, plan, place, device, gathered)
            if args.report:
                Path(args.report).write_text(json.dumps(result, indent=1) + "\n")
            print(
                f"{PROG}: {plan.parallel} on {place.world} processes ({place.nodes} nodes): "
                f"steps {result['first_step']}..{plan.steps} in "
                f"{sum(result['step_times_s']):.2f} s, resumed from "
                f"{result['resumed_from']}, largest parameter difference vs one process "
                f"{result['max_param_diff']:.1e}",
                flush=True,
            )
        dist.barrier()  # no rank tears its connections down while another still reads from them
        return 0
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # one line naming where; COURSE_DEBUG=1 adds the traceback
        # (BaseException: torch.distributed.checkpoint's CheckpointException is one, and it
        # carries a Ctrl-C that came during a save as one of its ranks' failures)
        if _wraps_ctrl_c(exc):
            raise KeyboardInterrupt from None
        told = isinstance(exc, StepError | Diverged)
        what = str(exc) if told else f": {type(exc).__name__}: {exc}"
        what = GLOO_NOISE.sub("", what)  # "[.../pair.cc:553] Connection closed by peer. This.."
        print(f"{PROG}: rank {place.rank} (node {place.node}) failed{what}".splitlines()[0],
              file=sys.stderr, flush=True)  # fmt: skip
        if os.environ.get("COURSE_DEBUG"):
            traceback.print_exc()
        if isinstance(exc, StepError) and place.restarts_left > 0:
            # A peer died mid-step (gloo notices at once; NCCL would hang). Its node's agent
            # is re-forming the job, and ours will stop us to join it; exiting first would
            # count as this node's own failure and use up one of its --max-restarts.
            time.sleep(PEER_LOST_WAIT_S)
        return 1
    finally:
        dist.destroy_process_group()


def _wraps_ctrl_c(exc: BaseException) -> bool:
    """Whether `exc` is a collective's report of a KeyboardInterrupt on some rank."""
    failures = getattr(exc, "failures", None)
    if not isinstance(failures, dict):
        return False
    return any(isinstance(f[0] if isinstance(f, tuple) else f, KeyboardInterrupt)
               for f in failures.values())  # fmt: skip


if __name__ == "__main__":
    code = main()
    # Everything this rank writes (report, checkpoints, logs) is written and flushed; skip the
    # interpreter's teardown, where gloo's threads can still free tensors after Python is gone
    # and abort the process (pytorch/pytorch#179291): once in CI, a rank that had trained and
    # reported correctly ended with SIGABRT, failing the job.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
