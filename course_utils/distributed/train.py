"""`python -m course_utils.distributed.train`: the course's model on processes that `torchrun`
starts, the same program on a laptop and on a cluster.

    torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT \\
        -m course_utils.distributed.train --parallel fsdp+pipeline --steps 6 \\
        --checkpoint-dir ckpt --report report.json

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
import os
import re
import signal
import socket
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from course_utils.distributed import checkpoint
from course_utils.distributed.cluster import _die_with_parent
from course_utils.distributed.parallelize import MODES, MOMENTUM, Parallel, PipelinePlan, optimizer
from course_utils.distributed.setup import MODELS, Setup, build_model
from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import RECOMMENDED, SCHEDULES

PROG = "course_utils.distributed.train"
DESCRIPTION = (
    "Train the course's model on the processes torchrun starts (ddp, fsdp, pipeline or "
    "fsdp+pipeline), with sharded checkpoints, a restart after a failure and a JSON report."
)
RUN_FILE = "run.json"  # in the checkpoint folder: which training its checkpoints belong to
MAX_STEPS, MAX_BATCH, MAX_MICROBATCHES = 1000, 4096, 64
# Gloo's messages start with its source file and end with generic advice: keep the middle.
GLOO_NOISE = re.compile(r"\[[^\]]*\.(?:cc|cpp|h):\d+\] | This is typically caused by.*")
PEER_LOST_WAIT_S = 30.0  # how long a rank that lost a peer waits for torchrun to restart it
OPTIMIZER = f"SGD, momentum {MOMENTUM}"


def parser() -> argparse.ArgumentParser:
    from course_utils.cli import OneLineParser

    class PerNodeParser(OneLineParser):
        """Every rank stops on a usage error; the first of each node says why, in one line."""

        def exit(self, status=0, message=None):
            if message and os.environ.get("LOCAL_RANK", "0") != "0":
                message = None
            super().exit(status, message)

    p = PerNodeParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog="Start it on every node with torchrun, e.g. torchrun --nnodes=2 "
        "--nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT "
        f"-m {PROG} --parallel fsdp+pipeline --checkpoint-dir CKPT --report report.json",
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
    p.add_argument("--batch", type=int, default=8, help="global batch, sequences (default 8)")
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
        "--timeout",
        type=float,
        default=300.0,
        help="seconds a rank waits for the others in any collective before giving up",
    )
    return p


# --------------------------------------------------------------------------- who am I


@dataclass(frozen=True)
class Launch:
    """This process's place in the job, as torchrun tells it."""

    rank: int
    local_rank: int
    world: int
    local_world: int
    restart_count: int
    max_restarts: int = 0

    @property
    def restarts_left(self) -> int:
        return self.max_restarts - self.restart_count

    @property
    def nodes(self) -> int:
        return self.world // self.local_world

    @property
    def node(self) -> int:
        return self.rank // self.local_world


def launch_from_env(env=os.environ) -> Launch:
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
    missing = [n for n in names if n not in env]
    if missing:
        raise CourseInputError(
            f"{', '.join(missing)} not set: start this module with torchrun, e.g. "
            f"torchrun --nproc-per-node=2 -m {PROG} --parallel ddp"
        )
    rank, local, world, local_world = (int(env[n]) for n in names)
    restarts = (
        int(env.get(n, 0)) for n in ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")
    )
    return Launch(rank, local, world, local_world, *restarts)


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Plan:
    """What every rank will do, worked out (and checked) from the arguments and the launch."""

    parallel: str
    setup: Setup
    steps: int
    lr: float
    mesh_shape: tuple[int, ...]
    mesh_names: tuple[str, ...]
    shares: int  # the batch is cut into this many equal shares (data-parallel degree)
    pipeline: PipelinePlan | None = None
    schedule: str | None = None  # what the report calls the schedule


