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
from conftest import SOCKETS_IN_TMP
from gradingkit import ALL, NAME, ROOT, blank, cell, data, passed, solved, with_code

from course_utils.grading import isolation
from course_utils.grading.batch import grade_all

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(isolation.problem() is not None, reason=str(isolation.problem())),
]
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
    for name in ("fill-sockets", "fill-sockets-many"):  # stopped: files beside its sockets
        assert any("beside its sockets" in n for n in results[name].notes), results[name].notes
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


def test_without_a_sandbox_grade_refuses_in_one_line_unless_told(monkeypatch, tmp_path, capsys):
    from course_utils.cli import main

    monkeypatch.setattr(isolation.shutil, "which", lambda name: None)
    isolation.problem.cache_clear()
    try:
        (tmp_path / "a.ipynb").write_bytes(data(solved()))
        assert main(["grade", str(tmp_path / "a.ipynb")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "bubblewrap (bwrap) is not installed" in err
        assert "--no-sandbox" in err
        assert main(["grade", str(tmp_path / "a.ipynb"), "--no-sandbox", "--json"]) == 0
        captured = capsys.readouterr()
        assert "--no-sandbox" in captured.err and '"score": 6' in captured.out
    finally:
        isolation.problem.cache_clear()


def test_the_stand_in_checks_hold_numbers_and_material_but_no_answers(tmp_path):
    from course_utils.grading import stand_in

    folder = stand_in.write(tmp_path / "checks", ROOT / "solutions", 3, {1: {"p": 4, "m": 12}})
    l03 = (folder / "l03.py").read_text()
    assert "def exercise_" not in l03 and "_bubble" not in l03 and "cases_" not in l03
    l06 = (folder / "l06.py").read_text()
    assert "ring_messages" not in l06 and "STRATEGY_ANSWERS" not in l06
    l10 = (folder / "l10.py").read_text()
    assert "_plan" not in l10  # the code drawing 10.6's numbers looks at the answer
    l08 = (folder / "l08.py").read_text()
    assert "def their_timeline" in l08 and "ORDER" not in l08  # material, not the answer
    assert (folder / "wire.py").read_bytes() == (ROOT / "course_utils/checks/wire.py").read_bytes()
    assert (folder / "rank_cases.py").exists() and not (folder / "rank_references.py").exists()
    assert "_ring_sums" not in l06 and "rank_references" not in l06.split("def ")[0]
