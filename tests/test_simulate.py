"""The simulator: timing rules, memory counting, and validate()'s messages for learners."""

from __future__ import annotations

import pytest

from course_utils.actions import Action, Schedule
from course_utils.errors import CourseInputError, ScheduleError
from course_utils.parallel.costs import ring_allreduce_time
from course_utils.pipeline.schedules import gpipe, one_f_one_b, zb_h1
from course_utils.pipeline.simulate import CostModel, simulate, validate


def _sched(devices: list[list[str]], stages: int, microbatches: int, name="mine") -> Schedule:
    parsed = tuple(tuple(Action.parse(a) for a in acts) for acts in devices)
    return Schedule(name, stages, microbatches, parsed)


# ------------------------------------------------------------------------------ timing rules


def test_two_stage_gpipe_by_hand():
    t = simulate(gpipe(2, 2), CostModel(forward=1, backward=2))
    times = {str(e.action): (e.start, e.end) for e in t.events}
    assert times == {
        "0F0": (0, 1),
        "0F1": (1, 2),
        "1F0": (1, 2),
        "1F1": (2, 3),
        "1B0": (3, 5),
        "1B1": (5, 7),
        "0B0": (5, 7),
        "0B1": (7, 9),
    }
    assert t.makespan == 9
    assert t.busy(0) == 6 and t.idle(0) == 3
    assert t.bubble_fraction == pytest.approx(6 / 18)
    assert t.source == "simulated" and t.peak_activations == [2, 2]


def test_p2p_is_added_only_between_devices():
    # Stages 0 and 1 on device 0, stage 2 on device 1: only the 1 -> 2 hop pays.
    sched = _sched([["0F0", "1F0", "1B0", "0B0"], ["2F0", "2B0"]], 3, 1)
    t = simulate(sched, CostModel(forward=1, backward=1, p2p=0.5, stage_forward=[1, 1, 1]))
    times = {str(e.action): (e.start, e.end) for e in t.events}
    assert times["1F0"] == (1, 2)  # same device: no transfer
    assert times["2F0"] == (2.5, 3.5)  # across devices: + p2p
    assert times["2B0"] == (3.5, 4.5)  # its own F is on the same device
    assert times["1B0"] == (5.0, 6.0)  # gradient comes back across: + p2p


def test_chunks_split_the_device_cost_and_per_stage_costs_override():
    sched = _sched([["0F0", "1F0", "1B0", "0B0"]], 2, 1)  # one device, two chunks
    t = simulate(sched, CostModel(forward=1, backward=2))
    assert t.makespan == pytest.approx(3)  # each chunk costs 1/2 of F and of B
    uneven = simulate(sched, CostModel(stage_forward=[1, 3], stage_backward=[2, 4]))
    assert uneven.makespan == pytest.approx(10)


def test_split_backward_costs_i_and_w_and_frees_memory_at_w():
    t = simulate(zb_h1(1, 2), CostModel(forward=1, backward=4, weight_fraction=0.25))
    durations = {str(e.action): e.duration for e in t.events}
    assert durations == {"0F0": 1, "0I0": 3, "0W0": 1, "0F1": 1, "0I1": 3, "0W1": 1}
    # A micro-batch is held from its F until its W: F0 I0 W0 F1 I1 W1 holds at most 1.
    assert t.peak_activations == [1]
    late_w = _sched([["0F0", "0I0", "0F1", "0I1", "0W0", "0W1"]], 1, 2)
    assert simulate(late_w).peak_activations == [2]


def test_naive_costs_scale_with_the_whole_batch():
    sched = Schedule(
        "naive",
        2,
        4,
        ((Action(0, "F", 0), Action(0, "B", 0)), (Action(1, "F", 0), Action(1, "B", 0))),
        batch_scale=4,
    )
    t = simulate(sched, CostModel(forward=1, backward=2, p2p=0.25))
    assert t.makespan == pytest.approx(2 * 4 * 3 + 2 * 4 * 0.25)


def test_communication_actions_in_a_schedule_are_ignored():
    plain = simulate(gpipe(2, 2))
    with_comm = Schedule(
        "gpipe",
        2,
        2,
        tuple(acts + (Action(d, "REDUCE_GRAD"),) for d, acts in enumerate(gpipe(2, 2).devices)),
    )
    assert validate(with_comm) == []
    assert simulate(with_comm).makespan == plain.makespan


def test_simulator_handles_a_large_schedule():
    t = simulate(one_f_one_b(16, 256))
    assert len(t.events) == 2 * 16 * 256
    assert t.makespan == pytest.approx((256 + 15) * 3)


