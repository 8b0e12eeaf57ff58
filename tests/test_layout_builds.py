"""Breadth-first with two stages per rank (Exercise 5.4), fill and drain on a V (Exercise
11.3) and data x pipeline parallelism on a grid of ranks (Exercise 12.9), written as
per-rank programs and judged from the run's evidence: the commonest wrong programs each
fail with their own hint, the solutions pass, breadth-first holds every micro-batch chunk
where depth-first does not, the V's order replays to fill and drain's step and holds every
micro-batch on both chunks at the turn, the grid's group sums take the bytes of one stage's
gradients, and the cases cross as data."""

from __future__ import annotations

import layoutprograms as progs
import pytest

from course_utils.checks import CheckFailed, Variant, l05, l11, l12
from course_utils.checks.pipeline_cases import (
    GridCase,
    VCase,
    grid_report,
    v_fill_drain,
    v_target,
)
from course_utils.checks.programs import ProgramCase, replayed, scorecard, target
from course_utils.checks.wire import decode, encode

EXERCISES = {
    "5.4": (l05.exercise_4, progs.MISTAKES_54, progs.MISTAKES_54),
    "11.3": (l11.exercise_3, progs.MISTAKES_113 | progs.OTHERS_113, progs.MISTAKES_113),
    "12.9": (l12.exercise_9, progs.MISTAKES_129 | progs.OTHERS_129, progs.MISTAKES_129),
}
WRONG = [
    pytest.param(k, wrong, id=f"{k}-{wrong.__name__}")
    for k, (_, hints, _) in EXERCISES.items()
    for wrong in hints
]


@pytest.mark.parametrize("k, wrong", WRONG)
def test_each_wrong_program_fails_with_its_own_hint(k, wrong):
    exercise, hints, commonest = EXERCISES[k]
    with pytest.raises(CheckFailed) as info:
        exercise(wrong)
    message = str(info.value)
    assert hints[wrong] in message, message
    if wrong in commonest:  # a further wrong program may repeat a commonest one's idea
        others = [words for other, words in commonest.items() if other is not wrong]
        assert not any(words in message for words in others), message


def test_the_solutions_pass_on_every_case(capsys):
    for exercise, solutions in (
        (l05.exercise_4, (progs.breadth_first,)),
        (l11.exercise_3, (progs.v_gpipe, progs.v_lifo)),
        (l12.exercise_9, (progs.grid,)),
    ):
        for solution in solutions:
            exercise(solution, variant=Variant("alice", cases_seed=2))
            assert capsys.readouterr().out.startswith("✅ Right")


def test_breadth_first_holds_every_chunk_where_depth_first_does_not_at_the_same_step():
    case = ProgramCase(devices=2, chunks=2, microbatches=6, batch=6, hidden=12, depth=4, seed=3)
    run = case.run(progs.breadth_first)
    breadth, depth = target(case, "breadth-first"), target(case, "interleaved")
    assert run.saved_microbatches == list(breadth.held) == [12, 12]
    assert depth.held[0] < 12  # depth-first starts its backwards early
    assert replayed(run, case).makespan == pytest.approx(breadth.step)


def test_the_v_runs_fill_and_drain_and_holds_every_micro_batch_at_the_turn():
    case = VCase(devices=3, chunks=2, microbatches=4, batch=8, hidden=12, depth=6, seed=3)
    run = case.run(progs.v_gpipe)
    assert case.placement() == [[0, 5], [1, 4], [2, 3]]
    assert [list(acts) for acts in v_fill_drain(3, 4).devices] == run.actions
    want = v_target(case)
    assert replayed(run, case).makespan == pytest.approx(want.step)
    assert run.saved_microbatches == list(want.held) == [8, 8, 8]
    # the turn is no message: rank 2 sends nothing to itself, and the bytes are the V's
    assert all(to != 2 for to, *_ in run.sends[2])
    assert "fill and drain on a V" in scorecard(run, case, want)


