"""What bounds a sandbox, checked without one: the setsid filter, a kernel's cgroup, the line
`grade` says (tests/test_sandbox.py asserts each mechanism from inside real sandboxes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from gradingkit import SETSID_PROBE

from course_utils.grading import isolation, resources

LAUNCHER = isolation.LAUNCHER
SETSID_IN_A_CHILD = f"""
import os, sys
sys.path.insert(0, {str(LAUNCHER.parent)!r})
import kernel_start
if sys.argv[1] == "filtered":
    kernel_start.block_setsid()
{SETSID_PROBE}
print(setsid_errno)
"""


@pytest.mark.skipif(not resources.setsid_blocked(), reason="no filter for this architecture")
def test_the_kernel_s_filter_refuses_setsid_to_it_and_its_children():
    def setsid(mode: str) -> int:
        done = subprocess.run(
            [sys.executable, "-I", "-c", SETSID_IN_A_CHILD, mode], capture_output=True, text=True
        )
        return int(done.stdout)

    assert setsid("plain") == 0  # a forked child may leave its session...
    assert setsid("filtered") == 1  # ...but not under the filter: EPERM


def test_the_filter_is_a_program_for_known_machines_only():
    from importlib import util

    spec = util.spec_from_file_location("kernel_start", LAUNCHER)
    assert spec is not None and spec.loader is not None
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for machine in ("x86_64", "aarch64"):
        program = module.setsid_filter(machine)
        assert program is not None and len(program) == 7 * 8  # seven sock_filter entries
    assert module.setsid_filter("riscv64") is None


TOUCH = """
import mmap, sys
size = int(sys.argv[1]) << 20
block = mmap.mmap(-1, size, flags=mmap.MAP_SHARED)
for at in range(0, size, 4096):
    block[at] = 1
print("touched")
"""


@pytest.mark.skipif(resources.cgroup_parent() is None, reason="no writable cgroup v2 here")
def test_a_kernel_s_cgroup_bounds_its_shared_memory():
    parent = resources.cgroup_parent()
    assert parent is not None
    cgroup = resources.make_cgroup(parent, 256 << 20, 64)
    try:
        enter = 'echo $$ > "$0/cgroup.procs" && exec "$@"'

        def touch(mib: int) -> subprocess.CompletedProcess:
            command = ["/bin/sh", "-c", enter, str(cgroup), sys.executable, "-c", TOUCH, str(mib)]
            return subprocess.run(command, capture_output=True, text=True)

        assert touch(128).stdout.strip() == "touched"
        assert touch(512).returncode == -9  # beyond memory.max: killed
    finally:
        resources.remove_cgroup(cgroup)
    assert not cgroup.exists()


def test_grade_s_line_names_every_bound(monkeypatch):
    limits = isolation.Limits(address_bytes=6 << 30)
    line = resources.describe(limits, None)
    for said in ("4.0 GiB data", "6.0 GiB address space", "/dev/shm 64 MiB", "/dev read-only",
                 "1 MiB tmpfs", "4 MiB a cell", "512 processes"):  # fmt: skip
        assert said in line, said
    assert "\n" not in line
    monkeypatch.setattr(resources, "cgroup_memory", lambda limits: 5 << 30)
    assert "memory 5.0 GiB per sandbox (cgroup v2" in resources.describe(limits, Path("/none"))
