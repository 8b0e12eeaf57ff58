"""Shared test helpers: paths, the venv's Python, free ports, the command line, and the
optional system tools.

`run_cli` runs `python -m course_utils ...` in this process (fast: no interpreter or torch
start-up per call); `run_module` really starts it, for the one smoke test per command.

Two system packages are optional, and a fresh machine has neither (`.ci/run` installs both):
bubblewrap (`bwrap`) for the grading sandbox and Debian's chromium for the real browser. A
test marked `needs_bwrap` or `needs_chromium` is skipped without its tool, and the run ends
with one line saying how many were skipped and what to install. With
COURSE_REQUIRE_OPTIONAL=1 (`.ci/run` sets it) or CI=true such a test fails instead, naming
the tool, so that CI never loses one silently.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Tests that make or watch /tmp/cg-*, where a grader with a long TMPDIR keeps its kernels'
# sockets: `--dist loadgroup` runs them on one pytest worker, one after the other.
SOCKETS_IN_TMP = pytest.mark.xdist_group("sockets-in-tmp")


def pytest_configure(config: pytest.Config) -> None:
    """COURSE_TEST_TORCH_THREADS=1 (`make test`, `make test-compat`): one intra-op thread for
    torch in each pytest worker. There the workers share the two cores with the notebook runs
    and the processes the tests start; with torch's default of one thread per core, its
    threads wait for each other on a busy core. Lesson 10's balancing-loss test took 10 s
    instead of 0.6 s in `make test`; its unit run took 589 s with one thread, 696 s without.
    `make test-fast`, whose cores are often idle, keeps the default (2-3 s faster).

    Also registers the markers of the optional tools (`TOOLS`)."""
    for tool in TOOLS:
        config.addinivalue_line(
            "markers",
            f"{tool.marker}: {_skipped_for(tool)}: skipped without it, failed without it where "
            "COURSE_REQUIRE_OPTIONAL=1 or CI=true",
        )
    threads = os.environ.get("COURSE_TEST_TORCH_THREADS")
    if threads and os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(int(threads))


class Tool(NamedTuple):
    """An optional system package, the marker of the tests that need it, and why they do."""

    marker: str
    package: str  # Debian's name, for apt-get
    needed_for: str
    missing: Callable[[], str | None]  # why it cannot be used here; None when it can


def _no_sandbox() -> str | None:
    from course_utils.grading import isolation

    return isolation.problem()  # not installed, or user namespaces off: said in one line


def _no_chromium() -> str | None:
    if shutil.which("chromium") or os.access("/usr/bin/chromium", os.X_OK):
        return None
    return "Debian's chromium is not installed"


TOOLS = (
    Tool("needs_bwrap", "bubblewrap", "the grading sandbox", _no_sandbox),
    Tool("needs_chromium", "chromium", "the real browser", _no_chromium),
)
NEEDS_BWRAP = pytest.mark.needs_bwrap


def optional_tools_required() -> bool:
    """COURSE_REQUIRE_OPTIONAL=1 or CI=true: a test that needs a missing tool fails."""
    required = os.environ.get("COURSE_REQUIRE_OPTIONAL", "").strip().lower()
    ci = os.environ.get("CI", "").strip().lower()
    return required not in ("", "0", "false", "no") or ci in ("true", "1", "yes")


def _skipped_for(tool: Tool) -> str:
    return f"needs {tool.package} ({tool.needed_for})"


def skip_without(marker: str) -> None:
    """Skip the running test if the tool of `marker` is missing (fail where that is required):
    the marker's rule, for a test that needs the tool in only some of its cases."""
    tool = next(t for t in TOOLS if t.marker == marker)
    if (why := tool.missing()) is None:
        return
    if optional_tools_required():
        pytest.fail(
            f"{_skipped_for(tool)}: {why}. COURSE_REQUIRE_OPTIONAL or CI is set, so this "
            f"fails instead of being skipped: apt-get install {tool.package}",
            pytrace=False,
        )
    pytest.skip(f"{_skipped_for(tool)}: {why}")


