"""`pytest --course-grade submissions/`: every exercise of every submitted notebook, as a test.

A pytest plugin, like nbval, for instructors (installed by `make setup` through
`instructor_tools/`, or loaded anywhere with `-p course_utils.grading.pytest_plugin`; the
learners' image does not have it). Each notebook under the paths given is graded exactly as
`python -m course_utils grade` does (each in its own sandbox, judged in the grader), and
each of its exercises becomes one test item:

    submissions/alice/03_bubble_tradeoff.ipynb::3.1 PASSED
    submissions/alice/03_bubble_tradeoff.ipynb::3.2 FAILED   (the hint is the failure)

(an exercise passes only when right; a partly right one fails with its hint, and the points
it earned are the item's `points` property in the JUnit report, "2.25/3")

so `--junitxml report.xml` hands GitHub Classroom, GitLab or any CI one test per exercise
per student. A notebook that could not be graded is one failed item, `::notebook`, saying
why. What a class needs a look at is a failed item too, with its reason: a notebook not on
the roster or whose folder's number and name disagree (`::roster`), one of a student's
duplicates (`::duplicate`, saying which one counts), and a roster student with no notebook
of a lesson (`ROSTER.csv::missing <id> lesson NN`). Each item records the time its
notebook's grading took, shared among the notebook's items (the items themselves only read
the verdicts). Options: `--course-variants` (each student's own numbers; implied by
`--course-roster CSV`), `--course-lesson N`, `--course-solutions DIR`, `--course-keep
latest|best|on-time`, `--course-jobs N` (notebooks at once), `--course-no-sandbox`.

With `--course-grade`, nothing from the submissions but their notebooks is imported or run,
and those only in their sandboxes, made exactly as `grade` makes them (`grade_all`; the
report's header says what bounds them): conftest files are not loaded at all (as with
`--noconftest`, forced before pytest looks for one), every other file under the paths given
is left out of collection (a `test_*.py` or `test*.txt` beside a notebook is not collected,
a folder's `__init__.py` is not imported), and a pytest ini file (`pytest.ini`,
`pyproject.toml`, `setup.cfg`, `tox.ini`) or `conftest.py` inside a folder given stops the run
in one line: its `addopts` or `pythonpath` could bring the folder's code in. (pytest reads an
ini file at or above the folder given before any plugin loads: grade the download's own
top folder, where an LMS puts no file of a student's.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

CONFIG_FILES = (
    "pytest.ini",
    ".pytest.ini",
    "pyproject.toml",
    "setup.cfg",
    "tox.ini",
    "conftest.py",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("course-grade", "grading the course's exercise notebooks")
    group.addoption(
        "--course-grade",
        action="store_true",
        help="collect .ipynb submissions: one test per exercise, the grader's verdict",
    )
    group.addoption("--course-variants", action="store_true", help="each student's own numbers")
    group.addoption(
        "--course-roster", type=Path, default=None, help="roster CSV: id,name[,lms_id][,login]"
    )
    group.addoption("--course-lesson", type=int, default=None, help="grade as this lesson")
    group.addoption("--course-solutions", type=Path, default=None, help="folder of solutions")
    group.addoption(
        "--course-keep",
        default="latest",
        help="which of a student's notebooks counts: latest (default), best or on-time",
    )
    group.addoption("--course-jobs", type=int, default=1, help="notebooks graded at once")
    group.addoption(
        "--course-no-sandbox",
        action="store_true",
        help="run learners' code without a sandbox (with your permissions)",
    )


def _config_files(config: pytest.Config) -> list[Path]:
    """The pytest configuration files in the folders given (at any depth) and beside the
    notebooks given."""
    args = config.known_args_namespace.file_or_dir or []
    found = []
    for path in (Path(str(a).split("::")[0]) for a in args):
        for name in CONFIG_FILES:
            if path.is_dir():
                found += sorted(path.rglob(name))
            elif (path.parent / name).exists():
                found.append(path.parent / name)
    return found


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Before pytest loads any conftest: none will be (`--noconftest`), and a folder to grade
    that holds a pytest configuration file stops the run."""
    if not early_config.known_args_namespace.course_grade:
        return
    early_config.known_args_namespace.noconftest = True  # what pytest's own hook reads next
    found = _config_files(early_config)
    if found:
        from course_utils.grading.neutral import visible

        raise pytest.UsageError(
            f"--course-grade: {visible(found[0])} is a pytest configuration file inside "
            f"a folder to grade (its addopts, pythonpath or hooks could run the "
            f"folder's code here): move it out, or grade the notebooks' folders"
        )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With --course-grade, every file but a notebook is left out: nothing else runs."""
    if config.getoption("course_grade") and collection_path.suffix != ".ipynb":
        if not collection_path.is_dir() or collection_path.is_symlink():
            return True
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collect_directory(path: Path, parent: pytest.Collector):
    """A plain folder, never a package: its `__init__.py` is not imported."""
    if parent.config.getoption("course_grade"):
        return pytest.Dir.from_parent(parent, path=path)
    return None


def pytest_report_header(config: pytest.Config) -> str | None:
    if not config.getoption("course_grade") or config.getoption("course_no_sandbox"):
        return None
    from course_utils.grading import isolation, resources

    if isolation.problem() is not None:
        return None
    limits, cgroup = resources.for_batch(600.0)
    warning = resources.root_warning(cgroup)
    return resources.describe(limits, cgroup) + (f"\n{warning}" if warning else "")


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if parent.config.getoption("course_grade") and file_path.suffix == ".ipynb":
        from course_utils.grading.neutral import visible

        node = GradedNotebook.from_parent(parent, path=file_path)
        node._nodeid = visible(node.nodeid)  # a file's name is a student's: shown, not obeyed
        return node
    return None


class ExerciseFailed(Exception):
    """The grader's hint for an exercise that did not pass (shown as the failure)."""


