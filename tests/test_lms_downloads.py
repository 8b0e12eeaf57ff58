"""One class, downloaded from Moodle and from Canvas as each names its files, graded with a
roster: duplicates, late work, a folder whose number and name disagree, a stranger and a
missing student, each flagged and counted as `--keep` says (issue 39); each LMS's gradebook
with its points possible, and a review the instructor writes into the CSV, folded in on the
rerun (issue 45). Then the grading run that cannot grade (a wrong solutions folder) and the
one that must grade again (a changed solution), and the same class through `pytest
--course-grade`.

Whose a file is, and which one counts, is what these test, not the sandbox: they grade with
`--no-sandbox` (tests/test_sandbox.py and test_grading.py grade in it).

The names are the LMSs' own (see `roster.py`): Moodle's `mod/assign/classes/downloader.php`
writes a folder per participant, `<full name>_<number>_assignsubmission_file` (4.1 and later),
with no mark for late work, the number the assignment's own participant id (not the user's:
matched by the name); Canvas's `ContentZipper#get_filename` writes flat files,
`<sortable name squeezed>[_LATE]_<user id>_<file id>_<file name>`.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest
from gradingkit import NAME, ROOT, blank, cell, data, personal, solved

from course_utils.grading.feedback import inline_markdown

pytestmark = pytest.mark.slow

ROSTER = (
    "id,name,lms_id,email\nalice,Alice Smith,1001,alice@uni.example\n"
    "bob,Bob Jones,1002,bob@uni.example\ncarol,Carol Núñez,1003,carol@uni.example\n"
    "dave,Dave Lee,1004,dave@uni.example\njames,James Ross,1005,james@uni.example\n"
)


def half(student: str) -> nbformat.NotebookNode:
    """Exercises 3.1, 3.2 and 3.5 answered on `student`'s numbers, the rest left blank."""
    nb = personal(solved(), student)
    for k in (3, 4, 6):
        cell(nb, f"answer-03-{k}").source = cell(blank(), f"answer-03-{k}").source
    return nb


def write(path: Path, nb: nbformat.NotebookNode, mtime: float | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data(nb))
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def moodle_download(folder: Path) -> Path:
    """Alice solved it; Bob handed in twice (the later one half done); Carol solved it, in a
    folder whose number is James's `lms_id` (a Moodle number is the assignment's participant
    id: anyone's `lms_id` may come up, and it says nothing); Eve is not on the roster; Dave and
    James sent nothing."""

    def place(who: str) -> Path:
        return folder / f"{who}_assignsubmission_file"

    write(place("Alice Smith_1001") / NAME, personal(solved(), "alice"))
    write(place("Bob Jones_1002") / NAME, personal(solved(), "bob"), mtime=1_700_000_000)
    write(place("Bob Jones_1002") / "03_bubble_tradeoff_v2.ipynb", half("bob"), 1_700_086_400)
    write(place("Carol Núñez_1005") / NAME, personal(solved(), "carol"))
    write(place("Eve Stranger_1099") / NAME, blank())
    return folder


def canvas_download(folder: Path) -> Path:
    """The same class flat, as Canvas names it: Alice's file is late; Bob's second upload
    (a larger file id) is late and half done."""
    for name, nb in {
        "smithalice_LATE_1001_70001_03_bubble_tradeoff.ipynb": personal(solved(), "alice"),
        "jonesbob_1002_70002_03_bubble_tradeoff.ipynb": personal(solved(), "bob"),
        "jonesbob_LATE_1002_70010_03_bubble_tradeoff-1.ipynb": half("bob"),
        "núñezcarol_1005_70003_03_bubble_tradeoff.ipynb": personal(solved(), "james"),
        "strangereve_1099_70004_03_bubble_tradeoff.ipynb": blank(),
    }.items():
        write(folder / name, nb)
    return folder


def rows_of(path: Path, parts: int = 2) -> dict[str, tuple[str, str, str, str]]:
    """{the notebook's last `parts` path parts, or the student of a missing row:
    (student, status, score, total)}."""
    found = {}
    for r in csv.DictReader(path.open(encoding="utf-8")):
        key = "/".join(Path(r["notebook"]).parts[-parts:]) if r["notebook"] else r["student"]
        found[key] = (r["student"], r["status"], r["score"], r["total"])
    return found


