"""Students: their names, the class roster, and whose notebook a downloaded file is.

A student's *id* is the seed of their numbers (`lNN.for_student(id)`) and the name of their
handout folder, so it must be a good folder name everywhere; it may be written in any script:

    check_name("José Núñez")   # -> "José Núñez" (NFC-normalised, outer spaces dropped)
    check_name("a/b")          # CourseInputError naming what is not allowed

A roster is a CSV file with a header: `id`, `name` and, optionally, `lms_id` (Canvas's user
id, as in its download's file names) and `login` (the student's LMS login or email; the
header may say `email` or `username`). The id seeds the student's numbers and names their
handout folder; the login is what an LMS's grade import finds a student by (the gradebook
writes it), so the two stay apart: an id in any script, a login as the LMS has it. `match`
finds whose a submitted file is, from the layouts instructors get:

- Moodle, "Download all submissions" (in folders, or flat), named by Moodle's
  `mod/assign/classes/downloader.php`: the participant's full name (its `_` made spaces),
  their participant number, the plugin:
  `Alice Smith_12345_assignsubmission_file/03_bubble_tradeoff.ipynb` (Moodle 4.1 and later;
  earlier ones end the folder with `_`), or flat,
  `Alice Smith_12345_assignsubmission_file_03_bubble_tradeoff.ipynb`. The number is the
  assignment's own participant id (`assign::get_uniqueid_for_user`: a row of the
  `assign_user_mapping` table for that assignment and user, handed out at random when the
  assignment first lists its participants, the "Participant 12345" of anonymous marking), not
  the user's id: it differs from one assignment to the next, so no roster column can hold it
  and a Moodle file is matched by its full name. Nothing in these names says a submission
  was late;
- Canvas, "Download Submissions", named by Canvas's `ContentZipper#get_filename`: the sortable
  name squeezed to word characters, `LATE` when late, the user id, the file's id, its name:
  `smithalice_12345_67890_03_bubble_tradeoff.ipynb`, `smithalice_LATE_12345_67891_...`;
- the course's own handouts (`make_exercises --roster`) and any plain layout:
  `<id>/03_bubble_tradeoff.ipynb` or `<id>.ipynb`, or a folder or file named by the
  student's login or email (`alice@uni.edu/03_bubble_tradeoff.ipynb`).

Canvas's user id is matched with the roster's `lms_id` where both have one (`by_number`),
else the login or email (`by_login`, any case), else the name (any case, any spacing) or the
id (`by_name`). A Canvas number of one student in a name of another is a disagreement `batch`
flags.
"""

from __future__ import annotations

import csv
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from course_utils import validation
from course_utils.errors import CourseInputError

MAX_NAME = 64
FORBIDDEN = set('/\\:*?"<>|')
RESERVED = "default"  # the course's own numbers
RULE = (
    'a name is any text, in any script, up to 64 characters, without / \\ : * ? " < > |, '
    "control characters or a leading '.', and not 'default'"
)


def check_name(name: str, where: str = "student name") -> str:
    """`name` NFC-normalised and stripped, or CourseInputError saying what is wrong."""
    if not isinstance(name, str):
        raise CourseInputError(f"{where} must be text, got {name!r}")
    clean = unicodedata.normalize("NFC", name).strip()
    if clean.isascii() and clean.isprintable():  # the common case, without a look per letter
        bad = sorted(FORBIDDEN.intersection(clean))
    else:
        bad = sorted({c for c in clean if c in FORBIDDEN or unicodedata.category(c)[0] == "C"})
    why = None
    if not clean:
        why = "it is empty"
    elif len(clean) > MAX_NAME:
        why = f"it has {len(clean)} characters"
    elif bad:
        why = "it contains " + ", ".join(repr(c) for c in bad)
    elif clean.startswith("."):
        why = "it starts with '.'"
    elif clean.casefold() == RESERVED:
        why = "'default' is the course's own numbers"
    if why:
        raise CourseInputError(f"{where} {name!r}: {why}; {RULE}")
    return clean