def _grades(config: pytest.Config) -> dict[Path, list]:
    """Every notebook under the command line's paths, graded once, as a batch."""
    if not hasattr(config, "_course_grades"):
        from course_utils.errors import CourseInputError
        from course_utils.grading.batch import find_submissions, grade_all, unowned_files
        from course_utils.grading.roster import read_roster

        paths = [Path(a.split("::")[0]) for a in config.args]
        paths = [
            p for p in paths if p.suffix == ".ipynb" or (p.is_dir() and any(p.rglob("*.ipynb")))
        ]
        from course_utils.grading import SOLUTIONS

        try:
            roster_path = config.getoption("course_roster")
            roster = read_roster(roster_path) if roster_path else None
            solutions = config.getoption("course_solutions") or SOLUTIONS
            if not solutions.is_dir():
                raise CourseInputError(f"--course-solutions {str(solutions)!r} is not a folder")
            results = grade_all(
                paths,
                jobs=config.getoption("course_jobs"),
                variants=config.getoption("course_variants") or roster is not None,
                lesson=config.getoption("course_lesson"),
                solutions=solutions,
                sandbox=not config.getoption("course_no_sandbox"),
                roster=roster,
                keep_rule=config.getoption("course_keep"),
            )
            unowned = unowned_files(find_submissions(paths, roster)) if paths else []
        except CourseInputError as exc:
            raise pytest.UsageError(str(exc)) from None
        config._course_unowned = unowned  # type: ignore[attr-defined]
        found: dict[Path, list] = {}
        for result in results:
            if result.notebook:
                found.setdefault(Path(result.notebook).resolve(), []).append(result)
        config._course_grades = found  # type: ignore[attr-defined]
        config._course_missing = [r for r in results if not r.notebook]  # type: ignore[attr-defined]
    return config._course_grades  # type: ignore[attr-defined]


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items) -> None:
    """A roster student with no notebook of a lesson: a failed item under the roster file."""
    missing = getattr(config, "_course_missing", [])
    roster = config.getoption("course_roster", None)
    if missing and roster is not None:
        node = RosterFile.from_parent(session, path=Path(roster).resolve())
        items += [
            ExerciseItem.from_parent(
                node, name=f"missing {r.student} lesson {r.lesson:02d}", result=r, exercise=None
            )
            for r in missing
        ]


class RosterFile(pytest.File):
    """The roster, as the place of the items of students who sent nothing (never collected:
    `pytest_collection_modifyitems` adds its items)."""

    def collect(self):
        return []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    """An exercise's item records its share of the time its notebook's grading took."""
    outcome = yield
    if isinstance(item, ExerciseItem) and call.when == "call":
        outcome.get_result().duration = item.seconds


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """The files beside the notebooks that no kernel got (nobody's, by the LMS's names)."""
    unowned = getattr(config, "_course_unowned", [])
    if unowned:
        from course_utils.grading.neutral import visible

        terminalreporter.section("files no kernel got (no graded student's)")
        for path in unowned:
            terminalreporter.line(visible(path))


class GradedNotebook(pytest.File):
    def collect(self):
        from course_utils.grading import keep

        for result in _grades(self.config).get(self.path.resolve(), []):
            items = []
            if result.problem or not result.exercises:
                items.append(("notebook", None, result.problem or "no exercises to grade"))
            items += [(e.id, e, None) for e in result.exercises]
            notes = [n.removeprefix(keep.PLACE_NOTE) for n in result.notes]
            if keep.NOT_ON_ROSTER in result.flags:
                items.append(("roster", None, f"not on the roster: graded as {result.student!r}, "
                              "and in no gradebook"))  # fmt: skip
            elif keep.DISAGREE in result.flags:
                said = "; ".join(n for n in notes if "its number" in n)
                items.append(("roster", None, f"the folder's number and name disagree: {said}"))
            if keep.DUPLICATE in result.flags:
                rule = self.config.getoption("course_keep")
                which = "this one counts" if keep.counted(result) else "another one counts"
                items.append(("duplicate", None, f"{result.student} handed in more than one "
                              f"notebook of lesson {result.lesson:02d}: {which} (--course-keep "
                              f"{rule})"))  # fmt: skip
            seconds = result.seconds / len(items)
            for name, exercise, failure in items:
                item = ExerciseItem.from_parent(self, name=name, result=result, exercise=exercise)
                item.failure, item.seconds = failure, seconds
                yield item


class ExerciseItem(pytest.Item):
    def __init__(self, *, result, exercise, **kwargs) -> None:
        super().__init__(**kwargs)
        self.result, self.exercise = result, exercise
        self.failure: str | None = None if exercise is not None else result.problem
        self.seconds = 0.0
        self.user_properties += [("student", result.student), ("variant", result.variant)]
        if result.name:
            self.user_properties.append(("name", result.name))
        if result.flags:
            self.user_properties.append(("flags", "; ".join(result.flags)))
        if exercise is not None:  # the points it earned of those it is worth (JUnit XML)
            self.user_properties.append(("points", f"{exercise.earned}/{exercise.points}"))

    def runtest(self) -> None:
        if self.exercise is None:
            raise ExerciseFailed(self.failure or "no exercises were found to grade")
        if not self.exercise.passed:
            raise ExerciseFailed(self.exercise.message)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ExerciseFailed):
            from course_utils.grading.neutral import visible

            said = f"{self.result.student}, exercise {self.name}: {excinfo.value}"
            return visible(said, newlines=True)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        from course_utils.grading.neutral import visible

        where = visible(self.path)
        return where, None, visible(f"{self.result.student}: exercise {self.name}")
