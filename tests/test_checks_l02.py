"""The lesson 02 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import functools
import math
import re
import time

import pipeprograms as pipes
import pytest
import roundprograms as rp

from course_utils.checks import CheckFailed, NotAnswered, Variant
from course_utils.checks import l02 as check
from course_utils.pipeline import CostModel, make_schedule, simulate
from course_utils.pipeline.simulate import validate


def gpipe_device(p, m, d):
    return [f"{d}F{k}" for k in range(m)] + [f"{d}B{k}" for k in range(m)]


def forward_backward_device(p, m, d):  # runs, but not GPipe: each forward followed by its backward
    return [a for k in range(m) for a in (f"{d}F{k}", f"{d}B{k}")]


def whole_pipeline_device(p, m, d):  # builds every device's list first: too big for HUGE
    if p > 1000:
        raise MemoryError("cannot build a pipeline that long")
    return gpipe_device(p, m, d)


def forwards_only_when_huge(p, m, d):
    return gpipe_device(p, m, d)[:m] if p > 1000 else gpipe_device(p, m, d)


def one_backward_missing(p, m, d):
    actions = gpipe_device(p, m, d)
    return actions[:-1] if d == 0 and p < 1000 else actions


RIGHT = {
    1: (["0F0", "0F1", "1F0", "0F2", "1F1", "1F2", "1B0", "0B0", "1B1", "0B1", "1B2", "0B2"],),
    2: ("0F6", "1F5"),
    3: (gpipe_device,),
    4: (27, 72 / 27),
    5: ("a", "b"),
    6: (rp.accumulate,),
    7: (1.0, 32.0),  # 0.1 ms + 450 kB / 500 MB/s; (4 + 1)(2 + 4) + 2 x 1
    8: (pipes.gpipe,),
    9: (3, 6),  # 2 stages of an MLP of 4 blocks: Linears [2, 3]; measured below
}


def test_ties_may_be_listed_either_way(capsys):
    check.exercise_1(
        ["0F0", "1F0", "0F1", "1F1", "0F2", "1F2", "1B0", "1B1", "0B0", "1B2", "0B1", "0B2"]
    )
    assert "✅" in capsys.readouterr().out


ORDER = RIGHT[1][0]  # GPipe on p = 2, m = 3 (F = 1, B = 2), by start
LIFO = ["0F0", "0F1", "1F0", "0F2", "1F1", "1F2", "1B2", "1B1", "1B0", "0B2", "0B1", "0B0"]

WRONG = [  # (exercise, arguments, words the hint must contain)
    (1, ([*ORDER[:6], "0B0", "1B0", *ORDER[8:]],), "1B0 starts first"),
    (1, (ORDER[:-1],), "missing"),
    (1, (["0F0", "0F0", *ORDER[2:]],), "twice"),
    (1, ([*ORDER[:-1], "2B2"],), "does not happen"),
    (1, (LIFO,), "first in, first out"),
    (1, (["0X0"],), "which is not an action"),
    (1, ("0F0 0F1",), "should be a list"),
    (2, ("0F5", "1F5"), "behind"),
    (2, ("0F7", "1F5"), "ahead"),
    (2, ("0B0", "1F5"), "no backward"),
    (2, ("0F", "1F5"), "needs a micro-batch number"),
    (2, ("1F6", "1F5"), "action of stage 0"),
    (2, ("0F5", "1F6"), re.compile(r"2 answers(.|\n)*`stage0_action`(.|\n)*`stage1_action`")),
    (4, (18, 72 / 27), "busy time"),
    (4, (72, 1.0), "naive"),
    (4, (24, 72 / 27), "Off by one slot"),
    (4, (30, 72 / 27), "Off by one slot"),
    (4, (40, 72 / 27), "Draw the forward half"),
    (4, (27.4, 72 / 27), "Draw the forward half"),
    (4, (27, 3.0), "speedup"),
    (4, (27, 4.0), "ideal"),
    (4, (27, 27 / 72), "upside down"),
    (4, (27, 2.7), "3 significant figures"),
    (4, (math.nan, 3.0), "NaN"),
    (4, (40, 4.0), re.compile(r"2 answers(.|\n)*`makespan`(.|\n)*`speedup`")),
    (5, ("b", "a"), re.compile(r"2 answers(.|\n)*`problem`(.|\n)*`fix`")),
    (7, (3.0, 40.0), re.compile(r"2 answers(.|\n)*`transfer_ms`(.|\n)*`step_ms`")),
    (5, ("b", "b"), "most grey"),
    (5, ("c", "b"), "fill-and-drain"),
    (5, ("a", "a"), "slow stage"),
    (5, ("a", "d"), "already the slow one"),
    (5, ("a", "z"), "should be one of"),
    (7, (0.9, 32.0), "leaves out the latency"),
    (7, (100.9, 32.0), "mixes units"),
    (7, (0.1, 32.0), "only the latency"),
    (7, (900.1, 32.0), "kilobytes"),
    (7, (7.3, 32.0), "kilobytes"),
    (7, (3.0, 32.0), "latency + bytes / bandwidth"),
    (7, (1.0, 30.0), "leaves the links out"),
    (7, (1.0, 38.0), "not every transfer adds"),
    (7, (1.0, 31.0), "the backward needs one too"),
    (7, (1.0, 50.0), "naive schedule"),
    (7, (1.0, 40.0), "Draw the chart"),
    (1, (["0F1", "0F0", *ORDER[2:]],), "both run on device 0"),
    (1, (["0F0", "1F0", "1B0", "0F1", "0F2", "1F1", "1F2", *ORDER[7:]],), "every forward before"),
    (2, ("0F6", "0F5"), "`stage1_action` should be an action of stage 1"),
    (3, (forward_backward_device,), "runs a backward before its last forward"),
    (3, (whole_pipeline_device,), "far too long to build whole"),
    (3, (forwards_only_when_huge,), "is not device 987654321's GPipe list"),
    (3, (one_backward_missing,), "The lists of gpipe_device("),
    (4, (27, 2.0), "`speedup` is not right"),
    (5, ("d", "b"), "Handing a tensor between threads takes microseconds"),
    (5, ("a", "c"), "The learning rate changes the maths"),
    (3, (lambda p, m, d: gpipe_device(p, m, (d + 1) % p),), "but device 0 runs stage 0 only"),
    *((6, (wrong,), words) for wrong, words in {**rp.MISTAKES_26, **rp.OTHERS_26}.items()),
    *((8, (wrong,), words) for wrong, words in {**pipes.MISTAKES_8, **pipes.OTHERS_8}.items()),
    (8, (pipes.one_f_one_b,), "it is not GPipe: all forwards first"),
    (8, pipes.reordered(check, 8, "gpipe_program", pipes.gpipe), "GPipe's is"),
    (9, (4, 6), "data batch"),
    (9, (2, 6), "the forward's count"),
    (9, (0, 6), "inside the forward"),
    (9, (5, 6), "Count the aten::mm calls inside 0B1"),
    (9, (3.5, 6), "Count the aten::mm calls inside 0B1"),
    (9, (3, 5), "its gradient is sent back"),
    (9, (3, 3), "backward makes two per Linear"),
    (9, (3, 7), "Count the aten::mm calls inside 1B1"),
    (9, ("3", 6), "without quotes"),
]


def test_lifo_backwards_get_the_same_convention_in_2_1_and_2_3():
    with pytest.raises(CheckFailed, match="first in, first out") as order:
        check.exercise_1(LIFO)

    def lifo_device(p, m, d):
        return [f"{d}F{k}" for k in range(m)] + [f"{d}B{k}" for k in reversed(range(m))]

    with pytest.raises(CheckFailed, match="first in, first out") as build:
        check.exercise_3(lifo_device)
    for info in (order, build):
        assert "valid schedule" in str(info.value) and "ScheduleGPipe" in str(info.value)
    # both are valid schedules: the simulator accepts the order the checks refuse
    assert validate([lifo_device(3, 4, d) for d in range(3)], 3, 4) == []


def test_build_exercise_catches_wrong_functions():
    def one_f_one_b_like(p, m, d):
        return [a for k in range(m) for a in (f"{d}F{k}", f"{d}B{k}")]

    def missing_backward(p, m, d):
        return [f"{d}F{k}" for k in range(m)]

    def wrong_stage(p, m, d):
        return gpipe_device(p, m, 0)

    def crashes(p, m, d):
        return [f"{d}F{k}" for k in range(m + "x")]

    def stub(p, m, d):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="backward before its last forward"):
        check.exercise_3(one_f_one_b_like)
    with pytest.raises(CheckFailed, match="missing|never"):
        check.exercise_3(missing_backward)
    with pytest.raises(CheckFailed, match="runs stage 1 only"):
        check.exercise_3(wrong_stage)
    with pytest.raises(CheckFailed, match="TypeError"):
        check.exercise_3(crashes)
    with pytest.raises(NotAnswered):
        check.exercise_3(stub)


def test_build_exercise_cannot_be_passed_by_building_the_whole_schedule(capsys):
    """One call of the library (make_schedule) cannot answer for a billion-stage pipeline:
    the check asks for devices of pipelines far too long to build, and says why it fails."""

    def from_library(p, m, d):
        if p > 10**4:  # what make_schedule("gpipe", p, m) would do: run out of time
            raise TimeoutError("ran past 20 s")
        return [str(a) for a in make_schedule("gpipe", p, m).devices[d]]

    with pytest.raises(CheckFailed, match="far too long to build whole"):
        check.exercise_3(from_library)
    start = time.perf_counter()
    check.exercise_3(gpipe_device)  # the learner's own construction answers at once
    assert capsys.readouterr().out.startswith("✅")
    assert time.perf_counter() - start < 5


def test_build_cases_are_fixed_by_the_grader_seed_and_cover_every_device():
    v = Variant("default", cases_seed=11)
    cases = check.cases_3(v)["gpipe_device"]
    assert cases == check.cases_3(v)["gpipe_device"]
    small = [c for c in cases if c not in check.HUGE]
    for p, m in {(p, m) for p, m, _ in small}:
        assert sorted(d for q, n, d in small if (q, n) == (p, m)) == list(range(p)) or (
            sum(1 for q, n, _ in small if (q, n) == (p, m)) % p == 0
        )


def test_exercise_2_5_flips_with_the_heavy_stage(capsys):
    heavy_first = next(
        Variant(f"s{i}")
        for i in range(200)
        if check.given_5(Variant(f"s{i}"))["blocks_on_stage0"] == 4
    )
    check.exercise_5("b", "d", variant=heavy_first)
    assert capsys.readouterr().out.startswith("✅")
    with pytest.raises(CheckFailed, match="device 0 is almost never idle"):
        check.exercise_5("a", "b", variant=heavy_first)
    with pytest.raises(CheckFailed, match="already the slow one"):
        check.exercise_5("b", "b", variant=heavy_first)


def right_for(variant):
    """The right answers of the exercises with per-student numbers."""
    g1, g2, g4, g5, g7 = (getattr(check, f"given_{k}")(variant) for k in (1, 2, 4, 5, 7))
    timeline = simulate(make_schedule("gpipe", g1["p"], g1["m"]))
    order = [str(e.action) for e in sorted(timeline.events, key=lambda e: (e.start, e.device))]
    moment = g2["stage"] + g2["microbatch"] + 1  # F = 1: forward sFk ends at s + k + 1
    makespan = (g4["m"] + g4["p"] - 1) * (g4["F"] + g4["B"])
    heavy_first = g5["blocks_on_stage0"] == 4
    transfer = g7["latency_us"] / 1000 + g7["message_kb"] / g7["bandwidth_mb_s"]
    costs = CostModel(forward=g7["F_ms"], backward=g7["B_ms"], p2p=transfer)
    return {
        1: (order,),
        2: (f"0F{moment}", f"1F{moment - 1}"),
        4: (makespan, g4["p"] * g4["m"] * (g4["F"] + g4["B"]) / makespan),
        5: ("b", "d") if heavy_first else ("a", "b"),
        8: (pipes.gpipe,),
        6: (rp.accumulate,),
        7: (transfer, simulate(make_schedule("gpipe", 2, g7["m"]), costs).makespan),
        9: profiled_mm(check.given_9(variant)),
    }


@functools.cache
def _profiled(p: int, depth: int) -> dict[str, int]:
    """aten::mm calls inside each backward of exercise 2.9's step, as torch.profiler's own
    trace counts them: the raw evidence the check's expectation must match."""
    import tempfile
    from pathlib import Path

    import torch

    from course_utils.measure.profiler import profile_step, read_profile
    from course_utils.models import MLP, loss_fn, partition
    from course_utils.pipeline.executor import PipelineExecutor

    torch.manual_seed(0)
    mlp = MLP(**check.MLP_9, depth=depth)
    x, y = torch.randn(64, 32), torch.randint(10, (64,))
    gpipe = make_schedule("gpipe", p, 4)
    with (
        tempfile.TemporaryDirectory() as folder,
        PipelineExecutor(partition(mlp, p), p, loss_fn, clock="wall") as executor,
    ):
        path = Path(folder) / "trace.json"
        profile_step(lambda: executor.step(gpipe, x, y), path, memory=False)
        profile = read_profile(path)
        return {
            a.name: profile.operators_in(a.name)["aten::mm"]
            for a in profile.actions
            if "B" in a.name
        }


def profiled_mm(g) -> tuple[int, int]:
    counts = _profiled(g["p"], g["depth"])
    return counts[f"0B{g['k']}"], counts[f"{g['p'] - 1}B{g['k']}"]


def test_exercise_2_9_expects_what_torch_profiler_counts_in_every_variant():
    for p, depth in [(2, 4), (2, 5), (3, 5), (3, 6), (2, 3)]:  # given_9's default and options
        linears = check.linears_per_stage(p, depth)
        counts = _profiled(p, depth)
        for k in range(4):
            assert counts[f"0B{k}"] == 2 * linears[0] - 1  # the data needs no gradient
            assert counts[f"{p - 1}B{k}"] == 2 * linears[-1]
            for s in range(1, p):
                assert counts[f"{s}B{k}"] == 2 * linears[s]
    assert profiled_mm(check.given_9()) == RIGHT[9]
