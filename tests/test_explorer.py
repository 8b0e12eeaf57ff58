"""The schedule explorer: its numbers are the simulator's, its chart shows them, its widget
stays in sync with its sliders, and it degrades to text and PNG without a widget frontend."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from course_utils.charts import style
from course_utils.charts.explorer import Settings, explorer_update, schedule_explorer
from course_utils.charts.raster import LEFT, RIGHT, TITLE_H, WIDTH, row_height
from course_utils.errors import CourseInputError
from course_utils.pipeline.schedules import make_schedule
from course_utils.pipeline.simulate import CostModel, simulate

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def rgb(png: bytes) -> np.ndarray:
    assert png.startswith(PNG_SIGNATURE)
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def pixel_at(view, device: int, t: float) -> np.ndarray:
    """The colour painted for `device` at time `t` (centre of the device's row)."""
    img = rgb(view.png)
    p = view.settings.devices
    row_h = row_height(p)
    plot_w = WIDTH - LEFT - RIGHT
    x = LEFT + int(t / view.makespan * plot_w)
    y = TITLE_H + device * row_h + row_h // 2
    return img[y, x]


def as_u8(color) -> np.ndarray:
    from matplotlib.colors import to_rgb

    return np.array([round(255 * c) for c in to_rgb(color)])


def close(pixel: np.ndarray, color) -> bool:
    """Equal up to the palette PNG's rounding (a level or two per channel)."""
    return bool((np.abs(pixel.astype(int) - as_u8(color)) <= 3).all())


@pytest.mark.parametrize(
    "name, p, m, v",
    [
        ("naive", 4, 8, 1),
        ("gpipe", 4, 8, 1),
        ("1f1b", 5, 7, 1),
        ("interleaved", 4, 8, 2),
        ("breadth-first", 3, 5, 3),
        ("zb-h1", 4, 6, 1),
    ],
)
def test_numbers_are_the_simulators(name, p, m, v):
    view = explorer_update(Settings(name, p, m, chunks=v, backward_ratio=2.5, comm_cost=0.2))
    schedule = make_schedule(name, p, m, chunks=v)
    timeline = simulate(schedule, CostModel(forward=1.0, backward=2.5, p2p=0.2))
    assert view.makespan == pytest.approx(timeline.makespan)
    assert view.bubble_fraction == pytest.approx(timeline.bubble_fraction)
    assert view.peak_activations == list(timeline.peak_activations)
    assert f"bubble {100 * view.bubble_fraction:.1f}%" in view.text
    assert f"bubble {100 * view.bubble_fraction:.1f}%" in view.title


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(["gpipe", "1f1b", "interleaved", "breadth-first"]),
    p=st.integers(1, 8),
    k=st.integers(1, 4),
    v=st.integers(1, 4),
    ratio=st.sampled_from([1.0, 2.0, 3.0]),
)
def test_closed_form_matches_simulation_without_transfer_cost(name, p, k, v, ratio):
    m = p * k  # interleaved needs m a multiple of p
    view = explorer_update(Settings(name, p, m, chunks=v, backward_ratio=ratio))
    assert view.formula is not None
    assert view.formula_value == pytest.approx(view.bubble_fraction, abs=1e-9)
    assert f"{100 * view.formula_value:.1f}%" in view.text


def test_no_closed_form_claimed_when_transfers_cost_time():
    view = explorer_update(Settings("gpipe", 4, 8, comm_cost=0.5))
    assert view.formula is None and "closed form" not in view.text
    # Transfers lengthen the step, so the bubble exceeds the formula's.
    assert view.bubble_fraction > (4 - 1) / (8 + 4 - 1)


def test_chart_paints_the_schedule():
    view = explorer_update(Settings("gpipe", 4, 8))
    img = rgb(view.png)
    assert img.shape[1] == WIDTH and img.shape[0] > 150
    # Device 0 runs micro-batch 0's forward first: its colour, plain.
    assert close(pixel_at(view, 0, 0.5), style.MICROBATCH_COLORS[0])
    # Device 3 starts 3 units late: idle (bubble) colour or its hatch at t=1.
    for device, t in ((3, 1.2), (0, 12.3)):  # device 0 waits from t=8 to its first backward
        colour = pixel_at(view, device, t)
        assert close(colour, style.BUBBLE_COLOR) or close(colour, style.BUBBLE_HATCH_COLOR)
    # Backward bars are darker than the forward bars of the same micro-batch.
    first_backward = pixel_at(view, 3, 12.9)  # 3B0 runs from 11 to 13 on the last device
    assert first_backward.sum() < as_u8(style.MICROBATCH_COLORS[0]).sum()


