"""Gradient accumulation (Exercise 2.6), GPipe in rounds under a memory budget (3.4) and ZB-H1
(4.4), written as
per-rank programs and judged from the run's evidence: the commonest wrong programs each fail
with their own hint, the solutions pass, the recorded order is the schedule's and replays to
its step, and what the harness counted held is what the simulator counts."""

from __future__ import annotations

import pytest
import roundprograms as rp
import torch

from course_utils.checks import CheckFailed, Variant, l02, l03, l04, rounds_build
from course_utils.checks.pipeline_cases import BudgetCase, SplitCase
from course_utils.checks.programs import replayed, target
from course_utils.checks.wire import Replay, decode, encode
from course_utils.pipeline import make_schedule, simulate

BUDGET = l03.room(l03.given_4())  # the default student's


def check_34(program):
    l03.exercise_4(BUDGET, program)


EXERCISES = {  # id: (the check of one program, its commonest mistakes, further ones)
    "2.6": (l02.exercise_6, rp.MISTAKES_26, rp.OTHERS_26),
    "3.4": (check_34, rp.MISTAKES_34, rp.OTHERS_34),
    "4.4": (l04.exercise_4, rp.MISTAKES_44, rp.OTHERS_44),
}
WRONG = [
    pytest.param(k, wrong, id=f"{k}-{wrong.__name__}")
    for k, (_, mistakes, others) in EXERCISES.items()
    for wrong in [*mistakes, *others]
]


@pytest.mark.parametrize("k, wrong", WRONG)
def test_each_wrong_program_fails_with_its_own_hint_only(k, wrong):
    check, mistakes, others = EXERCISES[k]
    with pytest.raises(CheckFailed) as info:
        check(wrong)
    message = str(info.value)
    words = {**mistakes, **others}
    assert words[wrong] in message, message
    assert not any(w in message for other, w in words.items() if other is not wrong), message


def test_the_solutions_pass_on_the_learners_own_cases_and_fresh_ones(capsys):
    for student in ("default", "alice"):
        l03.exercise_4(l03.room(l03.given_4(Variant(student))), rp.rounds, variant=Variant(student))
        l04.exercise_4(rp.zb_h1, variant=Variant(student))
    said = capsys.readouterr().out
    assert (
        said.count("✅ Right") == 4 and "take 3 rounds" in said and "rank 0 idles 3 units" in said
    )


def test_rounds_run_in_order_hold_the_budget_and_replay_to_their_target():
    for (case,) in l03.cases_4(Variant("bob", cases_seed=2))["rounds_program"]:
        run = case.run(rp.rounds)
        schedule = rounds_build.schedule(case)
        assert [list(acts) for acts in schedule.devices] == run.actions
        want = rounds_build.target(case)
        assert replayed(run, case).makespan == pytest.approx(want.makespan)
        assert run.saved_microbatches == list(want.peak_activations) == [case.budget] * case.devices
        assert rounds_build.rounds(run.actions[0]) == [
            len(range(s, min(s + case.budget, case.microbatches)))
            for s in range(0, case.microbatches, case.budget)
        ]


def test_the_zb_h1_program_runs_the_registrys_order_and_its_memory():
    for p, m in [(1, 3), (2, 1), (3, 2), (3, 5), (4, 7)]:
        case = SplitCase(devices=p, microbatches=m, batch=m, hidden=8, depth=p, seed=1)
        run = case.run(rp.zb_h1)
        schedule = make_schedule("zb-h1", p, m)
        assert [list(acts) for acts in schedule.devices] == run.actions
        want = simulate(schedule, case.costs())
        assert replayed(run, case).makespan == pytest.approx(target(case, "zb-h1").step)
        assert run.saved_microbatches == list(want.peak_activations)


def test_each_i_and_w_says_whether_the_weights_gradients_changed_in_it():
    case = SplitCase(devices=2, microbatches=2, batch=4, hidden=8, depth=2, seed=1)
    notes = case.__course_call__(rp.zb_h1)["split"]
    assert notes[1] == [("1I0", False), ("1I1", False), ("1W0", True), ("1W1", True)]
    wrong = case.__course_call__(rp.w_with_i)["split"]
    assert ("1I0", True) in wrong[1] and ("1W0", False) in wrong[1]


def test_the_cases_are_the_students_own_then_fixed_by_name_secret_graded():
    for cases, given, name in (
        (l03.cases_4, l03.given_4, "rounds_program"),
        (l04.cases_4, l04.given_4, "zb_h1_program"),
    ):
        mine, other = cases(Variant("alice")), cases(Variant("bob"))
        graded = cases(Variant("alice", cases_seed=1))
        g = given(Variant("alice"))
        first = mine[name][0][0]
        assert (first.devices, first.microbatches) == (g["p"], g["m"])
        assert mine == cases(Variant("alice")) and mine[name][1:] != other[name][1:]
        assert graded[name][0] == mine[name][0] and graded[name][1:] != mine[name][1:]
        assert all(decode(encode(case)) == case for (case,) in mine[name])
    budgets = [c.budget < c.microbatches for (c,) in l03.cases_4()["rounds_program"]]
    assert all(budgets)  # every case takes rounds
    assert "room for 4 micro-batches per rank" in repr(BudgetCase(2, 4, 8, 1, budget=4))


def test_a_record_without_the_notes_of_i_and_w_is_not_a_run():
    cases = l04.cases_4()["zb_h1_program"]
    records = [case.__course_call__(rp.zb_h1) for (case,) in cases]
    for record in records:
        del record["split"]
    forged = Replay("zb_h1_program", cases, [{"result": encode(r)} for r in records])
    with pytest.raises(CheckFailed, match="did not come back as the record of a run"):
        l04.exercise_4(forged)


def test_accumulation_gets_the_loss_unscaled_and_its_cases_never_have_as_many_ranks_as_mbs():
    cases = [c for (c,) in l02.cases_6(Variant("carol"))["accumulate_program"]]
    assert all(c.devices != c.microbatches for c in cases) and cases[0].devices == 2
    run, whole = cases[0].run(rp.accumulate), cases[0].reference()["grads"]
    assert None not in run.losses  # mean_loss records each micro-batch's loss, as loss does
    assert all(torch.allclose(g, whole[k], atol=1e-6) for d in run.grads for k, g in d.items())
    assert "the loss is yours to scale" in str(
        cases[0].run(rp.old_loss, raise_failure=False).failure
    )


def test_the_kernel_gets_the_cases_and_never_the_verdicts(tmp_path):
    import nbformat

    from course_utils.grading import stand_in
    from course_utils.grading.grader import solution_for

    solution = nbformat.read(solution_for(3), as_version=4)
    folder = stand_in.write(tmp_path / "checks", solution, l03, Variant("s7"))
    assert (folder / "pipeline_cases.py").exists()
    for verdict in ("rounds_build", "zero_bubble_build", "accumulation_build", "pipeline_hints"):
        assert not (folder / f"{verdict}.py").exists(), verdict
    assert "room" not in (folder / "l03.py").read_text()  # 3.4's budget stays the grader's
