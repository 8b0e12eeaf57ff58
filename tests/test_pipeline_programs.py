"""Pipeline schedules written as per-rank programs (Exercises 2.8, 4.7 and 5.7), judged from
the run's evidence: the commonest wrong programs each fail with their own hint, the solutions
pass (also on one core beside a busy loop), the recorded order replays through the simulator
to the schedule's own step, and the measured memory is the simulator's count."""

from __future__ import annotations

import pipeprograms as pipes
import pytest
from checkskit import beside_a_busy_loop

from course_utils.checks import CheckFailed, Variant, l02, l04, l05
from course_utils.checks.programs import ProgramCase, replayed, scorecard, target
from course_utils.pipeline import make_schedule, simulate

EXERCISES = {  # id: (check, its exercise, the schedule, the solution, its commonest mistakes)
    "2.8": (l02.exercise_8, l02.cases_8, "gpipe", pipes.gpipe, pipes.MISTAKES_8),
    "4.7": (l04.exercise_7, l04.cases_7, "1f1b", pipes.one_f_one_b, pipes.MISTAKES_7),
    "5.7": (l05.exercise_7, l05.cases_7, "interleaved", pipes.interleaved, pipes.MISTAKES_57),
}
MISTAKES = [
    pytest.param(k, wrong, id=f"{k}-{wrong.__name__}")
    for k, (*_, mistakes) in EXERCISES.items()
    for wrong in mistakes
]


@pytest.mark.parametrize("k, wrong", MISTAKES)
def test_each_common_mistake_fails_with_its_own_hint_only(k, wrong):
    exercise, *_, mistakes = EXERCISES[k]
    with pytest.raises(CheckFailed) as info:
        exercise(wrong)
    message = str(info.value)
    assert mistakes[wrong] in message, message
    others = [words for other, words in mistakes.items() if other is not wrong]
    assert not any(words in message for words in others), message


@pytest.mark.parametrize("k", EXERCISES)
def test_the_order_each_rank_ran_is_the_schedules_and_replays_to_its_step(k):
    _, cases, name, solution, _ = EXERCISES[k]
    for (case,) in cases(Variant("alice", cases_seed=3))[next(iter(cases()))]:
        run = case.run(solution)
        schedule = make_schedule(name, case.devices, case.microbatches, case.chunks)
        assert [list(acts) for acts in schedule.devices] == run.actions
        want = simulate(schedule, case.costs())
        assert replayed(run, case).makespan == pytest.approx(want.makespan)
        assert target(case, name).step == pytest.approx(want.makespan)
        # what the harness measured each rank holding is what the simulator counts
        assert run.saved_microbatches == list(want.peak_activations)


def test_the_cases_are_the_students_own_then_fixed_by_name_in_a_notebook_secret_graded():
    for cases, given in ((l02.cases_8, l02.given_8), (l04.cases_7, l04.given_7)):
        mine, again = cases(Variant("alice")), cases(Variant("alice"))
        other, graded = cases(Variant("bob")), cases(Variant("alice", cases_seed=1))
        (name,) = mine
        g = given(Variant("alice"))
        first = mine[name][0][0]
        assert (first.devices, first.microbatches) == (g["p"], g["m"])
        assert mine == again and mine[name][1:] != other[name][1:]
        assert graded[name][0] == mine[name][0] and graded[name][1:] != mine[name][1:]
    chunked = l05.cases_7(Variant("alice"))["interleaved_program"]
    assert all(case.chunks == 2 and case.microbatches % case.devices == 0 for (case,) in chunked)


def test_1f1b_holds_p_minus_r_micro_batches_and_gpipe_all_of_them():
    case = ProgramCase(devices=4, microbatches=7, batch=14, hidden=16, depth=4, seed=1)
    assert case.run(pipes.one_f_one_b).saved_microbatches == [4, 3, 2, 1]
    assert case.run(pipes.gpipe).saved_microbatches == [7, 7, 7, 7]
    kept = case.run(pipes.kept_after)  # the same order, each graph kept after its backward
    assert kept.actions == case.run(pipes.one_f_one_b).actions
    assert kept.saved_microbatches[0] == 7


def test_a_send_records_the_action_it_followed():
    case = ProgramCase(devices=2, microbatches=2, batch=4, hidden=8, depth=2, seed=1)
    run = case.run(pipes.gpipe)
    assert [(to, tag, after) for to, tag, _, after in run.sends[0]] == [
        (1, "('act', 0)", "0F0"),
        (1, "('act', 1)", "0F1"),
    ]
    assert [after for *_, after in run.sends[1]] == ["1B0", "1B1"]


def test_the_scorecard_prints_measured_against_target():
    case = ProgramCase(devices=3, microbatches=4, batch=8, hidden=16, depth=3, seed=2)
    run, naive = case.run(pipes.gpipe), case.run(pipes.gpipe, microbatches=1)
    text = scorecard(run, case, "gpipe", naive)
    want = target(case, "gpipe")
    assert f"{want.step:.4g} units" in text and "target (GPipe)" in text
    assert "measured on the virtual clock" in text and "simulated" in text
    assert str(want).startswith("Target (GPipe") and f"at most {want.held[0]}" in str(want)


def test_a_record_without_the_memory_is_not_a_run():
    from course_utils.checks.wire import Replay, encode

    cases = l04.cases_7()["one_f_one_b_program"]
    records = [case.__course_call__(pipes.one_f_one_b) for (case,) in cases]
    for record in records:
        del record["saved_microbatches"]
    forged = Replay("one_f_one_b_program", cases, [{"result": encode(r)} for r in records])
    with pytest.raises(CheckFailed, match="did not come back as the record of a run"):
        l04.exercise_7(forged)


@pytest.mark.slow  # a busy loop beside the test for a few seconds
def test_the_solutions_pass_on_one_core_beside_a_busy_loop(capsys):
    with beside_a_busy_loop():
        for exercise, _, _, solution, _ in EXERCISES.values():
            exercise(solution)
            assert capsys.readouterr().out.startswith("✅ Right")
