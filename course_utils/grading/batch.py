"""Grade a whole class: every notebook in its own worker process, a row for every file.

    results = grade_all([Path("submissions")], jobs=2, variants=True)
    write_csv(results, Path("grades.csv"))

All submissions are read into memory first, so nothing one submission does to the files
around it (deleting a classmate's notebook, say) changes what the others are graded on.
Each one is then graded by `python -m course_utils.grading.worker` in a process of its own,
at most `jobs` at a time. A worker reports on a pipe the learner's kernel cannot see, with
a token only it knows; a worker that is killed, hangs past its time limit or reports
nonsense gives that submission a row with the reason and no marks, and the batch goes on.
"""

from __future__ import annotations

import base64
import csv
import json
import os
import secrets
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from course_utils.checks import DEFAULT_STUDENT
from course_utils.errors import CourseInputError
from course_utils.grading.grader import GradeResult
from course_utils.grading.notebook_tools import SOLUTIONS

MAX_FOLDER_BYTES = 50_000_000  # data files copied beside a notebook, at most


def find_submissions(paths: list[Path]) -> list[tuple[Path, str]]:
    """(notebook, student) pairs: `alice/03_x.ipynb` is alice's, `alice.ipynb` too."""
    found: list[tuple[Path, str]] = []
    for path in paths:
        if path.is_dir():
            notebooks = sorted(
                p
                for p in path.rglob("*.ipynb")
                if not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
            if not notebooks:
                raise CourseInputError(f"submission folder {str(path)!r} has no .ipynb files")
            for nb in notebooks:
                parts = nb.relative_to(path).parts
                found.append((nb, parts[0] if len(parts) > 1 else nb.stem))
        elif path.suffix != ".ipynb":
            raise CourseInputError(f"submission {str(path)!r} is not a notebook (.ipynb)")
        elif not path.exists():
            raise CourseInputError(f"submission {str(path)!r} does not exist")
        else:
            found.append((path, path.stem))
    return found


def _folder_files(notebook: Path) -> dict[str, str]:
    """The other files beside a notebook (not notebooks), base64, up to MAX_FOLDER_BYTES."""
    files, total = {}, 0
    for path in sorted(notebook.parent.iterdir()):
        if path.is_file() and path.suffix != ".ipynb":
            size = path.stat().st_size
            if total + size > MAX_FOLDER_BYTES:
                break
            files[path.name] = base64.b64encode(path.read_bytes()).decode()
            total += size
    return files


def grade_all(
    paths: list[Path],
    jobs: int = 1,
    variants: bool = False,
    lesson: int | None = None,
    solutions: Path = SOLUTIONS,
    cell_timeout: float = 120.0,
    total_timeout: float = 600.0,
    call_timeout: float = 20.0,
    on_result=None,
) -> list[GradeResult]:
    """Grade every notebook under `paths`; one result per file, in the order found."""
    submissions = find_submissions(paths)
    jobs_data = []
    for path, student in submissions:  # read everything before any learner code runs
        try:
            data, files = path.read_bytes(), _folder_files(path)
        except OSError as exc:
            data, files = None, {}
            reason = f"could not read {path}: {exc.strerror or exc}"
        jobs_data.append((path, student, data, files, None if data is not None else reason))
    results: list[GradeResult | None] = [None] * len(jobs_data)
    lock = threading.Lock()

    def work(i: int) -> None:
        path, student, data, files, reason = jobs_data[i]
        if data is None:
            result = GradeResult(notebook=str(path), student=student, problem=reason)
        else:
            job = {
                "data": base64.b64encode(data).decode(),
                "name": str(path),
                "student": student,
                "variant": student if variants else DEFAULT_STUDENT,
                "lesson": lesson,
                "solutions": str(solutions),
                "folder_files": files,
                "cell_timeout": cell_timeout,
                "total_timeout": total_timeout,
                "call_timeout": call_timeout,
            }
            result = _run_worker(job, total_timeout + 120)
        with lock:
            results[i] = result
            if on_result:
                on_result(result)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(work, range(len(jobs_data))))
    return [r for r in results if r is not None]


def _run_worker(job: dict, limit: float) -> GradeResult:
    """Grade one job in a worker process; any failure of the worker is a row, not a crash."""
    token = secrets.token_hex(16)
    job["token"] = token
    read_end, write_end = os.pipe()
    command = [sys.executable, "-m", "course_utils.grading.worker", str(write_end)]
    proc = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        pass_fds=(write_end,),
        start_new_session=True,  # its own process group: a time-out kills the kernel too
    )
    os.close(write_end)
    chunks: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(read_end, chunks))
    reader.start()
    try:
        _, err = proc.communicate(json.dumps(job).encode(), timeout=limit)
    except subprocess.TimeoutExpired:
        _kill(proc)
        reader.join(5)
        return _failed(job, f"grading did not finish within {limit:g} s")
    reader.join(10)
    report = b"".join(chunks).decode(errors="replace")
    base = _failed(job, "")
    if proc.returncode != 0:
        why = (err or b"").decode(errors="replace").strip().splitlines()
        base.problem = f"the grading process ended with code {proc.returncode}" + (
            f": {why[-1]}" if why else ""
        )
        return base
    try:
        data = json.loads(report)
    except json.JSONDecodeError:
        base.problem = "the grading process sent no readable result"
        return base
    if data.pop("token", None) != token:
        base.problem = "the grading result did not come from the grading process"
        return base
    return _result_from_dict(data)


def _drain(fd: int, chunks: list[bytes]) -> None:
    with os.fdopen(fd, "rb") as pipe:
        chunks.append(pipe.read())


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def _failed(job: dict, problem: str) -> GradeResult:
    return GradeResult(
        notebook=job["name"],
        student=job["student"],
        variant=job["variant"],
        problem=problem or None,
    )


def _result_from_dict(data: dict) -> GradeResult:
    from course_utils.grading.grader import ExerciseResult

    result = GradeResult(
        notebook=data["notebook"],
        student=data["student"],
        lesson=data.get("lesson"),
        variant=data.get("variant", DEFAULT_STUDENT),
        exercises=[ExerciseResult(**e) for e in data.get("exercises", [])],
        tampering=data.get("tampering", []),
        problem=data.get("problem"),
        notes=data.get("notes", []),
        seconds=data.get("seconds", 0.0),
    )
    return result


def write_csv(results: list[GradeResult], path: Path) -> None:
    """One row per notebook: student, notebook, lesson, variant, score, total, a 1/0 column per
    exercise, the locked cells changed or removed, and why a notebook was not graded."""
    ids = sorted(
        {e.id for r in results for e in r.exercises}, key=lambda s: tuple(map(int, s.split(".")))
    )
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(
            [
                "student",
                "notebook",
                "lesson",
                "variant",
                "score",
                "total",
                *ids,
                "tampered",
                "problem",
            ]
        )
        for r in results:
            marks = {e.id: int(e.passed) for e in r.exercises}
            tampered = "; ".join(f"{t['cell']} {t['status']}" for t in r.tampering)
            writer.writerow(
                [r.student, r.notebook, r.lesson or "", r.variant, r.score, r.total,
                 *(marks.get(i, "") for i in ids), tampered, r.problem or ""]
            )  # fmt: skip
