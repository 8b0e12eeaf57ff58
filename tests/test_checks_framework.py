"""Tests for course_utils.checks: the helpers, the kind messages, and how a failed check
looks in a real kernel (no traceback) and under nbval (a failed cell)."""

from __future__ import annotations

import fractions
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_utils import checks
from course_utils.checks import (
    CheckFailed,
    NotAnswered,
    as_choice,
    as_int,
    as_number,
    as_sequence,
    check_function,
    close,
    passed,
    require,
)


@pytest.mark.parametrize("value", [None, ..., NotImplemented])
def test_require_placeholders_are_not_answered(value):
    with pytest.raises(NotAnswered, match=r"This exercise is not answered yet: `x` is still"):
        require(value, "x")


def test_not_answered_is_a_check_failed_and_an_assertion():
    assert issubclass(NotAnswered, CheckFailed)
    assert issubclass(CheckFailed, AssertionError)


@pytest.mark.parametrize("value", [0, 0.0, "", [], False])
def test_require_accepts_falsy_answers(value):
    assert require(value, "x") is value


@pytest.mark.parametrize(
    "value, expected",
    [(3, 3.0), (0.25, 0.25), (fractions.Fraction(3, 11), 3 / 11), (np.float32(0.5), 0.5)],
)
def test_as_number_accepts_numbers(value, expected):
    assert as_number(value, "x") == pytest.approx(expected)


def test_as_number_accepts_one_element_arrays_and_numpy_ints():
    assert as_number(np.array([2.5]), "x") == 2.5
    assert as_number(np.int64(7), "x") == 7.0


@pytest.mark.parametrize(
    "value, pattern",
    [
        (float("nan"), r"`x` is NaN"),
        (math.inf, r"`x` is infinite"),
        (-math.inf, r"`x` is infinite"),
        ("0.25", r"the text '0.25'"),
        (True, r"should be a number, not True"),
        ([1, 2], r"should be a number, but it is \[1, 2\] \(a list\)"),
        (np.array([1.0, 2.0]), r"should be one number, but it holds 2 values"),
        (np.array(float("nan")), r"is NaN"),
    ],
)
def test_as_number_rejects_with_a_message(value, pattern):
    with pytest.raises(CheckFailed, match=pattern) as info:
        as_number(value, "x")
    assert not isinstance(info.value, NotAnswered)


def test_as_number_on_a_torch_tensor_without_importing_torch_here():
    import torch

    assert as_number(torch.tensor(1.5), "x") == 1.5
    with pytest.raises(CheckFailed, match="holds 3 values"):
        as_number(torch.ones(3), "x")


def test_as_int():
    assert as_int(4, "n") == 4
    assert as_int(4.0, "n") == 4
    with pytest.raises(CheckFailed, match="whole number, but it is 2.5"):
        as_int(2.5, "n")
    with pytest.raises(NotAnswered):
        as_int(None, "n")


def test_as_choice_is_forgiving_about_case_and_spaces():
    assert as_choice("  Device 0 ", ["device 0", "device 1"], "who") == "device 0"
    assert as_choice(2, [1, 2, 3], "k") == 2
    with pytest.raises(CheckFailed, match=r"one of 'a', 'b'.*'c' \(a str\)"):
        as_choice("c", ["a", "b"], "pick")
    with pytest.raises(CheckFailed):
        as_choice(True, [1, 0], "pick")  # a bool is not the choice 1
    with pytest.raises(NotAnswered):
        as_choice(None, ["a"], "pick")


def test_as_sequence():
    assert as_sequence((1, 2), "xs") == [1, 2]
    assert as_sequence(range(3), "xs", length=3) == [0, 1, 2]
    assert as_sequence(np.array([1, 2]), "xs") == [1, 2]
    assert as_sequence(["1", 2.0], "xs", item=lambda v, w: as_int(2.0, w)) == [2, 2]
    with pytest.raises(CheckFailed, match="should be a list, but it is 'abc'"):
        as_sequence("abc", "xs")
    with pytest.raises(CheckFailed, match="should have 3 items, but it has 2"):
        as_sequence([1, 2], "xs", length=3)
    with pytest.raises(CheckFailed, match=r"`xs\[1\]` is NaN"):
        as_sequence([1, float("nan")], "xs", item=as_number)
    with pytest.raises(CheckFailed, match="should be a list"):
        as_sequence(5, "xs")


