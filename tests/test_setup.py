"""The foundation: pins agree with Binder's environment, notebooks are clean, the package
imports fast without torch, and the CLI lists its commands."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import nbformat
import pytest
import yaml
from conftest import ROOT
from packaging.specifiers import SpecifierSet
from packaging.version import Version

# pip name -> conda-forge name where they differ: `torch` is not a conda-forge package and
# `pytorch` may be a CUDA build; `matplotlib` adds Qt (pyside6), `matplotlib-base` does not.
CONDA_NAMES = {"torch": "pytorch-cpu", "matplotlib": "matplotlib-base"}
# Names that are a mistake in environment.yml, and why.
WRONG_CONDA_NAMES = {
    "torch": "not a conda-forge package: use pytorch-cpu",
    "pytorch": "may resolve to the CUDA build: use pytorch-cpu",
    "matplotlib": "pulls in Qt (pyside6): use matplotlib-base",
    "playwright": "on conda-forge the Node.js tool, not the Python package (and a test tool)",
}
# What only `make test` needs: never in the learner's requirements.txt or Binder image.
TEST_TOOLS = {
    "pytest", "pytest-xdist", "execnet", "nbval", "hypothesis", "ruff", "mypy", "playwright",
    "pyyaml", "setuptools",  # setuptools: the editable installs' build backend (make setup)
    "sphinx", "myst-nb", "myst-parser",  # the course book (make book)
}  # fmt: skip


def _pins(path) -> dict[str, str]:
    """{pip name: version} of a requirements file where every line is NAME==VERSION."""
    pins = {}
    for line in (ROOT / path).read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        assert version, f"{path}: {line!r} is not pinned with =="
        pins[name.lower()] = version
    return pins


def _conda_specs() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"]
    specs = {}
    for dep in env["dependencies"]:
        assert isinstance(dep, str), "environment.yml must not have a pip: section (Binder caching)"
        name, spec = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", dep).groups()
        specs[name.lower()] = spec.strip()
    return specs


def _range(spec: str) -> SpecifierSet:
    """A conda range such as ">=2.10,<2.14" as a PEP 440 specifier (same meaning here)."""
    assert re.fullmatch(r">=\d+(\.\d+)*,<\d+(\.\d+)*", spec), (
        f"{spec!r}: write a range, >=LOW,<HIGH (repo2docker's own Jupyter must fit in it)"
    )
    return SpecifierSet(spec)


def _checked_on_conda_forge() -> dict[str, str]:
    """docs/environment.md's table: {conda-forge name: newest version checked for 3.11}."""
    text = (ROOT / "docs" / "environment.md").read_text()
    rows = re.findall(
        r"^\| `([a-z0-9-]+)` \| `[^`]*` \| [^|]* \| ([0-9.]+) \| [^|]*\d{4}-\d\d-\d\d", text, re.M
    )
    return dict(rows)


def test_learner_requirements_hold_no_test_tool():
    learner, dev = _pins("requirements.txt"), _pins("requirements-dev.txt")
    assert not TEST_TOOLS & set(learner), (
        f"test tools in requirements.txt: {TEST_TOOLS & set(learner)}"
    )
    assert set(dev) == TEST_TOOLS, f"requirements-dev.txt: {sorted(dev)}"
    assert not set(learner) & set(dev), "a package pinned in both requirements files"


def test_environment_yml_lists_the_learner_requirements_under_conda_forge_names():
    learner = _pins("requirements.txt")
    specs = _conda_specs()
    assert specs.pop("python") == "=3.11"
    for name in specs:
        assert name not in WRONG_CONDA_NAMES, f"environment.yml: {name}: {WRONG_CONDA_NAMES[name]}"
        assert name not in TEST_TOOLS, (
            f"environment.yml: {name} is a test tool (requirements-dev.txt)"
        )
    expected = {CONDA_NAMES.get(name, name) for name in learner}
    assert set(specs) == expected, (
        f"only in environment.yml: {sorted(set(specs) - expected)}; "
        f"only in requirements.txt: {sorted(expected - set(specs))}"
    )


