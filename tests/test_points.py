"""Points per exercise and partial credit, the instructor's review and the gradebook an LMS
imports (issue 45), on results and checks alone (no kernel runs here; tests/test_lms_downloads.py
grades a class end to end).

A partly right Build earns the share of its cases it passes, in the notebook and in the
grader; the grader's share is recomputed there from the evidence the kernel sent back (each
case judged in the grader's process), never taken from anything the learner's code made.
"""

from __future__ import annotations

import csv
import importlib
import json
import re

import dpprograms as dp
import pipeprograms as pipes
import pytest
from gradingkit import ROOT

from course_utils import checks
from course_utils.checks import CheckFailed, Variant, l02, l04, l05, l06
from course_utils.checks.scoring import earned
from course_utils.checks.wire import call_outcome
from course_utils.grading.feedback import page
from course_utils.grading.gradebook import lesson_totals, write_gradebook
from course_utils.grading.grader import ExerciseResult, GradeResult, exercises_of, solution_for
from course_utils.grading.journal import Journal, reviews
from course_utils.grading.judge import cases_for, judge, worth
from course_utils.grading.roster import Student
from course_utils.grading.sandbox import Exercise
from course_utils.grading.stats import class_statistics

SOLUTIONS = ROOT / "solutions"


def forgets_that_m_can_be_small(p, m, d):
    """Exercise 4.2's 1F1B phases with the warm-up p - 1 - d whatever m: right unless m is
    smaller than the warm-up."""
    warm = p - 1 - d
    warmup = [f"{d}F{i}" for i in range(warm)]
    steady = [a for i in range(m - warm) for a in (f"{d}F{warm + i}", f"{d}B{i}")]
    return warmup, steady, [f"{d}B{i}" for i in range(max(m - warm, 0), m)]


def replayed(module, k: int, variant: Variant, **answers) -> tuple:
    """The grader's verdict on `answers` as the grader reaches it: each function called on
    the grader's cases as the learner's kernel calls it, its outcomes sent back as JSON, then
    judged here by the check itself (`judge.judge`)."""
    cases = cases_for(module, k, variant)
    found = {}
    for name, answer in answers.items():
        if name in cases:
            outcomes = [call_outcome(answer, case, 120) for case in cases[name]]
            found[name] = {"calls": json.loads(json.dumps(outcomes))}
        else:
            found[name] = {"value": answer}
    return judge(module, Exercise(k, list(answers)), found, variant, []), cases


def test_a_partly_right_build_earns_the_share_of_its_cases_in_the_notebook_and_the_grader():
    assert worth(l04, 2) == (2.0, True)
    mine = Variant("ann")  # in the notebook: the cases of ann's name, the same on every run
    cases = l04.cases_2(mine)["one_f_one_b"]
    right = [forgets_that_m_can_be_small(*c) == l04.phases(*c) for c in cases]
    assert 0 < sum(right) < len(right)
    with pytest.raises(CheckFailed) as caught:
        l04.exercise_2(forgets_that_m_can_be_small, variant=mine)
    assert caught.value.parts == (sum(right), len(right))
    assert caught.value.share == pytest.approx(sum(right) / len(right))
    share = earned(2, sum(right) / len(right))
    assert caught.value.message.splitlines()[-1] == (
        f"Partly right: {sum(right)} of {len(right)} cases ({share:g} of 2 points)."
    )
    assert caught.value.message.startswith("one_f_one_b(6, 3, 1) returned 7 actions")
    assert l04.cases_2(mine) == l04.cases_2(Variant("ann"))  # the same cases every run
    # Graded: the grader's secret cases, each judged here from the outcome the kernel sent.
    secret = Variant("ann", cases_seed="a secret of this run")
    verdict, drawn = replayed(l04, 2, secret, one_f_one_b=forgets_that_m_can_be_small)
    right = [forgets_that_m_can_be_small(*c) == l04.phases(*c) for c in drawn["one_f_one_b"]]
    assert drawn != {"one_f_one_b": cases} and 0 < sum(right) < len(right)
    assert not verdict.passed and verdict.share == pytest.approx(sum(right) / len(right))
    assert replayed(l04, 2, secret, one_f_one_b=l04.phases)[0].share == 1.0

    def stub(p, m, d):
        raise NotImplementedError

    blank = replayed(l04, 2, secret, one_f_one_b=stub)[0]
    assert blank.share == 0 and blank.message.startswith("Exercise 4.2 is not answered yet")


