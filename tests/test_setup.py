"""The foundation: pins agree with Binder's environment, notebooks are clean, the package
imports fast without torch, and the CLI lists its commands."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import nbformat
import pytest
import yaml
from conftest import ROOT

# pip name -> conda-forge name where they differ
CONDA_NAMES = {"torch": "pytorch-cpu"}


def _pip_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        assert version, f"requirements.txt: {line!r} is not pinned with =="
        pins[CONDA_NAMES.get(name.lower(), name.lower())] = version
    return pins


def _conda_pins() -> tuple[dict[str, str], dict]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pins = {}
    for dep in env["dependencies"]:
        assert isinstance(dep, str), "environment.yml must not have a pip: section (Binder caching)"
        name, _, version = dep.partition("=")
        pins[name.lower()] = version
    return pins, env


def test_environment_yml_matches_requirements():
    pip_pins = _pip_pins()
    conda_pins, env = _conda_pins()
    python = conda_pins.pop("python")
    assert python == "3.11"
    assert env["channels"] == ["conda-forge"]
    assert set(conda_pins) == set(pip_pins), (
        f"only in environment.yml: {sorted(set(conda_pins) - set(pip_pins))}; "
        f"only in requirements.txt: {sorted(set(pip_pins) - set(conda_pins))}"
    )
    for name, version in pip_pins.items():
        # conda's "=X.Y" means X.Y.*: the same family as pip's exact pin, not one patch release
        family = ".".join(version.split(".")[:2])
        assert conda_pins[name] == family, f"{name}: {conda_pins[name]} vs {family} ({version})"
    assert pip_pins["pytorch-cpu"] == "2.13.0"
    assert pip_pins["jupyterlab"].startswith("4.") and pip_pins["ipywidgets"].startswith("8.")


def test_binder_files():
    post_build = ROOT / "postBuild"
    assert os.access(post_build, os.X_OK), "postBuild must be executable"
    assert "pip install --no-deps -e ." in post_build.read_text()
    assert not (ROOT / "binder").exists(), "a binder/ folder would hide the root files"
    readme = (ROOT / "README.md").read_text()
    badge = re.search(
        r"\(https://mybinder\.org/v2/gh/[^)]*urlpath=lab/tree/(notebooks/[^)&]+)\)", readme
    )
    assert badge, "README needs a Binder badge opening JupyterLab on the course index"
    assert (ROOT / badge.group(1)).exists(), badge.group(1)


def test_readme_quick_start_is_two_commands():
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", quick, re.S).group(1)
    commands = [
        c for c in block.splitlines() if c.strip() and not c.startswith(("git clone", "cd "))
    ]
    assert commands == ["make lab", "make test"]


def _all_notebooks():
    return sorted(
        p
        for folder in ("notebooks", "exercises", "solutions")
        for p in (ROOT / folder).glob("*.ipynb")
    )


@pytest.mark.parametrize("path", _all_notebooks(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebooks_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {index} has outputs: clear them"
            assert cell.execution_count is None, f"{path.name} cell {index} has an execution count"


def test_every_lesson_is_listed_in_the_index_under_its_number():
    index = nbformat.read(ROOT / "notebooks" / "00_welcome.ipynb", as_version=4)
    text = "\n".join(c.source for c in index.cells)
    assert "check_setup()" in text
    linked = set(re.findall(r"\]\((\d\d_\w+\.ipynb)\)", text))
    for name in linked:
        assert (ROOT / "notebooks" / name).exists(), f"the index links to a missing {name}"
    lessons = {p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    lessons.discard("00_welcome.ipynb")
    assert len(lessons) >= 13
    assert lessons <= linked, f"lessons not linked from the index: {sorted(lessons - linked)}"
    for name in lessons:  # the row's number is the file's: | 08 | [..](08_....ipynb)
        assert re.search(rf"^\| {name[:2]} \| \[[^]]+\]\({name}\)", text, re.M), name


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_import_course_utils_is_fast_and_without_torch():
    code = (
        "import sys, time; t = time.perf_counter(); import course_utils, course_utils.cli; "
        "print(time.perf_counter() - t, 'torch' in sys.modules)"
    )
    seconds, torch_loaded = _run_python(code).stdout.split()
    assert torch_loaded == "False"
    assert float(seconds) < 0.5


def test_cli_help_lists_every_command(run_cli):
    out = run_cli("--help")
    assert out.returncode == 0
    for command in (
        "schedule",
        "gantt",
        "run",
        "data-parallel",
        "tensor-parallel",
        "grade",
        "plan",
        "distributed",
    ):
        assert re.search(rf"^\s+{command}\s", out.stdout, re.M), command


def test_cli_unknown_command_is_one_line_exit_2(run_cli):
    out = run_cli("frobnicate")
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert "frobnicate" in out.stderr and "Traceback" not in out.stderr


def test_setup_check_measures_real_concurrency():
    from course_utils.measure.setup_check import (
        available_cores,
        concurrency_speedup,
        python_runs_during_torch,
    )

    assert available_cores() >= 1
    assert concurrency_speedup() > 0
    # torch releases the GIL: the main thread keeps running during a long multiply.
    assert python_runs_during_torch() > 100


def test_setup_check_fails_when_the_gil_is_held(monkeypatch):
    """A torch that kept the GIL would freeze other Python threads: the check must say so."""
    import sys

    from course_utils.measure import setup_check

    def holds_the_gil() -> None:  # pure Python: keeps the GIL until the switch interval
        deadline = time.perf_counter() + 0.1
        while time.perf_counter() < deadline:
            pass

    monkeypatch.setattr(setup_check, "_long_op", holds_the_gil)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(5.0)  # no thread switch during the 0.1 s "kernel"
    try:
        assert setup_check.python_runs_during_torch() == 0
        with pytest.raises(RuntimeError, match="GIL"):
            setup_check.check_setup(attempts=1)
    finally:
        sys.setswitchinterval(interval)


def test_setup_check_busy_machine_is_a_warning_not_an_error(monkeypatch, capsys):
    from course_utils.measure import setup_check

    if setup_check.available_cores() < 2:
        pytest.skip("needs 2 cores")
    monkeypatch.setattr(setup_check, "concurrency_speedup", lambda: 1.18)
    info = setup_check.check_setup(attempts=2)
    out = capsys.readouterr().out
    assert info["speedup"] == pytest.approx(1.18)
    assert "only 1.18x faster" in out and "another program" in out
    monkeypatch.setattr(setup_check, "concurrency_speedup", lambda: 1.85)
    setup_check.check_setup(attempts=1)
    assert "1.85x faster than one thread" in capsys.readouterr().out


def test_makefile_targets_and_ci_script():
    makefile = (ROOT / "Makefile").read_text()
    for target in ("lab:", "test:", "test-fast:", "lint:", "exercises:", "bench:", "test-browser:"):
        assert re.search(rf"^{target}", makefile, re.M), target
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci
    assert os.access(ROOT / ".ci" / "run", os.X_OK)


def test_gitignore_covers_venv_and_caches():
    ignored = (ROOT / ".gitignore").read_text().split()
    for entry in (".venv/", "__pycache__/", ".pytest_cache/", "*.egg-info/"):
        assert entry in ignored


def test_requirements_pin_cpu_torch():
    assert "torch==2.13.0" in (ROOT / "requirements.txt").read_text()
