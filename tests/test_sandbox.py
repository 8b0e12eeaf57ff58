"""A hostile class against the sandbox: every attack scores 0 and leaves nothing behind.

Each class of attack of the earlier study (issue 24) comes in at least two variants, graded
as a class at `-j 2` beside an honest neighbour, who must keep full marks:

- plant a module the grader's worker would import (through `/proc/<ppid>/cwd`, `/proc/1/cwd`,
  TMPDIR, the virtual environment's site-packages);
- change the course's package (append to the check modules, to `course_utils/__init__.py`);
- find the grader's command line and a classmate's (or the solution's) notebook and run
  its answers;
- kill the neighbour's kernel, the worker, the grader;
- leave processes (a detached `sleep`, a double-forked daemon) and files (/tmp, /dev/shm,
  home) behind, or fill the one folder outside its sandbox it can write to (its sockets');
- hand back the check module's own reference function as a Build answer.

After the batch: no process of the attacks runs, no file they wrote exists outside their
sandboxes, the package (and the venv's site-packages) are byte for byte the same, and no
`course-grade-*` folder of the batch is left in the temporary folder.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import NEEDS_BWRAP, SOCKETS_IN_TMP
from gradingkit import (
    ALL,
    NAME,
    ROOT,
    SETSID_PROBE,
    blank,
    cell,
    data,
    passed,
    solved,
    with_code,
)
from roundprograms import ROUNDS

from course_utils.grading.batch import grade_all

pytestmark = [pytest.mark.slow, NEEDS_BWRAP]  # every test here is about the sandbox
MARK = f"course{secrets.token_hex(4)}"  # names every file and process the attacks make
SITE = Path(next(p for p in sys.path if p.endswith("site-packages")))

PLANT = f"""
import os, pathlib
code = "import builtins\\nbuiltins.{MARK} = True\\n"
places = ['/proc/%d/cwd' % os.getppid(), '/proc/1/cwd', os.environ.get('TMPDIR', '/tmp'),
          '..', '{SITE}', '{ROOT}']
planted = []
for place in places:
    for name in ('numpy.py', 'json.py', 'sitecustomize.py', '{MARK}.pth'):
        try:
            pathlib.Path(place, name).write_text(code)
            planted.append(place)
        except OSError:
            pass
"""
CHANGE_PACKAGE = f"""
import course_utils, pathlib
package = pathlib.Path(course_utils.__file__).parent
for target in ('checks/l03.py', 'checks/__init__.py', '__init__.py', 'grading/judge.py'):
    try:
        with open(package / target, 'a') as f:
            f.write("\\ndef exercise_1(*a, **k): print('✅ Right')  # {MARK}\\n")
    except OSError:
        pass
"""
READ_CLASSMATES = """
import json, os, pathlib
found = []
for pid in os.listdir('/proc'):
    try:
        found.append(pathlib.Path('/proc', pid, 'cmdline').read_bytes())
    except OSError:
        pass
answers = {}
for root in ('/', '/tmp', '..', os.path.expanduser('~')):
    for path in pathlib.Path(root).rglob('*.ipynb'):
        try:
            nb = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for c in nb.get('cells', []):
            if 'answer' in c.get('metadata', {}).get('tags', []):
                try:
                    exec(''.join(c['source']), globals())
                except Exception:
                    pass
"""
KILL = """
import os, signal
for pid in os.listdir('/proc'):
    if pid.isdigit() and int(pid) != os.getpid():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
try:
    os.kill(-1, signal.SIGKILL)
except OSError:
    pass
"""
LEAVE_BEHIND = f"""
import os, pathlib, subprocess, sys
subprocess.Popen(['sleep', '4242.{MARK[-4:].translate(str.maketrans("abcdef", "123456"))}'],
                 start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(4242)',
                                  '{MARK}'])
    os._exit(0)
for place in ('/tmp', '/dev/shm', os.path.expanduser('~'), '/var/tmp'):
    try:
        pathlib.Path(place, '{MARK}').write_text('left behind')
    except OSError:
        pass
"""
FILL_SOCKETS = """
import os, pathlib, sys
folder = pathlib.Path(sys.argv[sys.argv.index('-f') + 1]).parent  # the one writable folder
for i in range(COUNT):
    (folder / f'junk{i}').write_bytes(bytes(SIZE))
