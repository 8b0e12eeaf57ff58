"""Exercise 8.4 (Build): FSDP's forward with prefetch depth k as the program every rank runs.

The right program passes on the learner's case and fresh ones; each commonest wrong program
(waiting on each gather at once, never letting a gathered layer go, prefetching every layer
at the start, gathering a layer twice, running one layer too few or too many ahead) gets its
own hint; the verdict is recomputed from the evidence a kernel sends; the cases come from the
learner's numbers in the notebook and from a secret seed in the grader."""

from __future__ import annotations

import json

import pytest
from prefetchprograms import MISTAKES, never_freed, right

from course_utils.checks import CheckFailed, NotAnswered, Variant, l08
from course_utils.checks.recorded_cases import PrefetchCase
from course_utils.checks.wire import Replay, call_outcome, decode, encode


def test_the_right_program_passes_and_prints_the_memory_price(capsys):
    l08.exercise_4(right)
    said = capsys.readouterr().out
    k = l08.given_4(Variant("default"))["prefetch"]
    assert said.startswith("✅") and f"held up to {k + 1} gathered layers" in said


def test_the_commonest_mistakes_each_get_their_own_hint():
    hints = {}
    for wrong, words in MISTAKES.items():
        with pytest.raises(CheckFailed) as info:
            l08.exercise_4(wrong)
        assert words in str(info.value), (wrong.__name__, str(info.value))
        hints[wrong.__name__] = str(info.value)
    for name, message in hints.items():  # no mistake gets another's hint
        others = [w for wrong, w in MISTAKES.items() if wrong.__name__ != name]
        assert not any(w in message for w in others), (name, message)


def test_a_rank_that_skips_a_gather_is_a_deadlock_named_at_once():
    def skips(ctx):
        if ctx.rank == 1:
            return ctx.inputs[ctx.rank]
        return right(ctx)

    with pytest.raises(CheckFailed, match="never finished.*deadlock.*every rank gathers"):
        l08.exercise_4(skips)


def test_a_stub_is_not_answered():
    def stub(ctx):
        raise NotImplementedError()

    with pytest.raises(NotAnswered):
        l08.exercise_4(stub)


def test_the_verdict_comes_from_the_evidence_the_kernel_sends(capsys):
    variant = Variant("s7", cases_seed="grader")
    drawn = l08.cases_4(variant)["fsdp_forward"]
    outcomes = [call_outcome(right, decode(encode(tuple(c))), 20) for c in drawn]
    l08.exercise_4(Replay("fsdp_forward", drawn, outcomes), variant=variant)
    assert capsys.readouterr().out.startswith("✅")
    forged = [{"result": encode({"passed": True, "score": 1})} for _ in drawn]
    with pytest.raises(CheckFailed, match="did not come back as the record of a run"):
        l08.exercise_4(Replay("fsdp_forward", drawn, forged), variant=variant)
    lied = []  # a record that claims a pass: what the run did still shows
    for c in drawn:
        record = decode(json.loads(json.dumps(call_outcome(never_freed, c, 20)["result"])))
        record.update(failure=None, passed=True, verdict="✅ Right")
        lied.append({"result": encode(record)})
    with pytest.raises(CheckFailed, match="let its gathered tensor go"):
        l08.exercise_4(Replay("fsdp_forward", drawn, lied), variant=variant)


def test_the_notebook_tries_the_learners_numbers_the_grader_secret_ones():
    g = l08.given_4(Variant("alice"))
    mine = l08.cases_4(Variant("alice"))["fsdp_forward"]
    (case,) = mine[0]
    assert (case.devices, case.depth, case.hidden, case.prefetch) == (
        g["N"],
        g["depth"],
        g["hidden"],
        g["prefetch"],
    )
    assert mine == l08.cases_4(Variant("alice"))["fsdp_forward"]
    assert mine[1:] != l08.cases_4(Variant("bob"))["fsdp_forward"][1:]
    secret = l08.cases_4(Variant("alice", cases_seed="a1"))["fsdp_forward"]
    assert secret[0] == mine[0] and secret[1:] != mine[1:]
    assert {c.prefetch for (c,) in secret[1:]} & {0, 1} and max(c.prefetch for (c,) in secret) > 1


def test_the_case_crosses_to_a_kernel_as_data():
    case = PrefetchCase(3, 4, 20, 0, 5, 6)
    assert decode(json.loads(json.dumps(encode(case)))) == case
    with pytest.raises(ValueError, match="PrefetchCase.depth"):
        PrefetchCase(2, 0, 20, 1, 5, 4)
