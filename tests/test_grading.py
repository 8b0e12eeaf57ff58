"""The grader on lesson 03's real exercises: honest work scores right, tampering earns nothing.

Each submission is built from `solutions/03_bubble_tradeoff.ipynb` (fully solved) or the
blank `exercises/` version, graded like a learner's file: in its own kernel and scratch
folder, judged in the grader's process. Grading a notebook costs a kernel start (a few
seconds), so submissions are graded in batches where they can be.

The verdicts are tested in a sandbox where one can be made, and without one elsewhere (a
fresh machine without bubblewrap: `gradingkit.SANDBOX`); the attacks only in a sandbox
(`needs_bwrap`).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from pathlib import Path

import nbformat
import psutil
import pytest
from conftest import NEEDS_BWRAP
from gradingkit import (
    ALL,
    BLANK,
    NO_SANDBOX,
    ROOT,
    SANDBOX,
    SOLVED,
    cell,
    data,
    grade_folder,
    passed,
    personal,
    solved,
    with_code,
    wrong_answers,
)

from course_utils.checks import Variant
from course_utils.checks import l03 as checks
from course_utils.cli import main
from course_utils.grading import isolation
from course_utils.grading.batch import grade_all
from course_utils.grading.grader import detect_lesson, grade_notebook, name_in_notebook, naming

pytestmark = pytest.mark.slow


def grade(nb, **kwargs):
    return grade_notebook(data(nb), "sub.ipynb", student="tester", **{"sandbox": SANDBOX, **kwargs})


# --------------------------------------------------------------------------- honest work


def test_honest_notebooks_score_exactly_what_they_answered(tmp_path):
    partial = solved()
    for k in (3, 4, 6):  # answered 3.1, 3.2, 3.5 only: the rest back to the blank version
        cell(partial, f"answer-03-{k}").source = cell(BLANK, f"answer-03-{k}").source
    no_ids = solved()
    for c in no_ids.cells:
        c.pop("id", None)
        c.metadata.pop("tags", None)
    no_ids.nbformat_minor = 4  # an older notebook: no cell ids at all
    swapped = solved()
    cell(swapped, "check-03-1")["id"], cell(swapped, "check-03-2")["id"] = "x", "check-03-1"
    cell(swapped, "x")["id"] = "check-03-2"
    results = grade_folder(
        tmp_path,
        {"full": solved(), "blank": BLANK, "partial": partial, "no-ids": no_ids, "swap": swapped},
    )
    assert passed(results["full"]) == ALL
    assert passed(results["blank"]) == []
    assert all("not answered" in e.message for e in results["blank"].exercises)
    assert passed(results["partial"]) == ["3.1", "3.2", "3.5"]
    assert passed(results["no-ids"]) == ALL
    assert passed(results["swap"]) == ALL
    assert results["full"].lesson == 3 and results["full"].tampering == []


def test_a_hanging_answer_and_a_syntax_error_are_named_per_exercise(tmp_path):
    hanging = solved()
    # hangs only on the check's million-stage inputs, so 3.3 (which uses it) still works
    cell(hanging, "answer-03-2").source = (
        "def gpipe_bubble(p, m):\n"
        "    while p > 100_000:\n"
        "        pass\n"
        "    return (p - 1) / (m + p - 1)"
    )
    broken = solved()
    cell(broken, "answer-03-3").source = "microbatches = = 63"
    results = grade_folder(tmp_path, {"hang": hanging, "syntax": broken}, call_timeout=1)
    hang = {e.id: e for e in results["hang"].exercises}
    assert not hang["3.2"].passed and "ran past 1 s" in hang["3.2"].message
    assert passed(results["hang"]) == ["3.1", "3.3", "3.4", "3.5", "3.6"]
    syntax = {e.id: e for e in results["syntax"].exercises}
    assert not syntax["3.3"].passed and "SyntaxError" in syntax["3.3"].message
    assert passed(results["syntax"]) == ["3.1", "3.2", "3.4", "3.5", "3.6"]


def test_a_cell_that_hangs_stops_only_what_it_blocks(tmp_path):
    nb = with_code(solved(), "answer-03-4", "while True:\n    pass")  # after its answers
    # 8 s a cell: Exercise 3.4's cells import torch and run the learner's ranks
    result = grade(nb, cell_timeout=8)
    # The timed-out cell is interrupted; later cells still run and are judged on their own.
    assert passed(result) == ALL
    cut = solved()
    cell(cut, "answer-03-4").source = "while True:\n    pass\n" + cell(cut, "answer-03-4").source
    result = grade(cut, cell_timeout=8)
    verdicts = {e.id: e for e in result.exercises}
    assert not verdicts["3.4"].passed and "ran past 8 s" in verdicts["3.4"].message
    assert passed(result) == ["3.1", "3.2", "3.3", "3.5", "3.6"]


# A function answer that prints more than one message may hold (16 MiB), once, when the
# grader calls it (its capture calls it under a timer): an honest learner's debugging output.
LOUD_ONCE = """
import signal
_loud = [True]
_quiet_gpipe_bubble = gpipe_bubble
def gpipe_bubble(p, m):
    if _loud and signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        _loud.pop()
        print("x" * (20 << 20))
    return _quiet_gpipe_bubble(p, m)