def test_chart_changes_with_every_control():
    base = Settings("gpipe", 4, 8)
    before = explorer_update(base)
    for change in (
        {"microbatches": 12},
        {"devices": 6},
        {"schedule": "1f1b"},
        {"backward_ratio": 3.0},
        {"comm_cost": 0.5},
    ):
        after = explorer_update(base, **change)
        assert after.png != before.png, change
    assert explorer_update(base, microbatches=12).bubble_fraction < before.bubble_fraction
    inter = Settings("interleaved", 4, 8, chunks=2)
    assert explorer_update(inter, chunks=4).png != explorer_update(inter).png


@pytest.mark.parametrize(
    "change, word",
    [
        ({"devices": 0}, "devices"),
        ({"devices": 17}, "devices"),
        ({"microbatches": 65}, "microbatches"),
        ({"microbatches": 2.5}, "microbatches"),
        ({"chunks": 0}, "chunks"),
        ({"schedule": "pipedream"}, "schedule"),
        ({"backward_ratio": 0.0}, "backward_ratio"),
        ({"comm_cost": -1.0}, "comm_cost"),
        ({"schedule": "interleaved", "microbatches": 6}, "multiple"),
    ],
)
def test_bad_settings_name_the_problem(change, word):
    with pytest.raises(CourseInputError, match=word) as info:
        explorer_update(Settings("gpipe", 4, 8), **change)
    assert "\n" not in str(info.value)


def test_largest_settings_paint_without_labels_overflowing():
    view = explorer_update(Settings("interleaved", 16, 64, chunks=4))
    img = rgb(view.png)
    assert img.shape[1] == WIDTH and img.shape[0] < 600  # scrolls fine in a notebook
    assert view.peak_activations[0] > 0 and "chunks (=" in view.text


def test_widget_follows_its_sliders():
    ui = schedule_explorer("gpipe", devices=4, microbatches=8)
    assert "explorer-chart" in ui.chart._dom_classes
    assert "explorer-microbatches" in ui.microbatches._dom_classes
    assert "explorer-metrics" in ui.metrics._dom_classes
    assert ui.chunks.disabled  # GPipe has no chunks
    png, metrics = ui.chart.value, ui.metrics.value
    assert "bubble 27.3%" in metrics
    ui.microbatches.value = 12
    assert ui.chart.value != png and "bubble 20.0%" in ui.metrics.value
    ui.schedule.value = "interleaved"
    assert not ui.chunks.disabled
    # m=12 is a multiple of p=4: valid. Now make it invalid: the chart stays, a warning shows.
    shown = ui.chart.value
    ui.microbatches.value = 10
    assert ui.chart.value == shown
    assert "⚠" in ui.metrics.value and "multiple" in ui.metrics.value
    ui.microbatches.value = 16
    assert "⚠" not in ui.metrics.value and ui.chart.value != shown


def test_text_and_png_fallback_without_a_widget_frontend():
    ui = schedule_explorer("1f1b", devices=4, microbatches=8)
    bundle = ui._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert "bubble 27.3%" in bundle["text/plain"]
    import base64

    assert base64.b64decode(bundle["image/png"]).startswith(PNG_SIGNATURE)
    assert "bubble" in repr(ui)


def test_bad_arguments_to_the_widget_are_one_line_errors():
    with pytest.raises(CourseInputError, match="devices"):
        schedule_explorer("gpipe", devices=40)


def test_stages_is_still_accepted_for_devices():
    # The older spelling (lessons and notebooks written before the rename).
    assert schedule_explorer("gpipe", stages=6).settings().devices == 6


def test_explorer_module_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys; from course_utils.charts.explorer import explorer_update;"
        "explorer_update(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
