"""The per-rank Builds of lessons 06 to 09 (the ring all-reduce 6.4, DDP 6.8, the column-
parallel layer 7.1, a grid's process groups 7.5, the tensor-parallel MLP 7.8, ZeRO-2's step
8.2, sequence parallelism 9.1, the zig-zag ring 9.4): each commonest wrong program gets its
own hint, the verdict is recomputed from the evidence a kernel sends (a claim is not evidence),
the cases come from the learner's numbers in the notebook and from a secret seed in the
grader, and the solutions pass on one core beside a busy loop."""

from __future__ import annotations

import json
import threading

import dpprograms as dp
import pytest
import seqprograms as seq
import splitprograms as sp
from checkskit import beside_a_busy_loop

from course_utils.checks import CheckFailed, NotAnswered, Variant, l06, l07, l08, l09
from course_utils.checks.rank_cases import (
    ColumnCase,
    DDPCase,
    GroupsCase,
    RingCase,
    TPCase,
    ZeroCase,
    ZigzagCase,
)
from course_utils.checks.rank_references import ring_result
from course_utils.checks.wire import Replay, call_outcome, decode, encode

BUILDS = {  # name: (check, cases, the answer's name, the right program)
    "ring": (l06.exercise_4, l06.cases_4, "ring_all_reduce", dp.ring),
    "ddp": (l06.exercise_8, l06.cases_8, "ddp_program", dp.ddp),
    "tp": (l07.exercise_8, l07.cases_8, "tp_mlp", dp.tp),
    "column": (l07.exercise_1, l07.cases_1, "column_parallel", sp.column),
    "zero": (l08.exercise_2, l08.cases_2, "zero_step", sp.zero),
    "grid": (l07.exercise_5, l07.cases_5, "grid_groups", sp.grid),
    "zigzag": (l09.exercise_4, l09.cases_4, "zigzag_ring", sp.zigzag),
    "sequence": (l09.exercise_1, l09.cases_1, "sp_block", seq.sp),
}
MISTAKES = dp.MISTAKES | sp.MISTAKES  # the column-parallel layer's and ZeRO's: splitprograms
MISTAKES["sequence"] = seq.MISTAKES  # Megatron's sequence parallelism (9.1): seqprograms


@pytest.mark.parametrize("build", BUILDS)
def test_the_three_commonest_mistakes_each_get_their_own_hint(build):
    check = BUILDS[build][0]
    hints = {}
    for wrong, words in MISTAKES[build].items():
        with pytest.raises(CheckFailed) as info:
            check(wrong)
        assert words in str(info.value), (wrong.__name__, str(info.value))
        hints[wrong.__name__] = str(info.value)
    for name, message in hints.items():  # no mistake gets another's hint
        others = [w for wrong, w in MISTAKES[build].items() if wrong.__name__ != name]
        assert not any(w in message for w in others), (name, message)


@pytest.mark.parametrize("build", BUILDS)
def test_the_verdict_comes_from_the_evidence_the_kernel_sends(build, capsys):
    check, cases, name, right = BUILDS[build]
    variant = Variant("s7", cases_seed="grader")
    drawn = cases(variant)[name]
    assert drawn == cases(Variant("s7", cases_seed="grader"))[name]
    outcomes = [call_outcome(right, decode(encode(tuple(c))), 20) for c in drawn]
    check(Replay(name, drawn, outcomes), variant=variant)  # as the grader judges it
    assert capsys.readouterr().out.startswith("✅")
    forged = [{"result": encode({"passed": True, "score": 1})} for _ in drawn]
    with pytest.raises(CheckFailed, match="did not come back as the record of a run"):
        check(Replay(name, drawn, forged), variant=variant)
    # a record that claims what the run did not show: the failure wiped, right sums added
    wrong = next(iter(MISTAKES[build]))
    lied = []
    for c in drawn:
        outcome = call_outcome(wrong, c, 20)
        assert "result" in outcome, outcome
        record = decode(json.loads(json.dumps(outcome["result"])))
        record.update(failure=None, passed=True, verdict="✅ Right")
        lied.append({"result": encode(record)})
    with pytest.raises(CheckFailed):
        check(Replay(name, drawn, lied), variant=variant)


@pytest.mark.parametrize("build", BUILDS)
def test_a_stub_is_not_answered(build):
    check = BUILDS[build][0]

    def stub(ctx, *args, **kwargs):
        raise NotImplementedError()

    with pytest.raises(NotAnswered):
        check(stub)


