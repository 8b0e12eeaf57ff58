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

from course_utils.grading.feedback import (
    inline_markdown,
    locked_cells,
    page,
    solution_of_lesson,
    titles,
    write_feedback,
)
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
    assert rows[1] == ["Points Possible", "", "", "", "", "6", "100"]  # Canvas's own row
    assert rows[2:] == [
        ["Alice Smith", "1001", "alice", "", "", "6", "100.0"],
        ["Bob Jones", "1002", "bob", "", "", "3", "50.0"],
        ["Carol Núñez", "", "carol", "", "", "", ""],  # missing: left for the LMS to keep
    ]


def test_a_feedback_page_gives_each_exercise_and_its_hint_escaped_never_the_answer(tmp_path):
    r = result("alice", [1, 0, 1, 1, 1, 1], name="Alice <Smith>")
    r.exercises[1].message = "`x` = <script>alert(1)</script> is not right: count the idle slots."
    r.notes.append("its name cell was edited: it says 'bob', not 'alice'")
    r.flags.append("name cell edited")
    r.tampering.append({"cell": "check-03-2", "status": "changed"})
    r.tampering.append({"cell": "given-03-4", "status": "removed"})
    solution = solution_of_lesson(SOLUTIONS, 3)
    text = page(r, titles(solution), locked_cells(solution, 3))
    assert "<script>" not in text and "&lt;script&gt;" in text and "Alice &lt;Smith&gt;" in text
    assert "3.1 (Predict): the bubble of a pipeline" in text and "✅ passed" in text
    # markdown rendered as the notebook renders it, after escaping
    assert "<code>x</code> = &lt;script&gt;" in text and "`" not in text
    # plain words: no cell ids, no grader's jargon, the instructor's notes left out
    assert "check-03-2" not in text and "given-03-4" not in text and "locked" not in text
    assert "The check cell of Exercise 3.2 was changed." in text
    assert "The cell that shows the numbers of Exercise 3.4 was deleted." in text
    assert "first cell names someone else" in text and "it says 'bob'" not in text
    assert "count the idle slots" in text and "Score: 5 of 6 points (83%)" in text
    written = write_feedback([r], tmp_path / "fb", [Path("sub")], SOLUTIONS)
    assert written == [tmp_path / "fb" / "alice" / "03_bubble_tradeoff.html"]
    assert written[0].read_text(encoding="utf-8") == text


def test_inline_markdown_is_rendered_safely_and_possessives_read_right():
    from course_utils.grading.roster import possessive

    assert inline_markdown("`a < b` is **not** *quite* 2 ** 3 ** 4 <i>") == (
        "<code>a &lt; b</code> is <strong>not</strong> <em>quite</em> 2 ** 3 ** 4 &lt;i&gt;"
    )
    assert inline_markdown("x * y * z, `\x1b[2J`") == "x * y * z, <code>\\x1b[2J</code>"
    assert [possessive(n) for n in ("Eve Intruder", "James", "王小明")] == [
        "Eve Intruder's", "James'", "王小明's"
    ]  # fmt: skip


def test_a_reseeded_notebook_is_shown_what_its_own_checks_said_on_the_numbers_it_printed():
    # Her name cell said "default": the grade is on her own numbers, but the page shows the
    # verdicts her notebook's own check cells gave on the numbers it printed, never hers.
    r = result("eve", [0, 1])
    r.flags.append("default numbers")
    r.exercises[0].message = "bubble_fraction = 0.2 is not right: with p = 5 and m = 17 ..."
    r.exercises[0].as_printed = {"passed": True, "message": "Right: 3/15 = 0.2."}
    text = page(r, {})
    assert "p = 5" not in text and "m = 17" not in text
    assert "Right for the numbers your notebook showed, but those are not your numbers" in text
    assert 'first cell was set to "default"' in text


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


# --------------------------------------------------------------------------- which file counts
# Duplicates, late files and folders whose number and name disagree (issue 39): flagged in the
# row, chosen by --keep, and counted once per student by the gradebook and the statistics.


def _class_with_duplicates():
    first = result("bob", [1, 1, 1, 0, 0, 0])  # bob's first try, on time
    first.notebook = "sub/bob/03_a.ipynb"
    late = result("bob", [1, 0, 0, 0, 0, 0], flags=["late"])  # his second, late, worse
    late.notebook = "sub/bob/03_b.ipynb"
    alice = result("alice", [1, 1, 1, 1, 1, 1], flags=["late"])  # late, and alone
    stranger = result("eve", [1, 1, 1, 1, 1, 1], flags=["not on the roster"])
    swapped = result("carol", [1, 1, 1, 1, 1, 1], flags=["number and name disagree"])
    order = {first.notebook: (1,), late.notebook: (2,)}
    return [first, late, alice, stranger, swapped], order


