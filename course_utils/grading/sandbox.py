"""Run a submission in a kernel of its own and bring back its answers as data.

The learner's code runs in a fresh kernel inside a sandbox of its own (`isolation`: its own
namespaces, read-only system and package without the checks, a memory-backed scratch copy of
the notebook's folder as its working directory, limits), started as `python -I`, so neither
that folder nor PYTHONPATH nor the user's site packages are on `sys.path`. It has no network:
it talks to the grader over Jupyter's `ipc` transport, through sockets in a folder the
sandbox can see: a 1 MiB tmpfs of the worker's own (`isolation.worker_argv`), else a folder of
the grader's; either is watched (a kernel that stores anything else there is stopped). What
the kernel prints is read with caps, past which it is not kept and the row says so
(`kernel_output`). A cell whose output did not come back whole (a message too big broke the
connection) is followed by empty cells until one does, and a grader's cell that lost its
answer so is run again.

The grader inserts a *capture* cell after each exercise; it evaluates the
expressions the solution's check cell passes to `check.exercise_K(...)` and returns them
as data (`course_utils.checks.wire`). A function answer is called there, on the inputs
the grader chose, each call under a time limit, and only its results come back.

Nothing the kernel says is a verdict: the grader's own process judges the data
(`course_utils.grading.judge`). The kernel can only misreport its own answers.

Without a sandbox (`stand_in=None`, `grade --no-sandbox`) the kernel runs as the grader's
user in a scratch folder on disk, still isolated from `sys.path`, and sees the real checks.
"""

from __future__ import annotations

import ast
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from course_utils.grading import isolation
from course_utils.grading.kernel_output import Iopub, cap_output, capped_manager
from course_utils.grading.notebook_tools import notebook_client
from course_utils.grading.stand_in import KEPT_BY_GRADER

PRELUDE = """\
def __course_capture__(k, expressions, cases, limit):
    import json
    from course_utils.checks.wire import call_outcome, decode, encode
    namespace = get_ipython().user_ns
    found = {}
    for expression in expressions:
        try:
            value = eval(expression, namespace)
        except NameError as exc:
            found[expression] = {"missing": str(exc)}
            continue
        except Exception as exc:
            found[expression] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        if expression in cases and callable(value):
            calls = [call_outcome(value, decode(args), limit) for args in cases[expression]]
            found[expression] = {"calls": calls}
        elif callable(value) and not isinstance(value, type):
            found[expression] = {"function": True}
        else:
            try:
                found[expression] = {"value": encode(value)}
            except TypeError as exc:
                found[expression] = {"error": str(exc)}
    return "\\x1ecourse-answers" + json.dumps({"exercise": k, "found": found})
"""
MARK = "\x1ecourse-answers"
KERNEL_STARTS = 2  # a kernel that never became ready ran nothing: one fresh start is safe
GRADER_CELL_TRIES = 3  # a capture whose output was lost on the way is run again
MAX_ANSWER_CHARS = 5_000_000  # an answer bigger than this is not read
MAX_IPC_BYTES = 1 << 20  # sockets and the connection file; anything more is not Jupyter's
MAX_IPC_ENTRIES = 16


# What this process started and has not cleaned up yet, for `abandon` (a worker whose batch
# died, or that is told to stop, ends at once and leaves nothing behind).
_LIVE_KERNELS: set = set()
_SOCKET_FOLDERS: set[Path] = set()


def abandon() -> None:
    """Kill every kernel this process started and remove their socket folders in /tmp, now
    (the worker calls it just before it exits without the usual cleanup)."""
    for km in list(_LIVE_KERNELS):
        _kill(km)
    for folder in list(_SOCKET_FOLDERS):
        shutil.rmtree(folder, ignore_errors=True)


class KernelStartError(RuntimeError):
    """The learner's kernel never became ready: the submission could not be graded."""


@dataclass
class Exercise:
    """What the grader needs to capture one exercise: its number, the argument expressions of
    the solution's check call (positional, then keyword name -> expression), and the inputs a
    function answer is called on."""

    k: int
    args: list[str]
    kwargs: dict[str, str] = field(default_factory=dict)
    cases: dict[str, list] = field(default_factory=dict)  # expression -> encoded arg tuples

    @property
    def expressions(self) -> list[str]:
        return [*self.args, *self.kwargs.values()]


@dataclass
class Run:
    """What happened in the learner's kernel."""

    answers: dict[int, dict] = field(default_factory=dict)  # exercise -> expression -> capture
    problems: dict[int, list[str]] = field(default_factory=dict)  # exercise -> what went wrong
    notes: list[str] = field(default_factory=list)  # about the whole run
    seconds: float = 0.0


