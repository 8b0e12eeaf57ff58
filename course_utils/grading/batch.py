"""Grade a whole class: every notebook in its own worker process, a row for every file.

    results = grade_all([Path("submissions")], jobs=2, variants=True,
                        roster=read_roster(Path("roster.csv")), journal=Path("grades.csv"))

1. Find every notebook under the folders given and whose it is (`roster.label`, `match`):
   with a roster, a notebook nobody on it owns is graded and flagged "not on the roster".
   Only regular files are read: a link (to `/etc/passwd`, say) or a FIFO is a row saying
   so, and so is a link beside a notebook (it is not copied into the sandbox). A student's
   kernel gets that student's files only (`own_files`): all of their own folder's, or in a
   flat download the ones the LMS's name pattern says are theirs; a file nobody owns
   reaches no kernel (`unowned_files` lists them). A file the LMS marked late, and a
   folder whose number is one student's and name another's, are flagged (`keep`).
2. Read everything into memory first, so nothing one submission does to the files around it
   (deleting a classmate's notebook, say) changes what the others are graded on.
3. Grade each one in `python -I -m course_utils.grading.worker`, at most `jobs` at a time,
   started in a private folder of its own (its working folder and TMPDIR: nothing there
   comes from a submission), deleted when the worker ends, however it ends. Its kernel runs
   in a sandbox (`isolation`). A worker reports on a pipe the learner's kernel cannot see,
   with a token only it knows; a worker that is killed, hangs past its time limit or
   reports nonsense gives that submission a row with the reason and no marks.
   Interrupted (Ctrl-C, SIGTERM: `stop_workers`), the batch stops every worker at once and
   writes no row for the notebooks it did not finish; killed outright, its workers notice
   and end themselves (`worker.py`), so no worker or kernel outlives the batch.
4. With a `journal` (the per-notebook CSV), each row reaches the disk the moment its
   notebook is graded; a rerun reuses the rows whose resume key (`resume.py`: the
   notebook, its student's other files, the solutions and checks, the variant, the lesson)
   is unchanged and grades only the rest, each row saying why (`GradeResult.regraded`).
5. With a roster, each student with no notebook of a lesson in the batch gets a row
   "missing" for it. A student's duplicates are flagged, and `keep` says which one counts
   (`keep.flag_choices`: the latest by default).

A batch that cannot grade stops before any notebook runs (CourseInputError): the solutions
folder, made absolute once here (the workers run elsewhere), must hold every lesson found
that the course has exercises for; a notebook of a lesson the course does not have is a row.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from course_utils import validation
from course_utils.checks import DEFAULT_STUDENT
from course_utils.errors import CourseInputError
from course_utils.grading import isolation, keep
from course_utils.grading.grader import GradeResult
from course_utils.grading.notebook_tools import SOLUTIONS
from course_utils.grading.resume import ResumeKey, resume_key
from course_utils.grading.roster import Student, by_name, by_number, label, match, possessive
from course_utils.validation import MAX_NOTEBOOK_BYTES

MAX_FOLDER_BYTES = 50_000_000  # data files copied beside a notebook, at most
STOP_GRACE_S = 1.0  # a stopped worker's time to exit on SIGTERM before SIGKILL

# The workers running now, so that an interrupted batch can stop them all.
_live: set[subprocess.Popen] = set()
_live_lock = threading.Lock()
_stopping = threading.Event()


@dataclass
class Submission:
    path: Path
    student: str  # the roster's id, else what the file's place says (folder, name, stem)
    name: str = ""  # the roster's name for the student
    root: Path | None = None  # the folder given to `grade` it was found in
    flags: list[str] = field(default_factory=list)  # where it lies: `keep.PLACE_FLAGS`
    notes: list[str] = field(default_factory=list)  # what its place says, `keep.PLACE_NOTE`
    order: tuple = ()  # sorts a student's files from first handed in to last
    named: str = ""  # the student its name names, where its number names another


def _handed_in(path: Path, file_id: int) -> tuple:
    """When a file was handed in, as far as a download says: Canvas's file id (a later
    upload has a larger one), else the file's modification time (kept by unzip), else its
    name."""
    try:
        mtime = os.lstat(path).st_mtime_ns
    except OSError:
        mtime = 0
    return (file_id, mtime, str(path))


def _notebooks(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.rglob("*.ipynb")
        if not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def find_submissions(paths: list[Path], roster: list[Student] | None = None) -> list[Submission]:
    """Every notebook under `paths` and whose it is (see the module docstring)."""
    found: list[Submission] = []
    for path in paths:
        if path.is_dir():
            notebooks = _notebooks(path)
            if not notebooks:
                raise CourseInputError(f"submission folder {str(path)!r} has no .ipynb files")
            for nb in notebooks:
                found.append(_whose(nb, nb.relative_to(path), roster, path))
        elif path.suffix != ".ipynb":
            raise CourseInputError(f"submission {str(path)!r} is not a notebook (.ipynb)")
        elif not path.exists() and not path.is_symlink():
            raise CourseInputError(f"submission {str(path)!r} does not exist")
        else:
            found.append(_whose(path, Path(path.name), roster, None))
    return found


def _whose(path: Path, relative: Path, roster: list[Student] | None, root) -> Submission:
    said = label(relative)
    order = _handed_in(path, said.file_id)
    late = [keep.LATE] if said.late else []
    if roster is None:
        return Submission(path, said.text, root=root, flags=late, order=order)
    student = match(said, roster)
    if student is None:  # graded all the same, under the name its place in the download gives
        return Submission(path, said.text, said.text, root, [keep.NOT_ON_ROSTER, *late], [], order)
    sub = Submission(path, student.id, student.name, root, late, [], order)
    other = by_name(said, roster) if by_number(said, roster) is student else None
    if other is not None and other is not student:
        sub.flags.append(keep.DISAGREE)
        sub.named = other.id
        sub.notes.append(
            f"{keep.PLACE_NOTE}its number {said.number} is {possessive(student.name)} (lms_id), "
            f"its name {said.text!r} is {possessive(other.name)}: graded as "
            f"{possessive(student.name)}, counted for neither"
        )
    return sub


def _not_regular(path: Path, max_bytes: int | None = None) -> str | None:
    """Why `path` is not read: it is a link, a FIFO, a device, or bigger than `max_bytes`
    (None: a regular file of a reasonable size)."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"could not read {path}: {exc.strerror or exc}"
    mode = info.st_mode
    if stat.S_ISREG(mode):
        if max_bytes is not None and info.st_size > max_bytes:
            return (
                f"{path} is {info.st_size / 1e6:.1f} MB, over the limit of "
                f"{max_bytes / 1e6:g} MB for a notebook: not read"
            )
        return None
    kind = "a symbolic link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode) else None
    return f"{path} is not a regular file ({kind or 'not a file'}): not read"


