"""Inside a learner's sandbox, before any of their code: set the limits, make the scratch copy,
then become the kernel.

    python -I -S kernel_start.py '{"limits": {...}, "handout": ..., "work": ...}' -- KERNEL...

Run by `isolation.kernel_argv` as the sandbox's command. It uses the standard library only
(it runs with `-S`, before the virtual environment is on the path), sets the limits with
`setrlimit` (what `prlimit` does) so that they hold for the kernel and everything it starts,
forbids `setsid` (below), copies the submission's folder (mounted read-only) into the
memory-backed working folder, and `exec`s the kernel, which keeps the process, the limits,
the filter and the working folder.

Why `setsid` is forbidden: Linux's scheduler gives each *session* a group of its own
(autogroup) and shares the CPU fairly between groups, not processes. The whole sandbox is
one session (bwrap's `--new-session`), so however many processes a kernel starts they share
one group's share; a process that calls `setsid()` gets a group of its own, and 64 of them
took 64 shares (a neighbour's kernel ran 13-30 times slower). A seccomp filter, installed
after `no_new_privs` with `prctl` (the kernel's own interface, through ctypes: no package
needed), makes `setsid` fail with EPERM in the kernel and everything it starts.
`python kernel_start.py --can-filter` says whether this machine's architecture is covered.
"""

import ctypes
import errno
import json
import os
import platform
import resource
import shutil
import struct
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
X32_SYSCALL_BIT = 0x40000000
# machine -> (its audit architecture, the number of setsid)
SETSID = {"x86_64": (0xC000003E, 112), "aarch64": (0xC00000B7, 157)}


def _bpf(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def setsid_filter(machine: str) -> bytes | None:
    """The BPF program (struct sock_filter[]) that refuses setsid, or None if `machine` is
    not one this file knows. A system call of another architecture (32-bit calls on a 64-bit
    machine, x32's numbers) is refused too: a kernel's Python never makes one."""
    if machine not in SETSID:
        return None
    arch, setsid = SETSID[machine]
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JGE|K, RET|K
    deny = SECCOMP_RET_ERRNO | errno.EPERM
    return b"".join(
        [
            _bpf(ld, 0, 0, 4),  # seccomp_data.arch
            _bpf(jeq, 0, 4, arch),  # another architecture: refused
            _bpf(ld, 0, 0, 0),  # seccomp_data.nr
            _bpf(jge, 2, 0, X32_SYSCALL_BIT),  # x32: refused
            _bpf(jeq, 1, 0, setsid),  # setsid: refused
            _bpf(ret, 0, 0, SECCOMP_RET_ALLOW),
            _bpf(ret, 0, 0, deny),
        ]
    )


def block_setsid() -> None:
    """Install the filter in this process (inherited by what it execs and starts)."""
    program = setsid_filter(platform.machine())
    if program is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    prog = Fprog(len(program) // 8, program)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def main() -> None:
    if sys.argv[1:] == ["--can-filter"]:
        print(json.dumps(setsid_filter(platform.machine()) is not None))
        return
    settings = json.loads(sys.argv[1])
    command = sys.argv[sys.argv.index("--") + 1 :]
    limits = settings["limits"]
    chosen = [
        (resource.RLIMIT_DATA, limits["memory_bytes"]),
        (resource.RLIMIT_NPROC, limits["processes"]),
        (resource.RLIMIT_FSIZE, limits["file_bytes"]),
        (resource.RLIMIT_CORE, 0),
    ]
    if limits.get("address_bytes"):  # shared mappings too (RLIMIT_DATA counts private ones)
        chosen.append((resource.RLIMIT_AS, limits["address_bytes"]))
    for which, value in chosen:
        resource.setrlimit(which, (value, value))
    # SIGXCPU at the soft limit, SIGKILL ten seconds later.
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 10))
    block_setsid()
    shutil.copytree(settings["handout"], settings["work"], dirs_exist_ok=True)
    if "fonts" in settings:
        cache = os.environ["MPLCONFIGDIR"]
        os.makedirs(cache, exist_ok=True)
        for name in os.listdir(settings["fonts"]):
            if name.startswith("fontlist-v") and name.endswith(".json"):
                shutil.copyfile(os.path.join(settings["fonts"], name), os.path.join(cache, name))
    os.chdir(settings["work"])
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