def check_calls(source: str) -> dict[int, tuple[list[str], dict[str, str]]]:
    """{K: (positional expressions, keyword expressions)} of the `*.exercise_K(...)` calls."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    calls = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr.startswith("exercise_")
            and node.func.attr.removeprefix("exercise_").isdigit()
        ):
            k = int(node.func.attr.removeprefix("exercise_"))
            kwargs = {kw.arg: ast.unparse(kw.value) for kw in node.keywords if kw.arg}
            calls[k] = ([ast.unparse(a) for a in node.args], kwargs)
    return calls


def exercise_of_cells(nb: nbformat.NotebookNode, lesson: int) -> list[int | None]:
    """For each cell, the exercise whose part of the notebook it is in (by the headings)."""
    import re

    heading = re.compile(rf"^#+\s*Exercise\s+{lesson}\.(\d+)\b", re.M)
    current: int | None = None
    owner = []
    for cell in nb.cells:
        if cell.cell_type == "markdown" and (found := heading.search(cell.source)):
            current = int(found.group(1))
        owner.append(current)
    return owner


def _capture_points(nb: nbformat.NotebookNode, lesson: int, exercises: list[Exercise]) -> dict:
    """{cell index: [exercises captured right after that cell]}: the end of each exercise's
    part of the notebook, else after a cell calling its check, else the notebook's end."""
    owner = exercise_of_cells(nb, lesson)
    points: dict[int, list[int]] = {}
    last = len(nb.cells) - 1
    for ex in exercises:
        mine = [i for i, k in enumerate(owner) if k == ex.k]
        calls = [i for i, c in enumerate(nb.cells) if f"exercise_{ex.k}(" in c.source]
        at = mine[-1] if mine else (calls[-1] if calls else last)
        points.setdefault(at, []).append(ex.k)
    return points


def _kernel_spec(folder: Path, argv: list[str], sandboxed: bool) -> Path:
    """A kernel spec named "course-grader" in `folder` that starts the kernel with `argv`.

    In a sandbox the kernel is interrupted by a message (ipykernel then signals itself): a
    signal from the grader would reach bwrap, not the kernel in its own PID namespace."""
    spec = folder / "course-grader"
    spec.mkdir(parents=True)
    kernel: dict[str, object] = {"argv": argv, "display_name": "grader", "language": "python"}
    if sandboxed:
        kernel["interrupt_mode"] = "message"
    else:  # its IPython folder in the scratch folder: $HOME may not take one (HOME=/proc)
        ipython = str(folder / "ipython")
        kernel["env"] = {"MPLBACKEND": "Agg", "PYTHONNOUSERSITE": "1", "IPYTHONDIR": ipython}
    (spec / "kernel.json").write_text(json.dumps(kernel))
    return folder


def _plain_argv() -> list[str]:
    """The kernel without a sandbox: `python -I -m ipykernel_launcher` (isolated mode)."""
    return [sys.executable, "-I", "-m", "ipykernel_launcher", "-f", "{connection_file}"]


class _Watch:
    """Stops the kernel if its socket folder holds more than sockets: the one folder outside
    its sandbox it can write to, and only because the sockets must be made there."""

    def __init__(self, folder: Path, kill) -> None:
        self.folder, self.kill, self.tripped = folder, kill, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            entries, size, folders = 0, 0, [self.folder]
            while folders and entries <= MAX_IPC_ENTRIES:  # its sub-folders too
                try:
                    for entry in os.scandir(folders.pop()):
                        entries += 1
                        size += entry.stat(follow_symlinks=False).st_size
                        if entry.is_dir(follow_symlinks=False):
                            folders.append(Path(entry.path))
                except OSError:
                    continue
            if entries > MAX_IPC_ENTRIES or size > MAX_IPC_BYTES:
                self.tripped = True
                self.kill()
                return


def _error_text(cell) -> tuple[str, str] | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return out.get("ename", "Error"), out.get("evalue", "")
    return None


def _captured(cell) -> dict | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "execute_result":
            text = out.get("data", {}).get("text/plain", "")
            if len(text) > MAX_ANSWER_CHARS:
                return None
            try:
                value = ast.literal_eval(text)  # the repr of the string the capture returned
                if not isinstance(value, str) or not value.startswith(MARK):
                    return None
                return json.loads(value.removeprefix(MARK))
            except (ValueError, SyntaxError, json.JSONDecodeError):
                return None
    return None