def _beside(folder: Path) -> list[Path]:
    """The regular files in `folder` that are not notebooks (not links, not FIFOs)."""
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    return [p for p in entries if p.suffix != ".ipynb" and _not_regular(p) is None]


def own_files(sub: Submission) -> dict[str, Path]:
    """The files of `sub`'s student that its kernel gets ({name in its scratch copy: file}):
    every file beside the notebook when it lies in a folder of its own under the folder
    given (or alone in its folder); in a flat download (Moodle, Canvas: notebooks side by
    side), those whose name says they are the same student's (`Label.owns`), under the name
    the student gave them. In a flat folder of plain names (`alice.ipynb`, `bob.ipynb`) no
    file says whose it is: none is given."""
    folder = sub.path.parent
    relative = sub.path.relative_to(sub.root) if sub.root else Path(sub.path.name)
    others = [p for p in folder.glob("*.ipynb") if p != sub.path]
    if len(relative.parts) > 1 or not others:
        return {p.name: p for p in _beside(folder)}
    mine = label(Path(sub.path.name))
    found = {}
    for path in _beside(folder):
        theirs = label(Path(path.name))
        if mine.owns(theirs) and theirs.rest:
            found[theirs.rest] = path
    return found


def unowned_files(submissions: list[Submission]) -> list[Path]:
    """The files beside the notebooks (and at the top of each folder given) that no
    notebook's kernel gets: nobody's, or the files of a student with no notebook here."""
    places = {s.root for s in submissions if s.root is not None}
    places |= {s.path.parent for s in submissions}
    owned = {p for s in submissions for p in own_files(s).values()}
    return sorted(
        p
        for place in places
        for p in _beside(place)
        if p not in owned and not p.name.startswith(".")
    )