@pytest.mark.parametrize("build", BUILDS)
def test_the_notebook_tries_the_learners_numbers_the_grader_secret_ones(build):
    _, cases, name, _ = BUILDS[build]
    mine = cases(Variant("alice"))[name]
    assert mine == cases(Variant("alice"))[name]  # the same on every run of the notebook
    assert mine[1:] != cases(Variant("bob"))[name][1:]
    secret = cases(Variant("alice", cases_seed="a1"))[name]
    assert secret[0] == mine[0] and secret[1:] != mine[1:]
    assert secret != cases(Variant("alice", cases_seed="a2"))[name]


def test_the_learners_own_case_uses_their_numbers():
    g4, g8 = l06.given_4(Variant("alice")), l06.given_8(Variant("alice"))
    (ring,) = l06.cases_4(Variant("alice"))["ring_all_reduce"][0]
    assert (ring.devices, ring.length) == (g4["ranks"], g4["length"])
    (ddp,) = l06.cases_8(Variant("alice"))["ddp_program"][0]
    assert (ddp.bucket_cap, ddp.microbatches) == (g8["bucket_cap"], g8["microbatches"])
    g = l07.given_8(Variant("alice"))
    (tp,) = l07.cases_8(Variant("alice"))["tp_mlp"][0]
    assert (tp.tokens, tp.d_model) == (g["tokens"], g["d_model"])
    g1, g2 = l07.given_1(Variant("alice")), l08.given_2(Variant("alice"))
    (column,) = l07.cases_1(Variant("alice"))["column_parallel"][0]
    assert (column.tokens, column.d_out) == (g1["tokens"], g1["d_out"])
    (zero,) = l08.cases_2(Variant("alice"))["zero_step"][0]
    assert (zero.devices, zero.hidden) == (g2["N"], g2["hidden"])
    g5 = l07.given_5(Variant("alice"))
    (grid,) = l07.cases_5(Variant("alice"))["grid_groups"][0]
    assert (grid.tp, grid.dp) == (g5["tp"], g5["dp"])
    g4 = l09.given_4(Variant("alice"))
    (ring,) = l09.cases_4(Variant("alice"))["zigzag_ring"][0]
    assert (ring.devices, ring.chunk) == (g4["N"], g4["chunk"])


def test_the_cases_cross_to_a_kernel_as_data():
    cases = (RingCase(3, 7, 1), DDPCase(2, 8, 16, 2, 2, 300, 5), TPCase(3, 4, 6, 10, 2))
    cases += (ColumnCase(3, 4, 5, 7, 1), ZeroCase(3, 6, 9, 2, 2), GroupsCase(2, 3, 1))
    for case in (*cases, ZigzagCase(3, 2, 4, 1)):
        assert decode(json.loads(json.dumps(encode(case)))) == case
        assert repr(case) != repr(type(case)(*[v + 1 for v in vars(case).values()]))
    with pytest.raises(ValueError, match="RingCase.length"):
        RingCase(3, 0, 1)


def test_the_rings_replay_equals_its_formula_with_uneven_chunks():
    from course_utils.threads.clock import replay_messages

    for case in (RingCase(4, 10, 1), RingCase(5, 23, 2), RingCase(3, 2, 3), RingCase(1, 4, 4)):
        run = decode(json.loads(json.dumps(encode(case.__course_call__(dp.ring)))))
        seconds = replay_messages(run["messages"], l06.RING_LINKS)
        assert seconds == pytest.approx(case.seconds(), rel=1e-9, abs=1e-15)
        data = case.data()
        assert all(ring_result(data, r).equal(sum(data)) for r in range(case.devices))
    slow = decode(
        json.loads(json.dumps(encode(RingCase(4, 10, 1).__course_call__(dp.ring_in_turn))))
    )
    assert replay_messages(slow["messages"], l06.RING_LINKS) > 2 * RingCase(4, 10, 1).seconds()


def test_the_ddp_check_judges_the_order_of_events_not_the_clock():
    """A right program passes whatever its timings; one whose all-reduces are all issued
    after the backward fails, however the clock came out."""
    case = DDPCase(2, 32, 16, 2, 2, 300, 5)
    run = decode(json.loads(json.dumps(encode(case.__course_call__(dp.ddp)))))
    assert all(c["in"] == f"{r}B1" for r, calls in enumerate(run["collectives"]) for c in calls)
    late = decode(json.loads(json.dumps(encode(case.__course_call__(dp.ddp_after_backward)))))
    assert all(c["in"] is None for calls in late["collectives"] for c in calls)


@pytest.mark.slow  # a busy loop beside the test for several seconds
def test_the_solutions_pass_on_one_core_beside_a_busy_loop(capsys):
    before = set(threading.enumerate())
    with beside_a_busy_loop():
        for check, _, _, right in BUILDS.values():
            check(right)
    assert capsys.readouterr().out.count("✅ Right") == len(BUILDS)
    assert set(threading.enumerate()) <= before