def run_submission(
    submission: nbformat.NotebookNode,
    folder_files: dict[str, bytes],
    lesson: int,
    exercises: list[Exercise],
    cell_timeout: float = 120.0,
    total_timeout: float = 600.0,
    call_timeout: float = 20.0,
    skip: frozenset[str] = frozenset(),
    stand_in: Path | None = None,
    limits: isolation.Limits | None = None,
    ipc_root: Path | None = None,
    cgroup: Path | None = None,
) -> Run:
    """Execute the submission's cells in a sandboxed kernel, capturing each exercise's answers.

    `folder_files` are the other files of the submission's folder (name -> bytes), copied
    into the scratch folder the kernel works in. Cells run in order, each under
    `cell_timeout`; once `total_timeout` is spent the remaining learner cells are skipped
    (the captures still run, so what was answered by then still counts). Cells whose text is
    in `skip` are not run: the solution's own check cells only give the learner feedback, and
    the verdict is the grader's (a learner's function that hangs would hang them too).
    `stand_in` is the checks package the sandbox shows the kernel (`stand_in.write`); None
    runs the kernel without a sandbox. `limits` default to `Limits.for_notebook`.
    `ipc_root` is where the sockets go (the worker's tmpfs), `cgroup` the cgroup v2 folder
    each kernel gets a cgroup of its own under (`resources.cgroup_parent`).
    """
    from jupyter_client.kernelspec import KernelSpecManager
    from nbclient.exceptions import DeadKernelError

    _CappedKernelManager = capped_manager()

    run = Run()
    nb = copy.deepcopy(submission)
    nb.cells = [c for c in nb.cells if c.cell_type in ("code", "markdown")]
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    points = _capture_points(nb, lesson, exercises)
    owner = exercise_of_cells(nb, lesson)
    by_k = {ex.k: ex for ex in exercises}
    sandboxed = stand_in is not None
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="course-grade-") as tmp:
        handout = Path(tmp) / "handout"
        handout.mkdir()
        for name, data in folder_files.items():
            target = handout / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

        def run_all(client) -> None:
            iopub = Iopub(client, run)

            def run_cell(source: str) -> int:
                cell = nbformat.v4.new_code_cell(source)
                client.nb.cells.append(cell)
                client.execute_cell(cell, len(client.nb.cells) - 1)
                return len(client.nb.cells) - 1

            def execute(source: str) -> nbformat.NotebookNode:
                """A grader's cell (the prelude, a capture), run again when its output did
                not come back whole: its answer would be lost, through no fault of the
                learner's (a capture calls the learner's functions again)."""
                for _ in range(GRADER_CELL_TRIES):
                    index = run_cell(source)
                    if iopub.complete(index):
                        break
                    settled = iopub.settle(run_cell)  # so that the next cell is not lost
                    if index in iopub.ended or not settled:  # it came whole, before the break
                        break
                return client.nb.cells[index]

            execute(PRELUDE)
            for index, cell in enumerate(cells):
                where = owner[index]
                if cell.cell_type == "code" and cell.source.strip() not in skip:
                    if time.monotonic() - started > total_timeout:
                        note = f"the notebook ran past its {total_timeout:g} s limit"
                        if note not in run.notes:
                            run.notes.append(note)
                    else:
                        _run_learner_cell(client, cell, index, where, cell_timeout, run)
                        if not iopub.complete(index):  # the next answer must not be lost too
                            iopub.settle(run_cell)
                for k in points.get(index, []):
                    _capture(execute, by_k[k], call_timeout, run)
            for ex in exercises:  # answers defined later than their exercise still count
                if any("missing" in found for found in run.answers.get(ex.k, {}).values()):
                    _capture(execute, ex, call_timeout, run)
            iopub.close()

        cells = list(nb.cells)  # the learner's; captures are appended after them
        if stand_in is not None and limits is None:
            limits = isolation.Limits.for_notebook(total_timeout, cgroup=cgroup is not None)
        for attempt in range(1, KERNEL_STARTS + 1):
            ipc = _socket_folder(Path(tmp), attempt, ipc_root)
            box = None
            if stand_in is not None and limits is not None:
                if cgroup is not None:
                    from course_utils.grading import resources

                    memory = resources.cgroup_memory(limits)
                    box = resources.make_cgroup(cgroup, memory, limits.processes)
                argv = isolation.kernel_argv(
                    ipc, handout, stand_in, limits, isolation.font_cache(), box
                )
            else:
                argv = _plain_argv()
            specs = _kernel_spec(Path(tmp) / f"kernels{attempt}", argv, sandboxed)
            # nbclient drives the kernel from its event loop: a synchronous manager cannot
            # interrupt a cell that runs too long there (the interrupt silently never comes).
            km = _CappedKernelManager(
                kernel_name="course-grader",
                kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(specs)]),
                transport="ipc",
                connection_file=str(ipc / "kernel.json"),
            )
            client = notebook_client(
                nb,
                km=km,
                timeout=cell_timeout,
                allow_errors=True,
                interrupt_on_timeout=True,
                error_on_timeout={"ename": "CellTimeout", "evalue": f"ran past {cell_timeout:g} s"},
                # The folder the kernel starts in: in a sandbox its own scratch copy is in there.
                resources={"metadata": {"path": tmp if sandboxed else str(handout)}},
            )
            client.store_widget_state = False  # a widget's state is output too: not kept
            cap_output(client, len(cells), run)
            ready = False
            watch = _Watch(ipc, lambda km=km: _kill(km))
            _LIVE_KERNELS.add(km)
            try:
                # The kernel's own output goes nowhere: it must not reach the grader's streams.
                with client.setup_kernel(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
                    ready = True
                    with watch:
                        run_all(client)
            except DeadKernelError:
                run.notes.append("the kernel died (the notebook crashed or exited)")
            except RuntimeError as exc:
                # Raised while the kernel starts, before any learner code ran: the machine's
                # fault, not the submission's, so a fresh kernel is safe. After that, and after
                # the last try, it is the grading's problem (a row without a score), not a zero.
                if ready:
                    raise
                if attempt == KERNEL_STARTS:
                    why = f"the grading kernel did not start ({attempt} tries: {exc})"
                    raise KernelStartError(why) from exc
                continue
            finally:
                _stop(km, client)
                _LIVE_KERNELS.discard(km)
                if box is not None:
                    from course_utils.grading import resources

                    resources.remove_cgroup(box)
                if ipc_root is None and ipc.parent != Path(tmp):
                    shutil.rmtree(ipc.parent, ignore_errors=True)
                    _SOCKET_FOLDERS.discard(ipc.parent)
            if watch.tripped:
                run.notes.append(
                    "the kernel was stopped: it wrote files beside its sockets, "
                    "the one folder outside its sandbox it can reach"
                )
            break
    run.seconds = time.monotonic() - started
    return run


def _socket_folder(tmp: Path, attempt: int, root: Path | None = None) -> Path:
    """A fresh folder for one kernel's sockets: in `root` (the worker's tmpfs, its path kept
    short by the batch) if given; else in `tmp`, but a Unix socket's path must stay short
    (107 bytes), so where the temporary folder's path is long it goes to /tmp instead."""
    if root is not None:
        folder = root / f"k{attempt}"
        folder.mkdir()
        return folder
    folder = tmp / f"ipc{attempt}"
    if len(str(folder / "kernel-ipc-65535")) > 100:
        short = Path(tempfile.mkdtemp(prefix="cg-", dir="/tmp"))
        _SOCKET_FOLDERS.add(short)
        folder = short / "ipc"
    folder.mkdir()
    return folder


def _kill(km) -> None:
    """Kill the kernel's process (in a sandbox: bwrap, and with it everything inside)."""
    process = getattr(km.provisioner, "process", None)
    if process is not None:
        try:
            process.send_signal(signal.SIGKILL)
        except (OSError, ValueError):
            pass


def _stop(km, client) -> None:
    """Kill the kernel, reap its process and close the client's sockets, whatever happened:
    a grade made in a long-lived process (the Python API, the tests) leaves nothing running
    behind it, as a grading worker's exit does (nbclient stops only a kernel it started)."""
    _kill(km)
    process = getattr(km.provisioner, "process", None)
    if process is not None:
        try:
            process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
    kc = getattr(client, "kc", None)
    if kc is not None:
        kc.stop_channels()


def _run_learner_cell(client, cell, index: int, exercise: int | None, limit: float, run: Run):
    start = time.monotonic()
    client.execute_cell(cell, index)
    error = _error_text(cell)
    if exercise is None or error is None:
        return
    name, value = error
    if name == "CellTimeout" or time.monotonic() - start >= limit:
        run.problems.setdefault(exercise, []).append(f"a cell ran past {limit:g} s and was stopped")
    elif name in ("SyntaxError", "IndentationError", "TabError"):
        run.problems.setdefault(exercise, []).append(f"a cell has a {name}: {value}")
    elif KEPT_BY_GRADER in value:  # it used what only the grader has: say so, kindly
        run.problems.setdefault(exercise, []).append(f"a cell raised {name}: {value}")


def _capture(execute, ex: Exercise, call_timeout: float, run: Run) -> None:
    cases = json.dumps(ex.cases)
    cell = execute(
        f"__course_capture__({ex.k}, {ex.expressions!r}, __import__('json').loads({cases!r}), "
        f"{call_timeout!r})"
    )
    found = _captured(cell)
    if found is None or found.get("exercise") != ex.k:
        error = _error_text(cell)
        why = f"{error[0]}: {error[1]}" if error else "no readable answer came back"
        run.problems.setdefault(ex.k, []).append(f"the answers could not be read ({why})")
        return
    earlier = run.answers.get(ex.k, {})
    merged = dict(found["found"])
    for expression, capture in earlier.items():  # keep what the first capture found
        if "missing" not in capture:
            merged[expression] = capture
    run.answers[ex.k] = merged