"""


def test_answers_whose_output_was_lost_on_the_way_are_read_again(monkeypatch):
    """A message over 16 MiB breaks the grader's output connection, and what follows it is
    lost until the grader connects again; once it has, the kernel publishes to no one until
    it has taken the new subscription (on a busy machine CI lost an answer so). Here the
    first connection made again does not take: after the cell that printed 20 MB the grader
    runs empty cells until one comes back whole (so the next cell's SyntaxError is still
    read), and the capture whose output was lost (the function printed 20 MB when it was
    called) is run again."""
    from course_utils.grading import kernel_output

    connect = kernel_output.Iopub._connect
    made = []

    def first_does_not_take(self):
        made.append(self)
        if len(made) > 1:
            connect(self)

    monkeypatch.setattr(kernel_output.Iopub, "_connect", first_does_not_take)
    nb = with_code(solved(), "answer-03-2", LOUD_ONCE)
    answer = nb.cells.index(cell(nb, "answer-03-1"))
    nb.cells.insert(answer, nbformat.v4.new_code_cell("print('x' * (20 << 20))"))
    cell(nb, "answer-03-1").source = "bubble_fraction = = 0.2"
    result = grade(nb)
    first = next(e for e in result.exercises if e.id == "3.1")
    assert "SyntaxError" in first.message, first.message
    assert passed(result) == ALL[1:] and result.problem is None, result.exercises
    assert any("over 16 MiB" in n for n in result.notes), result.notes
    assert len(made) >= 3  # after the loud cell, in the empty cells, after the capture


def test_settling_connects_again_after_each_empty_cell_lost_and_gives_up_in_time():
    from course_utils.grading import kernel_output, sandbox

    class Quiet:  # a monitor that saw no broken connection
        def poll(self, timeout):
            return 0

    iopub = object.__new__(kernel_output.Iopub)
    iopub.run, iopub.monitor, iopub.ended = sandbox.Run(), Quiet(), set()
    connected, ran, whole, indices = [], [], [3], itertools.count(100)
    iopub._connect = lambda: connected.append(len(ran))

    def run_cell(source: str) -> int:  # the third empty cell's "idle" comes back
        ran.append(source)
        index = next(indices)
        if len(ran) in whole:
            iopub.ended.add(index)
        return index

    assert iopub.settle(run_cell) and ran == ["pass"] * 3 and connected == [1, 2]
    assert iopub.run.notes == []
    iopub.SETTLE_SECONDS, ran[:], whole[:] = 0.2, [], []  # none does
    assert not iopub.settle(run_cell) and len(ran) > 3
    given_up = len(ran)
    assert not iopub.settle(run_cell) and len(ran) == given_up  # no second wait
    assert iopub.run.notes == [
        "the kernel's output stopped coming back (for 0.2 s): what it printed and answered "
        "after that could not be read"
    ]


def test_without_a_sandbox_grade_refuses_in_one_line_unless_told(monkeypatch, tmp_path, capsys):
    # As on a fresh machine: no bwrap on PATH.
    monkeypatch.setattr(isolation.shutil, "which", lambda name: None)
    isolation.problem.cache_clear()
    try:
        (tmp_path / "a.ipynb").write_bytes(data(solved()))
        assert main(["grade", str(tmp_path / "a.ipynb")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "bubblewrap (bwrap) is not installed" in err
        assert "--no-sandbox" in err
        assert main(["grade", str(tmp_path / "a.ipynb"), "--no-sandbox", "--json"]) == 0
        captured = capsys.readouterr()
        assert "--no-sandbox" in captured.err and '"score": 6' in captured.out
    finally:
        isolation.problem.cache_clear()


def test_without_a_sandbox_an_edited_name_cell_grades_as_in_one():
    # In a sandbox the stand-in hands the kernel the numbers of the student graded, whatever
    # its name cell says; without one the notebook runs with its name cell naming them.
    theirs = personal(solved(), "s7")
    assert name_in_notebook(naming(theirs, "s8")) == "s8" and name_in_notebook(theirs) == "s7"
    result = grade(theirs, variant="s8", sandbox=False)
    assert passed(result) == ALL and result.flags == ["name cell edited"]


# --------------------------------------------------------------------------- tampering

SILENCERS = {
    "no-traceback": "get_ipython().showtraceback = lambda *a, **k: None",
    "custom-handler": "get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)",
    "exception-group": "raise ExceptionGroup('hidden', [ValueError('x')])",
}
PATCHERS = {
    "fake-check": (
        "import course_utils.checks.l03 as _m\n"
        "for _k in range(1, 7):\n"
        "    setattr(_m, f'exercise_{_k}', lambda *a, **k: print('✅ Right'))\n"
        "check.exercise_1 = check.exercise_2 = lambda *a, **k: print('✅ Right')"
    ),
    "isclose": "import math\nmath.isclose = lambda *a, **k: True",
    "fail": (
        "import course_utils.checks as _c\n_c.fail = lambda m: None\n"
        "_c.CheckFailed = ZeroDivisionError"
    ),
    "clever-answer": (
        "class Always(float):\n"
        "    def __eq__(self, other): return True\n"
        "    def __ge__(self, other): return True\n"
        "    def __le__(self, other): return True\n"
        "bubble_fraction = Always(0.5)"
    ),
}
FORGERS = {
    "fake-stdout": (
        "import os, json\n"
        "os.write(1, json.dumps({'score': 6, 'total': 6}).encode())\n"
        "os.write(2, b'all passed')"
    ),
    "fake-files": (
        "import pathlib, tempfile\n"
        "for d in (pathlib.Path('.'), pathlib.Path(tempfile.gettempdir())):\n"
        "    (d / 'report.xml').write_text('<testsuite failures=\"0\"/>')\n"
        "    (d / 'grades.csv').write_text('tester,6,6')"
    ),
}


@NEEDS_BWRAP
def test_silencing_errors_patching_checks_and_forging_output_earn_nothing(tmp_path):
    attacks = {**SILENCERS, **PATCHERS, **FORGERS}
    subs = {}
    for name, code in attacks.items():
        nb = wrong_answers(solved())
        subs[name] = with_code(nb, "answer-03-1", code, before=name == "clever-answer")
        if name == "clever-answer":  # its answer must survive the wrong answer set above
            cell(subs[name], "answer-03-1").source = code
    results = grade_folder(tmp_path, subs)
    assert set(results) == set(attacks)
    for name, result in results.items():
        assert passed(result) == [], (name, [(e.id, e.message) for e in result.exercises])


@NEEDS_BWRAP
def test_a_kernel_that_ends_itself_earns_nothing_and_cannot_end_the_grader(tmp_path):
    # Its parent is the sandbox's first process, not the grader: killing it does nothing, so
    # honest answers beside the attempt still count (tests/test_sandbox.py tries harder).
    kill_parent = with_code(solved(), "answer-03-1", "import os, signal\nos.kill(os.getppid(), 9)")
    kill_self = with_code(wrong_answers(solved()), "answer-03-1", "import os\nos._exit(0)")
    exit_early = with_code(wrong_answers(solved()), "answer-03-1", "import sys\nsys.exit(0)")
    results = grade_folder(
        tmp_path, {"kill-parent": kill_parent, "kill-self": kill_self, "exit": exit_early}
    )
    assert passed(results["kill-parent"]) == ALL and results["kill-parent"].problem is None
    assert passed(results["kill-self"]) == [] and passed(results["exit"]) == []


SLOW_START = """\
import os, runpy, sys, time
marker, rest = sys.argv[1], sys.argv[2:]
if marker == "never" or not os.path.exists(marker):
    open(os.devnull if marker == "never" else marker, "w").close()
    time.sleep(300)  # never answers: the grader must give up on this kernel and kill it