def make_plan(args: argparse.Namespace, launch: Launch) -> Plan:
    """Check the arguments against the launch; every rank gets the same answer."""
    for flag, low, high in [
        ("--steps", 1, MAX_STEPS),
        ("--batch", 1, MAX_BATCH),
        ("--microbatches", 1, MAX_MICROBATCHES),
        ("--checkpoint-every", 1, MAX_STEPS),
    ]:
        _int_in(args, flag, low, high)
    if not args.lr > 0 or not args.timeout > 0:
        raise CourseInputError(f"--lr and --timeout must be > 0, got {args.lr}, {args.timeout}")
    if args.fail_at_step is not None and not 1 <= args.fail_at_step <= args.steps:
        raise CourseInputError(
            f"--fail-at-step must be a step from 1 to --steps ({args.steps}), "
            f"got {args.fail_at_step}"
        )
    if args.report is not None and not args.report.endswith(".json"):
        raise CourseInputError(f"--report must end in .json, got {args.report!r}")
    if args.parallel is None:
        args.parallel = "pipeline" if args.schedule or args.csv else "ddp"
    setup = Setup(args.model, args.batch, args.seed)
    world, nodes = launch.world, launch.nodes
    pipelined = args.parallel in ("pipeline", "fsdp+pipeline")
    if not pipelined:
        for flag in ("schedule", "csv"):
            if getattr(args, flag) is not None:
                raise CourseInputError(
                    f"--{flag} goes with --parallel pipeline or fsdp+pipeline, not {args.parallel}"
                )
        _divides(args.batch, world, f"the world size ({world}): one equal share per rank")
        return Plan(args.parallel, setup, args.steps, args.lr, (world,), ("dp",), world)
    shape: tuple[int, ...]
    names: tuple[str, ...]
    if args.parallel == "pipeline":
        pp, dp = world, 1
        if pp < 2:
            raise CourseInputError(
                f"--parallel pipeline needs at least 2 processes (one pipeline rank each), "
                f"got a world size of {world}"
            )
        shape, names = (pp,), ("pp",)
    else:
        pp, dp = nodes, launch.local_world
        if nodes < 2:
            raise CourseInputError(
                "--parallel fsdp+pipeline puts one pipeline stage per node and shards it over "
                f"the node's processes: it needs --nnodes >= 2, got 1 node of {dp} processes"
            )
        shape, names = (pp, dp), ("pp", "dp")
    if args.schedule is not None and args.csv is not None:
        raise CourseInputError("give --schedule or --csv, not both")
    plan, schedule = _pipeline_plan(args, setup, pp, world)
    _divides(
        args.batch,
        dp * plan.microbatches,
        f"{dp} data-parallel share(s) x {plan.microbatches} micro-batches",
    )
    return Plan(args.parallel, setup, args.steps, args.lr, shape, names, dp, plan, schedule)


