"""The PyTorch releases the course supports, and what an older one lacks, said in one line.

The course supports PyTorch 2.10 to 2.13 (docs/environment.md: the first release of each API,
read from the wheels; `make test-compat` runs the oldest). On an older torch the thread
lessons still run; a run that needs a newer API stops with a `CourseInputError` naming the
API and the release that brought it, instead of an ImportError inside a worker process.
"""

from __future__ import annotations

from course_utils.errors import CourseInputError

OLDEST_TORCH = "2.10.0"  # the first release whose pipelining runs on gloo; make test-compat
NEWEST_TESTED_TORCH = "2.13.0"  # requirements.txt's pin

PIPELINING = "torch.distributed.pipelining.schedules"
# (module, name) -> the first PyTorch release where the course can use it
FIRST_RELEASE = {
    (PIPELINING, "ScheduleGPipe"): "2.4",
    (PIPELINING, "Schedule1F1B"): "2.4",
    (PIPELINING, "ScheduleLoopedBFS"): "2.4",
    (PIPELINING, "ScheduleInterleaved1F1B"): "2.4",
    (PIPELINING, "_PipelineScheduleRuntime"): "2.5",
    (PIPELINING, "ScheduleZBVZeroBubble"): "2.6",
    (PIPELINING, "ScheduleDualPipeV"): "2.9",
    ("torch.distributed.fsdp", "fully_shard"): "2.6",
    # Every pipeline on CPU processes: the stages' first handshake in 2.9.x sends an int64
    # where the neighbour receives a float32 (PipelineStage._get_init_p2p_neighbors_ops), which
    # gloo refuses by aborting both processes; 2.10.0 sends and receives float32.
    ("torch.distributed.pipelining.stage", "PipelineStage on gloo"): "2.10",
}


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string such as '2.9.0+cu128' or '2.13.0'."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def require(module: str, name: str, what: str) -> None:
    """Raise a one-line CourseInputError when this torch is older than `module.name`'s first
    release (compared by version: importing torch.distributed.pipelining here would be slow)."""
    import torch

    first = FIRST_RELEASE[(module, name)]
    if release(torch.__version__) < release(first):
        raise CourseInputError(
            f"{what} needs PyTorch {first} or newer ({module}.{name}); this is torch "
            f"{torch.__version__}. The course supports {OLDEST_TORCH} to "
            f"{NEWEST_TESTED_TORCH}: `make lab` installs {NEWEST_TESTED_TORCH}"
        )


def support_note(version: str) -> str | None:
    """A sentence for the set-up check when `version` is outside the tested range, else None."""
    if release(version) < release(OLDEST_TORCH):
        return (
            f"PyTorch {version} is older than {OLDEST_TORCH}, the oldest release this course "
            "is tested with: the lessons on threads run, but lessons 11 and 13 run PyTorch's "
            "pipelines (2.10 on CPU processes), ScheduleDualPipeV (2.9) and FSDP2's "
            "fully_shard (2.6) on processes, which stop with a message here. `make lab` "
            f"installs {NEWEST_TESTED_TORCH}. ⚠️"
        )
    if release(version) > release(NEWEST_TESTED_TORCH):
        return (
            f"PyTorch {version} is newer than {NEWEST_TESTED_TORCH}, the newest release this "
            "course is tested with: it should work; if a lesson fails, tell your instructor."
        )
    return None
