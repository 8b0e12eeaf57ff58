"""What crosses from a learner's kernel to the grader: answers as data, and a learner's
function called under the grader's limits (time and memory) with its outcome replayed."""

from __future__ import annotations

import json
import math
import time
from fractions import Fraction

import pytest
import torch

from course_utils.actions import Action
from course_utils.checks.wire import LearnerError, Replay, call_outcome, decode, encode
from course_utils.pipeline.schedules import make_schedule


@pytest.mark.parametrize(
    "value",
    [
        0.25,
        7,
        "b",
        None,
        True,
        [1, [2.5, "x"]],
        {"p": 4, "m": 12},
        Fraction(3, 15),
        Action(2, "F", 0),
    ],
)
def test_answers_cross_as_json_and_come_back_equal(value):
    assert decode(json.loads(json.dumps(encode(value)))) == value


def test_floats_json_cannot_write_and_tensors_keep_their_dtype():
    back = decode(json.loads(json.dumps(encode([math.nan, math.inf]))))
    assert math.isnan(back[0]) and back[1] == math.inf
    t = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    got = decode(json.loads(json.dumps(encode(t))))
    assert got.dtype == torch.float64 and torch.equal(got, t)
    schedule = make_schedule("1f1b", 2, 3)
    assert decode(json.loads(json.dumps(encode(schedule)))).devices == schedule.devices


def test_what_cannot_cross_is_refused():
    with pytest.raises(TypeError):
        encode(json)  # a module


def test_a_function_is_called_and_its_result_or_error_replayed():
    def bubble(p, m):
        return (p - 1) / (m + p - 1)

    def broken(p, m):
        return p / 0

    cases = [(4, 12), (2, 2)]
    replay = Replay("bubble", cases, [call_outcome(bubble, c, 5) for c in cases])
    assert replay(4, 12) == bubble(4, 12) and replay(2, 2) == bubble(2, 2)
    with pytest.raises(LookupError):
        replay(3, 3)  # only the graded inputs were called in the kernel
    failing = Replay("broken", cases, [call_outcome(broken, c, 5) for c in cases])
    with pytest.raises(LearnerError, match="division by zero") as info:
        failing(4, 12)
    assert type(info.value).__name__ == "ZeroDivisionError"


def test_a_function_that_runs_too_long_is_stopped_even_if_it_catches_exceptions():
    def stubborn(n):
        while True:
            try:
                time.sleep(0.01)
            except Exception:  # a learner's catch-all must not swallow the grader's limit
                pass

    start = time.perf_counter()
    outcome = call_outcome(stubborn, (1,), 0.3)
    assert "timeout" in outcome and time.perf_counter() - start < 2
    with pytest.raises(LearnerError, match="ran past 0.3 s"):
        Replay("stubborn", [(1,)], [outcome])(1)


def test_a_function_that_eats_memory_is_stopped_near_the_limit():
    def hungry(n):
        kept = []
        while True:
            kept.append(bytearray(8 << 20))  # 8 MiB at a time, as a huge list would grow

    outcome = call_outcome(hungry, (1,), 20, memory_limit=200 << 20)
    assert outcome.get("memory", "").startswith("used more than"), outcome
    with pytest.raises(LearnerError, match="memory") as info:
        Replay("hungry", [(1,)], [outcome])(1)
    assert type(info.value).__name__ == "MemoryError"


def test_a_rank_programs_case_crosses_and_says_how_the_program_is_called():
    from course_utils.checks.programs import ProgramCase

    case = ProgramCase(devices=2, batch=4, hidden=8, seed=5)
    back = decode(json.loads(json.dumps(encode((case,)))))
    assert back == (case,) and repr(back) == repr((case,))  # Replay finds it by its repr

    def program(ctx):  # the kernel runs it on the case's ranks, not program(case)
        if ctx.rank == 0:
            ctx.send(ctx.inputs[0], to=1)
        else:
            ctx.recv(0)

    outcome = call_outcome(program, back, 10)
    record = decode(json.loads(json.dumps(outcome["result"])))
    assert record["world"] == 2 and record["bytes_sent"] == [4 * 16 * 4, 0]
    with pytest.raises(ValueError, match="ProgramCase.batch"):
        ProgramCase(devices=2, batch=0, hidden=8, seed=5)