def _pipeline_plan(args, setup: Setup, pp: int, world: int) -> tuple[PipelinePlan, str]:
    """The schedule's stages and their placement on the `pp` pipeline ranks."""
    from course_utils.distributed.pipelining import course_schedule
    from course_utils.pipeline.export import from_pytorch_csv, pytorch_microbatches
    from course_utils.pipeline.schedules import check_shape

    layers = len(build_model(setup).layers())
    if args.csv is not None:
        try:
            schedule = from_pytorch_csv(args.csv)
        except CourseInputError as exc:
            raise CourseInputError(f"--csv {args.csv}: {exc}") from None
        if schedule.num_devices != pp:
            raise CourseInputError(
                f"--csv {args.csv} has {schedule.num_devices} rows (pipeline ranks), but "
                f"this launch has {pp} pipeline ranks (world size {world}): export the "
                f"schedule for {pp} devices"
            )
        kind, csv, name = "csv", args.csv, f"{Path(args.csv).name} (CSV)"
        microbatches, course = pytorch_microbatches(schedule), None
    else:
        name = args.schedule or RECOMMENDED
        if name not in SCHEDULES:
            raise CourseInputError(
                f"--schedule must be one of {', '.join(SCHEDULES)}, got {name!r}"
            )
        info = SCHEDULES[name]
        chunks = info.chunks(2 if info.uses_chunks else 1)
        if pp * chunks > layers:
            raise CourseInputError(
                f"world size {world} does not fit --schedule {name}: {pp} pipeline ranks x "
                f"{chunks} stage(s) each = {pp * chunks} stages, but the model has {layers} "
                f"layers to cut: use at most {layers // chunks} pipeline ranks"
            )
        check_shape(name, pp, args.microbatches, chunks if info.uses_chunks else 1)
        schedule = course_schedule(name, pp, args.microbatches)
        if info.pytorch:  # PyTorch's own class runs it
            kind, csv, microbatches, course = name, None, args.microbatches, None
        else:  # the course's schedule, which PyTorch's runtime reads as a CSV
            kind, csv, microbatches, course = "csv", None, pytorch_microbatches(schedule), schedule
    placement = schedule.device_of_stage()
    unplaced = sorted(set(range(schedule.stages)) - set(placement))
    if unplaced:
        raise CourseInputError(f"the schedule never runs stage(s) {unplaced}")
    if schedule.stages > layers:
        raise CourseInputError(
            f"the schedule has {schedule.stages} stages, but the model has {layers} layers"
        )
    plan = PipelinePlan(kind, schedule.stages, microbatches, placement, csv, course)
    return plan, name


def _int_in(args, flag: str, low: int, high: int) -> None:
    value = getattr(args, flag[2:].replace("-", "_"))
    if not low <= value <= high:
        raise CourseInputError(f"{flag} must be an integer from {low} to {high}, got {value}")


def _divides(batch: int, by: int, what: str) -> None:
    if batch % by:
        raise CourseInputError(f"--batch {batch} must be a multiple of {by}, {what}")


# --------------------------------------------------------------------------- agreement


def agree(problem: str | None) -> str | None:
    """Every rank's verdict to every rank: the first problem (by rank) or None. So one rank's
    missing file stops all of them together instead of leaving the others waiting."""
    verdicts: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, problem)
    return next((v for v in verdicts if v is not None), None)


def check_files(args, plan: Plan, launch: Launch) -> str | None:
    """What only this rank can see: its files. Returns the problem, or None."""
    try:
        if launch.rank == 0 and args.report is not None:
            folder = Path(args.report).resolve().parent
            if not folder.is_dir():
                return f"--report {args.report}: folder {str(folder)!r} does not exist"
        if launch.rank == 0 and args.checkpoint_dir is not None:
            return _claim_checkpoint_dir(Path(args.checkpoint_dir), plan)
    except OSError as exc:
        return f"rank {launch.rank}: {exc}"
    return None


def _run_record(plan: Plan) -> dict:
    """What a checkpoint folder's trainings must share to resume one another: the model,
    its data and the optimizer. The layout may change: DCP reshards by parameter name."""
    return {"setup": asdict(plan.setup), "optimizer": OPTIMIZER, "lr": plan.lr}


def _claim_checkpoint_dir(folder: Path, plan: Plan) -> str | None:
    folder.mkdir(parents=True, exist_ok=True)
    record = folder / RUN_FILE
    mine = _run_record(plan)
    if record.exists():
        theirs = json.loads(record.read_text())
        if theirs != mine:
            differ = sorted(k for k in mine if theirs.get(k) != mine[k])
            return (
                f"--checkpoint-dir {folder} holds checkpoints of another training "
                f"({', '.join(differ)} differ): use an empty folder"
            )
    else:
        record.write_text(json.dumps(mine, indent=1) + "\n")
    return None