def test_every_conda_range_holds_the_pin_and_what_conda_forge_has():
    learner = _pins("requirements.txt")
    specs = _conda_specs()
    checked = _checked_on_conda_forge()
    assert set(checked) == set(specs), (
        f"docs/environment.md checks {sorted(checked)}; environment.yml has {sorted(specs)}"
    )
    for pip_name, version in learner.items():
        name = CONDA_NAMES.get(pip_name, pip_name)
        allowed = _range(specs[name])
        assert version in allowed, f"{name} {specs[name]} excludes the pin {pip_name}=={version}"
        assert checked[name] in allowed, (
            f"{name} {specs[name]} excludes {checked[name]}, the newest on conda-forge "
            "(docs/environment.md): Binder could not solve it"
        )
    assert checked["python"].startswith("3.11.")


def test_pytorch_range_runs_from_the_oldest_tested_to_the_pinned_release():
    """Binder may get any release in the range: both ends are tested, nothing newer."""
    torch = _pins("requirements.txt")["torch"]
    oldest = re.search(r"^COMPAT_TORCH \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    major, minor = map(int, torch.split(".")[:2])
    low = ".".join(oldest.split(".")[:2])
    assert _conda_specs()["pytorch-cpu"] == f">={low},<{major}.{minor + 1}"
    assert Version(oldest) < Version(torch)
    docs = (ROOT / "docs" / "environment.md").read_text()
    assert f"**{oldest} is the oldest PyTorch the course supports**" in docs
    readme = (ROOT / "README.md").read_text()
    assert f"PyTorch {low} to {major}.{minor}" in readme


def test_binder_files():
    post_build = ROOT / "postBuild"
    assert os.access(post_build, os.X_OK), "postBuild must be executable"
    installs = [line for line in post_build.read_text().splitlines() if "pip install" in line]
    # The course package alone: its dependencies come from environment.yml (a cached layer).
    assert installs == ["pip install --no-deps -e ."], installs
    assert not (ROOT / "binder").exists(), "a binder/ folder would hide the root files"


def test_binder_badge_opens_the_course_index():
    readme = (ROOT / "README.md").read_text()
    badges = re.findall(r"\]\((https://mybinder\.org/v2/gh/[^)]*)\)", readme)
    assert badges, "README needs a Binder badge"
    for url in badges:
        parsed = urlparse(url)
        assert parsed.query == "urlpath=lab/tree/notebooks/00_welcome.ipynb", url
        assert re.fullmatch(r"/v2/gh/[\w.-]+/[\w.-]+/[\w.-]+", parsed.path), url
    path = parse_qs(urlparse(badges[0]).query)["urlpath"][0].removeprefix("lab/tree/")
    assert (ROOT / path).is_file(), path


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
    targets = ("lab:", "test:", "test-fast:", "lint:", "exercises:", "bench:", "test-browser:")
    for target in (*targets, "test-compat:", "test-limits:"):
        assert re.search(rf"^{target}", makefile, re.M), target
    # The compat venv lives outside the checkout (a clean clone must not carry GBs of torch).
    assert re.search(
        r"^COMPAT_VENV \?= \$\(or \$\(XDG_CACHE_HOME\),\$\(HOME\)/\.cache\)/", makefile, re.M
    )
    assert os.access(ROOT / ".ci" / "run", os.X_OK)


FAKE_MAKE = """#!/bin/sh
echo "$*" >> "$CALLS"
echo "$* COURSE_REQUIRE_OPTIONAL=$COURSE_REQUIRE_OPTIONAL" >> "$CALLS.env"
echo "output of make $*"
[ "$*" = "$FAILING" ] && exit 1
exit 0
"""


@pytest.mark.parametrize(
    "failing", ["", "test", "book", "test-nbval", "test-browser", "test-compat", "test-limits"]
)
def test_ci_runs_every_suite_and_fails_when_one_does(tmp_path, failing):
    """.ci/run with a stand-in `make` (and stand-ins for what it would apt-get): it runs make
    test, the book, strict nbval on the solutions, then the browser test beside the oldest
    PyTorch (showing the browser's log), then the limits, and fails when any of them fails;
    in each, a test that needs bubblewrap or chromium fails instead of being skipped
    (COURSE_REQUIRE_OPTIONAL=1)."""
    (tmp_path / ".ci").mkdir()
    script = tmp_path / ".ci" / "run"
    script.write_text((ROOT / ".ci" / "run").read_text())
    script.chmod(0o755)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    fakes = {"make": FAKE_MAKE, "chromium": "#!/bin/sh\n", "bwrap": "#!/bin/sh\n",
             "fc-list": "#!/bin/sh\necho Noto Color Emoji\n"}  # fmt: skip
    for name, text in fakes.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    calls = tmp_path / "calls"
    env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}", CALLS=str(calls), FAILING=failing)
    env.pop("COURSE_REQUIRE_OPTIONAL", None)  # .ci/run sets it
    out = subprocess.run([str(script)], capture_output=True, text=True, env=env, timeout=60)
    made = sorted(calls.read_text().split())
    # compat-env: the oldest PyTorch's install, started in the background after make setup
    first = ["compat-env", "setup", "test"]
    everything = sorted(
        [*first, "book", "test-browser", "test-compat", "test-limits", "test-nbval"]
    )
    if failing == "test":  # CI stops there (the background install may not have begun)
        assert [call for call in made if call != "compat-env"] == ["setup", "test"]
    else:
        assert made == everything
    in_turn = [call for call in calls.read_text().split() if call != "compat-env"]
    if failing != "test":  # the book from make test's runs, before the browser opens it
        assert in_turn[:4] == ["setup", "test", "book", "test-nbval"]
    assert (out.returncode == 0) == (failing == ""), (out.returncode, out.stdout, out.stderr)
    said = calls.with_name("calls.env").read_text().splitlines()
    assert said and all(line.endswith(" COURSE_REQUIRE_OPTIONAL=1") for line in said), said
    if failing != "test":
        assert "output of make test-browser" in out.stdout  # its log, printed after compat