def test_a_rank_program_right_on_some_pipelines_earns_their_share_judged_on_its_evidence():
    """Exercise 2.8's GPipe program that breaks on more than three ranks: each case is run by
    the (here: this) kernel, and only its evidence comes back to be judged."""
    breaks = '    kept = {}\n    if ctx.world > 3:\n        raise ValueError("no")\n'
    three_at_most = pipes.edit("gpipe_program", ("    kept = {}\n", breaks), text=pipes.GPIPE)
    for seed in range(50):  # a secret draw with pipelines of both kinds (fixed: seeds 0..)
        secret = Variant("default", cases_seed=seed)
        sizes = [case.devices for (case,) in l02.cases_8(secret)["gpipe_program"]]
        if 0 < sum(n <= 3 for n in sizes) < len(sizes):
            break
    verdict, _ = replayed(l02, 8, secret, gpipe_program=three_at_most)
    small = sum(n <= 3 for n in sizes)
    assert not verdict.passed and verdict.share == pytest.approx(small / len(sizes))
    assert f"Partly right: {small} of {len(sizes)} cases" in verdict.message
    assert worth(l02, 8) == (3.0, True)
    assert replayed(l02, 8, secret, gpipe_program=pipes.gpipe)[0].share == 1.0


def test_a_ring_all_reduce_right_on_small_rings_earns_their_share():
    """Exercise 6.4 (a Build of lesson 06's, declared beside the pipelines'): a ring that
    stops on more than four ranks, judged case by case on the evidence of its runs."""
    small_only = dp.edit(
        dp.RING, "ring_all_reduce", ("    n, rank = ctx.world, ctx.rank\n",
                                     "    n, rank = ctx.world, ctx.rank\n"
                                     "    if n > 4:\n        raise ValueError('no')\n"),
    )  # fmt: skip
    secret = Variant("default", cases_seed="ring")
    sizes = [case.devices for (case,) in l06.cases_4(secret)["ring_all_reduce"]]
    small = sum(n <= 4 for n in sizes)
    assert 0 < small < len(sizes)
    verdict, _ = replayed(l06, 4, secret, ring_all_reduce=small_only)
    assert not verdict.passed and verdict.share == pytest.approx(small / len(sizes))
    assert f"Partly right: {small} of {len(sizes)} cases" in verdict.message
    assert replayed(l06, 4, secret, ring_all_reduce=dp.ring)[0].share == 1.0


def _declared() -> dict[str, tuple[float, bool, bool]]:
    """{exercise: (points, partial, a Build)} of every check module's exercises."""
    found = {}
    for n in range(1, 15):
        if not (ROOT / "course_utils" / "checks" / f"l{n:02d}.py").exists():
            continue
        module = importlib.import_module(f"course_utils.checks.l{n:02d}")
        for k in range(1, 20):
            if hasattr(module, f"exercise_{k}"):
                found[f"{n}.{k}"] = (*worth(module, k), hasattr(module, f"cases_{k}"))
    return found


def test_every_build_earns_partial_credit_and_instructors_md_lists_what_each_is_worth():
    declared = _declared()
    builds = {e for e, (_, _, build) in declared.items() if build}
    assert {"6.4", "6.8", "7.8", "8.6", "9.2", "10.8", "3.2", "13.2"} <= builds
    # Every Build earns its cases' share (12.1 a part per answer: its function is judged with
    # its other answers) but 13.2, 13.3 (one run of two processes each: a single case).
    whole = {"13.2", "13.3"}
    assert {e for e in builds if not declared[e][1]} == whole
    said = (ROOT / "INSTRUCTORS.md").read_text(encoding="utf-8")
    paragraph = said[said.index("Declared today:") :].split("The share is")[0]
    listed = set(re.findall(r"\b\d+\.\d+\b", paragraph))
    assert listed == {e for e, (points, partial, _) in declared.items() if partial} | whole
    for e, (points, _, _) in declared.items():
        if points != 1:
            assert e in listed, e


def test_a_diagnose_earns_each_part_it_gets_right():
    with pytest.raises(CheckFailed) as caught:
        l04.exercise_5("b", "a")  # the right cause, a wrong fix
    assert (caught.value.parts, caught.value.share) == ((1, 2), 0.5)
    assert caught.value.message.endswith("Partly right: 1 of 2 parts (1 of 2 points).")
    with pytest.raises(CheckFailed) as caught:
        l04.exercise_5("a", "a")
    assert caught.value.share == 0 and "Partly right" not in caught.value.message


