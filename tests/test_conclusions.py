"""Printed conclusions agree with the numbers they print, whatever the machine gave.

Three regimes of the capacity probe: two free cores (about 2x), one core or a busy second
core (about 1x), and in between. For each, the sentences must not claim a speed-up the
machine could not give, and must say so when a measurement falls short or loses time.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_utils.measure.capacity import Capacity
from course_utils.measure.conclusions import (
    clocks_agree,
    follows,
    gain,
    overlap,
    ratio,
    slowdown,
    speedup,
    step_table,
    trend,
)

IDLE = Capacity(1.93, 2, 0.2, 0.104)
ONE_CORE = Capacity(0.98, 1, 0.2, 0.204)
HOGGED = Capacity(1.05, 2, 0.2, 0.19)
SHARED = Capacity(1.38, 2, 0.2, 0.145)


def numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"(\d+\.\d+)x", text)]


def test_two_free_cores_a_good_pipeline_reaches_what_the_machine_allows():
    text = speedup("GPipe", 1.49, 1.78, IDLE)
    assert "1.49x" in text and "1.78x" in text and "1.93x" in text
    assert "1.78x was the most" in text  # the ideal is the bound here, not the cores
    assert "84%" in text and "overheads" in text


@pytest.mark.parametrize("capacity", [ONE_CORE, HOGGED])
def test_one_core_never_promises_a_speedup(capacity):
    text = speedup("GPipe", 0.97, 1.78, capacity)
    assert "took turns" in text and "no speed-up could show" in text
    assert "most this run could reach" not in text
    slower = speedup("GPipe", 0.8, 1.78, capacity)
    assert "lost time" in slower


def test_a_shared_core_caps_the_bound_below_the_ideal():
    text = speedup("data parallelism", 1.2, 2.0, SHARED)
    assert "1.38x was the most this run could reach" in text
    assert "87%" in text  # 1.2 / 1.38
    assert "as good as this machine allows" not in text
    good = speedup("data parallelism", 1.36, 2.0, SHARED)
    assert "as good as this machine allows" in good


def test_slower_than_the_baseline_on_a_two_core_machine_is_said():
    text = speedup("ZB-H1", 0.85, 1.6, IDLE)
    assert "slower than the baseline" in text


@given(
    measured=st.floats(0.3, 2.5),
    ideal=st.floats(1.0, 4.0),
    cap=st.floats(0.8, 2.1),
    cores=st.sampled_from([1, 2]),
)
def test_no_sentence_claims_more_than_the_bound(measured, ideal, cap, cores):
    capacity = Capacity(cap, cores, 1.0, 1.0 / cap)
    text = speedup("X", measured, ideal, capacity)
    assert f"{measured:.2f}x" in text  # the number itself is printed
    bound = min(ideal, max(cap, 1.0))
    if "most this run could reach" in text:
        assert f"{bound:.2f}x was the most" in text
        assert capacity.regime != "one core"
    if "as good as this machine allows" in text:
        assert measured >= 0.9 * bound
    if "slower than the baseline" in text or "lost time" in text:
        assert measured < 0.9


def test_ratio_within_noise_and_beyond():
    assert "same time within noise" in ratio("naive", 0.100, "GPipe", 0.095)
    text = ratio("naive", 0.100, "GPipe", 0.060)
    assert text.startswith("GPipe was 1.67x as fast as naive")
    assert "(0.06 vs 0.1 s)" in text  # the times in the order the sentence names them


@pytest.mark.parametrize(
    "ys, words",
    [
        ([100, 160, 190, 170, 120], "rose, then fell"),
        ([190, 170, 140, 120, 100], "only fell"),
        ([100, 130, 150, 170, 190], "only rose"),
        ([100, 104, 98, 103, 101], "flat within noise"),
        ([100, 190, 185, 186, 188], "only rose"),  # a plateau is not a fall
    ],
)
def test_trend_names_the_shape_measured(ys, words):
    text = trend([1, 2, 4, 8, 16], ys, "m", "throughput")
    assert words in text
    if "highest" in text:
        best = [1, 2, 4, 8, 16][ys.index(max(ys))]
        assert f"m = {best}" in text


def test_trend_says_where_it_was_measured():
    text = trend([1, 2, 4], [100, 150, 120], "m", "throughput", where="the reference machine")
    assert text.startswith("On the reference machine throughput rose, then fell")


def test_follows_names_where_a_curve_leaves_its_formula():
    xs = [1, 2, 4, 8, 16]
    formula = [0.5, 0.33, 0.2, 0.11, 0.06]
    assert "within 0.05 of the formula at every m" in follows(
        xs, formula, formula, "m", "bubble", 0.05
    )
    measured = [0.51, 0.35, 0.22, 0.25, 0.3]
    text = follows(xs, measured, formula, "m", "bubble", 0.05)
    assert "up to m = 4" in text and "0.24 above it at m = 16" in text
    early = follows(xs, [0.1, 0.33, 0.2, 0.11, 0.06], formula, "m", "bubble", 0.05)
    assert "from the first point" in early and "0.40 below it at m = 1" in early


def test_overlap_none_says_one_device_at_a_time():
    text = overlap("This machine", 0.0, 0.06, IDLE)
    assert "no two bars overlapped" in text


@pytest.mark.parametrize("capacity", [IDLE, ONE_CORE])
def test_overlap_small_is_the_hand_overs_on_any_machine(capacity):
    text = overlap("This machine", 0.0004, 0.0635, capacity)
    assert "0.40 ms" in text and "0.6% of the 63.5 ms step" in text
    assert "the hand-overs" in text and "more than a hand-over" not in text


def test_overlap_large_on_one_core_is_waiting_for_the_core():
    text = overlap("This machine", 0.0173, 0.0511, ONE_CORE)
    assert "17.30 ms" in text and "33.9%" in text
    assert "more than a hand-over takes" in text
    assert "0.98x" in text and "took turns on one core" in text and "wait for the core" in text
    assert "one device at a time" in text


@pytest.mark.parametrize("capacity", [IDLE, SHARED, HOGGED])
def test_overlap_large_with_two_cores_names_what_else_holds_a_thread(capacity):
    text = overlap("The reference", 0.0075, 0.0567, capacity)
    assert "13.2%" in text and "more than a hand-over takes" in text
    assert f"{capacity.speedup:.2f}x" in text
    if capacity.regime == "one core":  # HOGGED: a busy second core counts as one core
        assert "took turns on one core" in text
    else:
        assert "another program" in text and "took turns" not in text


# gain(): one schedule against another, measured and predicted, in every regime.


def test_gain_on_two_free_cores_matches_or_falls_short():
    text = gain("ZB-H1", "1F1B", 1.18, 1.2, IDLE)
    assert "1.18x" in text and "1.20x" in text and "1.93x" in text
    assert "matched the prediction within noise" in text
    short = gain("ZB-H1", "1F1B", 1.12, 1.4, IDLE)
    assert "less than predicted" in short and "another program" not in short
    none = gain("ZB-H1", "1F1B", 1.02, 1.4, IDLE)
    assert "No difference showed beyond noise" in none
    slower = gain("ZB-H1", "1F1B", 0.8, 1.4, IDLE)
    assert "slower than 1F1B" in slower
    more = gain("ZB-H1", "1F1B", 1.7, 1.3, IDLE)
    assert "more than predicted" in more


@pytest.mark.parametrize("capacity", [ONE_CORE, HOGGED])
def test_gain_on_one_core_never_claims_or_denies_the_prediction(capacity):
    for measured in (0.7, 1.0, 1.3):
        text = gain("interleaved 1F1B", "1F1B", measured, 1.25, capacity)
        assert "took turns" in text and "could not gain here" in text
        assert "matched" not in text and "less than predicted" not in text


def test_gain_says_a_small_prediction_is_within_noise():
    for capacity in (IDLE, SHARED):
        text = gain("interleaved 1F1B", "1F1B", 0.97, 1.05, capacity)
        assert "neither confirm nor refute" in text


def test_gain_names_a_busy_core_and_a_predicted_loss():
    assert "another program was using a core" in gain("ZB-H1", "1F1B", 1.0, 1.4, SHARED)
    assert "predicted to be slower" in gain("v = 8", "v = 1", 0.9, 0.7, IDLE)


@given(
    measured=st.floats(0.3, 2.5),
    predicted=st.floats(0.5, 2.0),
    cap=st.floats(0.8, 2.1),
    cores=st.sampled_from([1, 2]),
)
def test_gain_sentences_agree_with_their_numbers(measured, predicted, cap, cores):
    capacity = Capacity(cap, cores, 1.0, 1.0 / cap)
    text = gain("A", "B", measured, predicted, capacity)
    assert f"{measured:.2f}x" in text and f"{predicted:.2f}x" in text
    if "matched the prediction" in text:
        assert abs(measured / predicted - 1) <= 0.1 and capacity.regime != "one core"
    if "gained, but less than predicted" in text:
        assert 1.1 < measured < predicted
    if "slower than B" in text:
        assert measured < 0.9


def test_gain_says_where_it_was_measured():
    text = gain("ZB-H1", "1F1B", 1.2, 1.2, IDLE, where="the reference machine")
    assert "2 threads ran 1.93x as fast as 1 on the reference machine" in text


@pytest.mark.parametrize("capacity", [ONE_CORE, HOGGED])
def test_a_straggler_is_not_claimed_where_the_threads_took_turns(capacity):
    same = slowdown("The skewed step", "the balanced one", 1.03, 1.6, capacity)
    assert "1.03x" in same and "1.60x" in same and "took turns" in same
    assert "same time within noise" in same and "agreed" not in same
    odd = slowdown("The skewed step", "the balanced one", 1.3, 1.6, capacity)
    assert "1.30x measured here is not that wait" in odd and "within noise" not in odd


def test_two_free_cores_compare_the_straggler_with_the_prediction():
    agreed = slowdown("The skewed step", "the balanced one", 1.55, 1.6, IDLE)
    assert "1.93x" in agreed and "agreed with the prediction within 10%" in agreed
    assert "took turns" not in agreed
    below = slowdown("The skewed step", "the balanced one", 1.2, 1.6, IDLE)
    assert "25% below the prediction" in below and "shared" not in below
    above = slowdown("The skewed step", "the balanced one", 2.0, 1.6, IDLE)
    assert "25% above the prediction" in above


def test_a_shared_core_may_hide_part_of_the_wait():
    text = slowdown("The skewed step", "the balanced one", 1.2, 1.6, SHARED)
    assert "below the prediction" in text and "core shared" in text


def test_speedup_names_the_machine_it_ran_on():
    text = speedup("GPipe on the reference machine", 1.42, 1.6, IDLE, where="the reference machine")
    assert "2 threads ran 1.93x as fast as 1 on the reference machine" in text
    assert "this machine" not in text
    assert "on this machine" in speedup("GPipe", 1.42, 1.6, IDLE)


def test_trend_calls_only_the_first_point_the_first_point():
    # m = 2 highest, within noise of m = 1: not "the first point" (lesson 03's old slip)
    text = trend([1, 2, 4, 8], [100, 104, 80, 60], "m", "throughput")
    assert "highest at m = 2, within noise of the first point" in text
    first = trend([1, 2, 4, 8], [104, 100, 80, 60], "m", "throughput")
    assert "highest at m = 1, the first point" in first


def test_follows_says_only_at_when_just_the_first_point_matched():
    text = follows([0, 2, 4, 8], [1.0, 1.4, 1.5, 1.6], [1.0, 1.1, 1.2, 1.3], "segments", "t", 0.15)
    assert "only at segments = 0" in text and "up to segments = 0" not in text


@pytest.mark.parametrize(
    "capacity, words",
    [
        (IDLE, "as they should with two free cores"),
        (ONE_CORE, "the two threads took turns on one core"),
        (SHARED, "another program shared a core"),
    ],
)
def test_clocks_agree_says_why_from_the_probe(capacity, words):
    apart = 1.0 if capacity is IDLE else 1.8
    text = clocks_agree(0.070, 0.070 * apart, capacity)
    assert "70.0 ms on the virtual clock" in text and words in text
    if capacity is not IDLE:
        assert f"{apart:.2f}x as long on the wall" in text


def test_step_table_lists_measured_and_simulated_steps():
    from course_utils.actions import Action
    from course_utils.measure.timing import Timing
    from course_utils.timeline import Event, Timeline

    tl = Timeline(
        [Event(0, Action(0, "F", 0), 0, 0.01), Event(1, Action(1, "F", 0), 0.01, 0.02)], 2
    )
    sim = Timeline(
        [Event(0, Action(0, "F", 0), 0, 0.01), Event(1, Action(1, "F", 0), 0.01, 0.021)], 2
    )
    table = step_table({"gpipe": tl}, {"gpipe": sim}, {"gpipe": Timing("gpipe", [0.02, 0.022])})
    row = table.splitlines()[1]
    assert row.split()[:3] == ["gpipe", "20.00", "10.00"] and "21.00" in row and "2, 10%" in row