def _folder_files(sub: Submission) -> dict[str, bytes]:
    """`own_files`, read, up to MAX_FOLDER_BYTES in all."""
    files, total = {}, 0
    for name, path in sorted(own_files(sub).items()):
        size = path.stat().st_size
        if total + size > MAX_FOLDER_BYTES:
            break
        files[name] = path.read_bytes()
        total += size
    return files


@dataclass
class _Job:
    submission: Submission
    data: bytes | None
    files: dict[str, bytes]
    problem: str | None
    variant: str
    lesson: int | None  # the lesson it will be graded as (pinned, or what it looks like)
    key: ResumeKey | None = None


def _read(sub: Submission, variant: str, lesson: int | None) -> _Job:
    from course_utils.grading.grader import detect_lesson, read_submission

    problem = _not_regular(sub.path, MAX_NOTEBOOK_BYTES)
    data, files = None, {}
    if problem is None:
        try:
            data, files = sub.path.read_bytes(), _folder_files(sub)
        except OSError as exc:
            problem = f"could not read {sub.path}: {exc.strerror or exc}"
    seen = lesson
    if data is not None and seen is None:
        try:
            seen = detect_lesson(read_submission(data, str(sub.path)))
        except CourseInputError:
            pass
    return _Job(sub, data, files, problem, variant, seen)


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
    sandbox: bool = True,
    roster: list[Student] | None = None,
    journal: Path | None = None,
    student: str | None = None,
    trust_name_cell: bool = False,
    keep_rule: str = keep.DEFAULT_KEEP,
    on_start=None,
) -> list[GradeResult]:
    """Grade every notebook under `paths`: one result per file, in the order found, then a
    "missing" row per roster student and lesson without a notebook.

    `student` grades the (single) notebook as that student's, on their numbers (no other
    student is then missing, and a journal keeps its other rows); with `trust_name_cell` a
    notebook graded without `variants` is graded on the numbers of the student its name
    cell names, flagged as not verified. `keep_rule` chooses which of a student's notebooks
    of a lesson counts (`keep.KEEP`). `on_result(result)` is called as each notebook
    finishes (not for rows reused from the journal). Raises CourseInputError, before any
    notebook runs, when the solutions folder cannot grade a lesson found; `on_start()` is
    called once it can (every notebook read), before the first runs."""
    from dataclasses import asdict

    from course_utils.grading import course_lessons, missing_solution, resources
    from course_utils.grading.journal import Journal

    validation.integer(jobs, "jobs", 1, validation.MAX_GRADE_JOBS)
    validation.choice(keep_rule, "keep", keep.KEEP)
    solutions = Path(solutions).absolute()  # once: the workers start in folders of their own
    if lesson is not None and (why := missing_solution(lesson, solutions)):
        raise CourseInputError(why)
    if sandbox and (why := isolation.problem()):
        raise CourseInputError(why)
    submissions = find_submissions(paths, roster)
    work = []
    for sub in submissions:  # read everything before any learner code runs
        if student is not None:
            sub.student = sub.name = student
            # its place in a download does not say whose it is (a late mark still holds)
            sub.flags, sub.notes = [f for f in sub.flags if f == keep.LATE], []
            mine = [s for s in roster or [] if s.id == student]
            sub.name = mine[0].name if mine else student
            if roster is not None and not mine:
                sub.flags.append(keep.NOT_ON_ROSTER)
        variant = sub.student if variants or student is not None else DEFAULT_STUDENT
        work.append(_read(sub, variant, lesson))
    known = course_lessons()
    for job in work:  # a notebook of a lesson the course does not have is a row, not a stop
        if job.problem is None and job.lesson is not None and job.lesson not in known:
            job.problem = f"{job.submission.path}: {missing_solution(job.lesson, solutions)}"
    lessons = sorted({j.lesson for j in work if j.lesson and j.lesson in known})
    for n in lessons:  # a solutions folder that cannot grade a lesson found: stop now
        if why := missing_solution(n, solutions):
            count = sum(1 for j in work if j.lesson == n)
            raise CourseInputError(f"{why} ({count} notebooks found are lesson {n:02d}'s)")
    if on_start:
        on_start()
    limits, cgroup = resources.for_batch(total_timeout) if sandbox else (None, None)
    book = Journal(journal, merge=student is not None) if journal else None
    done = book.previous() if book else {}
    results: list[GradeResult | None] = [None] * len(work)
    todo = []
    regraded: dict[int, list[str]] = {}
    for i, job in enumerate(work):
        path = str(job.submission.path)
        job.key = resume_key(path, job.data, job.files, job.variant, job.lesson, solutions)
        kept = done.get(path)
        changed = job.key.changes(ResumeKey.from_dict(kept.key) if kept else None)
        if kept is not None and not changed:
            keep.clear_place(kept)  # said again below, from where the file lies now
            kept.flags += job.submission.flags
            kept.notes += job.submission.notes
            kept.student, kept.name = job.submission.student, job.submission.name
            kept.regraded = []
            results[i] = kept
        else:
            todo.append(i)
            regraded[i] = changed if kept is not None else []
    if book:
        book.open(_exercise_ids(lessons, solutions), [r for r in results if r is not None])
    lock = threading.Lock()

    def grade(i: int) -> None:
        job = work[i]
        sub = job.submission
        if job.data is None or job.problem is not None:
            result = GradeResult(notebook=str(sub.path), student=sub.student, problem=job.problem)
            result.variant = job.variant
        else:
            result = _run_worker(
                {
                    "data": base64.b64encode(job.data).decode(),
                    "name": str(sub.path),
                    "student": sub.student,
                    "variant": job.variant if job.variant != DEFAULT_STUDENT else None,
                    "lesson": lesson,
                    "solutions": str(solutions),
                    "folder_files": {k: base64.b64encode(v).decode() for k, v in job.files.items()},
                    "cell_timeout": cell_timeout,
                    "total_timeout": total_timeout,
                    "call_timeout": call_timeout,
                    "sandbox": sandbox,
                    "trust_name_cell": trust_name_cell and job.variant == DEFAULT_STUDENT,
                    "limits": asdict(limits) if limits else None,
                    "cgroup": str(cgroup) if cgroup else None,
                },
                total_timeout + 120,
            )
        result.name = sub.name
        result.key = job.key.to_dict() if job.key else {}
        result.regraded = regraded.get(i, [])
        result.flags += sub.flags
        result.notes += sub.notes
        if result.lesson is None:
            result.lesson = job.lesson
        with lock:
            if _stopping.is_set():  # interrupted: this row is not a grade, keep it out
                return
            results[i] = result
            if book:
                book.add(result)
            if on_result:
                on_result(result)

    finished: list[GradeResult] | None = None
    _stopping.clear()
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        list(pool.map(grade, todo))
        finished = [r for r in results if r is not None]
        order = {str(j.submission.path): j.submission.order for j in work}
        keep.flag_choices(finished, keep_rule, order)
        if student is None:
            named = {j.submission.named: str(j.submission.path) for j in work}
            finished += missing_rows(finished, roster or [], lessons, named)
    except BaseException:  # Ctrl-C, SIGTERM: stop every worker now, not after its notebook
        stop_workers()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if book:  # interrupted: the rows graded so far, in order
            with lock:
                book.close(finished if finished is not None else [r for r in results if r])
    return finished


