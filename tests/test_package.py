"""The course works from an installed wheel, not only from an editable checkout.

The wheel is built from the tracked files alone (a copy of the checkout's `git ls-files`),
installed with `--no-deps` into a fresh virtual environment whose third-party packages come
from this one (a path file, so torch is not installed twice), and lesson 01 (the text data
and the reference recordings) runs from a folder outside the checkout.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT
from gradingkit import NO_SANDBOX

pytestmark = pytest.mark.slow

LESSON = "01_naive_model_parallelism.ipynb"


def _tracked(prefix: str) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", prefix], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the tracked files (nothing left in the checkout)."""
    source = tmp_path_factory.mktemp("source")
    for name in ["pyproject.toml", "README.md", *_tracked("course_utils")]:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)],
        check=True,
        timeout=300,
    )
    (built,) = dist.glob("course_utils-*.whl")
    return built


@pytest.fixture(scope="module")
def fresh_python(wheel, tmp_path_factory) -> Path:
    """A new venv with the wheel installed and this venv's packages on its path."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=300,
    )
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # A plain path, not a site dir: this venv's editable course_utils (a .pth hook) is not run.
    Path(purelib, "course_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python


def test_wheel_holds_the_package_data_and_no_solutions(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    data = [name for name in _tracked("course_utils") if "/data/" in name]
    assert len(data) > 15  # the text, its source note, the reference recordings
    missing = [name for name in data if name not in names]
    assert not missing, f"not in the wheel: {missing}"
    assert not [name for name in names if name.startswith(("solutions/", "tests/", "notebooks/"))]


def test_a_lesson_runs_from_the_installed_wheel_in_another_folder(fresh_python, tmp_path):
    where = subprocess.run(
        [str(fresh_python), "-c", "import course_utils; print(course_utils.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.strip()
    assert Path(where).is_relative_to(fresh_python.parent.parent), where  # not the checkout
    shutil.copy2(ROOT / "notebooks" / LESSON, tmp_path / LESSON)
    run = subprocess.run(
        [str(fresh_python), str(ROOT / "tests" / "nbrun.py"), LESSON, "--timeout", "300"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=400,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["error"] is None, result["error"]
    # The reference twins were found inside the package (a missing one prints nothing).
    assert "reference: 2-core machine" in result["stdout"], result["stdout"][-2000:]


def test_grading_from_the_wheel_asks_for_the_solutions_folder(fresh_python, tmp_path):
    submission = tmp_path / "03_bubble_tradeoff.ipynb"
    shutil.copy2(ROOT / "exercises" / submission.name, submission)
    out = subprocess.run(
        [str(fresh_python), "-m", "course_utils", "grade", str(submission), *NO_SANDBOX],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "--solutions DIR is needed" in out.stderr
    graded = subprocess.run(
        [str(fresh_python), "-m", "course_utils", "grade", str(submission), "--json"]
        + ["--solutions", str(ROOT / "solutions"), *NO_SANDBOX],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert graded.returncode == 0, graded.stderr[-2000:]
    (result,) = json.loads(graded.stdout)
    assert result["score"] == 0 and result["total"] > 0, result["problem"]  # the blank, graded
