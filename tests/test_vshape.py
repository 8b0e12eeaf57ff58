"""V-shaped schedules (ZB-V, DualPipeV): placement, PyTorch's orders, the closed forms against
the simulator, and real runs on threads that match the unsplit model."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from course_utils.actions import Action, Schedule
from course_utils.charts import gantt
from course_utils.errors import CourseInputError, ScheduleError
from course_utils.models import MLP, loss_fn, partition, single_thread
from course_utils.pipeline.executor import PipelineExecutor, simulated_from_measured
from course_utils.pipeline.schedules import interleaved, make_schedule
from course_utils.pipeline.simulate import simulate, simulate_arrays, validate
from course_utils.pipeline.vshape import (
    bubble_fraction,
    chunk_costs,
    dualpipe_v,
    dualpipe_v_early_send_formula_holds,
    dualpipe_v_early_send_idle,
    dualpipe_v_formula_holds,
    dualpipe_v_idle,
    dualpipe_v_peak,
    dualpipe_v_slots,
    transfers_per_microbatch,
    v_stages,
    zb_v,
    zb_v_formula_holds,
    zb_v_idle,
    zb_v_peak,
)

BUILDERS = {"zb-v": zb_v, "dualpipe-v": dualpipe_v}


def idle_per_device(schedule: Schedule, F: float, I: float, W: float) -> list[float]:  # noqa: E741
    result = simulate_arrays(schedule, chunk_costs(F, I, W))
    return [result["makespan"] - busy for busy in result["busy"]]


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


# --------------------------------------------------------------------------- structure


@pytest.mark.parametrize("name", BUILDERS)
def test_v_placement_and_validity(name):
    for p in range(1, 6):
        for m in range(2 * p if name == "dualpipe-v" else 1, 3 * p + 2):
            sched = BUILDERS[name](p, m)
            assert validate(sched) == [], (name, p, m)
            assert sched.stages == 2 * p and sched.chunks == 2 and sched.microbatches == m
            expected = {s: d for d in range(p) for s in v_stages(p, d)}
            assert sched.device_of_stage() == expected
            assert expected[0] == expected[2 * p - 1] == 0  # input and loss on device 0


def test_dualpipe_v_slots_are_single_actions_or_forward_then_backward():
    p, m = 3, 8
    slots = dualpipe_v_slots(p, m)
    flat = [[a for slot in dev for a in slot] for dev in slots]
    assert flat == [list(acts) for acts in dualpipe_v(p, m).devices]
    pairs = [slot for dev in slots for slot in dev if len(slot) == 2]
    assert pairs and all(f.kind == "F" and b.kind == "B" for f, b in pairs)
    assert all(f.stage != b.stage for f, b in pairs)  # the two chunks of one device


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: zb_v(0, 4), "devices must be an integer >= 1"),
        (lambda: zb_v(2, 0), "microbatches must be an integer >= 1"),
        (lambda: zb_v(2, 2.0), "microbatches must be an integer"),
        (lambda: zb_v(True, 2), "devices must be an integer"),
        (lambda: zb_v(1000, 1000), "at most"),
        (lambda: dualpipe_v(3, 5), "microbatches must be >= 2 x devices = 6"),
        (lambda: v_stages(3, 3), "device must be an integer in 0..2"),
        (lambda: chunk_costs(1.0, float("nan"), 1.0), "input_grad must be a finite number"),
        (lambda: zb_v_idle(3, 1.0, math.inf, 1.0), "I must be a finite number"),
        (lambda: dualpipe_v_idle(3, 1, 1, 1, fb=-1.0), "fb must be a finite number"),
        (
            lambda: Schedule("x", 2, 1, ((Action(0, "F", 0),),), send_groups=((2,),)),
            "send_groups must give, per device, sizes >= 1",
        ),
        (lambda: transfers_per_microbatch(3, "zigzag"), "placement must be 'looping' or 'v'"),
        (lambda: make_schedule("zb-v", 2, 4, chunks=2), "chunks > 1 works only with"),
        (lambda: make_schedule("dualpipe-v", 3, 5), "microbatches must be >= 2 x devices = 6"),
    ],
)
def test_bad_input_is_refused_with_one_line(call, message):
    with pytest.raises(CourseInputError, match=message) as info:
        call()
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- PyTorch


def torch_order(schedule_class, p: int, m: int) -> tuple[list[list[str]], list[list[tuple]]]:
    """PyTorch's order table as our strings (overlapped F&B slots flattened, F first), and
    the overlapped pairs per rank."""
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    orders, pairs = [], []
    for rank in get_schedule_ops(schedule_class, p, m):
        order, overlapped = [], []
        for a in rank:
            if a is None:
                continue  # an idle slot in PyTorch's table
            if a.sub_actions:  # OVERLAP_F_B
                overlapped.append(tuple(str(s) for s in a.sub_actions))
                order += [str(s) for s in a.sub_actions]
            elif a.computation_type.name in COMPUTE:  # by name: the values changed after 2.10
                order.append(str(a))
        orders.append(order)
        pairs.append(overlapped)
    return orders, pairs


COMPUTE = {"FORWARD", "FULL_BACKWARD", "BACKWARD_INPUT", "BACKWARD_WEIGHT"}
SHAPES = [(1, 2), (2, 1), (2, 3), (2, 4), (2, 7), (3, 2), (3, 5), (3, 6), (3, 9), (4, 8), (4, 11)]


@pytest.mark.parametrize("p, m", SHAPES)
def test_zb_v_matches_pytorch(p, m):
    from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble

    # Identical, including m < 2p-1, where PyTorch (like us) builds the order for 2p-1
    # micro-batches and blanks out those that do not exist.
    orders, _ = torch_order(ScheduleZBVZeroBubble, p, m)
    assert zb_v(p, m).as_strings() == orders


@pytest.mark.parametrize("p, m", [(p, m) for p, m in SHAPES if m >= 2 * p] + [(3, 7), (4, 9)])
def test_dualpipe_v_matches_pytorch_with_each_overlapped_pair_as_f_then_b(p, m):
    from torch.distributed.pipelining.schedules import ScheduleDualPipeV

    orders, pairs = torch_order(ScheduleDualPipeV, p, m)
    assert dualpipe_v(p, m).as_strings() == orders
    assert dualpipe_v(p, m, early_send=True).as_strings() == orders
    ours = [[tuple(map(str, s)) for s in dev if len(s) == 2] for dev in dualpipe_v_slots(p, m)]
    assert ours == pairs


def test_pytorch_refuses_dualpipe_v_below_2p_microbatches_like_us():
    from torch.distributed.pipelining.schedules import ScheduleDualPipeV

    with pytest.raises(ValueError, match="at least as many microbatches as stages"):
        torch_order(ScheduleDualPipeV, 3, 5)
    with pytest.raises(CourseInputError):
        dualpipe_v(3, 5)


# --------------------------------------------------------------------------- closed forms

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def zb_v_case(draw):
    p = draw(st.integers(1, 6))
    m = draw(st.integers(max(1, 2 * p - 1), 4 * p + 2))
    I = draw(st.floats(0.05, 3.0))  # noqa: E741
    W = draw(st.floats(I / 2, I))
    F = draw(st.floats(0.0, I))
    return p, m, F, I, W


@SETTINGS
@given(zb_v_case())
def test_zb_v_idle_and_bubble_match_the_simulator_inside_the_condition(case):
    p, m, F, I, W = case  # noqa: E741
    assert zb_v_formula_holds(p, m, F, I, W)
    timeline = simulate(zb_v(p, m), chunk_costs(F, I, W))
    for d in range(p):
        assert close(timeline.idle(d), zb_v_idle(p, F, I, W))
    fraction = bubble_fraction(m, F, I, W, zb_v_idle(p, F, I, W))
    assert close(timeline.bubble_fraction, fraction)


@SETTINGS
@given(st.integers(3, 12), st.floats(0.05, 3.0), st.floats(0.0, 1.0), st.floats(0.5, 4.0))
def test_zb_v_two_devices_need_no_w_at_most_i(m, I, f, w):  # noqa: E741
    # For p = 2 the W <= I part of the condition is not needed: W may be up to 4 I here.
    p, F, W = 2, I * f, I * w
    assert zb_v_formula_holds(p, m, F, I, W)
    assert all(close(x, zb_v_idle(p, F, I, W)) for x in idle_per_device(zb_v(p, m), F, I, W))


@pytest.mark.parametrize(
    "p, m, F, I, W, broken",
    [
        (3, 7, 1.5, 1.0, 1.0, "F > I"),
        (2, 5, 1.2, 1.0, 1.0, "F > I"),
        (3, 7, 1.0, 1.0, 0.4, "I > 2W"),
        (2, 5, 0.5, 1.0, 0.4, "I > 2W"),
        (3, 7, 1.0, 1.0, 1.5, "W > I"),
        (4, 9, 0.5, 1.0, 1.2, "W > I"),
        (3, 4, 1.0, 1.0, 0.5, "m < 2p-1"),
        (4, 6, 1.0, 1.0, 0.5, "m < 2p-1"),
        (4, 1, 1.0, 1.0, 1.0, "m < 2p-1"),
    ],
)
def test_zb_v_idle_formula_fails_outside_its_condition(p, m, F, I, W, broken):  # noqa: E741
    assert not zb_v_formula_holds(p, m, F, I, W), broken
    idle = idle_per_device(zb_v(p, m), F, I, W)
    assert max(idle) > zb_v_idle(p, F, I, W) + 1e-9, broken  # more bubble than the formula


def test_zb_v_equal_costs_is_a_parallelogram_the_papers_zero_bubble():
    # The ZB-V README table says bubble rate 0 for F = I = W; the simulator says (p-1) F per
    # device. Both are right: no device has a gap between its first and last action; the
    # idle time is the parallelogram's slant (device d starts d F late, ends (p-1-d) F early),
    # which consecutive steps can overlap when the optimizer step needs no global sync.
    p, m, t = 4, 9, 1.0
    result = simulate_arrays(zb_v(p, m), chunk_costs(t, t, t))
    for d in range(p):
        starts, ends = result["starts"][d], result["ends"][d]
        assert all(close(s, e) for s, e in zip(starts[1:], ends[:-1], strict=True))  # no gap
        assert close(starts[0], d * t) and close(result["makespan"] - ends[-1], (p - 1 - d) * t)
        assert close(result["makespan"] - result["busy"][d], (p - 1) * t)


@st.composite
def dualpipe_v_case(draw):
    p = draw(st.integers(1, 6))
    m = draw(st.integers(2 * p, 4 * p + 2))
    F = draw(st.floats(0.05, 3.0))
    W = draw(st.floats(0.0, F))
    return p, m, F, F, W


@SETTINGS
@given(dualpipe_v_case())
def test_dualpipe_v_idle_is_deepseeks_figure_in_the_simulator_inside_the_condition(case):
    # DeepSeek's send model (both results of an F&B slot leave when it ends) gives the
    # README's (PP/2-1)(F&B + B - 3W) = (p-1)(F + 2I - W) exactly, on every device.
    p, m, F, I, W = case  # noqa: E741
    assert dualpipe_v_formula_holds(p, m, F, I, W)
    timeline = simulate(dualpipe_v(p, m), chunk_costs(F, I, W))
    for d in range(p):
        assert close(timeline.idle(d), dualpipe_v_idle(p, F, I, W))
    assert close(dualpipe_v_idle(p, F, I, W), (p - 1) * (F + 2 * I - W))
    fraction = bubble_fraction(m, F, I, W, dualpipe_v_idle(p, F, I, W))
    assert close(timeline.bubble_fraction, fraction)


@pytest.mark.parametrize(
    "p, m, F, I, W, broken",
    [
        (3, 6, 1.0, 1.0, 1.2, "W > I"),
        (2, 5, 1.0, 1.0, 1.5, "W > I"),
        (4, 8, 0.8, 1.0, 1.0, "F < I"),
        (3, 7, 0.5, 1.0, 0.5, "F < I"),
        (4, 9, 1.5, 1.0, 0.5, "F > I"),
        (2, 4, 2.0, 1.0, 0.5, "F > I"),
    ],
)
def test_dualpipe_v_figure_fails_outside_its_condition(p, m, F, I, W, broken):  # noqa: E741
    assert not dualpipe_v_formula_holds(p, m, F, I, W), broken
    idle = idle_per_device(dualpipe_v(p, m), F, I, W)
    assert not all(close(x, dualpipe_v_idle(p, F, I, W)) for x in idle), broken


@st.composite
def early_send_case(draw):
    p = draw(st.integers(1, 6))
    m = draw(st.integers(2 * p, 4 * p + 2))
    W = draw(st.floats(0.0, 2.0))
    I = draw(st.floats(max(W, 0.05), W + 2.0))  # noqa: E741
    F = draw(st.floats((p - 1) * I / p, I + W))
    return p, m, F, I, W


@SETTINGS
@given(early_send_case())
# On the boundary (p-1) I = p F, F = (p-1) I / p rounds one step past it (found in CI):
@example((5, 10, 0.3260871094439587, 0.4076088868049484, 0.0))
def test_early_send_idle_and_bubble_match_the_simulator_inside_the_condition(case):
    p, m, F, I, W = case  # noqa: E741
    assert dualpipe_v_early_send_formula_holds(p, m, F, I, W)
    timeline = simulate(dualpipe_v(p, m, early_send=True), chunk_costs(F, I, W))
    for d in range(p):
        assert close(timeline.idle(d), dualpipe_v_early_send_idle(p, F, I, W))
    fraction = bubble_fraction(m, F, I, W, dualpipe_v_early_send_idle(p, F, I, W))
    assert close(timeline.bubble_fraction, fraction)


@pytest.mark.parametrize(
    "p, m, F, I, W, broken",
    [
        (3, 6, 1.5, 1.0, 1.2, "W > I"),
        (2, 5, 1.5, 1.0, 1.2, "W > I"),
        (3, 7, 0.6, 1.0, 0.5, "(p-1) I > p F"),
        (2, 4, 0.4, 1.0, 0.5, "(p-1) I > p F"),
        (3, 6, 2.5, 1.0, 0.5, "F > I + W"),
        (4, 9, 1.6, 1.0, 0.5, "F > I + W"),
    ],
)
def test_early_send_formula_fails_outside_its_condition(p, m, F, I, W, broken):  # noqa: E741
    assert not dualpipe_v_early_send_formula_holds(p, m, F, I, W), broken
    idle = idle_per_device(dualpipe_v(p, m, early_send=True), F, I, W)
    assert max(idle) > dualpipe_v_early_send_idle(p, F, I, W) + 1e-9, broken


def test_early_send_saves_p_minus_1_input_gradients_at_f_equal_i():
    # Exercise 11.6's costs flip the winner between the two send models; the lesson teaches
    # DeepSeek's. At F = I the variant idles (p-1) I less, whatever W.
    for p, m, F, I, W in [(4, 8, 1.0, 1.0, 1.0), (3, 6, 1.2, 1.2, 0.6), (5, 11, 0.9, 0.9, 0.0)]:  # noqa: E741
        ours = idle_per_device(dualpipe_v(p, m), F, I, W)
        early = idle_per_device(dualpipe_v(p, m, early_send=True), F, I, W)
        assert all(close(a - b, (p - 1) * I) for a, b in zip(ours, early, strict=True))


def test_dualpipe_v_send_groups_are_where_dualpipev_py_posts_its_sends():
    p, m = 3, 7
    sched = dualpipe_v(p, m)
    assert sched.send_groups is not None and dualpipe_v(p, m, early_send=True).send_groups is None
    for d, (slots, sizes) in enumerate(zip(dualpipe_v_slots(p, m), sched.send_groups, strict=True)):
        assert sum(sizes) == len(sched.devices[d])
        # Every overlapped F&B slot is one send group: both results leave when it ends.
        starts, at = set(), 0
        for size in sizes:
            starts.add(at)
            at += size
        at = 0
        for slot in slots:
            if len(slot) == 2:
                assert at in starts and at + 2 in starts | {len(sched.devices[d])}
            at += len(slot)
    # Warm-up (step 2): device 0's down-chunk output waits for its up-chunk forward.
    d0 = sched.devices[0]
    assert [str(a) for a in d0[4:6]] == ["0F4", "5F0"] and sched.send_groups[0][4] == 2


def atomic_slot_idle(p: int, m: int, F: float, I: float, W: float) -> list[float]:  # noqa: E741
    """Idle per device when every F&B slot is one block whose results all leave at its end
    (single actions as in the simulator): an independent reckoning of the README's count."""
    slots = dualpipe_v_slots(p, m)
    cost = {"F": F, "I": I, "W": W, "B": I + W}
    last = 2 * p - 1

    def key(a: Action) -> tuple:
        return (a.stage, "G" if a.kind in "BI" else a.kind, a.microbatch)

    def needs(a: Action) -> list[tuple]:
        s, mb = a.stage, a.microbatch
        if a.kind == "F":
            return [(s - 1, "F", mb)] if s > 0 else []
        if a.kind == "W":
            return [(s, "G", mb)]
        return [(s, "F", mb)] + ([(s + 1, "G", mb)] if s < last else [])

    end: dict[tuple, float] = {}
    pointer, free, busy = [0] * p, [0.0] * p, [0.0] * p
    progressed = True
    while progressed:
        progressed = False
        for d in range(p):
            while pointer[d] < len(slots[d]):
                slot = slots[d][pointer[d]]
                deps = [k for a in slot for k in needs(a) if k not in {key(b) for b in slot}]
                if any(k not in end for k in deps):
                    break
                start = max([free[d]] + [end[k] for k in deps])
                length = sum(cost[a.kind] for a in slot)
                free[d] = start + length
                busy[d] += length
                for a in slot:
                    end[key(a)] = free[d]
                pointer[d] += 1
                progressed = True
    assert pointer == [len(s) for s in slots]  # no deadlock
    return [max(free) - b for b in busy]