import time
time.sleep(5)  # the watch takes a moment
"""
REFERENCE = {
    "the-reference": "gpipe_bubble = l03._bubble",
    "a-call-to-it": "def gpipe_bubble(p, m):\n    return l03._bubble(p, m)",
    "through-import": (
        "import importlib\n"
        "def gpipe_bubble(p, m):\n"
        "    return getattr(importlib.import_module('course_utils.checks.l03'), '_bubble')(p, m)"
    ),
}


def attacker(code: str, where: str = "answer-03-1"):
    """A blank notebook (nothing answered) that runs `code` first."""
    return with_code(blank(), where, code, before=True)


def package_fingerprint() -> str:
    """Every file of the course's package and every top-level entry of site-packages."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "course_utils").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path).encode() + path.read_bytes())
    for path in sorted(SITE.iterdir()):
        digest.update(str(path).encode())
        if path.suffix == ".pth":
            digest.update(path.read_bytes())
    return digest.hexdigest()


def processes_with(marker: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            cmdline = Path("/proc", pid, "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline and pid != str(os.getpid()):
            found.append(f"{pid}: {cmdline}")
    return found


def grade_class(tmp_path: Path, submissions: dict, **kwargs) -> dict:
    folder = tmp_path / "class"
    for student, nb in submissions.items():
        (folder / student).mkdir(parents=True)
        (folder / student / NAME).write_bytes(data(nb))
    results = grade_all([folder], jobs=2, **kwargs)
    return {r.student: r for r in results}


@SOCKETS_IN_TMP  # its class makes /tmp/cg-* folders; test_limits watches them
def test_a_hostile_class_scores_nothing_leaves_nothing_and_its_neighbours_keep_full_marks(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # the grader's working folder: a plant would land here
    temporary = tmp_path / "tmp"  # the batch's temporary folder, watched for leftovers
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    before = package_fingerprint()
    attacks = {
        "plant": attacker(PLANT),
        "plant-late": attacker(PLANT, "answer-03-6"),
        "change-package": attacker(CHANGE_PACKAGE),
        "change-package-twice": attacker(CHANGE_PACKAGE + CHANGE_PACKAGE, "answer-03-3"),
        "read-classmates": attacker(READ_CLASSMATES),
        "read-classmates-late": attacker(READ_CLASSMATES, "answer-03-6"),
        "kill": attacker(KILL),
        "kill-late": attacker(KILL, "answer-03-4"),
        "leave-behind": attacker(LEAVE_BEHIND),
        "leave-behind-late": attacker(LEAVE_BEHIND, "answer-03-5"),
        "fill-sockets": attacker(FILL_SOCKETS.replace("COUNT", "1").replace("SIZE", "4 << 20")),
        "fill-sockets-many": attacker(FILL_SOCKETS.replace("COUNT", "40").replace("SIZE", "1")),
    }
    honest = {"a-honest": solved(), "z-honest": solved()}  # graded first and last
    results = grade_class(tmp_path, {**honest, **attacks})
    for name in attacks:
        assert passed(results[name]) == [], (name, results[name].exercises)
    for name in honest:
        assert passed(results[name]) == ALL and results[name].problem is None, name
    # The blank notebook graded after the one that appended to the check modules: still 0.
    assert results["change-package-twice"].score == 0
    # 4 MiB do not fit in the sockets' 1 MiB tmpfs (the write fails); 40 files are stopped.
    notes = results["fill-sockets-many"].notes
    assert any("beside its sockets" in n for n in notes), notes
    time.sleep(1)  # a process being killed may take a moment to leave /proc
    assert processes_with(MARK) == [] and processes_with("4242") == []
    places = (temporary, Path("/tmp"), Path("/dev/shm"), Path.home(), Path("/var/tmp"), tmp_path)
    for place in places:
        assert not (place / MARK).exists(), place
    for name in ("numpy.py", "json.py", "sitecustomize.py", f"{MARK}.pth"):
        assert not (tmp_path / name).exists() and not (SITE / name).exists()
    assert package_fingerprint() == before
    assert list(temporary.iterdir()) == []  # every worker's private folder is gone


def test_a_build_answer_that_hands_back_the_check_modules_reference_fails_kindly(tmp_path):
    subs = {}
    for name, code in REFERENCE.items():
        nb = solved()
        cell(nb, "answer-03-2").source = code
        subs[name] = nb
    results = grade_class(tmp_path, subs)
    for name in REFERENCE:
        verdicts = {e.id: e for e in results[name].exercises}
        assert not verdicts["3.2"].passed, name
        assert "belongs to the course's checks" in verdicts["3.2"].message, verdicts["3.2"]
        assert "Traceback" not in verdicts["3.2"].message
        assert {"3.1", "3.5"} <= set(passed(results[name]))  # not built on it: still count


LIMITS = """
hits = []
try:
    block = bytearray(6 << 30)
except MemoryError:
    hits.append('memory')
import os, time
children = []
try:
    for _ in range(700):
        pid = os.fork()
        if pid == 0:
            time.sleep(3)
            os._exit(0)
        children.append(pid)
except BlockingIOError:
    hits.append('processes')
for pid in children:
    os.waitpid(pid, 0)
try:
    with open('big', 'wb') as f:
        for _ in range(300):
            f.write(bytes(1 << 20))
except OSError:
    hits.append('file size')
import os
os.remove('big')
bubble_fraction = (g.p - 1) / (g.m + g.p - 1) if set(hits) >= EXPECTED else hits
"""


def test_the_sandbox_limits_memory_processes_and_file_size(tmp_path):
    # The notebook survives each limit (a MemoryError, a fork refused, a write refused) and
    # answers 3.1 right only if all of them held. Linux exempts root's processes from the
    # process limit (RLIMIT_NPROC), so run as root only memory and file size can be seen.
    expected = {"memory", "file size"} | ({"processes"} if os.geteuid() != 0 else set())
    nb = solved()
    cell(nb, "answer-03-1").source = f"EXPECTED = {expected!r}\n{LIMITS}"
    results = grade_class(tmp_path, {"limits": nb})
    verdict = {e.id: e for e in results["limits"].exercises}["3.1"]
    assert verdict.passed, verdict.message


# --------------------------------------------------------------------------- round three
# Issue 37: resources beyond the limits, a classmate's files, the pytest route, reports that
# one notebook could stop, what the instructor reads. Each mechanism is asserted from inside
# a sandbox (a notebook that answers 3.1 right only if all of them hold), never by timing.

MECHANISMS = """
import errno, mmap, os, pathlib, resource, sys
held = []
try:
    open('/dev/course-probe', 'w')
except OSError as exc:
    held += ['/dev read-only'] if exc.errno == errno.EROFS else []
shm = os.statvfs('/dev/shm')
if shm.f_blocks * shm.f_frsize <= 64 << 20:
    try:
        with open('/dev/shm/fill', 'wb') as f:
            for _ in range(80):
                f.write(bytes(1 << 20))
    except OSError as exc:
        held += ['/dev/shm small'] if exc.errno == errno.ENOSPC else []
    os.remove('/dev/shm/fill')
SETSID_PROBE
if setsid_errno == errno.EPERM:
    held.append('setsid refused')
limit = resource.getrlimit(resource.RLIMIT_AS)[0]
if limit != resource.RLIM_INFINITY:
    try:
        mmap.mmap(-1, limit + (1 << 30), flags=mmap.MAP_SHARED)
    except (OSError, MemoryError, OverflowError):
        held.append('shared mapping refused')
sockets = pathlib.Path(sys.argv[sys.argv.index('-f') + 1]).parent
room = os.statvfs(sockets)
(sockets / 'sub').mkdir()
try:
    with open(sockets / 'sub' / 'fill', 'wb') as f:
        f.write(bytes(2 << 20))
except OSError as exc:
    if exc.errno == errno.ENOSPC and room.f_blocks * room.f_frsize <= 1 << 20:
        held.append('sockets in a small tmpfs')
(sockets / 'sub' / 'fill').unlink(missing_ok=True)
(sockets / 'sub').rmdir()
bubble_fraction = (g.p - 1) / (g.m + g.p - 1) if set(held) >= EXPECTED else held
"""
FILL_DEV = """
import os
for place in PLACES:
    for i in range(8):
        try:
            with open(f'{place}/{MARK}{i}', 'wb') as f:
                for _ in range(240):
                    f.write(bytes(1 << 20))
        except OSError:
            pass
"""
SHARED_MAP = """
import mmap, os
try:
    if BACKING:
        fd = os.open('/tmp/MARK-map', os.O_RDWR | os.O_CREAT)
        os.ftruncate(fd, 5 << 30)
        block = mmap.mmap(fd, 5 << 30, flags=mmap.MAP_SHARED)
    else:
        block = mmap.mmap(-1, 5 << 30, flags=mmap.MAP_SHARED)
    for at in range(0, 5 << 30, 4096):
        block[at] = 1
except (OSError, MemoryError, OverflowError, ValueError):
    pass
"""
SOCKETS_SUBFOLDERS = """
import os, pathlib, sys
folder = pathlib.Path(sys.argv[sys.argv.index('-f') + 1]).parent
for depth in range(DEPTH):
    folder = folder / f'd{depth}'
    folder.mkdir()
try:
    for i in range(COUNT):
        with open(folder / f'{i}', 'wb') as f:
            for _ in range(SIZE >> 20 or 1):
                f.write(bytes(min(SIZE, 1 << 20)))
except OSError:
    pass
import time
time.sleep(2)  # the watch, if it notices, takes a moment
"""
FLOOD = """
import sys
for _ in range(COUNT):
    sys.stdout.write('x' * SIZE)
    sys.stdout.flush()
"""
SETSID_SPINNERS = """
import os, time
for _ in range(16):
    if os.fork() == 0:
        try:
            os.setsid()
        except OSError:
            pass
        end = time.monotonic() + 3
        while time.monotonic() < end:
            pass
        os._exit(0)
"""


@SOCKETS_IN_TMP  # its class makes /tmp/cg-* folders; test_limits watches them
def test_resources_beyond_the_limits_are_refused_in_each_sandbox(tmp_path, monkeypatch):
    from course_utils.grading import resources

    monkeypatch.chdir(tmp_path)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    monkeypatch.setattr(tempfile, "tempdir", None)
    sockets_before = set(Path("/tmp").glob("cg-*"))
    expected = {"/dev read-only", "/dev/shm small", "setsid refused", "sockets in a small tmpfs"}
    if resources.cgroup_parent() is None:  # else memory.max bounds it, not the address space
        expected.add("shared mapping refused")
    mechanisms = solved()
    probe = MECHANISMS.replace("SETSID_PROBE", SETSID_PROBE)
    cell(mechanisms, "answer-03-1").source = f"EXPECTED = {expected!r}\n{probe}"

    def fill(code: str, **names) -> str:
        for name, value in names.items():
            code = code.replace(name, str(value))
        return code.replace("MARK", MARK)

    attacks = {
        "fill-dev": attacker(fill(FILL_DEV, PLACES="['/dev', '/dev/shm']")),
        "fill-dev-late": attacker(fill(FILL_DEV, PLACES="['/dev/shm', '/dev']"), "answer-03-6"),
        "map-shared": attacker(fill(SHARED_MAP, BACKING=False)),
        "map-shared-file": attacker(fill(SHARED_MAP, BACKING=True), "answer-03-4"),
        "sockets-deep": attacker(fill(SOCKETS_SUBFOLDERS, DEPTH=3, COUNT=1, SIZE=1500 << 20)),
        "sockets-wide": attacker(fill(SOCKETS_SUBFOLDERS, DEPTH=1, COUNT=64, SIZE=4096)),
        "flood": attacker(fill(FLOOD, COUNT=40, SIZE=1 << 20)),  # 40 MB, a message each
        "setsid": attacker(SETSID_SPINNERS),
    }
    # One message of 300 MB: dropped unread, and the rest of the notebook is still graded.
    loud = with_code(solved(), "answer-03-1", fill(FLOOD, COUNT=1, SIZE=300 << 20))
    honest = {"a-honest": solved(), "loud-honest": loud, "z-honest": solved()}
    results = grade_class(tmp_path, {**honest, "mechanisms": mechanisms, **attacks})
    verdict = {e.id: e for e in results["mechanisms"].exercises}["3.1"]
    assert verdict.passed, verdict.message  # every mechanism held, seen from inside
    assert passed(results["mechanisms"]) == ALL
    for name in attacks:
        assert passed(results[name]) == [], (name, results[name].exercises)
        assert results[name].problem is None, (name, results[name].problem)
    for name in honest:
        assert passed(results[name]) == ALL and results[name].problem is None, name
    assert any("truncated" in n for n in results["flood"].notes), results["flood"].notes
    assert any("over 16 MiB" in n for n in results["loud-honest"].notes)
    assert any("beside its sockets" in n for n in results["sockets-wide"].notes)
    time.sleep(1)
    assert processes_with(MARK) == []
    assert not list(Path("/tmp").glob(f"{MARK}*")) and not list(Path("/dev/shm").glob(f"{MARK}*"))
    assert list(temporary.iterdir()) == []
    assert set(Path("/tmp").glob("cg-*")) <= sockets_before


EXPORT = "\n".join(  # a student's own answers, uploaded as a .py file beside the notebook
    [
        "bubble_fraction = (g.p - 1) / (g.m + g.p - 1)",
        "def gpipe_bubble(p, m):\n    return (p - 1) / (m + p - 1)",
        "microbatches = 1\nwhile gpipe_bubble(g3.p, microbatches) > g3.target:\n"
        "    microbatches += 1",
        "budget = int((g4.gpu_gb - g4.state_gb) // g4.per_microbatch_gb)",
        ROUNDS,
        'left_cause, right_cause = "a", "b"',
        "busy = [unbalanced.busy(d) for d in range(3)]",
        "efficiency = sum(busy) / (3 * unbalanced.makespan)",
        "busiest_device = busy.index(max(busy))",
    ]
)
RUN_EXPORTS = """
import glob, os
g3, g4, g = check.given(3), check.given(4), check.given(1)
for path in sorted(glob.glob('*.py') + glob.glob('/run/**/*.py', recursive=True)
                   + glob.glob('../**/*.py', recursive=True)):
    try:
        exec(open(path).read(), globals())
    except Exception:
        pass
"""


def runs_exports():
    """A blank notebook whose every answer cell runs the .py files it can find."""
    nb = blank()
    for k in range(1, 7):
        cell(nb, f"answer-03-{k}").source = RUN_EXPORTS
    return nb


def flat_download(folder: Path, names: dict[str, str]) -> None:
    """A flat download: each key is a file name prefix (the LMS's), the value the student's
    role: 'owner' solved it and uploaded the export too, 'thief' runs every .py it finds,
    'self' runs its own export (which must arrive), 'files-only' sent no notebook."""
    folder.mkdir(parents=True)
    for prefix, role in names.items():
        if role in ("owner", "self", "files-only"):
            (folder / f"{prefix}answers.py").write_text(EXPORT)
        if role == "owner":
            (folder / f"{prefix}{NAME}").write_bytes(data(solved()))
        elif role in ("thief", "self"):
            (folder / f"{prefix}{NAME}").write_bytes(data(runs_exports()))
    (folder / "helper.py").write_text(EXPORT)  # nobody's


def test_a_flat_download_gives_each_kernel_its_own_students_files_only(tmp_path):
    from course_utils.grading.batch import find_submissions, unowned_files
    from course_utils.grading.journal import Journal

    moodle = {
        "Bob Jones_1002_assignsubmission_file_": "owner",
        "Mallory X_1003_assignsubmission_file_": "thief",
        "Carol Day_1004_assignsubmission_file_": "self",
        "Dave Lee_1005_assignsubmission_file_": "files-only",
    }
    canvas = {
        "jonesbob_1002_551_": "owner",
        "xmallory_1003_552_": "thief",
        "daycarol_LATE_1004_553_": "self",
    }
    flat_download(tmp_path / "moodle", moodle)
    flat_download(tmp_path / "canvas", canvas)
    plain = tmp_path / "plain"  # alice.ipynb, mallory.ipynb, answers.py: nobody's
    plain.mkdir()
    (plain / "answers.py").write_text(EXPORT)
    (plain / "helper.py").write_text(EXPORT)
    (plain / "alice.ipynb").write_bytes(data(solved()))
    (plain / "mallory.ipynb").write_bytes(data(runs_exports()))
    folders = [tmp_path / "moodle", tmp_path / "canvas", plain]
    journal = tmp_path / "grades.csv"
    results = grade_all(folders, jobs=2, journal=journal)
    scores = {(Path(r.notebook).parent.name, r.student): r.score for r in results}
    assert scores == {
        ("moodle", "Bob Jones"): 6, ("moodle", "Mallory X"): 0, ("moodle", "Carol Day"): 6,
        ("canvas", "jonesbob"): 6, ("canvas", "xmallory"): 0, ("canvas", "daycarol"): 6,
        ("plain", "alice"): 6, ("plain", "mallory"): 0,
    }  # fmt: skip
    unowned = {(p.parent.name, p.name) for p in unowned_files(find_submissions(folders))}
    assert unowned == {
        ("moodle", "helper.py"), ("moodle", "Dave Lee_1005_assignsubmission_file_answers.py"),
        ("canvas", "helper.py"), ("plain", "helper.py"), ("plain", "answers.py"),
    }  # fmt: skip
    # A file added later is a reason to grade its student again, and only that student.
    (tmp_path / "moodle" / "Mallory X_1003_assignsubmission_file_notes.txt").write_text("hi")
    again = {r.notebook: r for r in grade_all(folders, jobs=2, journal=journal)}
    mallory = str(tmp_path / "moodle" / f"Mallory X_1003_assignsubmission_file_{NAME}")
    assert again[mallory].regraded == ["its other files changed"]
    assert [n for n, r in again.items() if r.regraded] == [mallory]
    assert len(Journal(journal).previous()) == len(results)
    before = next(r for r in results if r.notebook == mallory)
    assert again[mallory].key["files_sha256"] != before.key["files_sha256"]
    assert again[mallory].key["notebook_sha256"] == before.key["notebook_sha256"]


PLANTED = f"""
import pathlib
pathlib.Path('{{outside}}', '{MARK}-' + __name__.replace('.', '-')).write_text('ran')
"""


def test_the_pytest_route_runs_nothing_of_the_folder_but_its_notebooks(tmp_path):
    import subprocess

    folder = tmp_path / "submissions"
    outside = tmp_path / "outside"  # where the planted code would leave its mark
    outside.mkdir()
    planted = PLANTED.replace("{outside}", str(outside))
    for student, nb in {"alice": blank(), "bob": solved()}.items():
        (folder / student).mkdir(parents=True)
        (folder / student / NAME).write_bytes(data(nb))
    (folder / "alice" / "test_beside.py").write_text(planted + "def test_x():\n    pass\n")
    (folder / "alice" / "check_more_test.py").write_text(planted)
    (folder / "alice" / "test_doc.txt").write_text(
        ">>> import pathlib\n"
        f">>> _ = pathlib.Path({str(outside)!r}, '{MARK}-doctest').write_text('ran')\n"
    )
    (folder / "bob" / "__init__.py").write_text(planted)
    (folder / "sitecustomize.py").write_text(planted)

    def pytest_run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "course_utils.grading.pytest_plugin",
             "--course-grade", str(folder), "--course-jobs", "2", "-p", "no:cacheprovider",
             "-o", "python_files=*.py", "--doctest-glob=*.txt", *extra],
            capture_output=True, text=True, cwd=tmp_path,
        )  # fmt: skip

    run = pytest_run()
    assert run.returncode == 1, run.stdout + run.stderr  # alice's six fail
    assert "6 failed, 6 passed" in run.stdout
    assert "sandbox per kernel (bwrap)" in run.stdout  # the header says what bounds them
    assert "files no kernel got" in run.stdout and "sitecustomize.py" in run.stdout
    assert list(outside.iterdir()) == []
    # A configuration file inside the folder stops the run before anything is graded.
    configs = {
        "conftest.py": "import pytest\n" + planted,
        "pytest.ini": "[pytest]\naddopts = -p no:cacheprovider\n",
        "pyproject.toml": "[tool.pytest.ini_options]\npythonpath = ['.']\n",
        "setup.cfg": "[tool:pytest]\naddopts = -q\n",
        "tox.ini": "[pytest]\naddopts = -q\n",
    }
    for name, text in configs.items():
        (folder / "alice" / name).write_text(text)
        refused = pytest_run()
        (folder / "alice" / name).unlink()
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 4, (name, refused.stdout, refused.stderr)
        assert len(lines) == 1 and name in lines[0] and "inside a folder to grade" in lines[0]
        assert "passed" not in refused.stdout and "failed" not in refused.stdout
        assert list(outside.iterdir()) == []


DEEP = "def gpipe_bubble(p, m):\n    return (p - 1) / (m + p - 1)" + " + 0" * 600
TEX_ERROR = 'def gpipe_bubble(p, m):\n    raise ValueError(r"$\\undefinedmacro{x}$")'
ESCAPES = "\x1b[2J\x1b[H\x1b[1A\x1b[2K"
HIDING = {  # answers whose text would redraw the terminal, were it obeyed
    "answer-03-1": f"class Shown:\n    pass\nShown.__name__ = {ESCAPES + 'passed'!r}\n"
    "bubble_fraction = Shown()",
    "answer-03-2": f"def gpipe_bubble(p, m):\n    raise ValueError({ESCAPES + '3.2 passed'!r})",
}


def test_no_notebook_can_stop_a_report_or_reach_past_what_the_instructor_reads(tmp_path):
    import csv

    from course_utils.cli import main

    folder = tmp_path / "class"
    hiding = blank()
    for cell_id, source in HIDING.items():
        cell(hiding, cell_id).source = source
    deep, tex, tex_too = solved(), solved(), solved()
    cell(deep, "answer-03-2").source = DEEP
    cell(tex, "answer-03-2").source = TEX_ERROR
    cell(tex_too, "answer-03-2").source = TEX_ERROR
    formula = '=HYPERLINK("evil.example","x")_1009_assignsubmission_file_'
    for student, nb in {
        "deep": deep, "tex": tex, "tex-too": tex_too, "hiding": hiding,
        formula: solved(), "honest": solved(),
    }.items():  # fmt: skip
        (folder / student).mkdir(parents=True)
        (folder / student / NAME).write_bytes(data(nb))
    out = tmp_path / "out"
    out.mkdir()
    reports = [
        "--csv", out / "grades.csv", "--gradebook", out / "gradebook.csv",
        "--feedback", out / "feedback", "--stats", out / "stats.png",
        "--similarity", out / "pairs.csv",
    ]  # fmt: skip
    code, printed = _grade(main, [folder, "-j", "2", *reports])
    assert code == 0, printed
    for name in ("grades.csv", "gradebook.csv", "stats.png", "stats.csv", "pairs.csv"):
        assert (out / name).stat().st_size > 0, name
    assert "\x1b" not in printed and "\\x1b[2J" in printed  # shown, not obeyed
    assert "deep's answer nests too deeply to compare after renaming" in printed
    stats = {r["exercise"]: r for r in csv.DictReader((out / "stats.csv").open())}
    assert "$\\undefinedmacro{x}$" in stats["3.2"]["commonest hint"]
    rows = {r["student"]: r for r in csv.DictReader((out / "grades.csv").open())}
    assert rows['\'=HYPERLINK("evil.example","x")']["score"] == "6"
    assert rows["hiding"]["score"] == "0" and rows["deep"]["score"] == "6"
    book = (out / "gradebook.csv").read_text()
    assert "\n=" not in book and ",=" not in book and "'=HYPERLINK" in book
    pages = list((out / "feedback").rglob("*.html"))
    assert len(pages) == 6 and all(p.resolve().is_relative_to(out / "feedback") for p in pages)
    assert all("\x1b" not in p.read_text() for p in pages)

    # One handout graded alone trusts its name cell for its numbers, never for a path.
    elsewhere = tmp_path / "elsewhere" / "made"
    named = solved()
    cell(named, "s03-code-02").source = cell(named, "s03-code-02").source.replace(
        'l03.for_student("default")', f"l03.for_student({str(elsewhere)!r})"
    )
    single = tmp_path / "single.ipynb"
    single.write_bytes(data(named))
    feedback = tmp_path / "D"
    code, printed = _grade(main, [single, "--feedback", feedback, "--csv", tmp_path / "one.csv"])
    assert code == 0, printed
    assert not (tmp_path / "elsewhere").exists()
    (page,) = feedback.rglob("*.html")
    assert page.resolve().is_relative_to(feedback.resolve())
    (row,) = csv.DictReader((tmp_path / "one.csv").open())
    assert row["student"] == str(elsewhere) and row["score"] == "6"


def _grade(main, args: list) -> tuple[int, str]:
    """`grade ARGS` in this process: its exit code and everything it printed."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["grade", *map(str, args)])
    return code, out.getvalue() + err.getvalue()