@pytest.mark.parametrize(
    "keep, bob, alice",
    [("latest", "03_b", "6"), ("best", "03_a", "6"), ("on-time", "03_a", "")],
)
def test_keep_chooses_the_file_each_student_is_graded_on(tmp_path, keep, bob, alice):
    from course_utils.grading.keep import counted, flag_choices, summary

    rows, order = _class_with_duplicates()
    flag_choices(rows, keep, order)
    bobs = {Path(r.notebook).stem: r for r in rows if r.student == "bob"}
    assert all("duplicate" in r.flags for r in bobs.values())
    assert [name for name, r in bobs.items() if counted(r)] == [bob]
    assert ("not kept" in rows[2].flags) == (keep == "on-time")  # late alice, on-time rule
    assert not counted(rows[3]) and not counted(rows[4])  # a stranger, a disagreeing folder
    lines = summary(rows, keep)
    assert lines[0].startswith("2 notebooks are more than one of a student's for a lesson")
    assert any(line.startswith("2 notebooks marked late by the LMS") for line in lines)
    assert any("one student's number and another's name" in line for line in lines)
    roster = [Student("alice", "Alice Smith"), Student("bob", "Bob Jones"),
              Student("carol", "Carol Núñez")]  # fmt: skip
    path = tmp_path / "gradebook.csv"
    write_gradebook(rows, path, roster, SOLUTIONS)
    book = {r[0]: r[5] for r in csv.reader(path.open(encoding="utf-8"))}
    expected = {"latest": "1", "best": "3", "on-time": "3"}[keep]
    assert book == {"Student": "Lesson 03 score", "Points Possible": "6", "Alice Smith": alice,
                    "Bob Jones": expected, "Carol Núñez": ""}  # fmt: skip
    # statistics: one row per student (bob once, no stranger, no disagreeing folder)
    (first,) = [s for s in class_statistics(rows) if s.id == "3.1"]
    assert first.graded == (1 if keep == "on-time" else 2)


def test_statistics_count_unanswered_apart_from_the_wrong_answers():
    rows = [result(f"s{i}", [1, 0, 0]) for i in range(4)]
    for r in rows[:3]:  # three left 3.3 blank; one answered it wrong
        r.exercises[2].message = "Exercise 3.3 is not answered yet: `microbatches` is still None."
    stats = {s.id: s for s in class_statistics(rows)}
    assert (stats["3.3"].unanswered, stats["3.3"].wrong, stats["3.3"].hint_count) == (3, 1, 1)
    assert "relative to the busy time" in stats["3.3"].hint  # the mistake, not "not answered"
    assert stats["3.2"].unanswered == 0 and stats["3.2"].hint_count == 4
    table = stats_table(list(stats.values()))
    assert "not answered" in table.splitlines()[0] and "not answered yet" not in table


def test_missing_rows_have_no_score_and_a_student_regrade_joins_the_class_journal(tmp_path):
    path = tmp_path / "grades.csv"
    missing = GradeResult(notebook="", student="carol", lesson=3, flags=["missing"],
                          problem="missing: no notebook of lesson 03 was found")  # fmt: skip
    alice, bob = result("alice", [1, 1], sha256="aa"), result("bob", [0, 0], sha256="bb")
    Journal(path).close([alice, bob, missing])
    rows = {r["student"]: r for r in csv.DictReader(path.open(encoding="utf-8"))}
    assert (rows["carol"]["score"], rows["carol"]["total"]) == ("", "")
    assert missing.to_dict()["score"] is None and missing.to_dict()["total"] is None
    # `grade late.ipynb --student carol --csv grades.csv`: the class keeps its rows
    journal = Journal(path, merge=True)
    assert set(journal.previous()) == {alice.notebook, bob.notebook}
    late = result("carol", [1, 0])
    late.notebook = "late/carol_03.ipynb"
    journal.open(["3.1", "3.2"], [])
    journal.add(late)
    journal.close([late])
    rows = list(csv.DictReader(path.open(encoding="utf-8")))
    assert [(r["student"], r["score"]) for r in rows] == [("alice", "2"), ("bob", "0"),
                                                          ("carol", "1")]  # fmt: skip
    assert len(path.with_suffix(".jsonl").read_text().splitlines()) == 3


def test_grading_as_root_says_in_one_line_that_the_process_limit_does_not_hold(monkeypatch):
    from course_utils.grading import resources

    monkeypatch.setattr(resources.os, "geteuid", lambda: 1000)
    assert resources.root_warning(None) is None
    monkeypatch.setattr(resources.os, "geteuid", lambda: 0)
    line = resources.root_warning(None)
    assert line is not None and "\n" not in line
    assert line.startswith("warning: grading as the root user") and "512 processes" in line