def gradebook(path: Path) -> dict[str, tuple[str, str]]:
    """{student: (score, percent)} of a gradebook for Canvas or Moodle (no Points Possible)."""
    rows = list(csv.reader(path.open(encoding="utf-8")))
    head = rows[0]
    score = next(i for i, h in enumerate(head) if h.startswith("Lesson 03 score"))
    return {r[0]: (r[score], r[score + 1]) for r in rows[1:] if r[0] != "Points Possible"}


def test_a_moodle_download_flags_every_row_and_the_gradebook_takes_the_latest(tmp_path, run_cli):
    download = moodle_download(tmp_path / "moodle")
    roster = tmp_path / "roster.csv"
    roster.write_text(ROSTER, encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    command = [
        "grade", download, "--roster", roster, "-j", "2", "--no-sandbox",  # no --variants
        "--csv", out / "grades.csv", "--gradebook", out / "gradebook.csv", "--lms", "moodle",
        "--feedback", out / "feedback", "--stats", out / "stats.png",
    ]  # fmt: skip
    result = run_cli(*command)
    assert result.returncode == 0, result.stderr
    bob = "Bob Jones_1002_assignsubmission_file"
    assert rows_of(out / "grades.csv") == {
        f"Alice Smith_1001_assignsubmission_file/{NAME}": ("alice", "graded", "6", "6"),
        f"{bob}/{NAME}": ("bob", "duplicate; not kept", "6", "6"),
        f"{bob}/03_bubble_tradeoff_v2.ipynb": ("bob", "duplicate", "3", "6"),
        f"Carol Núñez_1005_assignsubmission_file/{NAME}": ("carol", "graded", "6", "6"),
        f"Eve Stranger_1099_assignsubmission_file/{NAME}": (
            "Eve Stranger", "default numbers; not on the roster", "0", "6"
        ),
        "dave": ("dave", "missing", "", ""),
        "james": ("james", "missing", "", ""),
    }  # fmt: skip
    # Moodle's grade import: an identifier column to map (email here), "-" for no grade.
    rows = list(csv.reader((out / "gradebook.csv").open(encoding="utf-8")))
    assert rows[0] == ["Full name", "ID number", "Email address", "Lesson 03 score (out of 6)",
                       "Lesson 03 percent"]  # fmt: skip
    assert rows[1:] == [
        ["Alice Smith", "alice", "alice@uni.example", "6", "100.0"],
        ["Bob Jones", "bob", "bob@uni.example", "3", "50.0"],
        ["Carol Núñez", "carol", "carol@uni.example", "6", "100.0"],
        ["Dave Lee", "dave", "dave@uni.example", "-", "-"],
        ["James Ross", "james", "james@uni.example", "-", "-"],
    ]
    said = result.stdout
    assert "2 notebooks are more than one of a student's for a lesson (1 student): the " \
        "gradebook takes the latest one (--keep latest)" in said  # fmt: skip
    assert f"counts: {download / bob / '03_bubble_tradeoff_v2.ipynb'}" in said
    assert "number and name disagree" not in said  # a Moodle number is no one's lms_id
    assert "Dave Lee (student dave): missing" in said and "course's default numbers (" not in said
    assert "for Moodle's grade import" in said
    # the feedback pages say which of Bob's counts, in plain words
    v2 = (out / "feedback" / bob / "03_bubble_tradeoff_v2.html").read_text(encoding="utf-8")
    first = (out / "feedback" / bob / "03_bubble_tradeoff.html").read_text(encoding="utf-8")
    assert "more than one notebook for this lesson: this is the one that counts" in v2
    assert "more than one notebook for this lesson: another one counts" in first
    assert "<code>microbatches</code>" in v2 and "`" not in v2  # markdown rendered
    # the statistics count students (Alice, Bob's latest, Carol), not files
    stats = {r["exercise"]: r for r in csv.DictReader((out / "stats.csv").open(encoding="utf-8"))}
    assert (stats["3.3"]["graded"], stats["3.3"]["passed"], stats["3.3"]["not answered"]) == (
        "3", "2", "1"
    )  # fmt: skip
    # The instructor reviews Bob's notebook in the CSV the grader wrote: 1 point for his
    # written reasoning; the same command again folds it in, grading nothing again.
    table = list(csv.reader((out / "grades.csv").open(encoding="utf-8")))
    at = {name: i for i, name in enumerate(table[0])}
    (line,) = [r for r in table if r[at["notebook"]].endswith("_v2.ipynb")]
    line[at["review"]], line[at["review note"]] = "1", "Your reasoning for **3.4** is sound."
    with (out / "grades.csv").open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(table)
    again = run_cli(*command)
    assert again.returncode == 0, again.stderr
    assert "5 rows kept from the earlier run (their resume key is unchanged), 0 graded again" \
        in again.stdout and "1 rows carry a review from grades.csv" in again.stdout  # fmt: skip
    assert gradebook(out / "gradebook.csv")["Bob Jones"] == ("4", "66.7")
    rows = {r["notebook"]: r for r in csv.DictReader((out / "grades.csv").open(encoding="utf-8"))}
    (mine,) = [r for name, r in rows.items() if name.endswith("_v2.ipynb")]
    assert (mine["score"], mine["review"], mine["final"]) == ("3", "1", "4")
    v2 = (out / "feedback" / bob / "03_bubble_tradeoff_v2.html").read_text(encoding="utf-8")
    assert "+1 point: Your reasoning for <strong>3.4</strong> is sound." in v2
    assert "Final score: 4 of 6 points (67%)" in v2


def test_files_named_by_the_students_login_are_theirs(tmp_path, run_cli):
    """A class collected by login or email (a folder per student, as a script or a course
    platform names them): matched through the roster's login column, whatever the id."""
    folder = tmp_path / "class"
    write(folder / "alice@uni.example" / NAME, personal(solved(), "alice"))
    write(folder / "BOB@uni.example.ipynb", half("bob"))
    roster = tmp_path / "roster.csv"
    roster.write_text(ROSTER, encoding="utf-8")
    book = tmp_path / "gradebook.csv"
    result = run_cli("grade", folder, "--roster", roster, "--no-sandbox", "-j", "2",
                     "--gradebook", book)  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = list(csv.reader(book.open(encoding="utf-8")))
    assert rows[1] == ["Points Possible", "", "", "", "", "6", "100"]
    assert rows[2] == ["Alice Smith", "1001", "alice", "alice@uni.example", "", "6", "100.0"]
    assert rows[3] == ["Bob Jones", "1002", "bob", "bob@uni.example", "", "3", "50.0"]


def test_a_canvas_download_flags_late_work_and_keep_on_time_regrades_nothing(tmp_path, run_cli):
    download = canvas_download(tmp_path / "canvas")
    roster = tmp_path / "roster.csv"
    roster.write_text(ROSTER, encoding="utf-8")
    grades, book = tmp_path / "grades.csv", tmp_path / "gradebook.csv"
    result = run_cli("grade", download, "--roster", roster, "-j", "2", "--no-sandbox",
                     "--csv", grades, "--gradebook", book)  # fmt: skip
    assert result.returncode == 0, result.stderr
    expected = {
        "smithalice_LATE_1001_70001_03_bubble_tradeoff.ipynb": ("alice", "late", "6", "6"),
        "jonesbob_1002_70002_03_bubble_tradeoff.ipynb": ("bob", "duplicate; not kept", "6", "6"),
        "jonesbob_LATE_1002_70010_03_bubble_tradeoff-1.ipynb": (
            "bob", "late; duplicate", "3", "6"
        ),
        "núñezcarol_1005_70003_03_bubble_tradeoff.ipynb": (
            "james", "number and name disagree", "6", "6"
        ),
        "strangereve_1099_70004_03_bubble_tradeoff.ipynb": (
            "strangereve", "default numbers; not on the roster", "0", "6"
        ),
        "carol": ("carol", "missing", "", ""),
        "dave": ("dave", "missing", "", ""),
    }  # fmt: skip
    assert rows_of(grades, parts=1) == expected
    assert gradebook(book) == {
        "Alice Smith": ("6", "100.0"), "Bob Jones": ("3", "50.0"), "Carol Núñez": ("", ""),
        "Dave Lee": ("", ""), "James Ross": ("", ""),
    }  # fmt: skip
    assert "2 notebooks marked late by the LMS; 2 of them count (--keep latest)" in (result.stdout)
    # Late work does not count: the same class again, nothing graded again.
    again = run_cli("grade", download, "--roster", roster, "--keep", "on-time", "--no-sandbox",
                    "--csv", grades, "--gradebook", book)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "5 rows kept from the earlier run (their resume key is unchanged), 0 graded again" \
        in again.stdout and "lesson 03, variant" not in again.stdout  # fmt: skip
    expected["smithalice_LATE_1001_70001_03_bubble_tradeoff.ipynb"] = (
        "alice", "late; not kept", "6", "6"
    )  # fmt: skip
    expected["jonesbob_1002_70002_03_bubble_tradeoff.ipynb"] = ("bob", "duplicate", "6", "6")
    expected["jonesbob_LATE_1002_70010_03_bubble_tradeoff-1.ipynb"] = (
        "bob", "late; duplicate; not kept", "3", "6"
    )  # fmt: skip
    assert rows_of(grades, parts=1) == expected
    assert gradebook(book)["Alice Smith"] == ("", "") and gradebook(book)["Bob Jones"] == (
        "6", "100.0"
    )  # fmt: skip
    assert "2 notebooks marked late by the LMS; 0 of them count (--keep on-time: late " \
        "work does not count)" in again.stdout  # fmt: skip


def test_a_relative_solutions_folder_grades_a_wrong_one_stops_and_a_fixed_one_regrades(
    tmp_path, run_cli, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions_v2")
    (tmp_path / "empty").mkdir()
    # Ann typed 3.1's answer as a number worked out from the numbers her notebook printed.
    from course_utils.checks import l03

    g = l03.for_student("default").given(1)
    ann = solved()
    cell(ann, "answer-03-1").source = f"bubble_fraction = {(g.p - 1) / (g.m + g.p - 1)!r}"
    for student, nb in {"ann": ann, "ben": blank()}.items():
        write(tmp_path / "class" / student / NAME, nb)
    # The instructor's copy of the solutions has a slip in a check cell the students never saw.
    solution = tmp_path / "solutions_v2" / NAME
    original = solution.read_bytes()
    nb = nbformat.read(solution, as_version=4)
    cell(nb, "check-03-2").source += "  # a slip"
    nbformat.write(nb, solution)
    first = run_cli("grade", "class", "--solutions", "solutions_v2", "--csv", "grades.csv",
                    "--no-sandbox")  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    rows = rows_of(tmp_path / "grades.csv")
    assert rows[f"ann/{NAME}"][2:] == ("6", "6") and rows[f"ben/{NAME}"][2:] == ("0", "6")
    flagged = [json.loads(line)["tampering"] for line in Path("grades.jsonl").open()]
    assert flagged == [[{"cell": "check-03-2", "status": "changed"}]] * 2  # against the slip
    # a run that cannot grade stops before grading: one line, exit 2, the table untouched
    before = (tmp_path / "grades.csv").read_bytes()
    for args, words in [
        (["--solutions", "empty"], "has no notebook of lesson 03 (03_*.ipynb)"),
        (["--solutions", "nowhere"], "--solutions 'nowhere' is not a folder"),
        (["--lesson", "14"], "--lesson 14: lesson 14 has no exercises in this course"),
    ]:
        stopped = run_cli("grade", "class", "--csv", "grades.csv", "--no-sandbox", *args)
        assert stopped.returncode == 2 and words in stopped.stderr, (args, stopped)
        assert len(stopped.stderr.strip().splitlines()) == 1 and "variant" not in stopped.stdout
        assert (tmp_path / "grades.csv").read_bytes() == before
    # The slip fixed: the same command grades both again, and the false flags are gone.
    solution.write_bytes(original)
    again = run_cli("grade", "class", "--solutions", "solutions_v2", "--csv", "grades.csv",
                    "--no-sandbox")  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "0 rows kept from the earlier run (their resume key is unchanged), 2 graded again " \
        "(2 because the solutions or the checks changed), 0 graded for the first time" \
        in again.stdout  # fmt: skip
    lines = [json.loads(line) for line in Path("grades.jsonl").open()]
    assert [r["regraded"] for r in lines] == [["the solutions or the checks changed"]] * 2
    assert [r["tampering"] for r in lines] == [[], []] and [r["score"] for r in lines] == [6, 0]
    # One notebook regraded for a student joins the class's table; its gradebook is hers alone.
    alone = run_cli("grade", f"class/ann/{NAME}", "--student", "ann", "--solutions",
                    "solutions_v2", "--csv", "grades.csv", "--gradebook", "ann.csv",
                    "--feedback", "fb", "--no-sandbox")  # fmt: skip
    assert alone.returncode == 0, alone.stderr
    assert "1 graded again (1 because it is graded on other numbers)" in alone.stdout
    assert [r[:2] for r in rows_of(tmp_path / "grades.csv").values()] == [
        ("ben", "graded"), ("ann", "default numbers")  # her notebook is on the course's
    ]  # fmt: skip
    assert list(gradebook(tmp_path / "ann.csv")) == ["ann"]
    # Her notebook printed the course's numbers, not hers: 3.1 is wrong on hers, and her
    # page shows what her own check cell said on the numbers it printed (right).
    (row,) = [json.loads(r) for r in Path("grades.jsonl").open() if '"ann"' in r]
    first = row["exercises"][0]
    assert not first["passed"] and first["as_printed"]["passed"]
    assert row["exercises"][1]["as_printed"] is None  # a Build exercise: the grader's calls
    text = (tmp_path / "fb" / "ann" / NAME.replace(".ipynb", ".html")).read_text(encoding="utf-8")
    assert "Right for the numbers your notebook showed, but those are not your numbers" in text
    assert inline_markdown(first["message"]) not in text  # the verdict on numbers it never showed


def test_a_batch_where_nothing_could_be_graded_exits_1_and_writes_no_gradebook(tmp_path, run_cli):
    folder = tmp_path / "class"
    folder.mkdir()
    (folder / "a.ipynb").write_text("hello")
    (folder / "b.ipynb").write_bytes(data(solved())[:300])
    book = tmp_path / "gradebook.csv"
    result = run_cli("grade", folder, "--csv", tmp_path / "grades.csv", "--gradebook", book,
                     "--feedback", tmp_path / "fb", "--no-sandbox")  # fmt: skip
    assert result.returncode == 1
    assert "no notebook could be graded (2 tried" in result.stdout
    assert not book.exists() and not (tmp_path / "fb").exists()
    assert len(list(csv.DictReader((tmp_path / "grades.csv").open()))) == 2  # the reasons


def test_pytest_course_grade_fails_a_missing_student_a_stranger_and_duplicates(tmp_path):
    folder = tmp_path / "submissions"
    write(folder / f"Alice Smith_1001_assignsubmission_file/{NAME}", personal(solved(), "alice"))
    write(folder / f"Bob Jones_1002_assignsubmission_file/{NAME}", personal(solved(), "bob"), 1e9)
    write(folder / "Bob Jones_1002_assignsubmission_file/again.ipynb", half("bob"), 2e9)
    write(folder / f"Eve Stranger_1099_assignsubmission_file/{NAME}", blank())
    roster = tmp_path / "roster.csv"
    roster.write_text("id,name,lms_id\nalice,Alice Smith,1001\nbob,Bob Jones,1002\n"
                      "dave,Dave Lee,1004\n", encoding="utf-8")  # fmt: skip
    report = tmp_path / "report.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "course_utils.grading.pytest_plugin",
         "--course-grade", str(folder), "--course-roster", str(roster), "--course-jobs", "2",
         "--course-no-sandbox", f"--junitxml={report}", "-p", "no:cacheprovider", "-q"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    cases = list(ET.parse(report).getroot().iter("testcase"))
    failed = {c.get("name"): c.find("failure").get("message") for c in cases
              if c.find("failure") is not None}  # fmt: skip
    assert "missing dave lesson 03" in failed
    assert "missing: no notebook of lesson 03 was found" in failed["missing dave lesson 03"]
    assert "not on the roster" in failed["roster"]
    duplicates = [c for c in cases if c.get("name") == "duplicate"]
    assert len(duplicates) == 2 and {
        "this one counts" in c.find("failure").get("message") for c in duplicates
    } == {True, False}
    # real times: each notebook's grading time, shared among its items
    timed = [float(c.get("time")) for c in cases if c.get("name") == "3.1"]
    assert len(timed) == 4 and all(t > 0 for t in timed), timed