def test_an_exercise_with_several_answers_earns_a_part_per_right_answer_in_the_grader_too():
    """Exercise 6.6 (issue 50): efficiency, cause and fix, each judged on its own; a wrong
    cause leaves 2 of 3 parts, in the notebook and in the grader, and names only the cause."""
    assert worth(l06, 6) == (1.0, True)
    with pytest.raises(CheckFailed) as caught:
        l06.exercise_6(0.625, "b", "a")
    assert (caught.value.parts, caught.value.share) == ((2, 3), pytest.approx(2 / 3))
    said = caught.value.message
    assert said.startswith("`cause` = 'b' is not it.") and "`fix`" not in said
    assert said.endswith("Partly right: 2 of 3 parts (0.67 of 1 point).")
    with pytest.raises(CheckFailed) as caught:  # all three wrong: each named, no point
        l06.exercise_6(10.0, "b", "c")
    said = caught.value.message
    assert said.startswith("3 answers are not right yet:")
    assert all(f"`{name}`" in said for name in ("efficiency_16", "cause", "fix"))
    assert caught.value.share == 0 and "Partly right" not in said
    answers = {"efficiency_16": 0.625, "cause": "a", "fix": "d"}
    found = {name: {"value": value} for name, value in answers.items()}
    verdict = judge(l06, Exercise(6, list(answers)), found, Variant(), [])
    assert not verdict.passed and verdict.share == pytest.approx(2 / 3)
    assert "Partly right: 2 of 3 parts" in verdict.message
    found["fix"] = {"value": "a"}
    assert judge(l06, Exercise(6, list(answers)), found, Variant(), []).passed


def test_a_diagnose_judges_every_table_and_the_rest_at_once():
    """Exercise 5.5: two tables and a number; all wrong, each is named in one run."""
    with pytest.raises(CheckFailed) as caught:
        l05.exercise_5("a", "c", 8)
    said = caught.value.message
    assert said.startswith("3 answers are not right yet:")
    assert "`problem` = 'a' is not it." in said and "`fix` = 'c' is not it." in said
    assert "`best_chunks`: with v = 8 the step is not the fastest" in said
    with pytest.raises(CheckFailed) as caught:  # the choices right, the number wrong
        l05.exercise_5("b", "b", 8)
    assert caught.value.parts == (2, 3)


def _module(source: str) -> dict:
    namespace = {"__name__": "course_utils.checks.l03", "checks": checks}
    exec(source, namespace)
    return namespace


def test_a_failed_check_never_earns_every_point_and_a_plain_one_earns_nothing():
    # Each case alone is right; together they are not (the check compares them): the whole
    # fails, so it earns all but one part's share.
    namespace = _module(
        "@checks.exercise(f='function', points=4, partial=True)\n"
        "def exercise_2(f, variant):\n"
        "    got = [r for _, _, r in checks.each_call(f, [(1,), (2,), (3,), (4,)])]\n"
        "    if len(got) > 1 and len(set(got)) == 1:\n"
        "        checks.fail('every case gave the same')\n"
        "    return 'Right.'\n"
        "@checks.exercise(f='function')\n"
        "def exercise_3(f, variant):\n"
        "    for (x,), shown, r in checks.each_call(f, [(1,), (2,)]):\n"
        "        if r != x:\n"
        "            checks.fail(f'{shown} is off')\n"
        "    return 'Right.'\n"
    )
    calls = []

    def constant(x):
        calls.append(x)
        return 7

    with pytest.raises(CheckFailed) as caught:
        namespace["exercise_2"](constant)
    assert caught.value.parts == (3, 4) and calls == [1, 2, 3, 4]  # each case run once
    with pytest.raises(CheckFailed) as caught:  # declared without partial credit
        namespace["exercise_3"](lambda x: 1)
    assert caught.value.share == 0 and caught.value.parts is None
    assert namespace["exercise_3"].points == 1 and not namespace["exercise_3"].partial
    with pytest.raises(ValueError, match="points must be a number > 0"):
        checks.exercise(points=0)