@SETTINGS
@given(st.integers(1, 6), st.integers(0, 6), st.floats(0.05, 3.0), st.floats(0.0, 1.0))
def test_the_simulator_and_an_independent_slot_reckoning_agree_with_the_readme(p, extra, F, w):
    m, I, W = 2 * p + extra, F, F * w  # noqa: E741
    readme = dualpipe_v_idle(p, F, I, W)
    assert all(close(x, readme) for x in atomic_slot_idle(p, m, F, I, W))
    assert all(close(x, readme) for x in idle_per_device(dualpipe_v(p, m), F, I, W))
    early = idle_per_device(dualpipe_v(p, m, early_send=True), F, I, W)
    assert all(close(x, readme - (p - 1) * I) for x in early)
    assert close(dualpipe_v_early_send_idle(p, F, I, W), readme - (p - 1) * I)


def test_dualpipe_readme_figure_is_only_an_estimate_when_f_differs_from_i():
    p, m, F, I, W = 4, 8, 2.0, 1.0, 0.5  # noqa: E741
    atomic = atomic_slot_idle(p, m, F, I, W)
    assert max(atomic) > dualpipe_v_idle(p, F, I, W) + 1e-9


def test_peak_activations_match_the_simulator_for_every_shape():
    for p in range(1, 7):
        for m in range(1, 4 * p + 2):
            peaks = simulate(zb_v(p, m)).peak_activations
            assert peaks == [zb_v_peak(p, m, d) for d in range(p)], (p, m)
            if m >= 2 * p - 1:
                assert peaks == [2 * p] * p  # p micro-batches of the device's layers: 1F1B's
            if m >= 2 * p:
                assert simulate(dualpipe_v(p, m)).peak_activations == [dualpipe_v_peak(p)] * p
                early = dualpipe_v(p, m, early_send=True)
                assert simulate(early).peak_activations == [dualpipe_v_peak(p)] * p


