"""The job every rank runs, worked out from torchrun's environment and the arguments, and
checked: the same verdict on every rank, so that all of them stop together on a bad launch.

- `check_arguments`  every flag on its own (numbers, names), before torch is imported
- `Place`       this process's place in the job (RANK, LOCAL_RANK, WORLD_SIZE, ...)
- `make_plan`   the mesh, the batch's shares and the pipeline's stages; CourseInputError if the
                launch does not fit (a world size the schedule's stages cannot use, a CSV
                written for another number of ranks, a batch that does not divide)
- `agree`       every rank's problem to every rank: the first one, or None
- `check_files`, `check_shared`  what only some ranks can see: files, a shared checkpoint folder

Importing this module does not import torch (`make_plan` and `agree` do, when called).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from course_utils import validation
from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import RECOMMENDED, SCHEDULES

if TYPE_CHECKING:
    from course_utils.distributed.parallelize import PipelinePlan
    from course_utils.distributed.setup import Setup

PROG = "course_utils.distributed.train"
RUN_FILE = "run.json"  # in the checkpoint folder: which training its checkpoints belong to
MODES = ("ddp", "fsdp", "pipeline", "fsdp+pipeline")  # how the model is laid out (parallelize)
MODELS = ("gpt", "mlp")  # the course's TinyGPT and MLP (setup.build_model)
MODEL_LAYERS = {"gpt": 6, "mlp": 5}  # what a pipeline cuts: len(build_model(...).layers())
# Limits (the batch is the model's, `validation.MAX_PROCESS_BATCH`; tests/test_limits.py).
MAX_STEPS, MAX_MICROBATCHES = 1000, 64
MAX_BATCH = validation.MAX_PROCESS_BATCH
MAX_LR = 10.0  # SGD's learning rate: beyond it the course's model only diverges
MAX_TIMEOUT = 86_400.0  # a day: the longest a rank waits for the others
MOMENTUM = 0.9
OPTIMIZER = f"SGD, momentum {MOMENTUM}"


def check_arguments(args: argparse.Namespace) -> None:
    """Every flag on its own, each in its range (one line naming it): what needs no torch,
    no other rank and no file."""
    from course_utils.commands.common import int_flag, number_flag

    for flag, low, high in [
        ("--steps", 1, MAX_STEPS),
        ("--microbatches", 1, MAX_MICROBATCHES),
        ("--checkpoint-every", 1, MAX_STEPS),
        ("--batch", 1, MAX_BATCH[args.model]),
    ]:
        int_flag(args, flag, low, high)
    validation.seed(args.seed, "--seed")
    number_flag(args, "--lr", 0.0, MAX_LR, strict=True)
    number_flag(args, "--timeout", 1.0, MAX_TIMEOUT)
    if args.fail_at_step is not None:
        int_flag(args, "--fail-at-step", 1, args.steps)
    if args.report is not None and not args.report.endswith(".json"):
        raise CourseInputError(f"--report must end in .json, got {args.report!r}")


def first_of_its_node(env=os.environ) -> bool:
    """Whether this process says why a launch stops: LOCAL_RANK 0 (or none, or one that is
    not a number: that one line is the error), so one line per node, not one per rank."""
    local = env.get("LOCAL_RANK", "0").strip()
    return not (local.isdigit() and int(local) > 0)


def env_int(name: str, low: int = 0, default: int | None = None, env=os.environ) -> int:
    """Environment variable `name` as an integer >= `low` (torchrun's RANK, ...), else one line
    naming it; `default` where it is unset."""
    text = env.get(name)
    if text is None and default is not None:
        return default
    value = str(text).strip()
    if not value.isdigit() or int(value) < low:
        raise CourseInputError(
            f"{name} must be an integer >= {low} (torchrun sets it), got {validation.shown(text)}"
        )
    return int(value)


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
    rank, local = env_int("RANK", env=env), env_int("LOCAL_RANK", env=env)
    world, local_world = env_int("WORLD_SIZE", 1, env=env), env_int("LOCAL_WORLD_SIZE", 1, env=env)
    if not (rank < world and local < local_world <= world and world % local_world == 0):
        raise CourseInputError(
            f"RANK {rank}, LOCAL_RANK {local}, WORLD_SIZE {world} and LOCAL_WORLD_SIZE "
            f"{local_world} do not make a launch: start this module with torchrun"
        )
    restarts = (
        env_int(n, default=0, env=env)
        for n in ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")
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
    from course_utils.distributed.setup import Setup

    check_arguments(args)
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
    from course_utils.distributed.parallelize import PipelinePlan
    from course_utils.distributed.pipelining import course_schedule
    from course_utils.distributed.setup import build_model
    from course_utils.pipeline.export import (
        from_pytorch_csv,
        pytorch_microbatches,
        runnable_problem,
    )
    from course_utils.pipeline.schedules import check_shape

    layers = len(build_model(setup).layers())
    if args.csv is not None:
        try:
            schedule = from_pytorch_csv(args.csv)
            problem = runnable_problem(schedule, MAX_MICROBATCHES, layers)
        except CourseInputError as exc:
            problem = str(exc)
        if problem:
            raise CourseInputError(f"--csv {args.csv}: {problem}")
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


def _divides(batch: int, by: int, what: str) -> None:
    if batch % by:
        raise CourseInputError(f"--batch {batch} must be a multiple of {by}, {what}")


# --------------------------------------------------------------------------- agreement


def agree(problem: str | None) -> str | None:
    """Every rank's verdict to every rank: the first problem (by rank) or None. So one rank's
    missing file stops all of them together instead of leaving the others waiting."""
    import torch.distributed as dist

    verdicts: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, problem)
    return next((v for v in verdicts if v is not None), None)


def check_files(args, plan: Plan, place: Place) -> str | None:
    """What only this rank can see: its files. Returns the problem, or None."""
    try:
        if place.rank == 0 and args.report is not None:
            validation.output_file(args.report, "--report", (".json",))
        if place.rank == 0 and args.checkpoint_dir is not None:
            return _claim_checkpoint_dir(Path(args.checkpoint_dir), plan)
    except CourseInputError as exc:
        return str(exc)
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
        try:
            theirs = json.loads(record.read_text(encoding="utf-8"))
        except ValueError:  # not JSON, or not UTF-8 text
            theirs = None
        if not isinstance(theirs, dict):
            return (
                f"--checkpoint-dir {folder}: its {RUN_FILE} is not a record the course wrote: "
                "use an empty folder"
            )
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
