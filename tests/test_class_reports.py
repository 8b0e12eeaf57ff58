"""What an instructor gets from a graded class: gradebook, feedback pages, class statistics,
similar answers and the resumable per-notebook CSV, made from results (no kernel runs here;
tests/test_instructor_loop.py grades a real class end to end)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import nbformat
import pytest
from gradingkit import ROOT, SOLVED, blank, cell, personal, solved

from course_utils.grading.feedback import page, write_feedback
from course_utils.grading.gradebook import write_gradebook
from course_utils.grading.grader import ExerciseResult, GradeResult
from course_utils.grading.journal import Journal
from course_utils.grading.roster import Student
from course_utils.grading.similarity import canonical, similar_pairs
from course_utils.grading.stats import class_statistics, stats_table, write_stats

SOLUTIONS = ROOT / "solutions"
HINT = "gpipe_bubble({p}, {m}) gives (p-1)/m: that is relative to the busy time, not the step."


def result(student, marks, lesson=3, **kwargs) -> GradeResult:
    exercises = [
        ExerciseResult(f"{lesson}.{k}", ok, "Right." if ok else HINT.format(p=k + 2, m=3 * k))
        for k, ok in enumerate(marks, start=1)
    ]
    return GradeResult(
        notebook=f"sub/{student}/03_bubble_tradeoff.ipynb",
        student=student,
        lesson=lesson,
        variant=student,
        exercises=exercises,
        **kwargs,
    )


def test_the_gradebook_has_a_row_per_roster_student_and_lms_columns(tmp_path):
    roster = [Student("alice", "Alice Smith", "1001"), Student("bob", "Bob Jones", "1002"),
              Student("carol", "Carol Núñez", "")]  # fmt: skip
    results = [
        result("alice", [1, 1, 1, 1, 1, 1]),
        result("bob", [1, 0, 0, 0, 0, 0]),
        result("bob", [1, 1, 1, 0, 0, 0]),  # handed in twice: the best counts
        result("eve", [1, 1, 1, 1, 1, 1], flags=["not on the roster"]),
        GradeResult(notebook="", student="carol", lesson=3, flags=["missing"], problem="missing"),
    ]
    path = tmp_path / "gradebook.csv"
    assert write_gradebook(results, path, roster, SOLUTIONS) == 3
    rows = list(csv.reader(path.open(encoding="utf-8")))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
                       "Lesson 03 score", "Lesson 03 percent"]  # fmt: skip
    assert rows[1:] == [
        ["Alice Smith", "1001", "alice", "", "", "6", "100.0"],
        ["Bob Jones", "1002", "bob", "", "", "3", "50.0"],
        ["Carol Núñez", "", "carol", "", "", "", ""],  # missing: left for the LMS to keep
    ]


def test_a_feedback_page_gives_each_exercise_and_its_hint_escaped_never_the_answer(tmp_path):
    r = result("alice", [1, 0, 1, 1, 1, 1], name="Alice <Smith>")
    r.exercises[1].message = "`x` = <script>alert(1)</script> is not right: count the idle slots."
    r.notes.append("its name cell was edited: it says 'bob', not 'alice'")
    r.tampering.append({"cell": "check-03-2", "status": "changed"})
    text = page(r, {"3.1": "(Predict): the bubble of a pipeline"})
    assert "<script>" not in text and "&lt;script&gt;" in text and "Alice &lt;Smith&gt;" in text
    assert "3.1 (Predict): the bubble of a pipeline" in text and "✅ passed" in text
    assert "count the idle slots" in text and "locked cell check-03-2: changed" in text
    assert "Score: 5 of 6 exercises (83%)" in text
    written = write_feedback([r], tmp_path / "fb", [Path("sub")], SOLUTIONS)
    assert written == [tmp_path / "fb" / "alice" / "03_bubble_tradeoff.html"]


def test_feedback_pages_hold_the_checks_messages_only():
    # The page shows the checks' own messages, and a failed check's message never holds the
    # expected value: lesson 03's checks on a wrong answer, with the solution's numbers.
    from course_utils.checks import CheckFailed, l03

    with pytest.raises(CheckFailed) as caught:
        l03.exercise_1(0.5)
    r = result("alice", [0])
    r.exercises[0].message = caught.value.message
    expected = 3 / 15  # p = 4, m = 12: the bubble fraction
    assert f"{expected:.3g}" not in page(r, {}) and "0.2" not in page(r, {})


def test_class_statistics_share_passed_and_the_commonest_hint_whatever_the_numbers(tmp_path):
    results = [result(f"s{i}", [1, i % 2, 0]) for i in range(6)]
    results.append(GradeResult(notebook="x", student="broken", problem="not a notebook"))
    stats = class_statistics(results)
    assert [(s.id, s.passed, s.graded) for s in stats] == [("3.1", 6, 6), ("3.2", 3, 6),
                                                           ("3.3", 0, 6)]  # fmt: skip
    assert stats[2].hint_count == 6  # six students, six sets of numbers, one mistake
    assert "relative to the busy time" in stats[2].hint
    assert "3.3" in stats_table(stats) and "0/6" in stats_table(stats)
    chart, table = write_stats(stats, tmp_path / "stats.png")
    assert chart.read_bytes()[:4] == b"\x89PNG"
    rows = list(csv.DictReader(table.open(encoding="utf-8")))
    assert rows[1]["percent passed"] == "50.0" and rows[2]["students given it"] == "6"


def test_answers_identical_after_renaming_are_the_same_program():
    a = canonical(["def gpipe_bubble(p, m):\n    return (p - 1) / (m + p - 1)"])
    b = canonical(['def bubble(stages, mb):\n    """Mine."""\n    # formula\n'
                   "    return (stages - 1) / (mb + stages - 1)"])  # fmt: skip
    c = canonical(["def gpipe_bubble(p, m):\n    return (p - 1) / (m + p)"])
    assert a == b and a != c


def test_similar_answers_are_reported_as_pairs_and_the_common_answer_is_not(tmp_path):
    def save(student: str, nb) -> tuple[str, str, int]:
        path = tmp_path / f"{student}.ipynb"
        nbformat.write(nb, path)
        return (student, str(path), 3)

    own = solved()  # a method of one's own for 3.2, the solution's elsewhere
    cell(
        own, "answer-03-2"
    ).source = (
        "def gpipe_bubble(p, m):\n    busy = m\n    idle = p - 1\n    return idle / (busy + idle)"
    )
    copied = personal(own, "bob")  # the same cells on bob's numbers, names changed
    cell(copied, "answer-03-2").source = (
        "def gpipe_bubble(stages, mbs):\n    work = mbs\n    wait = stages - 1\n"
        "    return wait / (work + wait)"
    )
    twin = personal(own, "carol")  # carol's is alice's, character for character
    others = [personal(SOLVED, f"s{i}") for i in range(6)]  # six write the solution's
    notebooks = [save("alice", personal(own, "alice")), save("bob", copied),
                 save("carol", twin), save("dan", blank())]  # fmt: skip
    notebooks += [save(f"s{i}", nb) for i, nb in enumerate(others)]
    pairs, common = similar_pairs(notebooks, SOLUTIONS)
    on_32 = {(p.first, p.second, p.how) for p in pairs if p.exercise == "3.2"}
    assert on_32 == {
        ("alice", "bob", "identical after renaming"),
        ("alice", "carol", "identical"),
        ("bob", "carol", "identical after renaming"),
    }
    assert all("dan" not in (p.first, p.second) for p in pairs)  # unanswered: never a pair
    # Nine of ten wrote the solution's 3.1: the common answer, not 36 pairs.
    assert not [p for p in pairs if p.exercise == "3.1"]
    assert any(line.startswith("3.1: 9 of 9 answers") for line in common)


def test_the_journal_keeps_each_row_as_it_comes_and_gives_back_finished_ones(tmp_path):
    path = tmp_path / "grades.csv"
    journal = Journal(path)
    assert journal.previous() == {}
    done = result("alice", [1, 1], sha256="aa")
    journal.open(["3.1", "3.2"], [])
    journal.add(done)
    journal.add(GradeResult(notebook="x", student="bob", problem="the kernel did not start"))
    # Killed here: both files already hold both rows.
    assert len(list(csv.reader(path.open()))) == 3
    assert len(path.with_suffix(".jsonl").read_text().splitlines()) == 2
    with path.with_suffix(".jsonl").open("a") as f:
        f.write('{"notebook": "torn')  # the line being written when it was killed
    again = Journal(path).previous()
    assert list(again) == [done.notebook]  # bob's row had no score: graded again
    assert json.loads(json.dumps(again[done.notebook].to_dict())) == done.to_dict()


# --------------------------------------------------------------------------- hostile text
# What a student writes reaches the instructor only as text shown, cells that stay text and
# file names chosen here (issue 37); no answer text can stop a report.


def test_escape_sequences_are_shown_and_formulas_stay_text():
    from course_utils.grading.neutral import cell, file_name, visible

    hidden = "\x1b[2J\x1b[1A\r\u202e\u200b\ud800\x00\x9b"
    shown = visible(f"score: 0/6{hidden}\nscore: 6/6")
    assert shown == ("score: 0/6\\x1b[2J\\x1b[1A\\r\\u202e\\u200b\\ud800\\x00\\x9b\\nscore: 6/6")
    assert visible("a\nb", newlines=True) == "a\nb" and visible("José ✅") == "José ✅"
    for dangerous in ("=HYPERLINK(1)", "+1+cmd", "-1+cmd", "@SUM(A1)", "\tx", "\rx"):
        assert cell(dangerous) == "'" + dangerous
    for harmless in (-3, 2.5, "-3", "+4.5e-3", "-.5", "alice", "", None):
        assert cell(harmless) == harmless
    assert file_name("/abs/dir") == "_abs_dir" and file_name("..") == "unnamed"
    assert file_name("a\x1b[2Jb/../c") == "a_x1b[2Jb_.._c"


def test_reports_hold_no_formula_and_feedback_stays_in_its_folder(tmp_path):
    hostile = [
        result('=HYPERLINK("x")', [1, 0], name="@SUM(1)"),
        result("/abs/dir", [1, 1]),
        result("..", [0, 0]),
    ]
    hostile[1].notebook = "/elsewhere/=bad\x1b[2J.ipynb"
    grades = tmp_path / "grades.csv"
    Journal(grades).close(hostile)
    book = tmp_path / "gradebook.csv"
    write_gradebook(hostile, book, None, SOLUTIONS)
    for path in (grades, book):
        for row in csv.reader(path.open(encoding="utf-8")):
            assert not any(c.startswith(("=", "+", "@", "\t", "\r")) for c in row), row
            assert not any(c.startswith("-") and not c.lstrip("-")[:1].isdigit() for c in row)
    rows = list(csv.DictReader(grades.open(encoding="utf-8")))
    assert rows[0]["student"] == '\'=HYPERLINK("x")' and rows[0]["score"] == "1"
    pages = write_feedback(hostile, tmp_path / "fb", [], SOLUTIONS)
    assert len(set(pages)) == 3
    for page_path in pages:
        assert page_path.resolve().is_relative_to((tmp_path / "fb").resolve()), page_path
        assert "\x1b" not in page_path.read_text()
    assert not Path("/abs").exists() and not (tmp_path / "elsewhere").exists()


def test_an_answer_nested_too_deeply_and_a_tex_hint_stop_no_report(tmp_path):
    deep = solved()
    cell(deep, "answer-03-2").source = (
        "def gpipe_bubble(p, m):\n    return (p - 1) / (m + p - 1)" + " + 0" * 600
    )
    twin = personal(deep, "twin")
    paths = []
    for student, nb in {"deep": deep, "twin": twin}.items():
        path = tmp_path / f"{student}.ipynb"
        nbformat.write(nb, path)
        paths.append((student, str(path), 3))
    (tmp_path / "broken.ipynb").write_text("{not json")
    paths.append(("broken", str(tmp_path / "broken.ipynb"), 3))
    pairs, lines = similar_pairs(paths, SOLUTIONS)
    assert ("3.2", "deep", "twin", "identical") in {
        (p.exercise, p.first, p.second, p.how) for p in pairs
    }  # compared as written
    assert any("deep's answer nests too deeply" in line for line in lines)
    assert any(line.startswith("broken:") and "could not be read" in line for line in lines)
    tex = r"gpipe_bubble(1, 6) raised ValueError: $\undefinedmacro{x}$"
    results = [result(f"s{i}", [1, 0]) for i in range(3)]
    for r in results:
        r.exercises[1].message = tex
    skipped: list[str] = []
    chart, table = write_stats(class_statistics(results), tmp_path / "stats.png", skipped)
    assert chart.read_bytes()[:4] == b"\x89PNG" and skipped == []  # drawn as plain text
    assert "$\\undefinedmacro{x}$" in table.read_text()


def test_the_resume_key_names_every_reason_to_grade_again(tmp_path):
    from course_utils.grading.resume import ResumeKey, resume_key

    def key(**changed) -> ResumeKey:
        given = {"data": b"nb", "files": {"a.csv": b"1"}, "variant": "alice", "lesson": 3}
        given.update(changed)
        return resume_key("sub/alice/03.ipynb", solutions=SOLUTIONS, **given)

    first = key()
    assert first.changes(first) == [] and key() == first
    assert first.changes(None) == ["it was not graded before"]
    assert key(data=b"other").changes(first) == ["the notebook changed"]
    assert key(files={"a.csv": b"2"}).changes(first) == ["its other files changed"]
    assert key(files={"a.csv": b"1", "b.py": b""}).changes(first) == ["its other files changed"]
    assert key(variant="default").changes(first) == ["it is graded on other numbers"]
    assert key(lesson=4).changes(first) == [
        "the solutions or the checks changed",
        "it is graded as another lesson",
    ]
    assert ResumeKey.from_dict(first.to_dict()) == first
    assert ResumeKey.from_dict({"notebook": "x"}) is None  # a row of an older journal
    copy = tmp_path / "solutions"  # the same lesson judged by edited solutions
    copy.mkdir()
    solution = SOLUTIONS / "03_bubble_tradeoff.ipynb"
    (copy / solution.name).write_bytes(solution.read_bytes() + b"\n")
    edited = resume_key("sub/alice/03.ipynb", b"nb", {"a.csv": b"1"}, "alice", 3, copy)
    assert edited.changes(first) == ["the solutions or the checks changed"]