def test_the_share_is_the_checks_alone(monkeypatch):
    """A share set on a failure by anything but a check with partial credit counts for
    nothing, and a learner's function that raises "partly right" words only fails its case."""
    forged = CheckFailed("Partly right: 6 of 6 cases")
    forged.share = 1.0

    def exercise_1(*answers, variant):
        raise forged

    monkeypatch.setattr(l04, "exercise_1", exercise_1)  # a plain check (no `partial`)
    found = {"peak_gpipe": {"value": 1}, "peak_1f1b": {"value": 1}}
    verdict = judge(l04, Exercise(1, ["peak_gpipe", "peak_1f1b"]), found, Variant(), [])
    assert (verdict.passed, verdict.share) == (False, 0.0)

    def says_it_passed(p, m, d):
        raise CheckFailed("Partly right: 12 of 12 cases (2 of 2 points).")

    secret = Variant("ann", cases_seed=1)
    assert replayed(l04, 2, secret, one_f_one_b=says_it_passed)[0].share == 0.0


def _row(student: str, earned_points: list[float], lesson: int = 4, **kwargs) -> GradeResult:
    module = __import__(f"course_utils.checks.l{lesson:02d}", fromlist=["x"])
    solution = exercises_of(
        __import__("nbformat").read(solution_for(lesson, SOLUTIONS), as_version=4)
    )
    exercises = []
    for ex, got in zip(solution, earned_points, strict=True):
        points = worth(module, ex.k)[0]
        exercises.append(
            ExerciseResult(
                f"{lesson}.{ex.k}",
                got == points,
                "Right." if got == points else "Not yet.",
                points=points,
                earned=got,
            )  # fmt: skip
        )
    return GradeResult(
        notebook=f"sub/{student}/04_1f1b_zero_bubble.ipynb",
        student=student,
        lesson=lesson,
        variant=student,
        exercises=exercises,
        sha256=student,
        **kwargs,
    )


def test_rows_carry_points_earned_and_an_older_journal_row_still_reads():
    old = ExerciseResult(**{"id": "3.1", "passed": True, "message": "Right."})
    assert (old.points, old.earned) == (1, 1)
    forged = ExerciseResult("4.7", False, "x", points=3, earned=9)  # a journal edited by hand
    assert forged.earned == 3 and ExerciseResult("4.7", True, "x", points=3, earned=0).earned == 3
    row = _row("ann", [1, 1.33, 1, 1, 1, 0, 2.25])
    assert (row.score, row.total) == (7.58, lesson_totals([4], SOLUTIONS)[4])
    again = GradeResult.from_dict(json.loads(json.dumps(row.to_dict())))
    assert again.to_dict() == row.to_dict() and again.exercises[6].partly
    stats = {s.id: s for s in class_statistics([row])}
    assert (stats["4.7"].partly, stats["4.2"].partly, stats["4.1"].partly) == (1, 1, 0)


def test_the_gradebook_for_canvas_and_for_moodle_gives_the_points_possible(tmp_path):
    total = lesson_totals([4], SOLUTIONS)[4]
    nb = __import__("nbformat").read(solution_for(4, SOLUTIONS), as_version=4)
    assert total == sum(worth(l04, ex.k)[0] for ex in exercises_of(nb)) > len(exercises_of(nb))
    roster = [Student("ann", "Ann Lee", "1001", "ann.lee@uni.example"),
              Student("王小明", "Wang Xiaoming", "1002", "wang@uni.example"),
              Student("dave", "Dave Roe", "", "dave@uni.example")]  # fmt: skip
    rows = [_row("ann", [1, 2, 1, 3, 2, 2, 3]), _row("王小明", [1, 1.5, 0, 1, 1, 0, 2])]
    canvas, moodle = tmp_path / "canvas.csv", tmp_path / "moodle.csv"
    assert write_gradebook(rows, canvas, roster, SOLUTIONS, "canvas") == 3
    book = list(csv.reader(canvas.open(encoding="utf-8")))
    assert book[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
                       "Lesson 04 score", "Lesson 04 percent"]  # fmt: skip
    assert book[1] == ["Points Possible", "", "", "", "", str(total), "100"]
    percent = round(100 * 6.5 / total, 1)
    assert book[2:] == [
        ["Ann Lee", "1001", "ann", "ann.lee@uni.example", "", str(total), "100.0"],
        ["Wang Xiaoming", "1002", "王小明", "wang@uni.example", "", "6.5", str(percent)],
        ["Dave Roe", "", "dave", "dave@uni.example", "", "", ""],  # no notebook: left as it is
    ]
    assert write_gradebook(rows, moodle, roster, SOLUTIONS, "moodle") == 3
    book = list(csv.reader(moodle.open(encoding="utf-8")))
    assert book == [
        ["Full name", "ID number", "Email address", f"Lesson 04 score (out of {total})",
         "Lesson 04 percent"],
        ["Ann Lee", "ann", "ann.lee@uni.example", str(total), "100.0"],
        ["Wang Xiaoming", "王小明", "wang@uni.example", "6.5", str(percent)],
        ["Dave Roe", "dave", "dave@uni.example", "-", "-"],  # Moodle's "no grade"
    ]  # fmt: skip
    usernames = [Student("ann", "Ann Lee", login="alee7"), Student("bo", "Bo Li")]
    write_gradebook(rows, moodle, usernames, SOLUTIONS, "moodle")
    assert next(csv.reader(moodle.open(encoding="utf-8")))[:3] == [
        "Full name", "ID number", "Username"
    ]  # fmt: skip