def stop_workers(grace: float = STOP_GRACE_S) -> None:
    """Stop every running worker at once and start no more: SIGTERM (the worker kills its
    kernel, removes its files and exits), then SIGKILL to its process group after `grace` s.
    The rows of the notebooks they were grading are not written."""
    import time

    _stopping.set()
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        _signal(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(proc, signal.SIGKILL)


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _exercise_ids(lessons: list[int], solutions: Path) -> list[str]:
    """The CSV's exercise columns, known before any notebook is graded: the solutions'."""
    import nbformat

    from course_utils.grading.grader import exercises_of, solution_for

    ids = []
    for lesson in lessons:
        try:
            solution = nbformat.read(solution_for(lesson, solutions), as_version=4)
        except CourseInputError:
            continue
        ids += [f"{lesson}.{ex.k}" for ex in exercises_of(solution)]
    return ids


def missing_rows(
    results: list[GradeResult],
    roster: list[Student],
    lessons: list[int],
    named: dict[str, str] | None = None,
) -> list[GradeResult]:
    """A "missing" row for each roster student and lesson with no notebook of theirs.
    `named` = {student: notebook} of the folders in a student's name that hold another
    student's number: said in that student's row."""
    have = {(r.student, r.lesson) for r in results}
    rows = []
    for lesson in lessons:
        for s in roster:
            if (s.id, lesson) not in have:
                problem = f"missing: no notebook of lesson {lesson:02d} was found"
                if named and s.id in named:
                    problem += f" ({named[s.id]} has their name but another student's number)"
                rows.append(
                    GradeResult(
                        notebook="",
                        student=s.id,
                        name=s.name,
                        lesson=lesson,
                        variant=s.id,
                        problem=problem,
                        flags=[keep.MISSING],
                    )
                )
    return rows


def _run_worker(job: dict, limit: float) -> GradeResult:
    """Grade one job in a worker process; any failure of the worker is a row, not a crash."""
    token = secrets.token_hex(16)
    job["token"] = token
    if _stopping.is_set():
        return _failed(job, "grading was interrupted")
    with tempfile.TemporaryDirectory(prefix="course-grade-", ignore_cleanup_errors=True) as private:
        read_end, write_end = os.pipe()
        life_read, life_write = os.pipe()  # the worker's watcher sees its end if we die
        worker = "course_utils.grading.worker"
        command = [sys.executable, "-I", "-m", worker, str(write_end), str(life_read)]
        sockets = None
        if job["sandbox"]:  # its kernels' sockets in a tmpfs of its own
            sockets = _socket_mount(Path(private))
            job["ipc"] = str(sockets)
            command = isolation.worker_argv(sockets, command)
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(write_end, life_read),
            cwd=private,  # nothing in its working folder or TMPDIR comes from a submission
            # the worker draws nothing on screen: a stray MPLBACKEND must not break it
            env={**os.environ, "TMPDIR": private, "MPLBACKEND": "agg"},
            start_new_session=True,  # its own process group: a time-out kills the kernel too
        )
        with _live_lock:
            _live.add(proc)
        if _stopping.is_set():  # stopped while it started
            _signal(proc, signal.SIGKILL)
        os.close(write_end)
        os.close(life_read)
        chunks: list[bytes] = []
        reader = threading.Thread(target=_drain, args=(read_end, chunks))
        reader.start()
        try:
            _, err = proc.communicate(json.dumps(job).encode(), timeout=limit)
        except subprocess.TimeoutExpired:
            _kill(proc)
            reader.join(5)
            return _failed(job, f"grading did not finish within {limit:g} s")
        finally:
            with _live_lock:
                _live.discard(proc)
            os.close(life_write)
            if sockets is not None and sockets.parent != Path(private):
                shutil.rmtree(sockets.parent, ignore_errors=True)
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
    return GradeResult.from_dict(data)


def _socket_mount(private: Path) -> Path:
    """An empty folder where a worker's sockets tmpfs is mounted (`isolation.worker_argv`):
    in its private folder, or in /tmp where that path is too long for a Unix socket's (107
    bytes; the sockets are `k2/kernel-ipc-NNNNN` in it)."""
    folder = private / "ipc"
    if len(str(folder / "k2" / "kernel-ipc-65535")) > 100:
        folder = Path(tempfile.mkdtemp(prefix="cg-", dir="/tmp")) / "ipc"
    folder.mkdir()
    return folder


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
        variant=job["variant"] or DEFAULT_STUDENT,
        problem=problem or None,
    )