@pytest.hookimpl(tryfirst=True)  # before any fixture of the test is set up
def pytest_runtest_setup(item: pytest.Item) -> None:
    for tool in TOOLS:
        if item.get_closest_marker(tool.marker) is not None:
            skip_without(tool.marker)


@pytest.hookimpl(wrapper=True, tryfirst=True)  # after the short summary that -ra prints
def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config):
    """One line at the end: how many tests were skipped for want of which package, and the
    command that installs them (or how many failed for it, where that was required)."""
    result = yield
    for outcomes, said in ((("skipped",), "skipped"), (("error", "failed"), "failed")):
        reports = [r for outcome in outcomes for r in terminalreporter.stats.get(outcome, [])]
        texts = [str(getattr(r, "longrepr", "")) for r in reports]
        counts = {t: sum(_skipped_for(t) in text for text in texts) for t in TOOLS}
        found = {t: n for t, n in counts.items() if n}
        if found:
            each = ", ".join(f"{n} need {t.package} ({t.needed_for})" for t, n in found.items())
            packages = " ".join(t.package for t in found)
            terminalreporter.write_line(
                f"{sum(found.values())} tests {said} for want of optional system packages: "
                f"{each}. To run them: sudo apt-get install {packages} (.ci/run does)",
                yellow=said == "skipped",
                red=said == "failed",
                bold=True,
            )
    return result


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A notebook collected by nbval (`make test-compat` runs three) is a list of cells that
    share one kernel, in order: `--dist loadgroup` keeps each notebook on one worker.

    Then the longest work goes first, so that the run does not end with one worker busy and
    the other idle (longest first is the classic rule for sharing jobs between machines):
    notebooks (the session's notebook runs, nbval's lessons), then the slow tests, then the
    rest, each in collection order. `make test` ended on a 57 s torchrun test alone."""
    for item in items:
        if type(item).__module__.startswith("nbval"):
            item.add_marker(pytest.mark.xdist_group(f"notebook-{item.path.stem}"))

    def rank(item: pytest.Item) -> int:
        group = item.get_closest_marker("xdist_group")
        if group is not None and str(group.args[0]).startswith("notebook"):
            return 0
        return 1 if item.get_closest_marker("slow") else 2

    items.sort(key=rank)  # stable: collection order within each rank


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def python() -> str:
    return sys.executable


class CliResult(NamedTuple):
    """(exit code, stdout, stderr), named like subprocess.CompletedProcess's fields."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run_cli(capsys):
    """`run_cli("schedule", "1f1b", ...)`: course_utils.cli.main in this process, its output
    captured: (exit code, stdout, stderr). Arguments may be paths or numbers.

    main() returns the exit code for everything, usage errors included, so a SystemExit
    escaping it is a bug and fails the test. A command may seed torch's global generator or
    change its thread count: when torch was loaded before the call, both are put back
    afterwards, so a command run here leaves the next test the torch state it found.
    """
    from course_utils.cli import main

    def run(*args: object) -> CliResult:
        capsys.readouterr()  # only this command's output
        torch = sys.modules.get("torch")
        saved = (torch.get_num_threads(), torch.get_rng_state()) if torch else None
        try:
            code = main([str(a) for a in args])
        finally:
            if torch is not None and saved is not None:
                torch.set_num_threads(saved[0])
                torch.set_rng_state(saved[1])
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return run


def run_module(*args: object, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """`python -m course_utils ARGS...` in a real child process, run from the repository's
    root (so it imports this checkout's course_utils): the smoke tests' way in."""
    return subprocess.run(
        [sys.executable, "-m", "course_utils", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        **kwargs,
    )


@pytest.fixture
def ctrl_c_delivered():
    """Python's own Ctrl-C handler while the test runs. A shell starts background jobs
    (`make test-fast &`, nohup) with SIGINT ignored, and then `_thread.interrupt_main` does
    nothing: the interrupt tests would wait and fail for a reason that is not ours."""
    import signal

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)