def test_the_grid_sums_each_stage_once_within_its_group():
    case = GridCase(devices=4, stages=2, microbatches=4, batch=8, hidden=12, depth=3, seed=4)
    run = case.run(progs.grid)
    sizes = [sum(p.numel() * 4 for p in piece.parameters()) for piece in case.build()[0]]
    partners = [
        [to for to, *_ in sends if to == case.partner(r)] for r, sends in enumerate(run.sends)
    ]
    assert [len(p) for p in partners] == [len(list(m.parameters())) for m in case.build()[0]]
    report = grid_report(run, case)
    assert all(f"{n:<20}{n:<11}" in report for n in sizes), report
    with pytest.raises(ValueError, match="replicas"):
        GridCase(devices=3, stages=2, microbatches=2, batch=2, hidden=8, seed=1)


def test_the_cases_cross_as_data_and_are_fixed_by_the_cases_seed():
    for cases, name in (
        (l05.cases_4, "breadth_first_program"),
        (l11.cases_3, "v_gpipe_program"),
        (l12.cases_9, "grid_program"),
    ):
        mine, graded = cases(Variant("alice")), cases(Variant("alice", cases_seed=1))
        assert mine == cases(Variant("alice")) and graded[name][0] == mine[name][0]
        assert graded[name][1:] != mine[name][1:]
        for (case,) in mine[name]:
            assert decode(encode(case)) == case
    g = l11.given_3(Variant("alice"))
    first = l11.cases_3(Variant("alice"))["v_gpipe_program"][0][0]
    assert (first.devices, first.microbatches) == (g["p"], g["m"])


def forged(exercise, cases, program, change) -> str:
    """The check's message on the run records of `program`, the first one changed by
    `change` (a kernel that sends a record of its own making)."""
    from course_utils.checks.wire import Replay

    (name,) = cases
    records = [case.__course_call__(program) for (case,) in cases[name]]
    change(records[0])
    replay = Replay(name, cases[name], [{"result": encode(r)} for r in records])
    with pytest.raises(CheckFailed) as info:
        exercise(replay)
    return str(info.value)


def later_first(record):  # rank 0 runs its second stage's micro-batches 1 then 0
    acts = record["actions"][0]
    i = next(k for k, a in enumerate(acts) if a.kind == "F" and a.stage >= record["world"])
    acts[i], acts[i + 1] = acts[i + 1], acts[i]


def elsewhere(record):  # rank 0's first activation sent past its neighbour
    to, tag, size, after = record["sends"][0][0]
    record["sends"][0][0] = (to + 1, tag, size, after)


def forged_messages() -> tuple[str, str]:
    return (
        forged(l05.exercise_4, l05.cases_4(), progs.breadth_first, later_first),
        forged(l11.exercise_3, l11.cases_3(), progs.v_gpipe, elsewhere),
    )


def test_a_record_slower_than_the_schedule_or_sent_elsewhere_fails_with_its_hint():
    slower, sent_elsewhere = forged_messages()
    assert "replays to a step of" in slower and "in the order they arrive" in slower
    assert "stage 1 lives on rank 1" in sent_elsewhere
    assert "a gradient back to the rank" in sent_elsewhere


def test_every_hint_of_the_layout_verdicts_is_reached():
    """Each hint of checks/breadth_first_build.py, v_pipeline_build.py and grid_build.py is
    what some wrong program (or forged record) above gets."""
    from pathlib import Path

    from test_checks_hints import hints_of

    said = []
    for exercise, wrongs in (
        (l05.exercise_4, progs.MISTAKES_54),
        (l11.exercise_3, progs.MISTAKES_113 | progs.OTHERS_113),
        (l12.exercise_9, progs.MISTAKES_129 | progs.OTHERS_129 | {lambda ctx: None: ""}),
    ):
        for wrong in wrongs:
            with pytest.raises(CheckFailed) as info:
                exercise(wrong)
            said.append(str(info.value))
    said.extend(forged_messages())
    text = "\n".join(said)
    for name in ("breadth_first_build", "v_pipeline_build", "grid_build"):
        path = Path(l05.__file__).parent / f"{name}.py"
        unreached = [h for h in hints_of(path) if h.fingerprint not in text]
        assert not unreached, (name, unreached)