def check_shared(args, plan: Plan, launch: Launch) -> str | None:
    """After rank 0 wrote the run record: can every rank read it? (shared storage)"""
    if args.checkpoint_dir is None:
        return None
    record = Path(args.checkpoint_dir) / RUN_FILE
    try:
        if json.loads(record.read_text()) == _run_record(plan):
            return None
    except (OSError, ValueError):
        pass
    return (
        f"--checkpoint-dir {args.checkpoint_dir} is not shared: rank {launch.rank} (node "
        f"{launch.node}) does not see what rank 0 wrote there; on a cluster it must be on "
        "storage every node mounts (NFS, Lustre, ...)"
    )


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


def maybe_fail(args, launch: Launch, step: int) -> None:
    """--fail-at-step: the last rank dies here, once, as a process killed on a real node."""
    if args.fail_at_step != step or launch.rank != launch.world - 1:
        return
    marker = Path(args.checkpoint_dir) / f"failed-at-step-{step}" if args.checkpoint_dir else None
    if launch.restart_count > 0 or (marker is not None and marker.exists()):
        return  # failed once already: this attempt runs through
    if marker is not None:
        marker.write_text(f"rank {launch.rank} was killed here on purpose\n")
    print(
        f"{PROG}: rank {launch.rank} (node {launch.node}): --fail-at-step {step}: "
        "killing myself (SIGKILL)",
        file=sys.stderr,
        flush=True,
    )
    os.kill(os.getpid(), signal.SIGKILL)


def resume_step(args, steps: int) -> int | None:
    """Rank 0 picks the last complete checkpoint; everyone gets its choice."""
    choice: list[int | None] = [None]
    if dist.get_rank() == 0 and args.checkpoint_dir is not None:
        choice[0] = checkpoint.latest_step(args.checkpoint_dir, at_most=steps)
    dist.broadcast_object_list(choice, src=0)
    return choice[0]


def train(args, plan: Plan, launch: Launch, device: torch.device, mesh) -> dict:
    from course_utils.distributed.clocks import clock_offset

    offset, rtt = clock_offset(device)
    par = build(plan, device, mesh)
    state = checkpoint.TrainState(par.parts, par.optimizers)
    resumed = resume_step(args, plan.steps)
    if resumed is not None:
        checkpoint.load(args.checkpoint_dir, resumed, state)
    steps, saves, losses = [], [], []
    for step in range((resumed or 0) + 1, plan.steps + 1):
        maybe_fail(args, launch, step)
        t0 = time.time_ns()
        try:
            loss, count = par.step(step)
        except Exception as exc:
            raise StepError(f" at step {step}: {type(exc).__name__}: {exc}") from exc
        t1 = time.time_ns()
        total = torch.tensor([loss, count], dtype=torch.float64, device=device)
        dist.all_reduce(total)  # every data-parallel share's loss, for the full batch's
        losses.append(float(total[0] / total[1]))
        steps.append((step, t0, t1))
        if args.checkpoint_dir and (step % args.checkpoint_every == 0 or step == plan.steps):
            t2 = time.time_ns()
            checkpoint.save(args.checkpoint_dir, step, state)
            saves.append((step, t2, time.time_ns()))
    return {
        "rank": launch.rank,
        "node": launch.node,
        "local_rank": launch.local_rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "offset": offset,
        "rtt": rtt,
        "records": par.records,
        "steps": steps,
        "saves": saves,
        "losses": losses,
        "resumed": resumed,
        "restart_count": launch.restart_count,
        "params": par.full_parameters(),
    }


