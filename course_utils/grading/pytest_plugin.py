"""`pytest --course-grade submissions/`: every exercise of every submitted notebook, as a test.

A pytest plugin, like nbval, for instructors (installed by `make setup` through
`instructor_tools/`, or loaded anywhere with `-p course_utils.grading.pytest_plugin`; the
learners' image does not have it). Each notebook under the paths given is graded exactly as
`python -m course_utils grade` does (each in its own sandbox, judged in the grader), and
each of its exercises becomes one test item:

    submissions/alice/03_bubble_tradeoff.ipynb::3.1 PASSED
    submissions/alice/03_bubble_tradeoff.ipynb::3.2 FAILED   (the hint is the failure)

so `--junitxml report.xml` hands GitHub Classroom, GitLab or any CI one test per exercise
per student. A notebook that could not be graded is one failed item, `::notebook`, saying
why. Options: `--course-variants` (each student's own numbers), `--course-roster CSV`,
`--course-lesson N`, `--course-jobs N` (notebooks at once), `--course-no-sandbox`.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("course-grade", "grading the course's exercise notebooks")
    group.addoption(
        "--course-grade",
        action="store_true",
        help="collect .ipynb submissions: one test per exercise, the grader's verdict",
    )
    group.addoption("--course-variants", action="store_true", help="each student's own numbers")
    group.addoption("--course-roster", type=Path, default=None, help="roster CSV: id,name[,lms_id]")
    group.addoption("--course-lesson", type=int, default=None, help="grade as this lesson")
    group.addoption("--course-jobs", type=int, default=1, help="notebooks graded at once")
    group.addoption(
        "--course-no-sandbox",
        action="store_true",
        help="run learners' code without a sandbox (with your permissions)",
    )


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if parent.config.getoption("course_grade") and file_path.suffix == ".ipynb":
        return GradedNotebook.from_parent(parent, path=file_path)
    return None


class ExerciseFailed(Exception):
    """The grader's hint for an exercise that did not pass (shown as the failure)."""


def _grades(config: pytest.Config) -> dict[Path, list]:
    """Every notebook under the command line's paths, graded once, as a batch."""
    if not hasattr(config, "_course_grades"):
        from course_utils.errors import CourseInputError
        from course_utils.grading.batch import grade_all
        from course_utils.grading.roster import read_roster

        paths = [Path(a.split("::")[0]) for a in config.args]
        paths = [
            p for p in paths if p.suffix == ".ipynb" or (p.is_dir() and any(p.rglob("*.ipynb")))
        ]
        try:
            roster_path = config.getoption("course_roster")
            results = grade_all(
                paths,
                jobs=config.getoption("course_jobs"),
                variants=config.getoption("course_variants"),
                lesson=config.getoption("course_lesson"),
                sandbox=not config.getoption("course_no_sandbox"),
                roster=read_roster(roster_path) if roster_path else None,
            )
        except CourseInputError as exc:
            raise pytest.UsageError(str(exc)) from None
        found: dict[Path, list] = {}
        for result in results:
            if result.notebook:
                found.setdefault(Path(result.notebook).resolve(), []).append(result)
        config._course_grades = found  # type: ignore[attr-defined]
    return config._course_grades  # type: ignore[attr-defined]


class GradedNotebook(pytest.File):
    def collect(self):
        for result in _grades(self.config).get(self.path.resolve(), []):
            if result.problem or not result.exercises:
                yield ExerciseItem.from_parent(self, name="notebook", result=result, exercise=None)
            for exercise in result.exercises:
                yield ExerciseItem.from_parent(
                    self, name=exercise.id, result=result, exercise=exercise
                )


class ExerciseItem(pytest.Item):
    def __init__(self, *, result, exercise, **kwargs) -> None:
        super().__init__(**kwargs)
        self.result, self.exercise = result, exercise
        self.user_properties += [("student", result.student), ("variant", result.variant)]
        if result.name:
            self.user_properties.append(("name", result.name))

    def runtest(self) -> None:
        if self.exercise is None:
            raise ExerciseFailed(self.result.problem or "no exercises were found to grade")
        if not self.exercise.passed:
            raise ExerciseFailed(self.exercise.message)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ExerciseFailed):
            return f"{self.result.student}, exercise {self.name}: {excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"{self.result.student}: exercise {self.name}"
