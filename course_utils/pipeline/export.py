"""Export a course schedule as the CSV file PyTorch's pipelining runtime loads.

PyTorch's `torch.distributed.pipelining` can run a hand-written schedule: its
`_PipelineScheduleRuntime._load_csv(path, format="compute_only")` (also inherited by
`ScheduleLoopedBFS`, `ScheduleInterleaved1F1B`, ...) reads one CSV row per rank, one
action per cell, each cell written like `_Action.__repr__` ("2F0", "1B3", "0I1", "0W1").
An empty cell means "nothing this step". PyTorch then adds the sends, receives and
gradient reductions itself ("lowering"), so a compute-only file is all it needs.

The course's `Action` prints exactly like PyTorch's `_Action`, so a schedule a learner
designed in the course can be written out here and run on PyTorch's runtime unchanged
(`course_utils.distributed.run_pipeline(schedule)` does that on real processes).

This module does not import torch: it only writes and reads text.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from course_utils import validation
from course_utils.actions import Action, Schedule
from course_utils.errors import CourseInputError

# The largest CSV read: a schedule the course's processes can run is a few kB (8 ranks of at
# most 64 micro-batches of a 6-layer model); reading stops before a huge file fills memory.
MAX_CSV_BYTES = validation.MB

FORMATS = ("compute_only", "compute_comms")


def to_pytorch_rows(schedule: Schedule, format: str = "compute_only") -> list[list[str]]:
    """One list of action strings per rank, as PyTorch's CSV rows.

    `format="compute_only"` keeps F/B/I/W actions only (PyTorch derives the communication);
    `format="compute_comms"` keeps every action as written, for a schedule that already
    spells out its sends and receives.
    """
    if not isinstance(schedule, Schedule):
        raise CourseInputError(
            f"schedule must be a course_utils.actions.Schedule, got {type(schedule).__name__}"
        )
    if format not in FORMATS:
        raise CourseInputError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    rows = []
    for actions in schedule.devices:
        kept = [a for a in actions if format == "compute_comms" or a.is_compute]
        rows.append([str(a) for a in kept])
    return rows


def to_pytorch_csv(
    schedule: Schedule, path: str | os.PathLike, format: str = "compute_only"
) -> Path:
    """Write `schedule` to `path` in PyTorch's pipeline CSV format; returns the path.

    Row r is rank r's actions in order. Load it on PyTorch with
    `schedule_runtime._load_csv(path, format="compute_only")`.
    PyTorch's `n_microbatches` must be `pytorch_microbatches(schedule)`: the unsplit
    "naive" schedule runs the whole batch as one micro-batch (`batch_scale`), and PyTorch
    has no such notion, so it exports as a one-micro-batch pipeline.
    """
    rows = to_pytorch_rows(schedule, format)
    path = Path(path)
    # newline="" is what the csv module wants, and what PyTorch's own _dump_csv uses.
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return path


def pytorch_microbatches(schedule: Schedule) -> int:
    """How many micro-batches the exported actions use (what PyTorch calls n_microbatches)."""
    used = {a.microbatch for actions in schedule.devices for a in actions if a.is_compute}
    return len(used - {None}) or 1


def from_pytorch_csv(
    path: str | os.PathLike, name: str | None = None, max_bytes: int = MAX_CSV_BYTES
) -> Schedule:
    """Read a PyTorch pipeline CSV (ours or one PyTorch dumped) back into a course Schedule.

    Empty cells (PyTorch's "idle this step" padding) are dropped: a course schedule is
    an order, not a grid. Stages and micro-batches are counted from the compute actions.
    A file over `max_bytes`, not UTF-8 text or not CSV is one line, read no further.
    """
    given = Path(path) if isinstance(path, os.PathLike) else path
    path = validation.input_file(given, "path", max_bytes)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except UnicodeDecodeError as exc:
        raise CourseInputError(
            f"path {str(path)!r} is not UTF-8 text (at byte {exc.start:,})"
        ) from None
    except csv.Error as exc:  # e.g. a cell over the csv module's 131,072 characters
        raise CourseInputError(f"path {str(path)!r} is not a CSV file: {exc}") from None
    devices = tuple(tuple(Action.parse(cell) for cell in row if cell.strip()) for row in rows)
    compute = [a for actions in devices for a in actions if a.is_compute]
    if not compute:
        raise CourseInputError(f"path {str(path)!r} holds no compute actions (F, B, I, W)")
    stages = 1 + max(a.stage for a in compute)
    microbatches = 1 + max(a.microbatch for a in compute if a.microbatch is not None)
    return Schedule(name or path.stem, stages, microbatches, devices)


def runnable_problem(schedule: Schedule, max_microbatches: int, max_stages: int) -> str | None:
    """Why PyTorch's runtime could not run `schedule` to the end on processes, or None: more
    micro-batches or stages than allowed, or an order the simulator cannot finish (an action
    twice or missing, a stage on two devices, a wait that never ends). Checked before any
    process starts, so a broken file is one line, not a failure inside the ranks."""
    if schedule.microbatches > max_microbatches:
        return (
            f"it uses {schedule.microbatches:,} micro-batches (numbered from 0), at most "
            f"{max_microbatches} are allowed"
        )
    if schedule.stages > max_stages:
        return f"it has {schedule.stages:,} stages, the model has {max_stages} layers to cut"
    from course_utils.pipeline.simulate import validate

    problems = validate(schedule)
    return problems[0] if problems else None