def test_a_review_written_into_the_csv_comes_back_on_every_rerun(tmp_path):
    path = tmp_path / "grades.csv"
    ann, bob = _row("ann", [1, 1.33, 1, 1, 1, 0, 2.25]), _row("bob", [1, 2, 1, 3, 2, 2, 3])
    missing = GradeResult(notebook="", student="carol", lesson=4, flags=["missing"])
    journal = Journal(path)
    journal.previous()
    ids = [e.id for e in ann.exercises]
    journal.open(ids, [])
    for r in (ann, bob):
        journal.add(r)
    journal.close([ann, bob, missing])
    rows = list(csv.DictReader(path.open(encoding="utf-8")))
    assert [r["4.7"] for r in rows[:2]] == ["2.25", "3"] and rows[0]["score"] == "7.58"
    assert [(r["review"], r["review note"], r["final"]) for r in rows] == [
        ("", "", "7.58"), ("", "", str(bob.total)), ("", "", "")
    ]  # fmt: skip
    # The instructor opens it in a spreadsheet that saves with ; and decimal commas.
    header, *lines = list(csv.reader(path.open(encoding="utf-8")))
    at = {name: i for i, name in enumerate(header)}
    lines[0][at["review"]], lines[0][at["review note"]] = "1,5", "=a clear explanation of 4.6"
    lines[1][at["review"]], lines[1][at["review note"]] = "5", "extra credit"
    lines[2][at["review"]] = "2"  # a missing row: nothing to add points to
    with path.open("w", newline="", encoding="utf-8-sig") as f:
        csv.writer(f, delimiter=";").writerows([header, *lines])
    found = reviews(path)
    assert found.found == {ann.notebook: (1.5, "=a clear explanation of 4.6"),
                           bob.notebook: (5.0, "extra credit")}  # fmt: skip
    assert len(found.problems) == 1 and "carol's row with no notebook" in found.problems[0]
    # The rerun: every row kept (same keys), each written again with its review.
    for _ in range(2):
        again = Journal(path)
        kept = list(again.previous().values())
        again.open(ids, kept)
        again.close(kept + [missing])
    rows = {r["student"]: r for r in csv.DictReader(path.open(encoding="utf-8"))}
    assert (rows["ann"]["review"], rows["ann"]["final"]) == ("1.5", "9.08")
    assert rows["ann"]["review note"] == "'=a clear explanation of 4.6"  # a formula stays text
    assert rows["bob"]["final"] == str(bob.total)  # never above the lesson's points
    kept = {r.student: r for r in Journal(path).previous().values()}
    assert kept["ann"].review == 1.5 and kept["ann"].final() == 9.08
    book = tmp_path / "gradebook.csv"
    write_gradebook(list(kept.values()), book, None, SOLUTIONS)
    assert list(csv.reader(book.open(encoding="utf-8")))[2][5] == "9.08"
    text = page(kept["ann"], {})
    assert "Your instructor's review" in text and "+1.5 points: =a clear explanation" in text
    assert "Final score: 9.08 of" in text and "Score: 7.58 of" in text
    # Cleared in the CSV: gone on the next run; a value that is no number is said, not taken.
    header, *lines = list(csv.reader(path.open(encoding="utf-8")))
    lines[0][at["review"]], lines[0][at["review note"]] = "", ""
    lines[1][at["review"]] = "lots"
    with path.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([header, *lines])
    assert "review 'lots' is not a number of points" in reviews(path).problems[0]
    again = Journal(path)
    kept = list(again.previous().values())
    again.open(ids, kept)
    again.close(kept)
    assert all(r.review is None for r in kept)
