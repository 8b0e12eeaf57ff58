"""The instructor's whole loop on real notebooks, through the command line: a Moodle download
graded with a roster into a gradebook, feedback pages, statistics and similar pairs; a batch
killed half way and resumed; one notebook regraded for a student; the name cell read and
checked; links refused; and the same verdicts as test items for pytest and JUnit."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from gradingkit import ALL, NAME, NO_SANDBOX, blank, cell, data, personal, solved

pytestmark = pytest.mark.slow


def moodle_class(folder: Path) -> Path:
    """A Moodle download (one folder per participant) and its roster: alice solved it on her
    numbers, bob copied her Build answer with names changed, carol answered half, dave sent
    nothing, eve is not on the roster."""
    roster = folder / "roster.csv"
    roster.write_text(
        "id,name,lms_id\nalice,Alice Smith,1001\nbob,Bob Jones,1002\n"
        "carol,Carol Núñez,1003\ndave,Dave Lee,1004\n",
        encoding="utf-8",
    )
    mine = solved()
    cell(
        mine, "answer-03-2"
    ).source = (
        "def gpipe_bubble(p, m):\n    busy = m\n    idle = p - 1\n    return idle / (busy + idle)"
    )
    copied = personal(mine, "bob")
    cell(
        copied, "answer-03-2"
    ).source = (
        "def gpipe_bubble(s, k):\n    work = k\n    wait = s - 1\n    return wait / (work + wait)"
    )
    half = personal(solved(), "carol")
    for k in (3, 4, 6):
        cell(half, f"answer-03-{k}").source = cell(blank(), f"answer-03-{k}").source
    for folder_name, nb in {
        "Alice Smith_1001_assignsubmission_file_": personal(mine, "alice"),
        "Bob Jones_1002_assignsubmission_file_": copied,
        "Carol Núñez_1003_assignsubmission_file_": half,
        "Eve Stranger_1099_assignsubmission_file_": personal(solved(), "eve"),
    }.items():
        (folder / "submissions" / folder_name).mkdir(parents=True)
        (folder / "submissions" / folder_name / NAME).write_bytes(data(nb))
    return roster


def test_a_moodle_download_with_a_roster_gives_every_report(tmp_path, run_cli):
    roster = moodle_class(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    result = run_cli(
        "grade", tmp_path / "submissions", "--roster", roster, "--variants", "-j", "2",
        "--csv", out / "grades.csv", "--gradebook", out / "gradebook.csv",
        "--feedback", out / "feedback", "--stats", out / "stats.png",
        "--similarity", out / "pairs.csv", *NO_SANDBOX,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = {r["student"]: r for r in csv.DictReader((out / "grades.csv").open(encoding="utf-8"))}
    assert {s: (r["score"], r["status"]) for s, r in rows.items()} == {
        "alice": ("6", "graded"),
        "bob": ("6", "graded"),
        "carol": ("3", "graded"),
        "Eve Stranger": ("6", "name cell edited; not on the roster"),
        "dave": ("", "missing"),  # no notebook: no score, no total
    }
    assert rows["carol"]["name"] == "Carol Núñez" and rows["alice"]["variant"] == "alice"
    book = list(csv.reader((out / "gradebook.csv").open(encoding="utf-8")))
    assert book[1:] == [
        ["Points Possible", "", "", "", "", "6", "100"],  # Canvas's, for new assignments
        ["Alice Smith", "1001", "alice", "", "", "6", "100.0"],
        ["Bob Jones", "1002", "bob", "", "", "6", "100.0"],
        ["Carol Núñez", "1003", "carol", "", "", "3", "50.0"],
        ["Dave Lee", "1004", "dave", "", "", "", ""],
    ]
    page = out / "feedback" / "Carol Núñez_1003_assignsubmission_file_" / "03_bubble_tradeoff.html"
    text = page.read_text(encoding="utf-8")
    assert "Carol Núñez" in text and "Score: 3 of 6 points (50%)" in text
    assert "<code>microbatches</code> is still None" in text and "`" not in text
    assert len(list((out / "feedback").rglob("*.html"))) == 4  # none for dave
    assert (out / "stats.png").read_bytes()[:4] == b"\x89PNG"
    stats = {r["exercise"]: r for r in csv.DictReader((out / "stats.csv").open(encoding="utf-8"))}
    assert stats["3.3"]["passed"] == "2" and stats["3.3"]["graded"] == "3"  # eve is no student
    assert stats["3.3"]["not answered"] == "1" and stats["3.3"]["commonest hint"] == ""
    pairs = list(csv.DictReader((out / "pairs.csv").open(encoding="utf-8")))
    assert {(p["exercise"], p["student"], p["other student"], p["how"]) for p in pairs} >= {
        ("3.2", "alice", "bob", "identical after renaming")
    }
    assert "Dave Lee (student dave): missing" in result.stdout
    assert "not on the roster" in result.stdout


def _descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def test_a_killed_batch_keeps_its_rows_and_a_rerun_grades_only_the_rest(tmp_path, run_cli):
    import psutil

    folder = tmp_path / "class"
    for i in range(4):
        (folder / f"s{i}").mkdir(parents=True)
        (folder / f"s{i}" / NAME).write_bytes(data(solved() if i % 2 else blank()))
    grades = tmp_path / "grades.csv"
    command = [sys.executable, "-m", "course_utils", "grade", str(folder), "--csv", str(grades)]
    command += NO_SANDBOX
    batch = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    jsonl = grades.with_suffix(".jsonl")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (
        not jsonl.exists() or len(jsonl.read_text().splitlines()) < 2
    ):
        time.sleep(0.2)
    children = _descendants(batch.pid)
    os.kill(batch.pid, signal.SIGKILL)  # no goodbye: the rows must already be on disk
    batch.wait()
    psutil.wait_procs([psutil.Process(p) for p in children if psutil.pid_exists(p)], timeout=300)
    kept = list(csv.DictReader(grades.open()))
    assert len(kept) >= 2 and all(r["status"] == "graded" for r in kept)
    first = {r["notebook"] for r in kept}

    again = run_cli("grade", folder, "--csv", grades, *NO_SANDBOX)
    assert again.returncode == 0, again.stderr
    regraded = {line.split(" (")[0] for line in again.stdout.splitlines() if "(student" in line}
    assert regraded and not regraded & first  # only what was missing was graded
    assert f"{len(first)} rows kept from the earlier run" in again.stdout
    rows = list(csv.DictReader(grades.open()))
    assert [r["score"] for r in rows] == ["0", "6", "0", "6"]  # all four, in order

    (folder / "s0" / NAME).write_bytes(data(solved()))  # s0 hands in again
    third = run_cli("grade", folder, "--csv", grades, *NO_SANDBOX)
    graded_now = [line for line in third.stdout.splitlines() if "(student" in line]
    assert len(graded_now) == 1 and "s0" in graded_now[0]
    assert [r["score"] for r in csv.DictReader(grades.open())] == ["6", "6", "0", "6"]


def test_regrading_one_notebook_and_reading_its_name_cell(tmp_path, run_cli):
    theirs = tmp_path / "s7.ipynb"
    theirs.write_bytes(data(personal(solved(), "s7")))
    regrade = run_cli("grade", theirs, "--student", "s7", "--json", *NO_SANDBOX)
    (row,) = json.loads(regrade.stdout)
    assert row["variant"] == "s7" and row["score"] == 6 and row["flags"] == []
    # Without a name: the one in its first cell, said to be unverified.
    unnamed = run_cli("grade", theirs, "--json", *NO_SANDBOX)
    (row,) = json.loads(unnamed.stdout)
    assert row["variant"] == "s7" and row["score"] == 6 and row["flags"] == ["name not verified"]
    assert any("not verified" in n for n in row["notes"])
    # The same file regraded as someone else's: their name cell is named as edited.
    other = run_cli("grade", theirs, "--student", "s8", "--json", *NO_SANDBOX)
    (row,) = json.loads(other.stdout)
    assert row["variant"] == "s8" and "name cell edited" in row["flags"]
    # A class graded on each student's numbers: s9 set their notebook back to the defaults.
    folder = tmp_path / "class"
    for student, nb in {"s7": personal(solved(), "s7"), "s9": solved()}.items():
        (folder / student).mkdir(parents=True)
        (folder / student / NAME).write_bytes(data(nb))
    batch = run_cli("grade", folder, "--variants", "--json", *NO_SANDBOX)
    rows = {r["student"]: r for r in json.loads(batch.stdout)}
    assert rows["s7"]["flags"] == [] and rows["s7"]["score"] == 6
    assert rows["s9"]["flags"] == ["default numbers"]
    assert any('its name cell says "default"' in n for n in rows["s9"]["notes"])
    assert run_cli("grade", folder, "--student", "s7", *NO_SANDBOX).returncode == 2  # one file only


def test_links_and_fifos_are_rows_saying_so_and_never_read(tmp_path, run_cli):
    folder = tmp_path / "class"
    folder.mkdir()
    (folder / "mallory.ipynb").symlink_to("/etc/passwd")
    os.mkfifo(folder / "fifo.ipynb")
    (folder / "honest").mkdir()
    (folder / "honest" / NAME).write_bytes(data(solved()))
    (folder / "honest" / "data.txt").symlink_to("/etc/passwd")  # beside a notebook: not copied
    grades = tmp_path / "grades.csv"
    result = run_cli("grade", folder, "--csv", grades, *NO_SANDBOX)
    assert result.returncode == 0, result.stderr
    text = grades.read_text()
    assert "root:" not in text and "root:" not in result.stdout
    rows = {r["student"]: r for r in csv.DictReader(grades.open())}
    assert "a symbolic link" in rows["mallory"]["problem"] and rows["mallory"]["score"] == "0"
    assert "a FIFO" in rows["fifo"]["problem"]
    assert rows["honest"]["score"] == "6"


def test_pytest_course_grade_makes_a_test_per_exercise_for_junit(tmp_path):
    folder = tmp_path / "submissions"
    for student, nb in {"alice": solved(), "bob": blank()}.items():
        (folder / student).mkdir(parents=True)
        (folder / student / NAME).write_bytes(data(nb))
    report = tmp_path / "report.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "course_utils.grading.pytest_plugin",
         "--course-grade", str(folder), "--course-jobs", "2", f"--junitxml={report}",
         "-p", "no:cacheprovider", "-q", *(["--course-no-sandbox"] if NO_SANDBOX else [])],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr  # bob's six fail
    assert "6 failed, 6 passed" in run.stdout
    cases = ET.parse(report).getroot().iter("testcase")
    verdicts = {(c.get("classname", "").split(".")[-3], c.get("name")): c for c in cases}
    assert {name for _, name in verdicts} == set(ALL)
    failed = {key for key, c in verdicts.items() if c.find("failure") is not None}
    assert failed == {("bob", k) for k in ALL}
    message = verdicts[("bob", "3.1")].find("failure").get("message")
    assert "not answered yet" in message and "Traceback" not in message
