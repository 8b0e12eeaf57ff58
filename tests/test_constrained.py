"""Every lesson and solution on a constrained machine: pinned to one core, then beside a CPU hog.

Binder gives a learner about one core and 2 GB; a laptop's other core is often busy. Each
notebook runs top to bottom in a fresh kernel (tests/nbrun.py) twice: pinned to core 0 with
`taskset`, and unpinned while another process spins on core 1. It must pass both times,
stay under 2 minutes on one core and under 1.5 GB of memory. That its printed conclusions
agree with its printed numbers is tested on the conclusion functions themselves
(tests/test_conclusions.py), for both regimes. `make test-constrained` runs this file; the
figures go to artifacts/constrained.json.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")) + sorted(
    (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")
)
ONE_CORE_BUDGET_S = 120
MEMORY_BUDGET_MB = 1536
REPORT = ROOT / "artifacts" / "constrained.json"

pytestmark = [
    pytest.mark.constrained,
    pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)"),
]


def run(notebook: Path, cores: str | None) -> dict:
    command = [sys.executable, str(ROOT / "tests" / "nbrun.py"), str(notebook)]
    if cores is not None:
        command = ["taskset", "-c", cores, *command]
    out = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def remember(notebook: Path, regime: str, result: dict) -> None:
    REPORT.parent.mkdir(exist_ok=True)
    report = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    key = f"{notebook.parent.name}/{notebook.name}"
    report.setdefault(key, {})[regime] = {
        "seconds": round(result["seconds"], 1),
        "peak_mb": round(result["peak_mb"]),
    }
    REPORT.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_on_one_core(notebook):
    result = run(notebook, "0")
    remember(notebook, "one core", result)
    assert result["error"] is None, result["error"]
    assert result["seconds"] < ONE_CORE_BUDGET_S, f"{result['seconds']:.0f} s on one core"
    assert result["peak_mb"] < MEMORY_BUDGET_MB, f"{result['peak_mb']:.0f} MB"


@pytest.fixture(scope="module")
def hog():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core only: no second core to load")
    spin = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", "while True: pass"])
    yield spin
    spin.kill()
    spin.wait(timeout=10)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_beside_a_cpu_hog(notebook, hog):
    assert hog.poll() is None, "the CPU hog died"
    result = run(notebook, None)
    remember(notebook, "beside a CPU hog", result)
    assert result["error"] is None, result["error"]
    assert result["peak_mb"] < MEMORY_BUDGET_MB, f"{result['peak_mb']:.0f} MB"