# ------------------------------------------------------------------------------ cost model


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(forward=-1), "forward cost must be a finite number >= 0"),
        (dict(backward=float("nan")), "backward cost"),
        (dict(p2p=float("inf")), "p2p cost"),
        (dict(weight_fraction=1.5), "weight_fraction must be a number between 0 and 1"),
        (dict(stage_forward=[1, -2]), "stage_forward must be a list of numbers >= 0"),
    ],
)
def test_cost_model_rejects_bad_values(kwargs, words):
    with pytest.raises(CourseInputError, match=words):
        CostModel(**kwargs)


def test_per_stage_costs_need_one_value_per_stage():
    with pytest.raises(CourseInputError, match=r"one cost per stage \(2\), got 3"):
        simulate(gpipe(2, 2), CostModel(stage_forward=[1, 1, 1]))


def test_ring_allreduce_formula():
    # 2(N-1)/N * bytes/bandwidth + 2(N-1) * latency
    assert ring_allreduce_time(1e9, 4, 1e9) == pytest.approx(1.5)
    assert ring_allreduce_time(1e9, 4, 1e9, latency_s=1e-3) == pytest.approx(1.5 + 6e-3)
    assert ring_allreduce_time(123, 1, 1.0) == 0.0  # one worker: nothing to reduce
    with pytest.raises(CourseInputError, match="bandwidth"):
        ring_allreduce_time(1, 2, 0)
    with pytest.raises(CourseInputError, match="workers"):
        ring_allreduce_time(1, 0, 1)


# ------------------------------------------------------------------------------ validate()


def test_validate_accepts_good_orders_as_strings_actions_or_schedules():
    good = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]
    assert validate(good, 2, 2) == []
    assert validate([[Action.parse(a) for a in acts] for acts in good], 2, 2) == []
    assert validate(one_f_one_b(4, 8)) == []
    assert validate(zb_h1(3, 5)) == []


def test_validate_names_missing_actions():
    problems = validate([["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1B1"]], 2, 2)
    assert problems == ["1F1 is missing"]
    assert validate([["0F0", "0I0"]], 1, 1) == ["0W0 is missing (it goes with 0I0)"]
    assert validate([["0F0"]], 1, 1) == ["0B0 is missing"]


def test_validate_names_duplicates_and_where_they_are():
    problems = validate([["0F0", "0F0", "0B0"], ["1F0", "1B0"]], 2, 1)
    assert problems == ["0F0 appears twice (device 0)"]
    problems = validate([["0F0", "0B0", "1B0"], ["1F0", "1B0"]], 2, 1)
    assert "1B0 appears twice (devices 0, 1)" in problems


def test_validate_names_a_stage_split_over_devices():
    problems = validate([["0F0", "0B0", "1F0"], ["1B0"]], 2, 1)
    assert problems == ["stage 1 runs on devices 0 and 1: a stage lives on one device"]


def test_validate_names_mixed_backward_kinds_and_out_of_range_actions():
    assert validate([["0F0", "0B0", "0I0", "0W0"]], 1, 1) == [
        "0B0 and 0I0 both appear: use either B or the split I + W for a micro-batch, not both"
    ]
    problems = validate([["0F0", "0B0", "3F0", "0F7"]], 1, 1)
    assert "3F0 on device 0: there are only 1 stages (0-0)" in problems
    assert "0F7 on device 0: micro-batches are numbered 0-0" in problems


def test_validate_explains_a_deadlock_device_by_device():
    # Device 0 wants 0B0 before device 1 has sent 1B0; device 1 wants 1F1 before 0F1 exists.
    devices = [["0F0", "0B0", "0F1", "0B1"], ["1F0", "1F1", "1B0", "1B1"]]
    assert validate(devices, 2, 2) == [
        "deadlock: device 0 waits at 0B0 for 1B0, device 1 waits at 1F1 for 0F1"
    ]


def test_validate_points_out_an_action_waiting_for_its_own_device():
    assert validate([["0B0", "0F0"]], 1, 1) == [
        "deadlock: device 0 waits at 0B0 for 0F0, which comes later on device 0"
    ]


def test_validate_reads_bad_action_text_kindly():
    problems = validate([["0F0", "zap"]], 1, 1)
    assert len(problems) == 1 and "cannot read action 'zap'" in problems[0]


def test_simulate_raises_schedule_error_naming_stuck_actions():
    sched = _sched([["0F0", "0B0", "0F1", "0B1"], ["1F0", "1F1", "1B0", "1B1"]], 2, 2, "bad")
    with pytest.raises(ScheduleError) as info:
        simulate(sched)
    message = str(info.value)
    assert "bad cannot finish (deadlock)" in message
    assert "device 0 waits at 0B0 for 1B0" in message
    assert "device 1 waits at 1F1 for 0F1" in message


def test_simulate_refuses_an_incomplete_schedule():
    with pytest.raises(ScheduleError, match="1F1 is missing"):
        simulate(_sched([["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1B1"]], 2, 2))
