"""What bounds one sandboxed kernel on this machine, and the line `grade` says about it.

Every resource a kernel can take is bounded per sandbox (`isolation` makes the sandbox,
`kernel_start` sets the limits inside it):

- **memory**, shared mappings and tmpfs included: a cgroup v2 `memory.max` per kernel where
  this process may make cgroups (a writable, delegated cgroup with the memory controller:
  `cgroup_parent`); otherwise `RLIMIT_AS` per process, sized from the address space a
  kernel really reserves (measured once: `address_space`, a kernel with torch loaded and 32
  threads started, each thread reserving its stack and malloc arena) plus `memory_bytes`,
  beside `RLIMIT_DATA`; tmpfs are bounded by their own sizes;
- **files**: the scratch folder, `/tmp` and `/dev/shm` are tmpfs of fixed sizes, `/dev` is
  read-only, and the sockets the kernel shares with its worker are a 1 MiB tmpfs of their
  own (`isolation.worker_argv`), not a folder of the host;
- **output**: the worker reads at most `MESSAGE_BYTES` a message and `CELL_OUTPUT_BYTES` a
  cell (`kernel_output`); the row says when it cut one short;
- **CPU**: every process of a sandbox stays in its one session (`setsid` is refused by a
  seccomp filter, `kernel_start.py`), so the scheduler shares the CPU between sandboxes,
  not between the processes one of them starts; in a cgroup with the CPU controller, its own
  CPU weight too. (The cgroup path was checked on a cgroup v2 machine: a kernel's cgroup
  under the grader's parent cgroup, `memory.max` 256 MiB: 128 MiB of shared memory touched,
  512 MiB killed.)
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from course_utils.grading import isolation

CGROUPS = Path("/sys/fs/cgroup")
PROBE_THREADS = 32  # a kernel of the course runs ~20 (a per-rank harness, torch's own)
# What the rest of a kernel (the course's package, matplotlib) adds to torch and ipykernel:
# 35 MiB measured here; importing them would make the probe take seconds longer.
REST_BYTES = 256 << 20
PROBE = f"""
import threading
import ipykernel.kernelapp, torch
torch.randn(256, 256) @ torch.randn(256, 256)  # torch's own intra-op threads
ready, go = threading.Barrier({PROBE_THREADS} + 1), threading.Event()
def work():
    torch.set_num_threads(1)
    (torch.randn(64, 64) @ torch.randn(64, 64)).sum()
    bytearray(1 << 16)
    ready.wait()
    go.wait()
threads = [threading.Thread(target=work) for _ in range({PROBE_THREADS})]
for t in threads:
    t.start()
ready.wait()
peak = next(line for line in open("/proc/self/status") if line.startswith("VmPeak"))
print(int(peak.split()[1]) * 1024)
go.set()
"""
GIB = 1 << 30


@functools.cache
def address_space(sandboxed: bool = True) -> int:
    """The peak address space (bytes) of a kernel-like process with torch loaded and
    `PROBE_THREADS` threads started, measured once in a sandbox (or without one)."""
    command = [sys.executable, "-I", "-c", PROBE]
    if sandboxed:
        command = isolation.probe_argv(command)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        return int(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return 3 * GIB  # what this course's kernels reserved with 32 threads, and then some


def address_limit(memory_bytes: int, sandboxed: bool = True) -> int:
    """RLIMIT_AS for a kernel: what one reserves with torch and its threads, plus
    `memory_bytes` to use, rounded up to 256 MiB."""
    step = 256 << 20
    total = address_space(sandboxed) + REST_BYTES + memory_bytes
    return -(-total // step) * step


def _own_cgroup() -> Path | None:
    try:
        text = Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return CGROUPS / line[3:].strip().lstrip("/")
    return None


@functools.cache
def cgroup_parent() -> Path | None:
    """A cgroup v2 folder where this process may make a cgroup per kernel with `memory.max`
    (its own cgroup or the one above: the memory controller on for its children, and both
    the folder and its `cgroup.procs` writable), tried by making one; None if there is none
    (cgroup v1, no delegation: then RLIMIT_AS)."""
    own = _own_cgroup()
    if own is None or not (CGROUPS / "cgroup.controllers").is_file():
        return None
    for place in (own, own.parent):
        if place != CGROUPS and CGROUPS not in place.parents:
            continue
        try:
            enabled = (place / "cgroup.subtree_control").read_text().split()
        except OSError:
            continue
        if "memory" not in enabled or not os.access(place / "cgroup.procs", os.W_OK):
            continue
        try:
            trial = make_cgroup(place, 1 << 30, 16)
        except OSError:
            continue
        remove_cgroup(trial)
        return place
    return None


def make_cgroup(parent: Path, memory_bytes: int, processes: int) -> Path:
    """A fresh cgroup under `parent` holding at most `memory_bytes` (no swap) and
    `processes` tasks (where the pids controller is on)."""
    folder = parent / f"course-kernel-{os.getpid()}-{secrets.token_hex(4)}"
    folder.mkdir()
    try:
        (folder / "memory.max").write_text(str(memory_bytes))
        for name, value in (("memory.swap.max", "0"), ("pids.max", str(processes))):
            if (folder / name).exists():
                (folder / name).write_text(value)
    except OSError:
        remove_cgroup(folder)
        raise
    return folder


def remove_cgroup(folder: Path) -> None:
    """Kill what is left in a kernel's cgroup and remove it (quietly, as far as it can)."""
    try:
        if (folder / "cgroup.kill").exists():
            (folder / "cgroup.kill").write_text("1")
    except OSError:
        pass
    for _ in range(50):
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


