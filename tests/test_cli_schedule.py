"""`python -m course_utils schedule`: JSON shape, the readable table, and one-line errors.

The command runs in this process (`run_cli`); one smoke test starts it for real."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import run_module


@pytest.fixture
def schedule(run_cli):
    """`python -m course_utils schedule ARGS...` in this process: (returncode, stdout, stderr)."""
    return lambda *args: run_cli("schedule", *args)


def test_json_output_has_the_agreed_shape(schedule):
    result = schedule("1f1b", "--devices", "4", "--microbatches", "8", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) == {
        "schedule",
        "devices",
        "events",
        "makespan",
        "bubble_fraction",
        "peak_activations",
    }
    assert doc["schedule"] == "1f1b"
    assert doc["devices"][0][:5] == ["0F0", "0F1", "0F2", "0F3", "0B0"]
    assert len(doc["devices"]) == 4 and sum(map(len, doc["devices"])) == 64
    assert len(doc["events"]) == 64
    assert set(doc["events"][0]) == {"device", "action", "start", "end"}
    assert doc["makespan"] == 33  # (m + p - 1)(F + B)
    assert doc["bubble_fraction"] == pytest.approx(9 / 33)
    assert doc["peak_activations"] == [4, 3, 2, 1]
    ends = {e["action"]: e["end"] for e in doc["events"]}
    assert ends["3F0"] == 4 and ends["3B0"] == 6


def test_costs_change_the_timeline(schedule):
    args = ("zb-h1", "--devices", "4", "--microbatches", "8", "--json")
    doc = json.loads(schedule(*args, "--forward-cost", "2", "--backward-cost", "4").stdout)
    assert doc["makespan"] == 8 * 6 + 3 * 2  # m(F+B) + (p-1)(F+I-W), I = W = 2
    doc = json.loads(schedule(*args, "--weight-cost", "0.5").stdout)
    assert doc["makespan"] == 8 * 3 + 3 * (1 + 1.5 - 0.5)
    doc = json.loads(schedule("gpipe", "--devices", "2", "--microbatches", "1", "--json",
                              "--p2p-cost", "0.5").stdout)  # fmt: skip
    assert doc["makespan"] == 3 * 2 + 2 * 0.5


def test_naive_runs_the_whole_batch(schedule):
    doc = json.loads(schedule("naive", "--devices", "3", "--microbatches", "4", "--json").stdout)
    assert doc["devices"] == [["0F0", "0B0"], ["1F0", "1B0"], ["2F0", "2B0"]]
    assert doc["makespan"] == 3 * 4 * 3
    assert doc["peak_activations"] == [4, 4, 4]


def test_readable_table(schedule):
    result = schedule("interleaved", "--devices", "2", "--microbatches", "4", "--chunks", "2")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "interleaved: 2 devices x 2 chunk(s) = 4 stages, 4 micro-batches" in out
    assert "device 0: 0F0 0F1 2F0 2F1" in out
    assert "device 1: 1F0 1F1 3F0" in out
    assert "makespan: 13.5 units" in out  # 4*3 + (2-1)*3/2
    assert "bubble:" in out and "%" in out
    assert "peak activations" in out


@pytest.mark.parametrize(
    "args, words",
    [
        (["pipedream", "--devices", "4", "--microbatches", "8"], "schedule must be one of"),
        (["gpipe", "--devices", "0", "--microbatches", "8"], "--devices must be an integer >= 1"),
        (["gpipe", "--devices", "2", "--microbatches", "-3"], "--microbatches must be"),
        (["gpipe", "--devices", "2", "--microbatches", "2", "--chunks", "0"], "--chunks"),
        (["interleaved", "--devices", "4", "--microbatches", "6"], "multiple of devices (4)"),
        (["1f1b", "--devices", "2", "--microbatches", "4", "--chunks", "2"], "chunks > 1 works"),
        (["gpipe", "--devices", "2", "--microbatches", "2", "--forward-cost", "-1"],
         "--forward-cost must be a finite number > 0"),
        (["gpipe", "--devices", "2", "--microbatches", "2", "--backward-cost", "nan"],
         "--backward-cost"),
        (["zb-h1", "--devices", "2", "--microbatches", "2", "--weight-cost", "3"],
         "--weight-cost must be between 0 and --backward-cost"),
        (["gpipe", "--devices", "2", "--microbatches", "2", "--p2p-cost", "-0.1"], "--p2p-cost"),
        (["gpipe", "--devices", "two", "--microbatches", "2"], "invalid int value"),
        (["gpipe", "--microbatches", "2"], "--devices"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_on_stderr_and_exit_2(schedule, args, words):
    result = schedule(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert words in lines[0]
    assert result.stdout == ""


def test_smoke_in_a_subprocess():
    ok = run_module("schedule", "1f1b", "--devices", "4", "--microbatches", "8", timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "1f1b: 4 devices x 1 chunk(s) = 4 stages, 8 micro-batches" in ok.stdout
    assert "makespan: 33 units" in ok.stdout  # (m + p - 1)(F + B)
    bad = run_module("schedule", "gpipe", "--devices", "0", "--microbatches", "8", timeout=60)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "--devices must be an integer >= 1" in bad.stderr


def test_the_schedule_command_never_imports_torch():
    code = (
        "import sys, io, contextlib\n"
        "from course_utils.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['schedule', 'zb-h1', '--devices', '3', '--microbatches', '4', '--json'])\n"
        "import course_utils.pipeline.schedules, course_utils.pipeline.simulate\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("command", ["schedule", "gantt"])
def test_stages_still_works_and_errors_name_the_flag_as_typed(run_cli, tmp_path, command):
    # --devices was called --stages before V schedules put two stages on each device
    out = ["--output", tmp_path / "g.png"] if command == "gantt" else ["--json"]
    old = run_cli(command, "1f1b", "--stages", "2", "--microbatches", "4", *out)
    new = run_cli(command, "1f1b", "--devices", "2", "--microbatches", "4", *out)
    assert old.returncode == new.returncode == 0 and old.stdout == new.stdout
    bad = run_cli(command, "1f1b", "--stages", "0", "--microbatches", "4", *out)
    assert bad.returncode == 2 and "--stages must be an integer >= 1" in bad.stderr
    short = run_cli(command, "1f1b", "-p", "0", "-m", "4", *out)  # only gantt has short flags
    assert short.returncode == 2 and ("-p must be" in short.stderr) == (command == "gantt")
