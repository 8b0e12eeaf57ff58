"""`python -m course_utils grade SUBMISSION.ipynb|FOLDER ...`: grade exercise notebooks.

Each notebook runs apart, in its own kernel inside a sandbox of its own; its answers are
judged in the grader's process (see `course_utils.grading` and INSTRUCTORS.md). A table per
notebook, or `--json` (always a list), and for the class: `--csv` (one row per notebook,
written as each finishes: a rerun grades only what is missing), `--roster`, `--gradebook`,
`--feedback`, `--stats`, `--similarity`. `grade FILE --student NAME` regrades one notebook on
that student's numbers. The CSV's `review` and `review note` columns are the instructor's: a
rerun reads them back and the gradebook (`--lms canvas|moodle`) takes the reviewed score.

A run that cannot grade stops before any notebook runs, in one line (exit 2): every argument
is checked first, the paths given are made absolute against the folder it was started in,
and the solutions folder must hold each lesson found. It says first, in one line, what
bounds each sandbox on this machine (`resources.describe`), and last a summary: the rows
graded again and why, duplicates, late files, folders whose number and name disagree
(`keep`), and which files beside the notebooks reached no kernel. Whatever it prints that
came from a submission is shown `visible`; no single notebook can stop a report: each report
is written on its own, and one that fails says so in a line while the others are still
written (exit code 1 then). A batch where no notebook could be graded at all writes no
gradebook, feedback, statistics or pairs, and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from course_utils import validation
from course_utils.commands.common import exit_on_sigterm, number_flag
from course_utils.errors import CourseInputError
from course_utils.grading.keep import DEFAULT_KEEP, KEEP
from course_utils.grading.roster import LMS

HELP = "grade exercise notebooks (each in a sandbox, judged outside the learner's kernel)"
MAX_JOBS = validation.MAX_GRADE_JOBS  # 3 kernels and their grading workers stay under 1.5 GB


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from course_utils.grading import SOLUTIONS

    parser.add_argument(
        "submissions", nargs="+", type=Path, help="submitted .ipynb files or folders of them"
    )
    parser.add_argument("--csv", help="one row per notebook, written as each finishes (resumable)")
    parser.add_argument("--json", action="store_true", help="print the results as a JSON list")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS, help="folder of solutions")
    parser.add_argument("--lesson", type=int, default=None, help="grade as this lesson (1-99)")
    parser.add_argument(
        "--variants",
        action="store_true",
        help="each learner's own numbers: their student id is the seed (see make_exercises); "
        "implied by --roster and --student",
    )
    parser.add_argument(
        "--student",
        default=None,
        metavar="NAME",
        help="regrade one notebook as NAME's, on NAME's numbers (implies --variants)",
    )
    parser.add_argument(
        "--roster",
        type=Path,
        help="CSV with id,name[,lms_id][,login or email]: whose each file is (Moodle, Canvas); "
        "implies --variants",
    )
    parser.add_argument(
        "--keep",
        choices=KEEP,
        default=DEFAULT_KEEP,
        help="which of a student's notebooks of a lesson the gradebook and statistics take: "
        "the latest handed in (default), the best score, or the latest on time (late work "
        "does not count)",
    )
    parser.add_argument(
        "--gradebook", help="CSV, one row per student, to import into the LMS named by --lms"
    )
    parser.add_argument(
        "--lms",
        choices=LMS,
        default="canvas",
        help="the gradebook's format: canvas (default: its import's columns and a Points "
        "Possible row) or moodle (Grades > Import > CSV: a login column and grade columns)",
    )
    parser.add_argument(
        "--feedback", metavar="DIR", help="write one HTML feedback page per notebook"
    )
    parser.add_argument(
        "--stats", metavar="PNG", help="class statistics: bar chart (and .csv beside)"
    )
    parser.add_argument(
        "--similarity",
        nargs="?",
        const=True,
        default=None,
        metavar="CSV",
        help="report answer cells identical (or after renaming) across students; CSV optional",
    )
    parser.add_argument(
        "--no-sandbox",
        action="store_true",
        help="run learners' code WITHOUT a sandbox, with your permissions (only if you must)",
    )
    parser.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=1,
        help=f"notebooks graded at once (limit: 1-{MAX_JOBS}, each a kernel of about 300 MB)",
    )
    parser.add_argument(
        "--timeout", type=float, default=600, help="seconds per notebook (default 600)"
    )
    parser.add_argument(
        "--cell-timeout", type=float, default=120, help="whole seconds per cell (default 120)"
    )
    parser.add_argument(
        "--call-timeout",
        type=float,
        default=20,
        help="seconds per call of a learner's function (default 20)",
    )


def _check(args: argparse.Namespace) -> None:
    """Every argument, before anything slow is imported or any notebook is run."""
    from course_utils.grading.roster import check_name, read_roster

    for flag in ("--timeout", "--call-timeout"):
        number_flag(args, flag, 0.0, 86400.0, strict=True)
    # nbclient counts a cell's time in whole seconds (an integer trait)
    if not number_flag(args, "--cell-timeout", 1.0, 86400.0).is_integer():
        raise CourseInputError(
            f"--cell-timeout must be a whole number of seconds from 1 to 86400, "
            f"got {args.cell_timeout:g}"
        )
    args.cell_timeout = int(args.cell_timeout)
    validation.integer(args.jobs, "--jobs", 1, MAX_JOBS)
    if args.lesson is not None:
        validation.integer(args.lesson, "--lesson", 1, 99)
    _check_solutions(args)
    # every output, before a notebook is graded: a name, a folder that takes files, no device
    if args.csv is not None:
        args.csv = validation.output_file(args.csv, "--csv", siblings=(".jsonl",))
    if args.gradebook is not None:
        args.gradebook = validation.output_file(args.gradebook, "--gradebook")
    if isinstance(args.similarity, str):
        args.similarity = validation.output_file(args.similarity, "--similarity")
    if args.stats is not None:
        args.stats = validation.output_file(args.stats, "--stats", (".png",), siblings=(".csv",))
        validation.matplotlib_ready()
    if args.feedback is not None:
        if not args.feedback.strip():
            raise CourseInputError("--feedback needs a folder name, got ''")
        args.feedback = validation.output_folder(args.feedback, "--feedback")
    if args.roster is not None:
        validation.input_file(args.roster, "--roster", validation.MAX_ROSTER_BYTES)
    for path in args.submissions:
        try:
            path.lstat()
        except FileNotFoundError:
            raise CourseInputError(f"submission {str(path)!r} does not exist") from None
        except OSError as exc:  # a name too long, a loop of links, no permission
            raise CourseInputError(f"submission {str(path)!r}: {exc.strerror}") from None
        if not _is_dir(path) and path.suffix != ".ipynb":
            raise CourseInputError(f"submission {str(path)!r} is not a notebook (.ipynb)")
    if args.student is not None:
        args.student = check_name(args.student, "--student")
        if len(args.submissions) != 1 or _is_dir(args.submissions[0]):
            raise CourseInputError("--student regrades one notebook: give exactly one .ipynb file")
    args.roster = read_roster(args.roster) if args.roster is not None else None


def _check_solutions(args: argparse.Namespace) -> None:
    """--solutions: a folder of solved notebooks (NN_name.ipynb), made absolute (the workers
    run elsewhere), and the one of --lesson among them (each submission's lesson is looked
    for before grading)."""
    from course_utils.grading import SOLUTIONS

    if not _is_dir(args.solutions):
        if args.solutions == SOLUTIONS:  # the default: course_utils is an installed package
            raise CourseInputError(
                "--solutions DIR is needed: the solved notebooks are not part of the installed "
                "course_utils package; give the solutions/ folder of a course checkout"
            )
        raise CourseInputError(f"--solutions {str(args.solutions)!r} is not a folder")
    # The workers start in folders of their own: a relative path means where we started.
    args.solutions = args.solutions.absolute()
    if args.lesson is not None:
        from course_utils.grading import missing_solution

        if why := missing_solution(args.lesson, args.solutions):
            raise CourseInputError(f"--lesson {args.lesson}: {why}")


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # a name too long for the file system is not a folder
        return False


def run(args: argparse.Namespace) -> int:
    _check(args)
    exit_on_sigterm()  # the batch's workers live in sessions of their own: stop them too
    from course_utils.grading import isolation

    if not args.no_sandbox and (why := isolation.problem()):
        raise CourseInputError(why)
    from course_utils.grading.batch import find_submissions, grade_all
    from course_utils.grading.grader import table

    found = find_submissions(args.submissions)  # an empty folder: one line too
    say = sys.stderr if args.json else sys.stdout

    def start() -> None:  # once every notebook was read: a run that cannot grade says only why
        if args.no_sandbox:
            print("warning: --no-sandbox: learners' code runs with your permissions", file=say)
            return
        from course_utils.grading import resources

        limits, cgroup = resources.for_batch(args.timeout)
        print(resources.describe(limits, cgroup), file=say, flush=True)
        if warning := resources.root_warning(cgroup):
            print(warning, file=say)

    graded_now = []

    def show(result) -> None:
        graded_now.append(result)
        if not args.json:
            print(table(result), flush=True)

    single = len(args.submissions) == 1 and not args.submissions[0].is_dir()
    variants = args.variants or args.roster is not None  # a roster's ids are the seeds
    results = grade_all(
        args.submissions,
        jobs=args.jobs,
        variants=variants,
        lesson=args.lesson,
        solutions=args.solutions,
        cell_timeout=args.cell_timeout,
        total_timeout=args.timeout,
        call_timeout=args.call_timeout,
        on_result=show,
        sandbox=not args.no_sandbox,
        roster=args.roster,
        journal=args.csv,
        student=args.student,
        trust_name_cell=single and args.student is None and not variants,
        keep_rule=args.keep,
        on_start=start,
    )
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2, allow_nan=False))
    _summary(args, results, found, len(graded_now), say)
    graded = [r for r in results if r.notebook]
    if graded and all(r.problem and not r.exercises for r in graded):
        print(
            f"no notebook could be graded ({len(graded)} tried: see each row's problem): "
            "no gradebook, feedback, statistics or pairs were written",
            file=say,
        )
        return 1 | _class_outputs(args, results, say, ("csv",))
    return _class_outputs(args, results, say, REPORTS)


def _summary(args: argparse.Namespace, results, found, graded_now: int, say) -> None:
    """What needs a look after the tables: missing students and strangers, rows graded
    again and why, duplicates, late files and disagreeing folders, files no kernel got."""
    from collections import Counter

    from course_utils.grading import keep
    from course_utils.grading.batch import unowned_files
    from course_utils.grading.neutral import visible

    out = sys.stdout if not args.json else say
    for r in results:
        if keep.MISSING in r.flags:
            print(visible(f"{r.name or r.student} (student {r.student}): {r.problem}"), file=out)
        elif keep.NOT_ON_ROSTER in r.flags:
            print(visible(f"{r.notebook}: not on the roster (graded as {r.student!r})"), file=out)
    if args.csv is not None:
        _reviews_said(args.csv, results, say)
    reused = sum(1 for r in results if r.notebook) - graded_now
    again = [r for r in results if r.regraded]
    if reused > 0 or again:
        first = graded_now - len(again)
        reasons = Counter(why for r in again for why in r.regraded)
        said = "; ".join(f"{n} because {why}" for why, n in reasons.most_common())
        print(f"{reused} rows kept from the earlier run (their resume key is unchanged), "
              f"{len(again)} graded again{f' ({said})' if said else ''}, {first} graded for "
              "the first time", file=say)  # fmt: skip
    for line in keep.summary(results, args.keep):
        print(visible(line), file=say)
    unowned = unowned_files(found)
    if unowned:
        print(f"{len(unowned)} files beside the notebooks are no graded student's (the LMS's "
              "names do not say whose, or that student sent no notebook): no kernel got them",
              file=say)  # fmt: skip
        for path in unowned:
            print(f"  {visible(path)}", file=say)


def _reviews_said(path: Path, results, say) -> None:
    """The instructor's reviews read back from the CSV: how many, and any not taken."""
    from course_utils.grading.journal import reviews
    from course_utils.grading.neutral import visible

    found = reviews(path)
    for line in found.problems:
        print(visible(line), file=say)
    reviewed = [r for r in results if r.notebook and r.review is not None]
    if reviewed:
        changed = [r for r in reviewed if "the notebook changed" in r.regraded]
        print(f"{len(reviewed)} rows carry a review from {path.name} (its review column): the "
              "gradebook takes their score with it", file=say)  # fmt: skip
        for r in changed:
            print(visible(f"  the review of {r.notebook} was made before it changed: see it "
                          "still holds"), file=say)  # fmt: skip