def test_close():
    assert close(1.0, 1.0005)
    assert not close(1.0, 1.01)
    assert close(1.0, 1.01, rel=0.02)
    assert close(0.0, 1e-12)


def test_passed_prints_a_tick(capsys):
    passed("Right: 3 of 11 slots are idle.")
    assert capsys.readouterr().out == "✅ Right: 3 of 11 slots are idle.\n"


def test_check_function_wraps_the_learners_errors():
    def broken(p, m):
        return p / m

    def stub(p, m):
        raise NotImplementedError()

    call = check_function(broken, "bubble")
    assert call(1, 2) == 0.5
    with pytest.raises(CheckFailed, match=r"bubble\(1, 0\) raised ZeroDivisionError") as info:
        call(1, 0)
    # No chained learner traceback is attached for IPython to print.
    assert info.value.__suppress_context__ and info.value.__cause__ is None
    with pytest.raises(NotAnswered, match="still raises NotImplementedError"):
        check_function(stub, "bubble")(1, 2)
    with pytest.raises(NotAnswered):
        check_function(None, "bubble")
    with pytest.raises(CheckFailed, match="should be a function"):
        check_function(3, "bubble")


@settings(max_examples=50, deadline=None)
@given(st.one_of(st.none(), st.booleans(), st.text(), st.floats(), st.lists(st.integers())))
def test_helpers_only_ever_raise_check_failed(value):
    for helper in (as_number, as_int, as_sequence):
        try:
            helper(value, "x")
        except CheckFailed as exc:
            assert str(exc).strip()  # always a message


def test_exercise_label_comes_from_the_check_module_convention():
    # Pretend to be course_utils.checks.l03.exercise_2, as a real check module declares it.
    namespace = {"__name__": "course_utils.checks.l03", "exercise": checks.exercise}
    exec(
        "@exercise(bubble_fraction='number')\ndef exercise_2(bubble_fraction):\n    pass\n",
        namespace,
    )
    with pytest.raises(NotAnswered, match=r"^Exercise 3\.2 is not answered yet: `bubble_fraction`"):
        namespace["exercise_2"](None)
    with pytest.raises(NotAnswered, match=r"^This exercise is not answered yet"):
        require(None, "x")


def test_render_traceback_is_only_the_message():
    exc = CheckFailed("Not quite.\nHint: count the idle slots.")
    assert exc._render_traceback_() == ["❌ Not quite.", "Hint: count the idle slots."]
    assert NotAnswered("x", exercise="Exercise 1.1")._render_traceback_() == [
        "✋ Exercise 1.1 is not answered yet: x"
    ]