def check_names(names: list[str], where: str = "--students") -> list[str]:
    """Every name checked before anything is written; no two alike (ignoring case, since
    some file systems do)."""
    return _distinct([check_name(n, f"{where}: name") for n in names], where)


def _distinct(clean: list[str], where: str) -> list[str]:
    """Checked names, none two alike ignoring case (one pass: a roster may be long)."""
    seen: dict[str, str] = {}
    for name in clean:
        if name.casefold() in seen:
            raise CourseInputError(
                f"{where}: {seen[name.casefold()]!r} and {name!r} are the same folder name "
                "(names must differ in more than upper and lower case)"
            )
        seen[name.casefold()] = name
    return clean


def possessive(name: str) -> str:
    """`name`'s, as English writes it: "Eve Intruder's", "James'" (a name ending in s)."""
    return f"{name}'" if name.endswith(("s", "S")) else f"{name}'s"


@dataclass(frozen=True)
class Student:
    id: str  # the seed of their numbers and their handout folder's name
    name: str
    lms_id: str = ""  # Canvas's user id
    login: str = ""  # their LMS login or email, as the LMS's grade import finds them


LMS = ("canvas", "moodle")  # the LMSs whose downloads and grade imports the grader knows
LOGIN_HEADERS = ("login", "email", "username", "email_address", "sis_login_id")


def _key(text: str) -> str:
    return re.sub(r"[\s_.\-]+", " ", unicodedata.normalize("NFC", text)).strip().casefold()


def read_roster(path: Path) -> list[Student]:
    """The students of a roster CSV (header `id,name[,lms_id][,login]`; the login column may
    be headed `email` or `username`), or one line saying what is wrong with it."""
    path = validation.input_file(path, "--roster", validation.MAX_ROSTER_BYTES)
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:  # Excel writes a BOM
            rows = list(csv.reader(f))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise CourseInputError(f"--roster {str(path)!r} is not a UTF-8 CSV file ({exc})") from None
    if not rows:
        raise CourseInputError(
            f"--roster {str(path)!r} is empty: give a header id,name[,lms_id][,login]"
        )
    header = [_key(h).replace(" ", "_") for h in rows[0]]
    if "id" not in header or "name" not in header:
        raise CourseInputError(
            f"--roster {str(path)!r}: the header must name the columns id and name "
            f"(and optionally lms_id and login), found {rows[0]}"
        )
    column = {h: i for i, h in enumerate(header)}
    logins = [h for h in LOGIN_HEADERS if h in column]
    if len(logins) > 1:
        raise CourseInputError(
            f"--roster {str(path)!r}: give the students' LMS login in one column, not in "
            f"{' and '.join(logins)}"
        )
    place = (
        column["id"], column["name"], column.get("lms_id"), column[logins[0]] if logins else None
    )  # fmt: skip
    students: list[Student] = []
    for line, row in enumerate(rows[1:], start=2):  # one pass: a roster may have 100,000 rows
        if not "".join(row).strip():
            continue
        sid, name, lms, login = (
            row[i].strip() if i is not None and i < len(row) else "" for i in place
        )
        try:
            sid = check_name(sid)
        except CourseInputError:
            check_name(sid, f"--roster {path.name}, line {line}: id")  # the same, said where
        if not name:
            raise CourseInputError(f"--roster {path.name}, line {line}: the name is empty")
        students.append(Student(sid, name, lms, login))
    if not students:
        raise CourseInputError(f"--roster {str(path)!r} lists no students")
    _distinct([s.id for s in students], f"--roster {path.name}")
    for what, values in (
        ("lms_id", [s.lms_id for s in students]),
        (logins[0] if logins else "login", [s.login.casefold() for s in students]),
    ):
        seen: set[str] = set()
        for value in values:
            if value in seen:
                raise CourseInputError(f"--roster {path.name}: {what} {value!r} is given twice")
            if value:
                seen.add(value)
    return students


