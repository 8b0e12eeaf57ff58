"""Students' names, rosters and downloads: whose each file is, before anything is graded."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from course_utils.errors import CourseInputError
from course_utils.grading import make_exercises
from course_utils.grading.roster import (
    Label,
    Student,
    by_login,
    by_name,
    by_number,
    check_name,
    label,
    match,
    read_roster,
)

ROSTER = [
    Student("alice", "Alice Smith", "1001"),
    Student("bob", "Bob Jones", ""),
    Student("jose", "José Núñez", "1003"),
    Student("wang", "王小明", ""),
]


@pytest.mark.parametrize(
    "name", ["ana", "José Núñez", "王小明", "Ольга Петрова", "O'Brien", "Zoë-Ann d.", "أحمد"]
)
def test_any_unicode_name_is_accepted(name):
    assert check_name(f"  {name} ") == name


def test_names_are_compared_in_one_unicode_form():
    decomposed = "Jose\u0301"  # é as e + combining accent (how macOS writes file names)
    assert check_name(decomposed) == "José"


@pytest.mark.parametrize(
    "name, why",
    [
        ("", "empty"),
        ("a/b", "'/'"),
        ("..", "starts with '.'"),
        (".hidden", "starts with '.'"),
        ('say "hi"', "'\"'"),
        ("tab\there", "'\\t'"),
        ("default", "course's own numbers"),
        ("x" * 65, "65 characters"),
    ],
)
def test_a_bad_name_is_one_line_naming_what_is_wrong(name, why):
    with pytest.raises(CourseInputError, match="student name") as caught:
        check_name(name)
    assert why in str(caught.value) and "\n" not in str(caught.value)


def test_make_exercises_checks_every_name_before_writing_anything(tmp_path, capsys):
    code = make_exercises.main(["--students", "ana", "José", "bad/name", "--out", str(tmp_path)])
    assert code == 2 and list(tmp_path.iterdir()) == []
    assert "bad/name" in capsys.readouterr().err
    code = make_exercises.main(["--students", "Ana", "ana", "--out", str(tmp_path)])
    assert code == 2 and list(tmp_path.iterdir()) == []
    assert "same folder name" in capsys.readouterr().err


def test_make_exercises_writes_a_handout_per_roster_student_on_their_numbers(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text("id,name,lms_id\nalice,Alice Smith,1001\n王小明,Wang Xiaoming,1002\n")
    out = tmp_path / "handout"
    assert make_exercises.main(["--roster", str(roster), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["alice", "王小明"]
    nb = nbformat.read(out / "王小明" / "03_bubble_tradeoff.ipynb", as_version=4)
    assert any('for_student("王小明")' in c.source for c in nb.cells)


def test_a_roster_is_read_with_its_problems_named(tmp_path):
    path = tmp_path / "roster.csv"
    path.write_text("\ufeffID,Name,LMS ID\nalice,Alice Smith,1001\n\n王小明,王小明,\n")
    alice, wang = Student("alice", "Alice Smith", "1001"), Student("王小明", "王小明")
    assert read_roster(path) == [alice, wang]
    for text, problem in [
        ("name\nAlice\n", "must name the columns id and name"),
        ("id,name\nalice,\n", "line 2: the name is empty"),
        ("id,name\na/b,A\n", "line 2: id"),
        ("id,name,lms_id\na,A,1\nb,B,1\n", "lms_id '1' is given twice"),
        ("id,name\nann,A\nAnn,B\n", "same folder name"),
        ("id,name\n", "lists no students"),
    ]:
        path.write_text(text)
        with pytest.raises(CourseInputError, match=problem):
            read_roster(path)


@pytest.mark.parametrize(
    "relative, expected",
    [
        # Moodle, in folders (4.1 and later: no trailing _) and flat
        ("Alice Smith_1001_assignsubmission_file/03_bubble_tradeoff.ipynb", "alice"),
        ("Alice Smith_1001_assignsubmission_file_/03_bubble_tradeoff.ipynb", "alice"),
        ("Alice Smith_1001_assignsubmission_onlinetext/onlinetext.ipynb", "alice"),
        ("José Núñez_1003_assignsubmission_file_03_bubble_tradeoff.ipynb", "jose"),
        ("Jose\u0301 Nu\u0301n\u0303ez_9_assignsubmission_file_/x.ipynb", "jose"),  # NFD
        ("Bob Jones_2002_assignsubmission_file_/03_bubble_tradeoff.ipynb", "bob"),  # by name
        # Canvas: login-like name, Canvas id, submission id, the file's name (-1: resubmitted)
        ("smithalice_1001_55501_03_bubble_tradeoff.ipynb", "alice"),
        ("jonesbob_LATE_2002_55502_03_bubble_tradeoff-1.ipynb", "bob"),
        # the course's own handouts, and plain files
        ("wang/03_bubble_tradeoff.ipynb", "wang"),
        ("王小明/03_bubble_tradeoff.ipynb", "wang"),
        ("bob.ipynb", "bob"),
        # nobody on the roster
        ("Eve Stranger_1099_assignsubmission_file_/03_bubble_tradeoff.ipynb", None),
        ("strangereve_1099_55509_03_bubble_tradeoff.ipynb", None),
    ],
)
def test_downloads_are_matched_to_the_roster(relative, expected):
    found = match(label(Path(relative)), ROSTER)
    assert (found.id if found else None) == expected


def test_a_download_without_a_roster_is_named_by_its_student():
    assert label(Path("Alice Smith_1001_assignsubmission_file_/x.ipynb")) == Label(
        "Alice Smith", "1001", "moodle"
    )
    assert label(Path("Alice Smith_1001_assignsubmission_file/x.ipynb")) == Label(
        "Alice Smith", "1001", "moodle"
    )
    assert label(Path("smithalice_1001_5_x.ipynb")).text == "smithalice"
    assert label(Path("alice/03_bubble_tradeoff.ipynb")) == Label("alice")


def test_canvas_names_say_late_and_which_upload_came_later():
    # Canvas's ContentZipper: [sortable name squeezed, "LATE" if late, user id] joined by _,
    # then the uploaded file's id and its name.
    on_time = label(Path("núñezcarol_1003_70001_03_bubble_tradeoff.ipynb"))
    late = label(Path("núñezcarol_LATE_1003_70002_03_bubble_tradeoff-1.ipynb"))
    assert (on_time.late, late.late) == (False, True)
    assert (on_time.number, late.number, late.rest) == (
        "1003",
        "1003",
        "03_bubble_tradeoff-1.ipynb",
    )
    assert late.file_id > on_time.file_id and on_time.owns(late)
    carol = Student("carol", "Carol Núñez")
    assert match(late, [carol]) == carol  # by the squeezed sortable name


def test_a_canvas_number_of_one_student_in_the_name_of_another_is_seen():
    found = label(Path("núñezjosé_1001_70001_03_bubble_tradeoff.ipynb"))
    assert by_number(found, ROSTER).id == "alice" and by_name(found, ROSTER).id == "jose"
    assert match(found, ROSTER).id == "alice"  # Canvas's user id first; batch flags the rest


def test_a_moodle_number_is_the_assignments_participant_id_and_never_matched():
    # Moodle's download names a folder by the assignment's own participant id
    # (assign_user_mapping), which differs per assignment: 1001 here may be anyone's.
    found = label(Path("José Núñez_1001_assignsubmission_file/03_bubble_tradeoff.ipynb"))
    assert found.number == "1001" and by_number(found, ROSTER) is None
    assert match(found, ROSTER).id == "jose"  # by the full name Moodle wrote


def test_a_login_or_email_column_matches_files_named_by_it_and_stays_apart_from_the_id(tmp_path):
    path = tmp_path / "roster.csv"
    path.write_text(
        "id,name,email\n王小明,Wang Xiaoming,Xiaoming.Wang@uni.example\nann,Ann Lee,\n",
        encoding="utf-8",
    )
    wang, ann = read_roster(path)
    assert (wang.id, wang.login, ann.login) == ("王小明", "Xiaoming.Wang@uni.example", "")
    for relative in ("xiaoming.wang@uni.example/03_bubble_tradeoff.ipynb",
                     "Xiaoming.Wang@uni.example.ipynb"):  # fmt: skip
        assert match(label(Path(relative)), [wang, ann]) == wang, relative
    assert by_login(label(Path("ann/03.ipynb")), [wang, ann]) is None  # ann has no login
    for text, problem in [
        ("id,name,login\na,A,x@y\nb,B,X@Y\n", "login 'x@y' is given twice"),
        ("id,name,login,email\na,A,x,x@y\n", "in one column, not in login and email"),
    ]:
        path.write_text(text)
        with pytest.raises(CourseInputError, match=problem):
            read_roster(path)