def test_importing_checks_does_not_import_torch():
    # The framework and every lesson's check module (they import torch lazily, if at all).
    lessons = sorted(Path(checks.__file__).parent.glob("l[0-9]*.py"))
    modules = ["course_utils.checks", *(f"course_utils.checks.{p.stem}" for p in lessons)]
    code = (
        f"import sys\nfor m in {modules!r}:\n"
        "    __import__(m)\n    assert 'torch' not in sys.modules, m"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# -- in a real kernel --------------------------------------------------------------------------

CHECKER = textwrap.dedent(
    """
    from course_utils.checks import CheckFailed, as_number, close, passed

    def exercise_1(x):
        value = as_number(x, "bubble_fraction")
        if not close(value, 0.25):
            raise CheckFailed("bubble_fraction is not right yet. Hint: count idle slots.")
        passed("Right.")
    """
)


def _tiny_notebook(answer: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nb.cells = [
        nbformat.v4.new_code_cell(CHECKER),
        nbformat.v4.new_code_cell(f"answer = {answer}"),
        nbformat.v4.new_code_cell("exercise_1(answer)"),
    ]
    return nb


@pytest.mark.slow
def test_failed_check_in_a_kernel_shows_only_the_message():
    from course_utils.grading.notebook_tools import notebook_client

    nb = _tiny_notebook("float('nan')")
    nb.cells.append(nbformat.v4.new_code_cell("exercise_1(0.3)"))
    nb.cells.append(nbformat.v4.new_code_cell("exercise_1(None)"))
    nb.cells.append(nbformat.v4.new_code_cell("exercise_1(0.25)"))
    notebook_client(nb, timeout=60, kernel_name="python3", allow_errors=True).execute()
    nan, wrong, unanswered, right = (cell.outputs for cell in nb.cells[2:])
    for outputs, ename, text in [
        (nan, "CheckFailed", "❌ `bubble_fraction` is NaN"),
        (wrong, "CheckFailed", "❌ bubble_fraction is not right yet. Hint: count idle slots."),
        (unanswered, "NotAnswered", "✋ This exercise is not answered yet: `bubble_fraction`"),
    ]:
        (error,) = [o for o in outputs if o.output_type == "error"]
        assert error.ename == ename
        assert len(error.traceback) == 1 and error.traceback[0].startswith(text)
        assert "File " not in "\n".join(error.traceback)  # no frames from the checker
    assert right[0].text == "✅ Right.\n"


@pytest.mark.slow
def test_failed_check_is_a_failed_nbval_test(tmp_path):
    nbformat.write(_tiny_notebook("0.3"), tmp_path / "wrong.ipynb")
    nbformat.write(_tiny_notebook("0.25"), tmp_path / "right.ipynb")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env"]
        + ["-p", "no:cacheprovider", "--color=no", "-q", "-rN", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout
    assert "1 failed, 5 passed" in result.stdout
    assert "❌ bubble_fraction is not right yet" in result.stdout


def test_failing_call_names_tensors_by_shape_not_by_their_numbers():
    import numpy as np
    import torch

    from course_utils.checks import check_function

    def broken(parts, n):
        raise ValueError("boom")

    call = check_function(broken, "gather_outputs")
    with pytest.raises(CheckFailed) as info:
        call([torch.zeros(2, 3), torch.ones(2, 3)], np.int64(2))
    message = str(info.value)
    assert "gather_outputs([tensor(shape=(2, 3)), tensor(shape=(2, 3))], 2)" in message
    assert "0." not in message  # no tensor contents


def test_expect_choice_explains_the_wrong_option_chosen():
    from course_utils.checks import expect_choice

    hints = {"a": "a costs time, not memory.", "c": "c is about gradients."}
    expect_choice("b", "b", hints, "unused {got!r} {hint}")  # right: no error
    with pytest.raises(CheckFailed, match=r"^`fix` = 'c' is not it: c is about gradients\.$"):
        expect_choice("c", "b", hints, "`fix` = {got!r} is not it: {hint}")


@pytest.mark.parametrize(
    "value, expected",
    [
        (0.63, 0.625),
        (0.62, 0.625),
        (0.6, 0.625),
        (0.33, 1 / 3),
        (0.3, 1 / 3),
        (30, 27),
        (0.11, 7 / 64),
    ],
)
def test_a_too_rounded_answer_is_called_close_whichever_way_it_was_rounded(value, expected):
    from course_utils.checks import judge

    with pytest.raises(CheckFailed, match="close: give 3 significant figures"):
        judge(float(value), expected, "x", {})


@pytest.mark.parametrize(
    "value, expected", [(0.64, 0.625), (0.7, 0.625), (0.35, 1 / 3), (0.12, 7 / 64)]
)
def test_a_wrong_answer_is_not_called_close(value, expected):
    from course_utils.checks import judge

    assert judge(value, expected, "x", {}) is False  # the check goes on to its own hint


def test_numbers_declares_picks_drawn_together_and_derived_numbers():
    from course_utils.checks import DEFAULT, Variant, numbers, pick

    given = numbers(pick("1", (2, 4), [(3, 6), (4, 8)], "p", "m"), F=1.0, B=lambda g: 2 * g.F)
    assert given(DEFAULT) == {"p": 2, "m": 4, "F": 1.0, "B": 2.0}
    assert list(given(DEFAULT)) == ["p", "m", "F", "B"]
    drawn = [given(Variant(name)) for name in ("s1", "s2", "s3", "alice", "bob")]
    assert {(g["p"], g["m"]) for g in drawn} <= {(3, 6), (4, 8)}
    assert given(Variant("s1")) == given(Variant("s1"))  # the same student, the same numbers


def test_seeded_is_none_for_the_default_student_and_fixed_per_student():
    from course_utils.checks import DEFAULT, Variant

    assert DEFAULT.seeded("1seed") is None
    one, again = Variant("alice").seeded("1seed"), Variant("alice").seeded("1seed")
    assert one is not None and again is not None and one.random() == again.random()


def test_each_call_shows_the_call_and_hands_the_learner_a_copy():
    from course_utils.checks import each_call

    def grows(xs, n):
        xs.append(n)
        return len(xs)

    cases = [([1, 2], 3), ([], 0)]
    tried = list(each_call(check_function(grows, "grows"), cases))
    assert tried == [(([1, 2], 3), "grows([1, 2], 3)", 3), (([], 0), "grows([], 0)", 1)]
    assert cases == [([1, 2], 3), ([], 0)]  # the learner's append changed a copy


def test_as_action_reads_text_and_names_a_bad_one():
    from course_utils.actions import Action
    from course_utils.checks import as_action

    assert as_action("2F0", "a") == Action(2, "F", 0)
    with pytest.raises(CheckFailed, match=r"`a` is 'F2' \(a str\), which is not an action\. Write"):
        as_action("F2", "a")
    with pytest.raises(NotAnswered):
        as_action(None, "a")


def test_as_tensor_converts_and_checks_the_shape():
    import torch

    from course_utils.checks import as_tensor

    assert torch.equal(as_tensor([[1, 2]], "t", shape=(1, 2)), torch.tensor([[1.0, 2.0]]))
    with pytest.raises(CheckFailed, match=r"`t` has shape \(2,\); it should be \(1, 2\)"):
        as_tensor([1, 2], "t", shape=(1, 2))
    with pytest.raises(CheckFailed, match="should be a tensor, but it is 'x'"):
        as_tensor("x", "t")


def test_as_dict_names_the_keys_it_needs():
    from course_utils.checks import as_dict

    assert as_dict({"a": 1, "b": 2}, "d", ("a", "b")) == {"a": 1, "b": 2}
    with pytest.raises(CheckFailed, match=r"should be a dict with the keys 'a', 'b', but it is"):
        as_dict([1], "d", ("a", "b"))
    with pytest.raises(CheckFailed, match=r"`d` has no key 'b': give it all of 'a', 'b'\."):
        as_dict({"a": 1}, "d", ("a", "b"))


def test_a_diagnosis_judges_every_answer_and_never_names_the_right_one(capsys):
    from course_utils.checks import OTHERWISE, RIGHT

    namespace = {"__name__": "course_utils.checks.l03", "exercise": checks.exercise}
    namespace["tables"] = {
        "problem": {"b": RIGHT, "a": "The bars are even.", "c": "Sends are fast.", "d": "No."},
        "fix": {"a": RIGHT, OTHERWISE: "What lets stages overlap?"},
    }
    source = "@exercise(**tables)\ndef exercise_5(problem, fix):\n    return 'Right.'\n"
    exec(source, namespace)
    check = namespace["exercise_5"]
    check("B ", "a")
    assert capsys.readouterr().out == "✅ Right.\n"
    with pytest.raises(CheckFailed, match=r"^`problem` = 'c' is not it\. Sends are fast\.$"):
        check("c", "a")
    with pytest.raises(CheckFailed, match=r"^`fix` = 'd' is not it\. What lets stages overlap\?$"):
        check("b", "d")  # the right `problem` is not named (it would give it away)
    with pytest.raises(CheckFailed, match=r"2 answers are not right yet:\n- `problem` = 'c'"):
        check("c", "d")  # every wrong answer at once
    with pytest.raises(CheckFailed, match=r"one of 'a', 'b', 'c', 'd'"):  # in order: no clue
        check("e", "a")


def test_judge_takes_one_hint_for_every_wrong_answer_and_names_a_ratio_upside_down():
    from course_utils.checks import judge

    assert judge(2.0, 2.0, "gain", "Divide the makespans.")
    with pytest.raises(CheckFailed, match=r"^`gain` is upside down: before over after\.$"):
        judge(0.5, 2.0, "gain", "Divide the makespans.", upside_down="before over after")
    with pytest.raises(CheckFailed, match=r"^Divide the makespans\.$"):
        judge(3.0, 2.0, "gain", "Divide the makespans.", upside_down="before over after")