# --------------------------------------------------------------------------- transfers


def crossings_per_microbatch(schedule: Schedule) -> float:
    """Dependencies between stages on different devices (forward and backward), per
    micro-batch: what the simulator charges a p2p transfer for."""
    owner = schedule.device_of_stage()
    crossing = sum(owner[s] != owner[s + 1] for s in range(schedule.stages - 1))
    return 2 * crossing


@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_v_placement_makes_two_fewer_transfers_per_microbatch_than_looping(p):
    assert crossings_per_microbatch(zb_v(p, 2 * p)) == transfers_per_microbatch(p, "v")
    assert crossings_per_microbatch(dualpipe_v(p, 2 * p)) == transfers_per_microbatch(p, "v")
    looping = interleaved(p, p, 2)
    assert crossings_per_microbatch(looping) == transfers_per_microbatch(p, "looping")
    if p > 1:
        assert transfers_per_microbatch(p, "looping") - transfers_per_microbatch(p, "v") == 2


@pytest.mark.parametrize("name", BUILDERS)
def test_simulator_charges_no_p2p_at_the_bottom_of_the_v(name):
    p, m, hop = 3, 6, 0.75
    sched = BUILDERS[name](p, m)
    timeline = simulate(sched, chunk_costs(1.0, 1.0, 1.0, p2p=hop))
    owner = sched.device_of_stage()
    done = {}
    for e in timeline.events:
        slot = "G" if e.action.kind in "BI" else e.action.kind
        done[(e.action.stage, slot, e.action.microbatch)] = e
    charged_at_bottom = []
    for (s, slot, mb), e in done.items():
        if slot == "F" and s > 0:
            producer = done[(s - 1, "F", mb)]
        elif slot == "G" and s < 2 * p - 1:
            producer = done[(s + 1, "G", mb)]
        else:
            continue
        gap = e.start - producer.end
        if owner[s] != owner[producer.action.stage]:
            assert gap >= hop - 1e-12  # every crossing pays the transfer
        elif {s, producer.action.stage} == {p - 1, p}:
            charged_at_bottom.append(gap)
    # Stage p-1 -> p (and its gradient back) stays on device p-1: some of these start the
    # moment their producer ends, which a charged transfer would forbid.
    assert len(charged_at_bottom) == 2 * m and min(charged_at_bottom) == 0.0
    p2p_free = simulate(sched, chunk_costs(1.0, 1.0, 1.0))
    assert timeline.makespan > p2p_free.makespan  # the other hops are charged


