"""The sandbox a learner's kernel runs in: bubblewrap's command line, its limits, and the check
that one can be made on this machine.

Each kernel gets a sandbox of its own made by `bwrap` (bubblewrap, the tool Flatpak uses;
unprivileged through user namespaces):

- its own user, PID, network, IPC, UTS and cgroup namespaces: it sees only its own processes,
  so it cannot find, read or signal the grader, the other kernels or their workers; it has
  no network, so it talks to the grader over Jupyter's `ipc` transport (Unix sockets in a
  folder both can see: a 1 MiB tmpfs of the worker's own, `worker_argv`); it cannot make
  further namespaces, and it keeps no capabilities;
- a file system of read-only parts: the system's `/usr`, Python, the virtual environment,
  and `course_utils` with its `checks/` replaced by the stand-in (`stand_in.py`): no check,
  reference function or expected answer is in there, nor the solutions, nor any submission
  but its own; `/dev` is read-only too (its device nodes only);
- the only places it can write are memory-backed and bounded: its scratch copy of the
  submission's folder (its working folder and home), a private `/tmp` and a small
  `/dev/shm`; all vanish with it, so it leaves no file behind;
- limits (`kernel_start.py`, like `prlimit`) on memory, processes and threads, file size
  and CPU time, set inside the sandbox before the kernel starts, and `setsid` refused; or a
  cgroup of its own (`resources`: which bound applies on this machine);
- `--die-with-parent` and the PID namespace: when the kernel ends, or the worker that
  started it dies, every process it started is killed with it.

`problem()` says in one line why a sandbox cannot be made here (no bwrap, user namespaces
off), or None when it can; `grade` refuses then unless told `--no-sandbox`.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import course_utils

PACKAGE = Path(course_utils.__file__).resolve().parent
LAUNCHER = PACKAGE / "grading" / "kernel_start.py"
HOME = "/home/learner"  # the kernel's home; its scratch copy is HOME/work
HANDOUT = "/run/course/handout"  # the submission's folder, read-only, copied into HOME/work
FONTS = "/run/course/matplotlib"  # the grader's matplotlib font list, so no kernel rebuilds it
MIB = 1 << 20
IPC_BYTES = 1 * MIB  # the tmpfs a worker shares with its kernel: sockets and the connection file


@dataclass(frozen=True)
class Limits:
    """What one sandboxed kernel may use. Memory per process: RLIMIT_DATA (what it has written
    to, private) and, where no cgroup bounds the sandbox, RLIMIT_AS (`address_bytes`: the
    address space, shared mappings included; 0 = not set). Processes count threads, CPU is
    per process; the tmpfs are bounded by their sizes."""

    memory_bytes: int = 4096 * MIB
    processes: int = 512
    file_bytes: int = 256 * MIB
    cpu_seconds: int = 1800
    scratch_bytes: int = 512 * MIB  # the working folder (and home)
    tmp_bytes: int = 256 * MIB
    shm_bytes: int = 64 * MIB  # /dev/shm
    address_bytes: int = 0

    @classmethod
    def for_notebook(cls, total_timeout: float, cgroup: bool = False) -> Limits:
        """Limits for a notebook given `total_timeout` seconds: CPU time twice that, plus a
        minute (two busy threads for the whole run), so only a runaway process meets it;
        without a cgroup, the address space a kernel needs (measured once) plus its memory."""
        from course_utils.grading import resources

        limits = cls(cpu_seconds=int(2 * total_timeout) + 60)
        if cgroup:
            return limits
        return replace(limits, address_bytes=resources.address_limit(limits.memory_bytes))


def _system_mounts() -> list[str]:
    """The host's /usr read-only, and /bin, /lib, ... as they are there (links or folders)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    for name in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives"):
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return args


def _python_mounts() -> list[str]:
    """Python itself, the virtual environment, and this package, read-only; and any other
    site-packages folder on the path (a .pth file may add another environment's)."""
    places = {Path(sys.base_prefix), Path(sys.prefix), Path(os.path.realpath(sys.executable))}
    places |= {
        Path(entry)
        for entry in sys.path
        if Path(entry).name in ("site-packages", "dist-packages") and Path(entry).is_dir()
    }
    places |= {p.resolve() for p in places}
    places = {p.parent.parent if p.is_file() else p for p in places}  # the executable's root
    args: list[str] = []
    for place in sorted(places):
        if place.parts[:2] != ("/", "usr"):
            args += ["--ro-bind", str(place), str(place)]
    return args + ["--ro-bind", str(PACKAGE), str(PACKAGE)]


def font_cache() -> Path | None:
    """The grader's matplotlib cache folder if it holds a font list (found the way
    matplotlib finds it, without importing matplotlib)."""
    if os.environ.get("MPLCONFIGDIR"):
        folder = Path(os.environ["MPLCONFIGDIR"])
    else:
        folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "matplotlib"
    return folder if any(folder.glob("fontlist-v*.json")) else None