sys.argv = ["ipykernel_launcher", *rest]
runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
"""


def slow_kernel_spec(monkeypatch, tmp_path: Path, marker: str, seconds: int = 8) -> None:
    """Kernels (without a sandbox: the script lives in tmp_path) start through SLOW_START:
    the first start (or every one) never answers; each try gets `seconds` to answer."""
    import sys

    from course_utils.grading import notebook_tools, sandbox

    script = tmp_path / "slow_start.py"
    script.write_text(SLOW_START)
    argv = [sys.executable, "-I", str(script), marker, "-f", "{connection_file}"]
    monkeypatch.setattr(sandbox, "_plain_argv", lambda: argv)
    monkeypatch.setattr(notebook_tools, "KERNEL_STARTUP_SECONDS", seconds)


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_a_grade_made_in_this_process_leaves_no_kernel_running():
    # The API's grade_notebook, called from an instructor's script or a test: once it has
    # returned, its kernel (in the sandbox: bwrap and all it started) is gone and reaped.
    before = children()
    assert passed(grade(solved())) == ALL
    assert children() <= before


def test_a_kernel_that_never_starts_is_retried_once_then_reported(monkeypatch, tmp_path):
    # Seen in CI: on a fresh, busy machine a grading kernel did not answer in time. No learner
    # code has run then, so a fresh kernel is safe; if that fails too, the row says why.
    marker = tmp_path / "first-start-happened"
    slow_kernel_spec(monkeypatch, tmp_path, str(marker))
    before = children()
    result = grade(solved(), sandbox=False)
    assert marker.exists() and result.problem is None
    assert passed(result) == ALL
    assert children() <= before  # neither the kernel that never answered nor the one that did
    # No kernel is meant to start now: 2 s a try is enough, and the test idles 12 s less.
    slow_kernel_spec(monkeypatch, tmp_path, "never", seconds=2)
    result = grade(solved(), sandbox=False)
    assert result.problem and "the grading kernel did not start (2 tries" in result.problem
    assert result.exercises == [] and result.score == 0


@NEEDS_BWRAP
def test_shadowing_imports_from_the_submission_folder_earns_nothing(tmp_path):
    fake = tmp_path / "class"
    fake.mkdir()
    # A flat folder of submissions with a fake package and a sitecustomize beside them.
    (fake / "course_utils").mkdir()
    (fake / "course_utils" / "__init__.py").write_text("RIGGED = True\n")
    (fake / "course_utils" / "checks").mkdir()
    (fake / "course_utils" / "checks" / "__init__.py").write_text(
        "def __getattr__(name):\n    return lambda *a, **k: print('✅ Right')\n"
    )
    (fake / "sitecustomize.py").write_text(
        "import builtins\nbuiltins.RIGGED = True\n"
        "import math\nmath.isclose = lambda *a, **k: True\n"
    )
    (fake / "alice.ipynb").write_bytes(data(wrong_answers(solved())))
    (fake / "bob.ipynb").write_bytes(data(solved()))
    cheat = with_code(wrong_answers(solved()), "answer-03-1", "import sys\nsys.path.insert(0, '.')")
    (fake / "carol.ipynb").write_bytes(data(cheat))
    results = {r.student: r for r in grade_all([fake], jobs=2)}
    assert passed(results["alice"]) == [] and passed(results["carol"]) == []
    assert passed(results["bob"]) == ALL  # honest work beside the fake package still counts


@NEEDS_BWRAP
def test_a_submission_cannot_touch_its_classmates(tmp_path):
    vandal = with_code(
        wrong_answers(solved()),
        "answer-03-1",
        "import pathlib\nfor p in pathlib.Path('..').glob('**/*.ipynb'):\n    p.unlink()",
    )
    results = grade_folder(tmp_path, {"a-vandal": vandal, "b-honest": solved()})
    assert passed(results["b-honest"]) == ALL
    assert (tmp_path / "b-honest" / "03_bubble_tradeoff.ipynb").exists()  # never ran there


def test_another_lessons_notebook_is_graded_as_what_it_is_or_as_pinned():
    other = nbformat.read(ROOT / "solutions" / "04_1f1b_zero_bubble.ipynb", as_version=4)
    assert detect_lesson(other) == 4
    pinned = grade(other, lesson=3)
    assert pinned.lesson == 3 and pinned.score == 0
    assert any("looks like lesson 04" in n for n in pinned.notes)


def test_tampering_is_reported_cell_by_cell():
    nb = solved()
    cell(nb, "check-03-2").source = "print('✅ Right')"
    nb.cells.remove(cell(nb, "check-03-5"))
    cell(nb, "given-03-1").source = "g = check.given(1)\ng['p'] = 2"
    result = grade(nb)
    report = {t["cell"]: t["status"] for t in result.tampering}
    assert report == {"check-03-2": "changed", "check-03-5": "removed", "given-03-1": "changed"}
    # The answers still count: tampering is reported, not punished by the grader. But the
    # judge uses the real given numbers, so 3.1, worked out from a forged p, is wrong.
    assert passed(result) == [e for e in ALL if e != "3.1"]


# --------------------------------------------------------------------------- variants


def test_each_student_gets_numbers_of_their_own():
    seven, eight = Variant("s7"), Variant("s8")
    numbers = [checks.given_1(v) for v in (seven, eight)] + [
        checks.given_4(v) for v in (seven, eight)
    ]
    assert numbers[0] != numbers[1] or numbers[2] != numbers[3]
    assert checks.given_1(Variant("s7")) == numbers[0]  # the same student: the same numbers
    assert checks.given_1(Variant()) == {"p": 4, "m": 12}  # the default: the course's own


def test_a_copied_answer_fails_for_another_student(tmp_path):
    from course_utils.grading.make_exercises import for_student

    def personal(student: str) -> nbformat.NotebookNode:
        return nbformat.reads(for_student(nbformat.writes(SOLVED), student), as_version=4)

    # s7 solves with the formulas on their own numbers; s8 copies s7's numeric answers.
    g1, g3, g4 = (
        checks.given_1(Variant("s7")),
        checks.given_3(Variant("s7")),
        checks.given_4(Variant("s7")),
    )
    copied = personal("s8")
    cell(
        copied, "answer-03-1"
    ).source = f"bubble_fraction = {(g1['p'] - 1) / (g1['m'] + g1['p'] - 1)!r}"
    fewest = math.ceil((g3["p"] - 1) * (1 - g3["target"]) / g3["target"] - 1e-9)
    cell(copied, "answer-03-3").source = f"microbatches = {fewest}"
    budget = math.floor((g4["gpu_gb"] - g4["state_gb"]) / g4["per_microbatch_gb"] + 1e-9)
    answer = cell(copied, "answer-03-4")  # s7's budget, typed in; the program is the same
    answer.source = answer.source.replace("budget = int(", f"budget = {budget}  # int(")
    results = grade_folder(tmp_path, {"s7": personal("s7"), "s8": copied}, variants=True)
    assert passed(results["s7"]) == ALL and results["s7"].variant == "s7"
    s8 = {e.id: e.passed for e in results["s8"].exercises}
    assert not s8["3.1"] and not s8["3.3"] and not s8["3.4"]
    assert s8["3.2"] and s8["3.5"] and s8["3.6"]  # not copied: computed from s8's numbers


# --------------------------------------------------------------------------- a class


def test_a_class_with_two_broken_files_gives_a_row_for_every_file(tmp_path, capsys):
    # 4 notebooks (two solved, one blank, one with 4 of 6 answered) and 2 broken files (a
    # class of 30 at -j 2 is timed by make bench: benchmarks/bench_grading.py).
    folder = tmp_path / "class"
    folder.mkdir()
    for i in (0, 1, 3, 4):
        nb = solved() if i % 2 else partial_blank(i)
        (folder / f"student{i:02d}.ipynb").write_bytes(data(nb))
    (folder / "truncated.ipynb").write_bytes(data(solved())[:500])
    (folder / "not-a-notebook.ipynb").write_text("hello")
    csv_path = tmp_path / "grades.csv"
    code = main(["grade", str(folder), "--json", "--csv", str(csv_path), "-j", "2", *NO_SANDBOX])
    out = capsys.readouterr().out
    assert code == 0
    rows = json.loads(out)
    assert isinstance(rows, list) and len(rows) == 6
    broken = {r["student"]: r for r in rows if r["problem"]}
    assert set(broken) == {"truncated", "not-a-notebook"}
    assert all("not a readable notebook" in r["problem"] for r in broken.values())
    scores = {r["student"]: r["score"] for r in rows if not r["problem"]}
    assert scores == {f"student{i:02d}": 6 if i % 2 else i % 6 for i in (0, 1, 3, 4)}
    with csv_path.open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == 6 and {"tampered", "problem", "3.1", "lesson", "variant"} <= set(table[0])


def partial_blank(i: int) -> nbformat.NotebookNode:
    """A solved notebook with only its first i % 6 exercises answered."""
    nb = solved()
    for k in range(i % 6 + 1, 7):
        cell(nb, f"answer-03-{k}").source = cell(BLANK, f"answer-03-{k}").source
    return nb
