"""The PyTorch releases the course supports, and what an older one lacks, said in one line.

The course supports PyTorch 2.10 to 2.13 (docs/environment.md: the first release of each API,
read from the wheels; `make test-compat` runs the oldest). On an older torch, or on 2.10 and
2.11 for the V schedules on processes, the thread lessons still run; a run on processes that
needs a newer release stops with a `CourseInputError` naming what is missing and the release
that brought it, before any process starts, instead of an error inside a worker.
"""

from __future__ import annotations

from course_utils.errors import CourseInputError

OLDEST_TORCH = "2.10.0"  # the first release whose pipelines run on gloo; make test-compat
NEWEST_TESTED_TORCH = "2.13.0"  # requirements.txt's pin

# What the course runs on processes -> (the first release where it works, what it is).
FIRST_RELEASE = {
    "ScheduleGPipe": ("2.4", "torch.distributed.pipelining's ScheduleGPipe"),
    "Schedule1F1B": ("2.4", "torch.distributed.pipelining's Schedule1F1B"),
    "ScheduleLoopedBFS": ("2.4", "torch.distributed.pipelining's ScheduleLoopedBFS"),
    "ScheduleInterleaved1F1B": ("2.4", "torch.distributed.pipelining's ScheduleInterleaved1F1B"),
    "_PipelineScheduleRuntime": ("2.5", "PyTorch's runtime for a schedule read from CSV"),
    "ScheduleZBVZeroBubble": ("2.6", "torch.distributed.pipelining's ScheduleZBVZeroBubble"),
    "ScheduleDualPipeV": ("2.9", "torch.distributed.pipelining's ScheduleDualPipeV"),
    "fully_shard": ("2.6", "FSDP2's torch.distributed.fsdp.fully_shard"),
    # 2.9.x: the stages' first handshake sends an int64 where the neighbour receives a
    # float32 (PipelineStage._get_init_p2p_neighbors_ops); gloo aborts both processes.
    "pipelines on gloo": ("2.10", "a pipeline on CPU processes (gloo)"),
    # 2.10 and 2.11: the same handshake makes a process that holds two adjacent stages (the
    # turn of a V) send to itself, which gloo refuses ("Pair is not connected"). 2.12 replaced
    # that start-up (read in its source; run here on 2.13, not on 2.12, a CUDA 13 build).
    "V placement on gloo": ("2.12", "a V schedule on CPU processes (two adjacent stages on one)"),
}


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string such as '2.10.0+cu128' or '2.13.0'."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def lacks(feature: str) -> str | None:
    """One line saying this torch is too old for `feature` (a FIRST_RELEASE key), or None."""
    import torch

    first, what = FIRST_RELEASE[feature]
    if release(torch.__version__) >= release(first):
        return None
    return (
        f"{what} needs PyTorch {first} or newer; this is torch {torch.__version__}. The course "
        f"supports {OLDEST_TORCH} to {NEWEST_TESTED_TORCH}: `make lab` installs "
        f"{NEWEST_TESTED_TORCH}"
    )


def require(feature: str) -> None:
    """Raise a one-line CourseInputError when this torch is too old for `feature`."""
    message = lacks(feature)
    if message:
        raise CourseInputError(message)


def support_note(version: str) -> str | None:
    """A sentence for the set-up check when `version` is not fully supported, else None."""
    if release(version) < release(OLDEST_TORCH):
        return (
            f"PyTorch {version} is older than {OLDEST_TORCH}, the oldest release this course "
            "is tested with: the lessons on threads run, but lessons 11 and 13 run PyTorch's "
            "pipelines on processes (2.10), which stop with a message here. `make lab` "
            f"installs {NEWEST_TESTED_TORCH}. ⚠️"
        )
    if release(version) < release(FIRST_RELEASE["V placement on gloo"][0]):
        return (
            f"PyTorch {version}: every lesson runs; lesson 11 runs ZB-V and DualPipeV on "
            "threads only, because on processes they need PyTorch 2.12 (lesson 11 says why)."
        )
    if release(version) > release(NEWEST_TESTED_TORCH):
        return (
            f"PyTorch {version} is newer than {NEWEST_TESTED_TORCH}, the newest release this "
            "course is tested with: it should work; if a lesson fails, tell your instructor."
        )
    return None