def report(args, plan: Plan, launch: Launch, device: torch.device, outs: list[dict]) -> dict:
    """Rank 0: compare with one process, put every rank's times on rank 0's clock."""
    from course_utils.distributed.setup import _timeline, one_process_training

    _, _, reference = one_process_training(
        plan.setup, plan.steps, lambda ps: optimizer(ps, plan.lr)
    )
    seen: set[str] = set()
    max_diff = 0.0
    for out in outs:
        for name, value in out["params"].items():
            seen.add(name)
            max_diff = max(max_diff, float((value - reference[name]).abs().max()))
    if seen != set(reference):
        raise RuntimeError(f"no rank holds parameters {sorted(set(reference) - seen)[:3]}")

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
    name = f"{plan.parallel} on {launch.world} processes, {launch.nodes} nodes"
    timeline = _timeline(per_rank, name, {"model": plan.setup.model})
    if plan.pipeline is not None:
        timeline.stages, timeline.microbatches = plan.pipeline.stages, plan.pipeline.microbatches
        timeline.chunks = max(1, plan.pipeline.stages // plan.mesh_shape[0])
    steps = spans("steps")
    resumed = outs[0]["resumed"]
    return {
        "world_size": launch.world,
        "nodes": launch.nodes,
        "procs_per_node": launch.local_world,
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
                "clock_offset_s": o["offset"] / 1e9,
                "clock_rtt_s": o["rtt"] / 1e9,
            }
            for o in outs
        ],
        "timeline": timeline.to_dict(),
    }


def main(argv: list[str] | None = None) -> int:
    # torchrun's agent gone (killed) -> this rank goes too. The course's launcher names the
    # agent: it may have died while this process was importing torch, leaving it orphaned.
    _die_with_parent(int(os.environ.get("COURSE_AGENT_PID", os.getppid())))
    try:
        args = parser().parse_args(argv)
        launch = launch_from_env()
    except CourseInputError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if launch.max_restarts and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        if launch.local_rank == 0 and launch.restart_count == 0:
            print(
                f"{PROG}: warning: torchrun shares its rendezvous store with the ranks across "
                "restarts (pytorch/pytorch#135712): a restart may fail to connect; start "
                "torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
                file=sys.stderr,
            )
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # tiny model: more threads per process only add overhead
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", launch.local_rank) if cuda else torch.device("cpu")
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
            plan = make_plan(args, launch)
            problem = check_files(args, plan, launch)
        except CourseInputError as exc:
            problem = str(exc)
        problem = agree(problem)
        if problem is None:
            assert plan is not None
            problem = agree(check_shared(args, plan, launch))
        if problem is not None:
            if launch.local_rank == 0:  # one line per node, on every node
                print(f"{PROG}: error: {problem}", file=sys.stderr)
            return 2
        assert plan is not None
        mesh = None
        if plan.parallel != "ddp":
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh(device.type, plan.mesh_shape, mesh_dim_names=plan.mesh_names)
        out = train(args, plan, launch, device, mesh)
        gathered: list[dict] | None = [{}] * launch.world if launch.rank == 0 else None
        dist.gather_object(out, gathered, dst=0)
        if launch.rank == 0:
            assert gathered is not None
            result = report(args, plan, launch, device, gathered)
            if args.report:
                Path(args.report).write_text(json.dumps(result, indent=1) + "\n")
            print(
                f"{PROG}: {plan.parallel} on {launch.world} processes ({launch.nodes} nodes): "
                f"steps {result['first_step']}..{plan.steps} in "
                f"{sum(result['step_times_s']):.2f} s, resumed from "
                f"{result['resumed_from']}, largest parameter difference vs one process "
                f"{result['max_param_diff']:.1e}",
                flush=True,
            )
        return 0
    except Exception as exc:  # one line naming where; COURSE_DEBUG=1 adds the traceback
        what = str(exc) if isinstance(exc, StepError) else f": {type(exc).__name__}: {exc}"
        what = GLOO_NOISE.sub("", what)  # "[.../pair.cc:553] Connection closed by peer. This.."
        print(f"{PROG}: rank {launch.rank} (node {launch.node}) failed{what}".splitlines()[0],
              file=sys.stderr, flush=True)  # fmt: skip
        if os.environ.get("COURSE_DEBUG"):
            traceback.print_exc()
        if isinstance(exc, StepError) and launch.restarts_left > 0:
            # A peer died mid-step (gloo notices at once; NCCL would hang). Its node's agent
            # is re-forming the job, and ours will stop us to join it; exiting first would
            # count as this node's own failure and use up one of its --max-restarts.
            time.sleep(PEER_LOST_WAIT_S)
        return 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