def test_setup_names_the_missing_optional_packages_in_one_line_and_never_fails(tmp_path):
    """Without bwrap and chromium on PATH `make setup` says so in one line (what each is for,
    and the apt-get line), exits 0, and says nothing once both are there. `-o` keeps make from
    remaking the venv; `make lab` does not say it (a learner needs neither)."""
    make = shutil.which("make")
    assert make
    command = [make, "-s", "--no-print-directory", "-o", ".venv/.installed"]

    def said(goal: str, path: Path) -> str:
        run = subprocess.run(
            [*command, goal] + (["-n"] if goal == "lab" else []),
            cwd=ROOT, capture_output=True, text=True, env={"PATH": str(path)}, timeout=60,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        return run.stdout

    empty = tmp_path / "empty"
    empty.mkdir()
    lines = [line for line in said("setup", empty).splitlines() if "Optional" in line]
    assert len(lines) == 1, lines
    for words in ("bubblewrap (sandboxed grading", "chromium (the real-browser test", "make test"):
        assert words in lines[0], lines[0]
    assert lines[0].endswith("sudo apt-get install bubblewrap chromium")
    assert "Optional" not in said("lab", empty)
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("bwrap", "chromium"):
        (tools / name).write_text("#!/bin/sh\n")
        (tools / name).chmod(0o755)
    assert "Optional" not in said("setup", tools)


def test_every_course_utils_module_reads_in_one_sitting():
    """The style rule (picotron's): in course_utils a module is one idea, at most 600 lines."""
    long = {
        str(p.relative_to(ROOT)): n
        for p in sorted((ROOT / "course_utils").rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600
    }
    assert long == {}, f"split these at a natural seam: {long}"


def test_gitignore_covers_venv_and_caches():
    ignored = (ROOT / ".gitignore").read_text().split()
    for entry in (".venv/", "__pycache__/", ".pytest_cache/", "*.egg-info/"):
        assert entry in ignored


def test_requirements_pin_the_torch_the_course_is_recorded_with():
    """The reference runs the lessons draw beside a learner's were recorded with the torch
    release requirements.txt installs (a new pin means recording them again)."""
    import json

    pinned = _pins("requirements.txt")["torch"]
    recordings = sorted((ROOT / "course_utils" / "data" / "reference").glob("*.json"))
    assert recordings
    for path in recordings:
        recorded = json.loads(path.read_text())["machine"]["torch"]
        assert recorded.split("+")[0] == pinned, (path.name, recorded, pinned)


def test_binder_learners_are_told_their_work_is_lost_and_how_to_keep_it():
    welcome = nbformat.read(ROOT / "notebooks" / "00_welcome.ipynb", as_version=4)
    lesson = "\n".join(c.source for c in welcome.cells)
    quick = (ROOT / "README.md").read_text().split("### On Binder", 1)[1].split("\n### ", 1)[0]
    for text in (lesson, quick):
        flat = " ".join(text.split())
        assert re.search(r"lost when the session ends|Nothing is kept when the session ends", flat)
        assert "File > Download" in flat
        assert "`exercises/`" in flat and "instructor" in flat


def test_set_up_check_tells_a_binder_learner_to_download(monkeypatch, capsys):
    from course_utils.measure import setup_check

    monkeypatch.setattr(setup_check, "concurrency_speedup", lambda: 1.9)
    for name in setup_check.BINDER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    setup_check.check_setup(attempts=1)
    assert "Binder" not in capsys.readouterr().out
    monkeypatch.setenv("BINDER_REPO_URL", "https://github.com/parallel-training-course/course")
    setup_check.check_setup(attempts=1)
    out = capsys.readouterr().out
    assert "You are on Binder: nothing is kept" in out and "File > Download" in out


@pytest.mark.slow
def test_setup_remakes_a_half_built_venv(tmp_path):
    """An interrupted first `make` leaves .venv without pip: the next one starts it again."""
    lines = subprocess.run(
        ["make", "-n", "-B", "--no-print-directory", ".venv/.installed"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    first = lines[0]
    assert "-m pip --version" in first and "-m venv .venv" in first, first
    broken = tmp_path / ".venv" / "bin"
    broken.mkdir(parents=True)
    (broken / "python").symlink_to("/bin/false")  # a venv whose python cannot run pip
    (tmp_path / ".venv" / "left-over").write_text("from the interrupted run")
    subprocess.run(["bash", "-c", first], cwd=tmp_path, check=True, timeout=300)
    pip = subprocess.run([str(tmp_path / ".venv/bin/python"), "-m", "pip", "--version"])
    assert pip.returncode == 0
    assert not (tmp_path / ".venv" / "left-over").exists()
    (tmp_path / ".venv" / "installed-packages").write_text("a healthy venv is kept")
    subprocess.run(["bash", "-c", first], cwd=tmp_path, check=True, timeout=300)
    assert (tmp_path / ".venv" / "installed-packages").exists()


GROUPED = """
import pytest

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    pass

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    pass
"""


@pytest.mark.slow
def test_tests_in_one_xdist_group_run_on_one_worker(tmp_path):
    # make test relies on it: the tests reading the notebook runs wait for none of them on the
    # other worker, and two tests watching /tmp/cg-* never overlap (`--dist loadgroup`).
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / name).write_text(GROUPED)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:nbval"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    workers = set(re.findall(r"\[(gw\d)\] \[[ \d]+%\] PASSED \S+::test_grouped", out.stdout))
    grouped = re.findall(r"PASSED \S+::test_grouped\S*", out.stdout)
    assert len(grouped) == 12 and len(workers) == 1, out.stdout[-3000:]


class _Item:
    """What the ordering hook reads of a collected test: its markers."""

    def __init__(self, name: str, *marks: pytest.MarkDecorator) -> None:
        self.name, self.marks = name, {m.mark.name: m.mark for m in marks}

    def get_closest_marker(self, name: str):
        return self.marks.get(name)


def test_the_longest_work_is_handed_out_first():
    # tests/conftest.py: the notebooks, then the slow tests, then the rest, each in the order
    # collected, so that a long test does not start last and leave one worker running alone.
    import conftest
    from notebook_runs import READS_THE_RUNS  # the real group: a rename must keep its rank

    runs, slow = READS_THE_RUNS, pytest.mark.slow
    items = [
        _Item("fast-1"),
        _Item("slow-1", slow),
        _Item("reads-the-runs", runs, slow),
        _Item("grouped-fast", pytest.mark.xdist_group("sockets-in-tmp")),
        _Item("fast-2"),
        _Item("slow-2", slow),
        _Item("lesson-cell", pytest.mark.xdist_group("notebook-08_sharded")),
    ]
    conftest.pytest_collection_modifyitems(items)
    assert [i.name for i in items] == [
        "reads-the-runs", "lesson-cell", "slow-1", "slow-2", "fast-1", "grouped-fast", "fast-2",
    ]  # fmt: skip