def _sandbox_args(limits: Limits) -> list[str]:
    """bwrap's options for a learner's sandbox, before the mounts of its own files."""
    return [
        shutil.which("bwrap") or "bwrap",
        "--unshare-all",  # pid, net, ipc, uts, cgroup: its own of each
        "--unshare-user",  # and its own user namespace, even when the grader is root
        "--disable-userns",  # ...in which it cannot make more
        "--cap-drop", "ALL",
        "--die-with-parent",
        "--new-session",  # no controlling terminal to type into (CVE-2017-5226)
        "--uid", "1000", "--gid", "1000",
        "--hostname", "grading",
        *_system_mounts(),
        "--proc", "/proc",
        # device nodes only: read-only, but for a small /dev/shm
        "--dev", "/dev", "--size", str(limits.shm_bytes), "--tmpfs", "/dev/shm",
        "--remount-ro", "/dev",
        "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
        "--size", str(limits.scratch_bytes), "--tmpfs", HOME,
        # after the private /tmp, so a Python or venv that lives under /tmp stays visible
        *_python_mounts(),
    ]  # fmt: skip


ENV = {
    "HOME": HOME,
    "USER": "learner",
    "LOGNAME": "learner",
    "PATH": f"{Path(sys.prefix) / 'bin'}:/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
    "MPLBACKEND": "Agg",
    "MPLCONFIGDIR": f"{HOME}/.matplotlib",
    "PYTHONNOUSERSITE": "1",
}


def _closing_args() -> list[str]:
    args = ["--remount-ro", "/", "--chdir", HOME, "--clearenv"]
    for name, value in ENV.items():
        args += ["--setenv", name, value]
    return args


def kernel_argv(
    ipc: Path,
    handout: Path,
    checks: Path,
    limits: Limits,
    fonts: Path | None = None,
    cgroup: Path | None = None,
) -> list[str]:
    """The command that starts a learner's kernel in a sandbox (a Jupyter kernel spec's argv,
    with `{connection_file}`, which lives in `ipc`). `handout` holds the submission's
    folder, `checks` the stand-in checks package; `cgroup` (a folder of cgroup v2) is
    entered before the sandbox is made, so everything in it is counted there."""
    args = [
        *_sandbox_args(limits),
        "--ro-bind", str(checks), str(PACKAGE / "checks"),
        "--ro-bind", str(handout), HANDOUT,
        "--bind", str(ipc), str(ipc),
    ]  # fmt: skip
    if fonts is not None:
        args += ["--ro-bind", str(fonts), FONTS]
    args += _closing_args()
    start = {"limits": asdict(limits), "handout": HANDOUT, "work": f"{HOME}/work"}
    if fonts is not None:
        start["fonts"] = FONTS
    if cgroup is not None:  # the shell moves itself into the cgroup, then becomes bwrap
        enter = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
        args = ["/bin/sh", "-c", enter, str(cgroup), *args]
    return [
        *args,
        sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(start), "--",
        sys.executable, "-I", "-m", "ipykernel_launcher", "-f", "{connection_file}",
    ]  # fmt: skip


def probe_argv(command: list[str]) -> list[str]:
    """`command` in a sandbox like a kernel's, without limits (to measure what one needs)."""
    return [*_sandbox_args(Limits()), *_closing_args(), *command]


def worker_argv(ipc: Path, command: list[str]) -> list[str]:
    """`command` (a grading worker) seeing the whole machine as it is, but for `ipc`, where
    it sees a tmpfs of `IPC_BYTES` of its own: the folder its kernels' sockets are made in,
    the only one the kernel can write outside its sandbox. On the host `ipc` stays an empty
    folder, removed (with its parent, when empty) by the shell around bwrap once the worker
    is gone, however it ended: its mount namespace gone, only a process outside can."""
    bwrap = shutil.which("bwrap") or "bwrap"
    sandboxed = [bwrap, "--dev-bind", "/", "/", "--size", str(IPC_BYTES), "--tmpfs", str(ipc)]
    tidy = '"$@"; code=$?; rmdir "$0" "$(dirname "$0")" 2>/dev/null; exit $code'
    return ["/bin/sh", "-c", tidy, str(ipc), *sandboxed, *command]


@functools.cache
def problem() -> str | None:
    """Why a sandbox cannot be made here, in one line; None when it can (checked once by
    making one, with the options a kernel's sandbox uses)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return (
            "bubblewrap (bwrap) is not installed, so learners' code cannot be sandboxed: "
            "install it (Debian/Ubuntu: sudo apt-get install bubblewrap), or pass --no-sandbox "
            "to run their code with your own permissions"
        )
    import tempfile

    try:  # a kernel's sandbox inside a worker's, as `grade` makes them
        with tempfile.TemporaryDirectory(prefix="course-probe-") as tmp:
            ipc = Path(tmp) / "ipc"
            ipc.mkdir()
            probe = worker_argv(ipc, probe_argv([sys.executable, "-I", "-S", "-c", "pass"]))
            made = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not make a sandbox here ({exc}); pass --no-sandbox to grade without"
    if made.returncode != 0:
        said = (made.stderr.strip().splitlines() or ["no reason given"])[-1]
        return (
            f"bwrap could not make a sandbox here ({said}): user namespaces may be switched off "
            "(sysctl kernel.unprivileged_userns_clone / user.max_user_namespaces, or an "
            "AppArmor policy); pass --no-sandbox to run learners' code with your permissions"
        )
    return None