@pytest.mark.parametrize("name", BUILDERS)
def test_gantt_draws_every_action_of_a_v_schedule_in_its_row(name, tmp_path):
    """Each action of a V schedule (two chunks per device) is one bar in its device's row,
    at its simulated time, in its micro-batch's colour and kind's shade; the chart saves."""
    from collections import Counter

    from test_gantt import bar_key, bars, chart, event_key

    schedule = BUILDERS[name](2, 4)
    timeline = simulate(schedule, chunk_costs(1.0, 1.0, 0.5))
    fig = chart(timeline)
    drawn = Counter(bar_key(b) for b in bars(fig.axes[0], "compute"))
    assert drawn == Counter(event_key(e, timeline.start) for e in timeline.events)
    assert sum(drawn.values()) == sum(len(actions) for actions in schedule.devices)
    assert gantt.save(fig, tmp_path / "v.png").read_bytes()[:4] == b"\x89PNG"


# --------------------------------------------------------------------------- on threads


@pytest.fixture()
def one_thread():
    with single_thread():
        yield


def make_mlp(num_stages: int) -> MLP:
    torch.manual_seed(0)
    return MLP(8, 16, 5, depth=num_stages)


def max_grad_diff(a, b) -> float:
    return max(
        (p.grad - q.grad).abs().max().item()
        for p, q in zip(a.parameters(), b.parameters(), strict=True)
    )


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name, p, m", [("zb-v", 2, 4), ("zb-v", 3, 2), ("dualpipe-v", 2, 4)])
def test_v_schedules_on_threads_match_the_unsplit_model(name, p, m):
    model = make_mlp(2 * p)
    x, y = model.example_batch(2 * m, torch.Generator().manual_seed(1))
    ref = copy.deepcopy(model)
    ref_loss = loss_fn(ref(x), y)
    ref_loss.backward()
    sched = BUILDERS[name](p, m)
    with PipelineExecutor(partition(model, 2 * p), p, loss_fn) as ex:
        result = ex.step(sched, x, y)
    assert abs(result.loss - ref_loss.item()) <= 1e-5
    assert max_grad_diff(model, ref) <= 1e-5
    tl = result.timeline
    computed = [e for e in tl.events if e.action.is_compute]
    assert {e.action.stage: e.device for e in computed} == sched.device_of_stage()
    for d in range(p):
        assert [e.action for e in tl.device_events(d) if e.action.is_compute] == list(
            sched.devices[d]
        )
    assert tl.peak_activations == simulate(sched).peak_activations
    predicted = simulated_from_measured(result, sched)
    assert predicted.num_devices == p and len(predicted.events) == len(computed)
    assert gantt.compare(predicted, tl).axes