# The plugin part is `assignsubmission_file` (or `_onlinetext`, ...): lower-case letters.
MOODLE_FOLDER = re.compile(r"(?P<name>.+?)_(?P<number>\d+)_assignsubmission_[a-z]+_?")
MOODLE = re.compile(r"(?P<name>.+?)_(?P<number>\d+)_assignsubmission_[a-z]+_(?P<rest>.+)")
CANVAS = re.compile(r"(?P<login>[^_]+?)(?P<late>_LATE)?_(?P<number>\d+)_(?P<file>\d+)_(?P<rest>.+)")


@dataclass(frozen=True)
class Label:
    """What a file's place in a download says about whose it is."""

    text: str  # the name, login or folder, as written
    number: str = ""  # the LMS's number for the student, if the layout has one
    layout: str = "plain"
    rest: str = ""  # in a flat download: the file's own name, after the LMS's prefix
    late: bool = False  # the LMS marked it late (Canvas's `_LATE_`)
    file_id: int = -1  # Canvas's id of the uploaded file: a later upload has a larger one

    def owns(self, other: Label) -> bool:
        """Whether `other` (a file's label in a flat download) is this student's: the same
        LMS layout, name and number. A plain name (`alice.ipynb`) owns nothing else."""
        return self.layout != "plain" and (other.layout, other.text, other.number) == (
            self.layout,
            self.text,
            self.number,
        )


def label(relative: Path) -> Label:
    """Whose `relative` (a notebook's path inside the folder given to `grade`) seems to be."""
    relative = Path(unicodedata.normalize("NFC", str(relative)))  # macOS writes names as NFD
    if len(relative.parts) > 1:  # in a folder of its own: the folder says
        if found := MOODLE_FOLDER.fullmatch(relative.parts[0]):
            return Label(found["name"], found["number"], "moodle")
        return Label(relative.parts[0])
    if found := MOODLE.fullmatch(relative.name):
        return Label(found["name"], found["number"], "moodle", found["rest"])
    if found := CANVAS.fullmatch(relative.name):
        late = bool(found["late"])
        return Label(
            found["login"], found["number"], "canvas", found["rest"], late, int(found["file"])
        )
    return Label(relative.stem)


def _canvas_logins(name: str) -> set[str]:
    """How Canvas may have squeezed a name into a file name: "Alice Smith" -> smithalice."""
    words = [re.sub(r"\W", "", w).casefold() for w in name.replace(",", " ").split()]
    words = [w for w in words if w]
    if not words:
        return set()
    return {"".join(words[-1:] + words[:-1]), "".join(words), "".join(reversed(words))}


def match(found: Label, roster: list[Student]) -> Student | None:
    """The roster's student a file belongs to, or None (not on the roster)."""
    return by_number(found, roster) or by_login(found, roster) or by_name(found, roster)


def by_number(found: Label, roster: list[Student]) -> Student | None:
    """The student whose `lms_id` is the file's number, if any: Canvas's user id (a Moodle
    download's number is the assignment's participant id, the same for no two assignments:
    never matched)."""
    if found.number and found.layout != "moodle":
        for s in roster:
            if s.lms_id and s.lms_id == found.number:
                return s
    return None


def by_login(found: Label, roster: list[Student]) -> Student | None:
    """The student whose login or email the file's folder or name is (any case), if any."""
    key = unicodedata.normalize("NFC", found.text).strip().casefold()
    for s in roster:
        if s.login and s.login.casefold() == key:
            return s
    return None


def by_name(found: Label, roster: list[Student]) -> Student | None:
    """The student the file's name, login or folder names (name or id, any case and
    spacing; Canvas's squeezed names), if any."""
    key = _key(found.text)
    for s in roster:
        if _key(s.name) == key or _key(s.id) == key:
            return s
    if found.layout == "canvas":
        for s in roster:
            if found.text.casefold() in _canvas_logins(s.name):
                return s
    return None
