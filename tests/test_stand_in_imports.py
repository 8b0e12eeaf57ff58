"""The checks package as a sandboxed kernel sees it (`course_utils.grading.stand_in`).

Nothing here needs bubblewrap: the stand-in is a folder of files, and a Python started with
it in place of `course_utils/checks/` (as the sandbox mounts it) shows what a learner's
kernel can import. The sandbox itself is tried in tests/test_sandbox.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
from conftest import ROOT

from course_utils.checks import Variant, l12
from course_utils.grading import stand_in
from course_utils.grading.grader import solution_for

LESSONS = sorted(int(p.stem[1:]) for p in (ROOT / "course_utils/checks").glob("l[0-9][0-9].py"))


def test_the_stand_in_checks_hold_numbers_and_material_but_no_answers(tmp_path):
    from course_utils.checks import l08

    solution = nbformat.read(ROOT / "solutions" / "08_sharded_data_parallelism.ipynb", 4)
    folder = stand_in.write(tmp_path / "checks", solution, l08, Variant("s7"))
    for path in folder.glob("l[0-9][0-9].py"):  # data, and no function of the lesson's
        text = path.read_text()
        assert "def exercise_" not in text and "cases_" not in text, path
        assert "_bubble" not in text and "ring_messages" not in text and "_plan" not in text
    text = (folder / "l08.py").read_text()
    assert '"their_timeline"' in text and "def their_timeline" not in text  # material, as data
    assert "ORDER" not in text  # not the answer
    assert (folder / "wire.py").read_bytes() == (ROOT / "course_utils/checks/wire.py").read_bytes()
    assert (folder / "rank_cases.py").exists() and not (folder / "rank_references.py").exists()
    assert (folder / "processes.py").exists() and not (folder / "worker_runs.py").exists()


def package_with(checks: Path, root: Path) -> Path:
    """A `course_utils` under `root` whose `checks/` is `checks` (the rest links to ours)."""
    package = root / "course_utils"
    package.mkdir(parents=True)
    for entry in (ROOT / "course_utils").iterdir():
        if entry.name not in ("checks", "__pycache__"):
            (package / entry.name).symlink_to(entry)
    (package / "checks").symlink_to(checks)
    return root


IMPORT_EVERY_LESSON = """
import contextlib, importlib, io, sys
import course_utils.checks as checks
assert checks.__file__.startswith(sys.argv[1]), checks.__file__  # the stand-in, not ours
for n in {lessons!r}:
    module = importlib.import_module(f"course_utils.checks.l{{n:02d}}")
    assert not hasattr(module, "cases_1"), n
module = importlib.import_module("course_utils.checks.l12")  # the lesson the stand-in is for
check = module.for_student("alice")
with contextlib.redirect_stdout(io.StringIO()) as said:
    print(check.given(7), check.given(8))
    check.exercise_5(None, None, None)
print(said.getvalue())
print(module.moe_layout(2)[1].ep)
from course_utils.checks import judge, Variant
from course_utils.checks.programs import ProgramCase
from course_utils.checks.processes import WorkerDDPCase, WorkerRingCase  # lesson 13's cases
"""


def test_every_lesson_imports_from_the_stand_in_alone(tmp_path):
    # A framework module the stand-in does not copy (a new one beside checks/__init__.py, or
    # one the rank programs import) breaks every sandboxed grade: here it fails fast.
    solution = nbformat.read(solution_for(12, ROOT / "solutions"), as_version=4)
    folder = stand_in.write(tmp_path / "checks", solution, l12, Variant("alice"))
    root = package_with(folder, tmp_path / "site")
    code = IMPORT_EVERY_LESSON.format(lessons=LESSONS)
    env = {**os.environ, "PYTHONPATH": str(root)}
    run = subprocess.run(
        [sys.executable, "-c", code, str(root)], capture_output=True, text=True, env=env, cwd=root
    )
    assert run.returncode == 0, run.stderr
    assert "seq = 65536" in run.stdout and "gpus = 16" in run.stdout  # 12.7 and 12.8's numbers
    assert "exercise_5: your answer is judged by the grader" in run.stdout
    assert run.stdout.rstrip().endswith("2")  # lesson 12's material: the layout with ep = 2