def cgroup_memory(limits: isolation.Limits) -> int:
    """A kernel cgroup's `memory.max`: its memory and the tmpfs it can fill."""
    return limits.memory_bytes + limits.scratch_bytes + limits.tmp_bytes + limits.shm_bytes


@functools.cache
def setsid_blocked() -> bool:
    """Whether `kernel_start.py` can refuse `setsid` on this machine's architecture."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(isolation.LAUNCHER), "--can-filter"],
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout or "false") is True


def for_batch(total_timeout: float) -> tuple[isolation.Limits, Path | None]:
    """The limits of each kernel of a batch, and the cgroup v2 folder its kernels' cgroups
    go under (None: none here, so RLIMIT_AS bounds each process)."""
    cgroup = cgroup_parent()
    return isolation.Limits.for_notebook(total_timeout, cgroup=cgroup is not None), cgroup


def root_warning(cgroup: Path | None = None) -> str | None:
    """One line when the grader runs as root, where Linux does not apply the process limit
    (RLIMIT_NPROC) to the kernels; None otherwise. A cgroup with the pids controller still
    bounds them (`make_cgroup`), and the line says so."""
    if os.geteuid() != 0:
        return None
    pids = cgroup is not None and "pids" in _controllers(cgroup)
    return (
        "warning: grading as the root user, whose processes Linux does not hold to the limit "
        f"of {isolation.Limits.processes} processes (RLIMIT_NPROC)"
        + (" (the kernels' cgroup still bounds them)" if pids else "")
        + "; grade as a normal user"
    )


def _controllers(cgroup: Path) -> list[str]:
    try:
        return (cgroup / "cgroup.subtree_control").read_text().split()
    except OSError:
        return []


def _size(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n >> 20} MiB"


def describe(limits: isolation.Limits, cgroup: Path | None) -> str:
    """One line: which mechanisms bound each kernel here (`grade` says it at the start)."""
    from course_utils.grading import kernel_output

    cpu = "CPU shared per sandbox (setsid refused by seccomp)"
    if cgroup is not None:
        memory = f"memory {_size(cgroup_memory(limits))} per sandbox (cgroup v2, tmpfs included)"
        try:
            if "cpu" in (cgroup / "cgroup.subtree_control").read_text().split():
                cpu = "CPU shared per sandbox (setsid refused by seccomp; a cgroup's CPU weight)"
        except OSError:
            pass
    else:
        memory = (
            f"memory {_size(limits.memory_bytes)} data, {_size(limits.address_bytes)} address "
            "space (shared mappings included) per process (RLIMIT_AS: no writable cgroup v2 "
            "here)"
        )
    if not setsid_blocked():
        cpu = "CPU: setsid NOT refused (seccomp filter unknown for this architecture)"
    return (
        f"sandbox per kernel (bwrap): {memory}; tmpfs work {_size(limits.scratch_bytes)}, "
        f"/tmp {_size(limits.tmp_bytes)}, /dev/shm {_size(limits.shm_bytes)}, /dev read-only; "
        f"sockets in a {_size(isolation.IPC_BYTES)} tmpfs; output read up to "
        f"{_size(kernel_output.CELL_OUTPUT_BYTES)} a cell; {limits.processes} processes; {cpu}"
    )