REPORTS = ("csv", "gradebook", "feedback", "stats", "similarity")


def _class_outputs(args: argparse.Namespace, results, say, reports) -> int:
    """The gradebook, feedback pages, statistics and similarity pairs, each if asked for,
    each on its own: one that fails is a line, and the others are still written (then 1)."""
    failed = 0
    for report in reports:
        if getattr(args, report):
            try:
                _report(report, args, results, say)
            except Exception as exc:  # noqa: BLE001 - the other reports still get written
                from course_utils.grading.neutral import visible

                print(f"could not write the --{report} report: {visible(repr(exc))}", file=say)
                failed = 1
    return failed


def _report(report: str, args: argparse.Namespace, results, say) -> None:
    from course_utils.grading.keep import counted
    from course_utils.grading.neutral import visible

    if report == "csv":
        print(f"wrote {args.csv} ({len(results)} rows) and {args.csv.with_suffix('.jsonl')}",
              file=say)  # fmt: skip
    elif report == "gradebook":
        from course_utils.grading.gradebook import notes, write_gradebook

        roster = args.roster
        if args.student is not None:  # one student's row: an import changes only that one
            roster = [s for s in roster or [] if s.id == args.student] or None
        rows = write_gradebook(results, args.gradebook, roster, args.solutions, args.lms)
        lms = {"canvas": "Canvas", "moodle": "Moodle"}[args.lms]
        print(f"wrote {args.gradebook} ({rows} students, for {lms}'s grade import)", file=say)
        for line in notes(roster, args.lms):
            print(f"  {visible(line)}", file=say)
    elif report == "feedback":
        from course_utils.grading.feedback import write_feedback

        pages = write_feedback(results, args.feedback, args.submissions, args.solutions)
        print(f"wrote {len(pages)} feedback pages in {args.feedback}", file=say)
    elif report == "stats":
        from course_utils.grading.stats import class_statistics, stats_table, write_stats

        stats = class_statistics(results)
        print(stats_table(stats), file=say)
        skipped: list[str] = []
        chart, table = write_stats(stats, args.stats, skipped)
        for line in skipped:
            print(f"  {visible(line)}", file=say)
        print(f"wrote {chart} and {table}", file=say)
    elif report == "similarity":
        from course_utils.grading.similarity import pairs_table, similar_pairs, write_pairs

        graded = [(r.student, r.notebook, r.lesson) for r in results if r.exercises and (
            counted(r) or "not on the roster" in r.flags)]  # fmt: skip
        pairs, common = similar_pairs(graded, args.solutions)
        print(pairs_table(pairs), file=say)
        for line in common:
            print(f"  {visible(line)}", file=say)
        if isinstance(args.similarity, Path):
            write_pairs(pairs, args.similarity)
            print(f"wrote {args.similarity} ({len(pairs)} pairs)", file=say)
