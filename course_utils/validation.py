"""What a user may pass in, checked in one place: the limits that fit a laptop, and the one-line
`CourseInputError` that names the argument (the commands pass the flag's name instead).

The commands and the Python API read the same limits from here, so `make_schedule`, the
`schedule` command and the planner refuse the same sizes. Every documented limit is a run that
succeeds on a 2-core laptop in under `MEMORY_BUDGET` (Binder gives 2 GB): tests/test_limits.py
runs each one and measures it. A limit may be raised on purpose (`max_actions`,
`--max-actions`) only while the predicted memory stays under `MEMORY_BUDGET` and under half of
the memory this machine has available now.

Nothing here imports torch, numpy or matplotlib: a refusal costs well under a second.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from course_utils.errors import CourseInputError

MB = 10**6
MEMORY_BUDGET = 1500 * MB  # what one run at a documented limit may use, at most

# -- the limits (the commands and the API share them) ----------------------------------------

MAX_ACTIONS = 500_000  # actions in one schedule built or simulated (about 0.4 GB as JSON)
MAX_GANTT_ACTIONS = 20_000  # bars matplotlib draws in a few seconds
MAX_THREADS = 16  # simulated devices (threads) in any one pool: data parallelism's limit
MAX_WORKERS = 8  # threads of a tensor-, context- or expert-parallel or ZeRO run
MAX_PIPELINE_DEVICES, MAX_PIPELINE_STAGES = MAX_WORKERS, 32  # PipelineExecutor and `run`
# torch.distributed processes on this machine (a Cluster, `distributed`): each one imports
# torch, about 160 MB, beside the parent's; more would not leave room for their work.
MAX_PROCESSES = 4
# Sequences (samples) of one batch on those processes, by model: every rank holds its share
# and the one-process reference all of it, about 0.6 MB a sequence of the course's GPT.
MAX_PROCESS_BATCH = {"gpt": 64, "mlp": 4096}
# Steps of a comparison on those processes: every rank returns each step's gradients (0.8 MB
# a step of the GPT) to be checked against one process's.
MAX_COMPARED_STEPS = 10
MAX_SEED = 2**31 - 1
MAX_GPUS = 65_536  # GPUs the planner searches
# Each grading job is a worker and a sandboxed kernel with torch, about 300 MB: 4 at once stay
# under the budget (tests/test_limits.py grades 4 of the heaviest lessons at once).
MAX_GRADE_JOBS = 3
MAX_NOTEBOOK_BYTES = 25 * MB  # a submitted notebook (ours are under 1 MB with outputs)
MAX_ROSTER_BYTES = 5 * MB  # a class list

# Bytes one more schedule action costs, on top of what the process holds before it starts:
# building only, printed as a table, printed as JSON, drawn as a chart. Measured (peak
# resident memory, 0.3 to 2 million actions; 20,000 to 60,000 bars) about 275, 350, 730-850 and
# 1,700 bytes, rounded up here so that a prediction is never below the run (tests/test_limits.py
# checks that at the limits).
ACTION_BYTES = {"build": 300, "table": 450, "json": 900, "gantt": 2_000}
BASE_BYTES = {"build": 20 * MB, "table": 30 * MB, "json": 30 * MB, "gantt": 120 * MB}


# -- numbers ---------------------------------------------------------------------------------


def integer(value: object, name: str, low: int = 1, high: int | None = None) -> int:
    """`value` as an int in [low, high] (bools, floats and strings refused), else one line."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        allowed = f"from {low:,} to {high:,}" if high is not None else f">= {low:,}"
        raise CourseInputError(f"{name} must be an integer {allowed}, got {shown(value)}")
    return value


def number(
    value: object, name: str, low: float = 0.0, high: float = math.inf, strict: bool = False
) -> float:
    """`value` as a finite float >= low (> low if `strict`) and <= high, else one line."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < low
        or (strict and value == low)
        or value > high
    ):
        bound = f"> {low:g}" if strict else f">= {low:g}"
        within = f" and <= {high:g}" if math.isfinite(high) else ""
        raise CourseInputError(
            f"{name} must be a finite number {bound}{within}, got {shown(value)}"
        )
    return float(value)


def choice(value: object, name: str, choices: Iterable[str]) -> str:
    """`value` if it is one of `choices` (strings only: a list or None is refused cleanly)."""
    options = list(choices)
    if not isinstance(value, str) or value not in options:
        raise CourseInputError(f"{name} must be one of {', '.join(options)}, got {shown(value)}")
    return value


def instance(value: object, name: str, kind: type | tuple[type, ...], what: str = "") -> object:
    """`value` if it is a `kind` (a class or a tuple of them), else one line naming `name`
    and what it must be (`what`, or the class's name)."""
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float)):
        if not what:
            kinds = kind if isinstance(kind, tuple) else (kind,)
            what = " or ".join(f"a {k.__name__}" for k in kinds)
        raise CourseInputError(f"{name} must be {what}, got {type(value).__name__} {shown(value)}")
    return value