@pytest.mark.usefixtures("one_thread")
def test_dualpipe_v_training_steps_give_the_same_weights():
    p, m = 2, 4
    model = make_mlp(2 * p)
    ref = copy.deepcopy(model)
    opt, opt_ref = (torch.optim.SGD(mod.parameters(), lr=0.1) for mod in (model, ref))
    gen = torch.Generator().manual_seed(2)
    with PipelineExecutor(partition(model, 2 * p), p, loss_fn) as ex:
        for _ in range(2):
            x, y = model.example_batch(2 * m, gen)
            ex.step(dualpipe_v(p, m), x, y, optimizer=opt)
            opt_ref.zero_grad()
            loss_fn(ref(x), y).backward()
            opt_ref.step()
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        assert (a - b).abs().max().item() <= 1e-5


@pytest.mark.usefixtures("one_thread")
def test_executor_refuses_a_stage_on_two_devices():
    p, m = 2, 2
    model = make_mlp(2 * p)
    x, y = model.example_batch(2 * m)
    rows = [list(acts) for acts in zb_v(p, m).devices]
    moved = Action(3, "W", 1)  # stage 3 lives on device 0; put one of its actions on device 1
    rows[0].remove(moved)
    rows[1].append(moved)
    bad = Schedule("bad", 2 * p, m, tuple(map(tuple, rows)))
    with PipelineExecutor(partition(model, 2 * p), p, loss_fn) as ex:
        message = "stage 3 runs on devices 0 and 1: a stage lives on one device"
        with pytest.raises(ScheduleError, match=message):
            ex.step(bad, x, y)
        assert ex.step(zb_v(p, m), x, y).loss > 0  # still usable


