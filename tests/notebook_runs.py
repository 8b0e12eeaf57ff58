"""Every notebook of the course run once per test session, and what each run showed.

Lessons (notebooks/), solutions (solutions/) and the blank exercise notebooks (exercises/)
each run top to bottom in a fresh kernel pinned to one core (the Binder case), by
tests/nbrun.py under `taskset`, two notebooks at a time, one per core. A `Run` keeps the
wall time, the kernel's peak memory, the first error, the printed text, the headlines the
notebook printed (`course_utils.measure.headline`) and the executed notebook itself. The
lessons' tests (test_lessons.py) and the exercises' (test_exercises.py) read these runs
instead of running the notebooks again.

Runs are kept in artifacts/notebook-runs/ under a hash of the notebook and of the course's
code, so a second `make test` without changes reuses them; each summary also says when and on
which machine (CPU, cores, torch) the run was made. `make book` renders these executed copies
(`records`) instead of running the notebooks again. A file lock lets the pytest
workers of `make test` (pytest-xdist) share one set of runs: the first to ask runs them, the
others wait for it and read them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import queue
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import nbformat
import pytest

from course_utils.measure.reference import cpu_model

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "artifacts" / "notebook-runs"
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("[0-9][0-9]_*.ipynb"))
TIMEOUT_S = 900
# The tests that read the runs go to one pytest worker (`--dist loadgroup`): while the runs
# take both cores there, the other worker goes on with the rest instead of waiting for them.
READS_THE_RUNS = pytest.mark.xdist_group("notebook-runs")


@dataclass
class Run:
    seconds: float
    peak_mb: float
    error: str | None
    stdout: str
    headlines: list[dict]
    notebook: nbformat.NotebookNode


def _code_hash() -> str:
    """The course's code and data, and this runner: a change to any of them runs again."""
    digest = hashlib.sha256()
    files = sorted((ROOT / "course_utils").rglob("*")) + [ROOT / "tests" / "nbrun.py"]
    for path in files:
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _key(path: Path, code: str) -> str:
    digest = hashlib.sha256(path.read_bytes() + code.encode()).hexdigest()[:16]
    return f"{path.parent.name}__{path.stem}__{digest}"


def _run_one(path: Path, core: int, key: str) -> None:
    heads, saved, summary = (FOLDER / f"{key}.{ext}" for ext in ("heads", "ipynb", "json"))
    heads.unlink(missing_ok=True)
    command = [sys.executable, str(ROOT / "tests" / "nbrun.py"), str(path), "--save", str(saved)]
    if path.parent.name != "notebooks":
        command.append("--allow-errors")  # every check of an exercise notebook runs
    pinned = shutil.which("taskset") is not None and len(os.sched_getaffinity(0)) > core
    if pinned:
        command = ["taskset", "-c", str(core), *command]
    env = dict(os.environ, COURSE_HEADLINES=str(heads))
    out = subprocess.run(
        command, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT, env=env
    )
    if out.returncode != 0:
        result = {"seconds": 0.0, "peak_mb": 0.0, "error": out.stderr[-2000:], "stdout": ""}
    else:
        result = json.loads(out.stdout.strip().splitlines()[-1])
    lines = heads.read_text().splitlines() if heads.exists() else []
    result["headlines"] = [json.loads(line) for line in lines]
    result["machine"] = _machine(pinned, cores_used=1 if pinned else len(os.sched_getaffinity(0)))
    heads.unlink(missing_ok=True)
    summary.write_text(json.dumps(result, indent=1))


def _machine(pinned: bool, cores_used: int) -> dict:
    """When and where a run was made, for whoever shows its outputs (the course book)."""
    return {
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "pinned": pinned,
        "cores_used": cores_used,
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": version("torch"),
    }


def records(paths: list[Path]) -> dict[Path, Path | None]:
    """The summary (.json) of each notebook's stored run for the code as it is now, or None
    where there is none; the executed notebook lies beside it (same name, .ipynb)."""
    code = _code_hash()
    found = {p: FOLDER / f"{_key(p, code)}.json" for p in paths}
    return {p: (summary if summary.exists() else None) for p, summary in found.items()}


_lock = threading.Lock()
_runs: dict[Path, Run] = {}


def runs(paths: list[Path] | None = None) -> dict[Path, Run]:
    """The runs of `paths` (default: every lesson, solution and exercise notebook), running
    the ones not yet run (two at a time, each on its own core)."""
    paths = paths if paths is not None else LESSONS + SOLUTIONS + EXERCISES
    with _lock:
        if any(p not in _runs for p in paths):
            FOLDER.mkdir(parents=True, exist_ok=True)
            with open(FOLDER / ".lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                _run_and_load(paths)
        return {p: _runs[p] for p in paths}


def _run_and_load(paths: list[Path]) -> None:
    """Run each of `paths` without a stored run of this code (in the order given: lessons
    and solutions, the slow ones, first), then load their runs."""
    code = _code_hash()
    keys = {p: _key(p, code) for p in paths}
    todo = [p for p in keys if not (FOLDER / f"{keys[p]}.json").exists()]
    free: queue.SimpleQueue[int] = queue.SimpleQueue()
    for core in range(min(2, len(os.sched_getaffinity(0)))):
        free.put(core)

    def on_a_free_core(path: Path) -> None:
        core = free.get()
        try:
            _run_one(path, core, keys[path])
        finally:
            free.put(core)

    with ThreadPoolExecutor(free.qsize()) as pool:
        list(pool.map(on_a_free_core, todo))
    for p, key in keys.items():
        data = json.loads((FOLDER / f"{key}.json").read_text())
        saved = FOLDER / f"{key}.ipynb"
        notebook = (
            nbformat.read(saved, as_version=4) if saved.exists() else nbformat.v4.new_notebook()
        )
        fields = (data[k] for k in ("seconds", "peak_mb", "error", "stdout", "headlines"))
        _runs[p] = Run(*fields, notebook)


def run(path: Path) -> Run:
    return runs()[path]