def seed(value: object, name: str = "seed") -> int:
    """A random seed every generator the course uses accepts: 0 to 2**31 - 1."""
    return integer(value, name, 0, MAX_SEED)


def env_port(name: str = "MASTER_PORT") -> int | None:
    """The port in environment variable `name` (None where it is unset or empty), checked
    before torch is imported: a typo costs a one-line error, not seconds."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise CourseInputError(f"{name} must be a port number from 1 to 65535, got {text[:40]!r}")
    return int(text)


def shown(value: object) -> str:
    """`value` as an error message quotes it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- memory ----------------------------------------------------------------------------------


def available_memory() -> int | None:
    """Bytes of memory available now (free plus reclaimable cache), or None if unknown."""
    try:
        import psutil  # type: ignore[import-untyped]

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - psutil missing or unsupported here: say unknown
        return None


def memory_allowance() -> tuple[int, str]:
    """The most one run may be predicted to use now, and why: `MEMORY_BUDGET`, or half of
    the memory available now where that is less."""
    available = available_memory()
    if available is not None and available // 2 < MEMORY_BUDGET:
        return available // 2, f"half of the {available / 1e9:.1f} GB available now"
    return MEMORY_BUDGET, f"the {MEMORY_BUDGET / 1e9:g} GB a run may use"


def check_memory(predicted: int, what: str, name: str, advice: str) -> None:
    """Refuse a run predicted to need more memory than `memory_allowance()`."""
    allowed, why = memory_allowance()
    if predicted > allowed:
        raise CourseInputError(
            f"{name}: {what} would need about {predicted / 1e9:.2f} GB, over {why}: {advice}"
        )


# -- schedules -------------------------------------------------------------------------------


def schedule_actions(stages: int, microbatches: int, kinds: int = 2, unsplit: bool = False) -> int:
    """Compute actions of a schedule: `kinds` per stage and micro-batch (F and B, or F, I and
    W), or per stage only when the batch goes through unsplit (naive)."""
    return kinds * stages * (1 if unsplit else microbatches)


