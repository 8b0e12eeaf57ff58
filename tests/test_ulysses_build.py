"""Exercise 9.7's Build, Ulysses attention per rank: each commonest wrong program gets its own
hint, the verdict is recomputed from the evidence a kernel sends, the cases are the learner's
in the notebook and secret in the grader, heads the ranks do not divide are refused, and the
printed run shows the bytes both routes sent."""

from __future__ import annotations

import json

import buildprograms
import pytest
import torch
import ulyssesprograms as up
from checkskit import fails_with_its_own_hint

from course_utils.checks import CheckFailed, Variant, l09
from course_utils.checks.recorded_cases import UlyssesCase
from course_utils.checks.wire import Replay, call_outcome, decode, encode


@pytest.mark.parametrize("wrong", list(up.MISTAKES), ids=lambda f: f.__name__)
def test_the_commonest_mistakes_each_get_their_own_hint(wrong):
    fails_with_its_own_hint(l09.exercise_7, wrong, up.MISTAKES)


def test_a_collective_only_some_ranks_call_is_named_a_deadlock():
    with pytest.raises(CheckFailed, match="waits for rank .*same number of times"):
        l09.exercise_7(up.one_rank_only)


def test_the_verdict_comes_from_the_evidence_the_kernel_sends(capsys):
    variant = Variant("s7", cases_seed="grader")
    drawn = l09.cases_7(variant)["ulysses"]
    outcomes = [call_outcome(up.right, decode(encode(tuple(c))), 20) for c in drawn]
    l09.exercise_7(Replay("ulysses", drawn, outcomes), variant=variant)  # as the grader does
    assert capsys.readouterr().out.startswith("✅")
    forged = [{"result": encode({"passed": True, "score": 1})} for _ in drawn]
    with pytest.raises(CheckFailed, match="did not come back as the record of a run"):
        l09.exercise_7(Replay("ulysses", drawn, forged), variant=variant)
    lied = []  # the head split's record, with the second all-to-all's bytes added
    for c in drawn:
        record = decode(json.loads(json.dumps(call_outcome(up.no_second, c, 20)["result"])))
        for watch in record["watched"]:
            watch["collectives"].append(watch["collectives"][0])
        lied.append({"result": encode(record)})
    with pytest.raises(CheckFailed, match="rank 0 returned"):  # the outputs are judged
        l09.exercise_7(Replay("ulysses", drawn, lied), variant=variant)


def test_the_cases_are_the_learners_in_the_notebook_and_secret_in_the_grader():
    mine = l09.cases_7(Variant("alice"))["ulysses"]
    g = l09.given_7(Variant("alice"))
    first = mine[0][0]
    assert (first.devices, first.tokens, first.heads, first.dim) == (g.N, g.tokens, g.heads, g.dim)
    assert [c.causal for (c,) in mine[:2]] == [1, 0]  # causal and not, on their own ranks
    secret = l09.cases_7(Variant("alice", cases_seed="grader"))["ulysses"]
    assert secret[:2] == mine[:2] and secret[2:] != mine[2:]
    assert all(c.heads % c.devices == 0 for (c,) in mine + secret)


def test_heads_the_ranks_do_not_divide_are_refused():
    with pytest.raises(ValueError, match="3 ranks must divide the 4 heads"):
        UlyssesCase(devices=3, tokens=3, heads=4, dim=4, causal=1, seed=1)


def test_the_printed_run_measures_both_routes():
    from course_utils.parallel.context_parallel.ulysses_program import beside_ring

    lines = beside_ring(up.right, buildprograms.ring_attention, 4, 4, 4, 4)  # 9.2's ring
    assert float(lines[0].rsplit(" ", 1)[1]) < 1e-5
    assert "768 bytes with Ulysses" in lines[2] and "2.00x as much" in lines[2]  # N / 2


def test_ulysses_equals_full_attention_in_float64():
    from course_utils.parallel.context_parallel import attention
    from course_utils.parallel.context_parallel.ulysses_program import run_ulysses_program

    q, k, v = (torch.randn(6, 9, 5, dtype=torch.float64) for _ in range(3))
    run = run_ulysses_program(up.right, q, k, v, workers=3, causal=True)
    assert torch.allclose(torch.cat(run.results, dim=1), attention(q, k, v, causal=True))