@pytest.mark.usefixtures("one_thread")
def test_measured_stage_costs_count_each_backward_once_when_b_and_i_w_mix():
    """DualPipeV runs some backwards whole (B) and some split (I, then W) on one stage: the
    measured backward cost per micro-batch is all of that stage's backward time over m,
    not mean(B) + mean(I) + mean(W) (which counted a backward about twice)."""
    p, m = 2, 4
    model = make_mlp(2 * p)
    x, y = model.example_batch(2 * m, torch.Generator().manual_seed(3))
    sched = dualpipe_v(p, m)
    with PipelineExecutor(partition(model, 2 * p), p, loss_fn) as ex:
        result = ex.step(sched, x, y)
    kinds = {
        s: {e.action.kind for e in result.timeline.events if e.action.stage == s}
        for s in range(2 * p)
    }
    assert any({"B", "I", "W"} <= k for k in kinds.values())  # the case this test is about
    for s in range(2 * p):
        spent = sum(
            e.duration
            for e in result.timeline.events
            if e.action.stage == s and e.action.kind in ("B", "I", "W")
        )
        assert result.stage_costs.backward[s] == pytest.approx(spent / m)


@pytest.mark.parametrize("name", BUILDERS)
def test_run_command_takes_a_v_schedule_with_its_two_chunks_per_device(name, run_cli):
    # The registry knows a V schedule has 2 chunks per device: `run` builds 2p stages.
    out = run_cli("run", name, "--devices", 2, "--microbatches", 4, "--model", "mlp", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["schedule"] == name and data["max_grad_diff"] <= 1e-5
    assert {e["action"][0] for e in data["events"]} == {"0", "1", "2", "3"}  # stages 0..3
    bad = run_cli("run", name, "--devices", 2, "--microbatches", 4, "--chunks", 2)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "chunks" in bad.stderr


def test_dualpipe_v_on_threads_sends_a_slots_outputs_when_the_slot_ends():
    """DeepSeek's send model on the executor: an output for another device leaves when its
    send group (an F&B slot) ends, as the simulator assumes (Schedule.send_groups)."""
    p, m = 2, 4
    model = make_mlp(2 * p)
    x, y = model.example_batch(2 * m, torch.Generator().manual_seed(1))
    sched = dualpipe_v(p, m)
    assert sched.send_groups is not None
    with PipelineExecutor(partition(model, 2 * p), p, loss_fn) as ex:
        tl = ex.step(sched, x, y).timeline
    ends = {(e.device, e.action): e.end for e in tl.events if e.action.is_compute}
    group_end = {}
    for d, (actions, sizes) in enumerate(zip(sched.devices, sched.send_groups, strict=True)):
        at = 0
        for size in sizes:
            group = actions[at : at + size]
            for a in group:
                group_end[(d, a.stage, a.microbatch, a.kind)] = ends[(d, group[-1])]
            at += size
    sends = [e for e in tl.events if e.action.kind in ("SEND_F", "SEND_B")]
    assert sends
    for send in sends:
        a = send.action
        kinds = ("F",) if a.kind == "SEND_F" else ("B", "I")
        made = [
            group_end[k]
            for k in group_end
            if k[0] == send.device and k[1:3] == (a.stage, a.microbatch) and k[3] in kinds
        ]
        assert made and send.start >= made[0] - 1e-12, (send, made)


def test_dualpipe_v_early_send_on_threads_sends_before_its_slot_ends():
    """Without send groups the executor sends an output as its action ends: some F&B slot's
    forward output leaves before the slot's backward is done (lesson 11's "early send")."""
    p, m = 2, 4
    model = make_mlp(2 * p)
    x, y = model.example_batch(2 * m, torch.Generator().manual_seed(1))
    sched = dualpipe_v(p, m, early_send=True)
    assert sched.send_groups is None
    with PipelineExecutor(partition(model, 2 * p), p, loss_fn) as ex:
        tl = ex.step(sched, x, y).timeline
    ends = {(e.device, e.action): e.end for e in tl.events if e.action.is_compute}
    sends = {(e.device, e.action.stage, e.action.microbatch): e.start
             for e in tl.events if e.action.kind == "SEND_F"}  # fmt: skip
    early = 0
    for d, slots in enumerate(dualpipe_v_slots(p, m)):
        for slot in slots:
            if len(slot) == 2 and (d, slot[0].stage, slot[0].microbatch) in sends:
                sent = sends[(d, slot[0].stage, slot[0].microbatch)]
                assert sent >= ends[(d, slot[0])] - 1e-12  # after its forward ...
                early += sent < ends[(d, slot[1])]  # ... and before the slot's backward ends
    assert early > 0