def check_actions(
    actions: int,
    max_actions: object,
    name: str = "max_actions",
    use: str = "build",
    default: int = MAX_ACTIONS,
    what: str = "the schedule",
) -> int:
    """Refuse `actions` over `max_actions`; a `max_actions` above `default` holds only while
    the predicted memory (`use`: build, table, json or gantt) fits `memory_allowance()`."""
    limit = integer(max_actions, name)
    if actions > limit:
        raise CourseInputError(
            f"{what} has {actions:,} actions, at most {limit:,} are allowed ({name}): use "
            f"fewer stages or micro-batches, or raise {name}"
        )
    if actions > default:
        predicted = BASE_BYTES[use] + ACTION_BYTES[use] * actions
        allowed, _ = memory_allowance()
        most = max(default, (allowed - BASE_BYTES[use]) // ACTION_BYTES[use])
        check_memory(
            predicted,
            f"{what} of {actions:,} actions",
            name,
            f"at most about {most:,} actions fit here",
        )
    return limit


# -- files -----------------------------------------------------------------------------------


def output_file(
    path: object, name: str, suffixes: Sequence[str] = (), siblings: Sequence[str] = ()
) -> Path:
    """Check that `path` can be written as a regular file before any work is done: a name
    (not empty, not a folder, not too long), a folder that exists and takes new files, and
    no device, FIFO or /proc file in its place. `suffixes` are the endings allowed;
    `siblings` are other endings that will be written beside it (a journal's .jsonl)."""
    if isinstance(path, Path):
        path = str(path)
    if not isinstance(path, str) or not path.strip():
        raise CourseInputError(f"{name} needs a file name, got {shown(path)}")
    if path.endswith(("/", os.sep)) or Path(path).name in ("", ".", ".."):
        raise CourseInputError(f"{name} {path!r} names a folder: give a file name")
    out = Path(path)
    if suffixes and out.name.lower() in suffixes:  # ".png": an ending without a name
        raise CourseInputError(
            f"{name} {path!r} is an ending without a name: give one, e.g. chart{out.name}"
        )
    if suffixes and out.suffix.lower() not in suffixes:
        allowed = ", ".join(suffixes[:-1]) + " or " + suffixes[-1] if suffixes[1:] else suffixes[0]
        raise CourseInputError(f"{name} must end in {allowed}, got {path!r}")
    limit = _name_max(out.parent)
    for part in out.parts:
        if len(os.fsencode(part)) > limit:
            raise CourseInputError(
                f"{name} {path!r}: a name in it is longer than this file system allows "
                f"({len(os.fsencode(part))} bytes, at most {limit})"
            )
    folder = out.parent
    try:
        folder_mode = folder.stat().st_mode
    except OSError as exc:
        why = "does not exist" if isinstance(exc, FileNotFoundError) else exc.strerror or str(exc)
        raise CourseInputError(f"{name} {path!r}: folder {str(folder)!r} {why}") from None
    if not stat.S_ISDIR(folder_mode):
        raise CourseInputError(
            f"{name} {path!r} cannot be written: {str(folder)!r} is a file, not a folder"
        )
    for target in (out, *(out.with_suffix(s) for s in siblings)):
        _writable_file(target, name, path)
    _folder_takes_files(folder, name, path)
    return out


def output_folder(path: object, name: str) -> Path:
    """Check that `path` is a folder that takes new files, or one that can be made (with the
    folders above it): its nearest existing folder is a folder, not a file or a device, and a
    file can be made there (not /proc, not read-only). Nothing is made yet."""
    if isinstance(path, Path):
        path = str(path)
    if not isinstance(path, str) or not path.strip():
        raise CourseInputError(f"{name} needs a folder name, got {shown(path)}")
    out = Path(path)
    limit = _name_max(Path("."))
    for part in out.parts:
        if len(os.fsencode(part)) > limit:
            raise CourseInputError(
                f"{name} {path!r}: a name in it is longer than this file system allows "
                f"({len(os.fsencode(part))} bytes, at most {limit})"
            )
    existing = out
    while not (existing.exists() or existing.is_symlink()) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "is" if existing == out else f"cannot be made: {str(existing)!r} is"
        raise CourseInputError(f"{name} {path!r} {what} a file, not a folder")
    _folder_takes_files(existing, name, path)
    return out


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder if folder.is_dir() else ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _writable_file(target: Path, name: str, path: str) -> None:
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CourseInputError(f"{name} {path!r} cannot be written: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        raise CourseInputError(f"{name} {str(target)!r} is a folder: give a file name")
    if not stat.S_ISREG(mode):
        raise CourseInputError(
            f"{name} {str(target)!r} is not a regular file (a device, FIFO or socket): "
            "give a file name"
        )
    try:  # the only sure test of write access is opening it to write (/proc files say EIO)
        with target.open("ab"):
            pass
    except OSError as exc:
        raise CourseInputError(
            f"{name} {str(target)!r} cannot be written: {exc.strerror}"
        ) from None


def _folder_takes_files(folder: Path, name: str, path: str) -> None:
    """Make (and remove) a file in `folder`: a read-only or full file system says so now."""
    probe = folder / f".course-write-test-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        raise CourseInputError(
            f"{name} {path!r}: folder {str(folder)!r} takes no new files: {exc.strerror}"
        ) from None
    os.close(fd)
    try:
        probe.unlink()
    except OSError:
        pass


def input_file(path: object, name: str, max_bytes: int) -> Path:
    """A regular file of at most `max_bytes` (a FIFO, device or huge file is refused before it
    is read, and nothing of its content is quoted)."""
    if isinstance(path, str):
        path = Path(path)
    if not isinstance(path, Path) or not str(path).strip():
        raise CourseInputError(f"{name} needs a file name, got {shown(path)}")
    try:
        info = path.stat()
    except OSError as exc:
        why = "does not exist" if isinstance(exc, FileNotFoundError) else exc.strerror
        raise CourseInputError(f"{name} {str(path)!r} {why}") from None
    if stat.S_ISDIR(info.st_mode):
        raise CourseInputError(f"{name} {str(path)!r} is a folder: give a file")
    if not stat.S_ISREG(info.st_mode):
        raise CourseInputError(f"{name} {str(path)!r} is not a regular file: not read")
    if info.st_size > max_bytes:
        raise CourseInputError(
            f"{name} {str(path)!r} is {info.st_size / 1e6:.1f} MB, over the limit of "
            f"{max_bytes / 1e6:g} MB: not read"
        )
    return path


def matplotlib_ready(name: str = "MPLBACKEND") -> None:
    """Import matplotlib now, so a bad MPLBACKEND is one line before any work, not a traceback
    after it (the commands only write files: any backend would do, but a wrong one fails)."""
    try:
        import matplotlib  # noqa: F401
    except ValueError as exc:
        value = os.environ.get("MPLBACKEND", "")
        if "backend" not in str(exc):
            raise
        raise CourseInputError(
            f"{name}={value!r} is not a matplotlib backend: unset it or set MPLBACKEND=agg "
            "(charts are written to files)"
        ) from None
