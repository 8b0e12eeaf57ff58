"""Timeline arithmetic: busy, idle and bubble agree, and JSON keeps event labels."""

from __future__ import annotations

import pytest

from course_utils.actions import Action
from course_utils.pipeline.schedules import make_schedule
from course_utils.pipeline.simulate import CostModel, simulate
from course_utils.timeline import Event, Timeline


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1", "naive"])
def test_busy_idle_and_bubble_agree(name):
    tl = simulate(make_schedule(name, 4, 6), CostModel(forward=1, backward=2, p2p=0.3))
    per_device = tl.busy_per_device()
    assert per_device == pytest.approx([tl.busy(d) for d in range(4)])
    idle = sum(tl.idle(d) for d in range(4))
    assert tl.bubble_fraction == pytest.approx(idle / (4 * tl.makespan))
    d = tl.to_dict()
    assert d["busy"] == pytest.approx(per_device)
    assert d["idle"] == pytest.approx([tl.idle(k) for k in range(4)])


def test_communication_is_not_busy_time_and_labels_survive_json():
    events = [
        Event(0, Action(0, "F", 0), 0.0, 1.0),
        Event(1, Action(1, "F", 0), 1.0, 2.0),
        Event(0, Action(0, "REDUCE_GRAD"), 2.0, 3.0, label="bucket 0"),
    ]
    tl = Timeline(events, num_devices=2)
    assert tl.busy_per_device() == [1.0, 1.0]  # the all-reduce is communication, not compute
    assert tl.bubble_fraction == pytest.approx(1 - 2 / (2 * 3))
    assert tl.to_dict()["events"][2]["label"] == "bucket 0"
    labelled = Event(0, Action(0, "F", 1), 3.0, 4.0, label="micro-batch 1")
    assert labelled.to_dict()["label"] == "micro-batch 1"
    assert "label" not in events[0].to_dict()
