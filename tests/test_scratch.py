"""Scratch folders of runs on processes: a killed run's folder is removed by the next run of
its kind, never a living process's, another kind's or a folder the course did not make."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from course_utils.distributed.scratch import scratch_folder


def test_the_next_run_removes_only_the_folders_of_processes_that_are_gone(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = tmp_path / f"course-worker-{int(gone.stdout)}-abc"
    living = tmp_path / f"course-worker-{os.getpid()}-def"
    other_kind = tmp_path / f"course-job-{int(gone.stdout)}-ghi"
    not_ours = tmp_path / "course-worker-notapid"
    for folder in (dead, living, other_kind, not_ours):
        (folder / "rank0.out").parent.mkdir()
        (folder / "rank0.out").write_text("x")
    made = scratch_folder("worker")
    assert not dead.exists()
    assert living.is_dir() and other_kind.is_dir() and not_ours.is_dir()
    assert made.is_dir() and made.parent == tmp_path
    assert made.name.startswith(f"course-worker-{os.getpid()}-")
