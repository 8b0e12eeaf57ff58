"""The job every rank runs, worked out from torchrun's environment and the arguments, and
checked: the same verdict on every rank, so that all of them stop together on a bad launch.

- `Place`       this process's place in the job (RANK, LOCAL_RANK, WORLD_SIZE, ...)
- `make_plan`   the mesh, the batch's shares and the pipeline's stages; CourseInputError if the
                launch does not fit (a world size the schedule's stages cannot use, a CSV
                written for another number of ranks, a batch that does not divide)
- `agree`       every rank's problem to every rank: the first one, or None
- `check_files`, `check_shared`  what only some ranks can see: files, a shared checkpoint folder
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch.distributed as dist

from course_utils.distributed.parallelize import MOMENTUM, PipelinePlan
from course_utils.distributed.setup import Setup, build_model
from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import RECOMMENDED, SCHEDULES

PROG = "course_utils.distributed.train"
RUN_FILE = "run.json"  # in the checkpoint folder: which training its checkpoints belong to
MAX_STEPS, MAX_BATCH, MAX_MICROBATCHES = 1000, 4096, 64
OPTIMIZER = f"SGD, momentum {MOMENTUM}"


@dataclass(frozen=True)
class Place:
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


def place_from_env(env=os.environ) -> Place:
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
    return Place(rank, local, world, local_world, *restarts)


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


def make_plan(args: argparse.Namespace, place: Place) -> Plan:
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
    world, nodes = place.world, place.nodes
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
        pp, dp = nodes, place.local_world
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


def check_files(args, plan: Plan, place: Place) -> str | None:
    """What only this rank can see: its files. Returns the problem, or None."""
    try:
        if place.rank == 0 and args.report is not None:
            folder = Path(args.report).resolve().parent
            if not folder.is_dir():
                return f"--report {args.report}: folder {str(folder)!r} does not exist"
        if place.rank == 0 and args.checkpoint_dir is not None:
            return _claim_checkpoint_dir(Path(args.checkpoint_dir), plan)
    except OSError as exc:
        return f"rank {place.rank}: {exc}"
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


def check_shared(args, plan: Plan, place: Place) -> str | None:
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
        f"--checkpoint-dir {args.checkpoint_dir} is not shared: rank {place.rank} (node "
        f"{place.node}) does not see what rank 0 wrote there; on a cluster it must be on "
        "storage every node mounts (NFS, Lustre, ...)"
    )
