"""Gantt charts (course_utils.charts.gantt): what the figures say, not what the pixels look like.

One row per device, one bar per action, a stable colour per micro-batch, forward / backward /
W told apart by shade and hatch, bubbles marked, thin communication bars, labels that fit,
titles with the makespan and the bubble, stacked charts on one time axis, PNG/SVG files,
and the `python -m course_utils gantt` command (one-line errors, no torch).
"""

from __future__ import annotations

import struct
import subprocess
import sys
from collections import Counter

import matplotlib

matplotlib.use("Agg")  # no display, in this process and before pyplot is imported

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from conftest import run_module  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

from course_utils.actions import Action  # noqa: E402
from course_utils.charts import gantt, style  # noqa: E402
from course_utils.errors import CourseInputError  # noqa: E402
from course_utils.parallel.timelines import dp_pp_timeline  # noqa: E402
from course_utils.pipeline.schedules import make_schedule  # noqa: E402
from course_utils.pipeline.simulate import CostModel, simulate  # noqa: E402
from course_utils.timeline import Event, Timeline  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BUBBLE = to_rgb(style.BUBBLE_COLOR)
COMM = to_rgb(style.COMM_COLOR)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# ----------------------------------------------------------------------------- helpers


def sim(name: str, p: int, m: int, v: int = 1, costs: CostModel | None = None) -> Timeline:
    return simulate(make_schedule(name, p, m, v), costs)


def chart(timeline, **kwargs):
    """draw() outside pyplot, so nothing global is touched."""
    return gantt.draw(timeline, pyplot=False, **kwargs)


def rgb(color) -> tuple[float, float, float]:
    return tuple(round(float(c), 4) for c in to_rgb(tuple(color[:3])))


def bars(ax, kind: str = "all") -> list[dict]:
    """Every rectangle of every PolyCollection in `ax`, with its fill and its collection.

    kind: "compute", "comm", "bubble" or "all" (told apart by fill colour).
    """
    out = []
    for coll in ax.collections:
        if not isinstance(coll, PolyCollection):
            continue
        paths = coll.get_paths()
        fills = coll.get_facecolors()
        for i, path in enumerate(paths):
            xs, ys = path.vertices[:, 0], path.vertices[:, 1]
            fill = rgb(fills[i if len(fills) > 1 else 0])
            what = "bubble" if fill == rgb(BUBBLE) else "comm" if fill == rgb(COMM) else "compute"
            if kind in ("all", what):
                out.append(
                    {
                        "x0": float(xs.min()),
                        "x1": float(xs.max()),
                        "y0": float(ys.min()),
                        "y1": float(ys.max()),
                        "device": round(float(ys.mean())),
                        "fill": fill,
                        "hatch": coll.get_hatch(),
                        "collection": coll,
                        "what": what,
                    }
                )
    return out


def expected_fill(action: Action):
    base = style.microbatch_color(action.microbatch)
    if action.kind in ("B", "I"):
        return rgb(style.darken(base))
    if action.kind == "W":
        return rgb(style.lighten(base))
    return rgb(base)


def bar_key(b: dict, ndigits: int = 6):
    return (b["device"], round(b["x0"], ndigits), round(b["x1"], ndigits), b["fill"])


def event_key(e: Event, start: float, scale: float = 1.0, ndigits: int = 6):
    x0, x1 = (e.start - start) * scale, (e.end - start) * scale
    return (e.device, round(x0, ndigits), round(x1, ndigits), expected_fill(e.action))


def legend_labels(fig) -> list[str]:
    legend = fig.legends[0] if fig.legends else fig.axes[0].get_legend()
    return [t.get_text() for t in legend.get_texts()]


def legend_hatches(fig) -> dict[str, str | None]:
    legend = fig.legends[0]
    return {h.get_label(): h.get_hatch() for h in legend.legend_handles}


def luminance(color) -> float:
    r, g, b = to_rgb(color)
    return 0.299 * r + 0.587 * g + 0.114 * b


def measured_like(offset: float = 1000.0) -> Timeline:
    """A 2-device GPipe step in seconds (F 4 ms, B 8 ms), starting at perf-counter `offset`."""
    f, b = 0.004, 0.008
    rows = {
        0: [("0F0", 0, f), ("0F1", f, 2 * f), ("0B0", 3 * f + b, 3 * f + 2 * b),
            ("0B1", 3 * f + 2 * b, 3 * f + 3 * b)],
        1: [("1F0", f, 2 * f), ("1F1", 2 * f, 3 * f), ("1B0", 3 * f, 3 * f + b),
            ("1B1", 3 * f + b, 3 * f + 2 * b)],
    }  # fmt: skip
    events = [
        Event(d, Action.parse(a), offset + s, offset + e)
        for d, row in rows.items()
        for a, s, e in row
    ]
    return Timeline(
        events,
        2,
        name="gpipe",
        source="measured",
        unit="s",
        stages=2,
        microbatches=2,
    )


# ----------------------------------------------------------------------------- one chart


def test_one_row_per_device_with_axis_labels():
    tl = sim("1f1b", 4, 8)
    fig = chart(tl)
    assert len(fig.axes) == 1
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["dev 0", "dev 1", "dev 2", "dev 3"]
    assert list(ax.get_yticks()) == [0, 1, 2, 3]
    top, bottom = ax.get_ylim()[1], ax.get_ylim()[0]
    assert top < bottom  # device 0 is drawn at the top
    assert ax.get_xlabel() == "time (units)"
    assert ax.get_ylabel() == "device"
    # every bar sits inside its device's row
    for b in bars(ax):
        assert b["device"] - 0.5 < b["y0"] < b["y1"] < b["device"] + 0.5
    # the time axis covers the whole step and starts at 0
    x0, x1 = ax.get_xlim()
    assert x0 == 0 and tl.makespan <= x1 <= 1.05 * tl.makespan


@pytest.mark.parametrize(
    "name, p, m, v, words",
    [
        ("gpipe", 4, 8, 1, "GPipe, p=4, m=8 — makespan 33.0 units, bubble 27.3%"),
        ("1f1b", 4, 8, 1, "1F1B, p=4, m=8 — makespan 33.0 units, bubble 27.3%"),
        ("interleaved", 2, 4, 2, "Interleaved 1F1B, p=2, m=4, v=2 — makespan 13.5 units"),
        ("zb-h1", 3, 4, 1, "ZB-H1, p=3, m=4"),
        ("naive", 3, 2, 1, "Naive (no micro-batches), p=3, m=2"),
        ("breadth-first", 2, 2, 3, "Breadth-first, p=2, m=2, v=3"),
    ],
)
def test_title_has_makespan_and_the_timelines_bubble(name, p, m, v, words):
    tl = sim(name, p, m, v)
    title = chart(tl).axes[0].get_title(loc="left")
    assert words in title
    assert f"makespan {tl.makespan:.1f} units" in title or f"makespan {tl.makespan:.3g}" in title
    assert f"bubble {100 * tl.bubble_fraction:.1f}%" in title  # Timeline's own definition
    assert title == gantt.title_for(tl)
    assert gantt.bubble_fraction(tl) == pytest.approx(tl.bubble_fraction)


def test_a_custom_title_keeps_makespan_and_bubble():
    tl = sim("gpipe", 2, 2)
    title = chart(tl, title="My pipeline").axes[0].get_title(loc="left")
    assert title.startswith("My pipeline — makespan 9")
    assert f"bubble {100 * tl.bubble_fraction:.1f}%" in title


SCHEDULE_SHAPES = st.one_of(
    st.tuples(
        st.sampled_from(["naive", "gpipe", "1f1b", "zb-h1"]),
        st.integers(1, 4),
        st.integers(1, 6),
        st.just(1),
    ),
    st.tuples(st.just("breadth-first"), st.integers(1, 3), st.integers(1, 4), st.integers(1, 3)),
    st.integers(1, 3).flatmap(
        lambda p: st.tuples(
            st.just("interleaved"),
            st.just(p),
            st.integers(1, 2).map(lambda k: k * p),
            st.integers(1, 3),
        )  # fmt: skip
    ),
)


@settings(max_examples=12, deadline=None)
@given(SCHEDULE_SHAPES)
def test_every_action_is_one_bar_in_its_row_with_its_colour(shape):
    name, p, m, v = shape
    tl = sim(name, p, m, v)
    ax = chart(tl).axes[0]
    drawn = Counter(bar_key(b) for b in bars(ax, "compute"))
    expected = Counter(event_key(e, tl.start) for e in tl.events)
    assert drawn == expected
    assert sum(drawn.values()) == sum(len(acts) for acts in make_schedule(name, p, m, v).devices)
    assert not bars(ax, "comm")


def test_a_microbatch_has_one_colour_across_devices_and_charts():
    one = chart(sim("gpipe", 3, 4)).axes[0]
    other = chart(sim("1f1b", 3, 4)).axes[0]
    measured = chart(measured_like()).axes[0]
    forward_colours: dict[int, set] = {}
    for ax, tl in ((one, sim("gpipe", 3, 4)), (other, sim("1f1b", 3, 4))):
        for b in bars(ax, "compute"):
            (event,) = [
                e
                for e in tl.events
                if e.device == b["device"] and e.start - tl.start == pytest.approx(b["x0"])
            ]
            if event.action.kind == "F":
                forward_colours.setdefault(event.action.microbatch, set()).add(b["fill"])
    assert sorted(forward_colours) == [0, 1, 2, 3]
    for mb, colours in forward_colours.items():
        assert colours == {rgb(style.microbatch_color(mb))}, f"micro-batch {mb}: {colours}"
    # four micro-batches, four different colours
    assert len({c for cs in forward_colours.values() for c in cs}) == 4
    # the measured chart uses the same colours for the same micro-batches
    fills = {b["fill"] for b in bars(measured, "compute")}
    assert rgb(style.microbatch_color(0)) in fills and rgb(style.microbatch_color(1)) in fills


def test_forward_backward_and_weight_grad_look_different():
    # gpipe: F and B; zb-h1: F, I and W. Wide bars, so hatches are drawn.
    for name, kinds in (("gpipe", "FB"), ("zb-h1", "FIW")):
        tl = sim(name, 2, 2)
        fig = chart(tl)
        ax = fig.axes[0]
        by_kind: dict[str, list[dict]] = {k: [] for k in kinds}
        for b in bars(ax, "compute"):
            (event,) = [
                e
                for e in tl.events
                if e.device == b["device"] and e.start - tl.start == pytest.approx(b["x0"])
            ]
            by_kind[event.action.kind].append(b | {"mb": event.action.microbatch})
        hatches = {k: {b["hatch"] for b in bs} for k, bs in by_kind.items()}
        assert all(len(h) == 1 for h in hatches.values()), hatches
        assert hatches["F"] in ({None}, {""})
        for k in kinds[1:]:
            assert hatches[k] != hatches["F"]
        if name == "gpipe":
            assert hatches["B"] == {style.BACKWARD_HATCH}
        else:
            assert hatches["I"] == {style.INPUT_GRAD_HATCH}
            assert hatches["W"] == {style.WEIGHT_GRAD_HATCH}
            assert hatches["I"] != hatches["W"]
        # same micro-batch: backward drawn darker than forward, W lighter than forward
        shade = {(k, b["mb"]): luminance(b["fill"]) for k, bs in by_kind.items() for b in bs}
        for mb in range(2):
            f = shade[("F", mb)]
            assert shade[(kinds[1], mb)] < f - 0.1
            if name == "zb-h1":
                assert shade[("W", mb)] > f + 0.1
        # the legend names each kind, with the same hatch as the bars, and the bubble
        labels = legend_labels(fig)
        names = {"F": "forward (F)", "B": "backward (B)", "I": "input-grad (I)"}
        names["W"] = "weight-grad (W)"
        assert labels == [names[k] for k in kinds] + ["idle (bubble)"]
        handles = legend_hatches(fig)
        for k in kinds[1:]:
            assert handles[names[k]] == next(iter(hatches[k]))
        assert fig.legends[0].get_title().get_text() == "colour = micro-batch"


def test_narrow_bars_still_tell_forward_from_backward_by_shade():
    tl = sim("gpipe", 4, 48)
    ax = chart(tl).axes[0]
    kinds: dict[str, set] = {"F": set(), "B": set()}
    starts = {(e.device, round(e.start - tl.start, 6)): e.action.kind for e in tl.events}
    for b in bars(ax, "compute"):
        kinds[starts[(b["device"], round(b["x0"], 6))]].add(b["fill"])
    assert kinds["F"] and kinds["B"] and not kinds["F"] & kinds["B"]


def test_zero_length_bars_do_not_switch_off_the_hatches():
    # --weight-cost 0: every W lasts no time; the other bars are wide and keep their hatch
    tl = sim("zb-h1", 2, 2, costs=CostModel(weight_fraction=0.0))
    ax = chart(tl).axes[0]
    hatches = {b["hatch"] for b in bars(ax, "compute")}
    assert style.INPUT_GRAD_HATCH in hatches
    assert len(bars(ax, "compute")) == len(tl.events)  # the W's are still there, one each


def test_bubbles_cover_exactly_the_idle_time():
    tl = sim("1f1b", 4, 4)
    fig = chart(tl)
    ax = fig.axes[0]
    bubbles = bars(ax, "bubble")
    assert bubbles and all(b["hatch"] == style.BUBBLE_HATCH for b in bubbles)
    compute = bars(ax, "compute")
    for d in range(4):
        mine = [b for b in bubbles if b["device"] == d]
        assert sum(b["x1"] - b["x0"] for b in mine) == pytest.approx(tl.idle(d))
        for bub in mine:  # a bubble never hides work on the same device
            for c in (c for c in compute if c["device"] == d):
                assert bub["x1"] <= c["x0"] + 1e-9 or c["x1"] <= bub["x0"] + 1e-9
    assert "idle (bubble)" in legend_labels(fig)
    # bubbles can be switched off, and then the legend does not mention them
    fig = chart(tl, show_bubble=False)
    assert not bars(fig.axes[0], "bubble")
    assert "idle (bubble)" not in legend_labels(fig)


def test_a_single_device_has_no_bubble():
    tl = sim("gpipe", 1, 3)
    fig = chart(tl)
    assert not bars(fig.axes[0], "bubble")
    assert "bubble 0.0%" in fig.axes[0].get_title(loc="left")
    assert "idle (bubble)" not in legend_labels(fig)


def test_communication_is_a_thin_bar_and_not_busy_time():
    tl = dp_pp_timeline("1f1b", 2, 4, 1, dp_workers=2, grad_bytes_per_stage=2.0, bandwidth=1.0)
    comm_events = [e for e in tl.events if not e.action.is_compute]
    assert comm_events  # the stage all-reduces
    fig = chart(tl)
    ax = fig.axes[0]
    comm, compute = bars(ax, "comm"), bars(ax, "compute")
    assert Counter((b["device"], round(b["x0"], 6), round(b["x1"], 6)) for b in comm) == Counter(
        (e.device, round(e.start, 6), round(e.end, 6)) for e in comm_events
    )
    thickest_comm = max(b["y1"] - b["y0"] for b in comm)
    thinnest_compute = min(b["y1"] - b["y0"] for b in compute)
    assert thickest_comm < thinnest_compute / 2
    for b in comm:  # its own lane: below the compute bar of the same device
        row = [c for c in compute if c["device"] == b["device"]]
        assert b["y0"] >= max(c["y1"] for c in row)
    assert "communication" in legend_labels(fig)
    assert f"bubble {100 * tl.bubble_fraction:.1f}%" in ax.get_title(loc="left")
    assert gantt.bubble_fraction(tl) == pytest.approx(tl.bubble_fraction)


def rendered(fig):
    """Draw with Agg so text extents are real; returns the renderer."""
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def check_labels_fit(fig, tl) -> int:
    ax = fig.axes[0]
    renderer = rendered(fig)
    compute = bars(ax, "compute")
    for text in ax.texts:
        x, y = text.get_position()
        (bar,) = [b for b in compute if b["x0"] < x < b["x1"] and b["y0"] < y < b["y1"]]
        box = text.get_window_extent(renderer)
        (left, _), (right, _) = ax.transData.transform([(bar["x0"], y), (bar["x1"], y)])
        assert left <= box.x0 and box.x1 <= right, f"{text.get_text()!r} overflows its bar"
        assert text.get_color() == style.text_color_on(bar["fill"])  # readable on its bar
    return len(ax.texts)


def test_labels_name_the_action_and_fit_inside_their_bars():
    tl = sim("gpipe", 2, 4)
    fig = chart(tl)
    assert check_labels_fit(fig, tl) == len(tl.events)  # wide bars: every one is labelled
    texts = Counter(t.get_text() for t in fig.axes[0].texts)
    assert texts == Counter(f"{e.action.kind}{e.action.microbatch}" for e in tl.events)
    # with chunks the label says which stage too
    tl = sim("interleaved", 2, 2, 2)
    fig = chart(tl)
    assert Counter(t.get_text() for t in fig.axes[0].texts) == Counter(
        str(e.action) for e in tl.events
    )
    # an event's own label wins over the action's name
    labelled = Timeline([Event(0, Action(0, "F", 0), 0.0, 5.0, "warm-up")], 1)
    assert [t.get_text() for t in chart(labelled).axes[0].texts] == ["warm-up"]
    # dense chart: fewer labels than bars, and those shown still fit
    tl = sim("1f1b", 4, 40)
    fig = chart(tl)
    assert check_labels_fit(fig, tl) < len(tl.events)
    assert not chart(tl, labels=False).axes[0].texts


# ----------------------------------------------------------------------------- measured


def test_a_measured_timeline_is_drawn_in_milliseconds_from_its_start():
    tl = measured_like(offset=1000.0)
    fig = chart(tl)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time (ms)"
    title = ax.get_title(loc="left")
    assert f"makespan {tl.makespan * 1000:.1f} ms" in title
    assert f"bubble {100 * tl.bubble_fraction:.1f}%" in title
    assert "(measured)" in title
    assert title.endswith("makespan 36.0 ms, bubble 33.3%")  # 3F+3B long, each device busy 2F+2B
    drawn = Counter(bar_key(b, 4) for b in bars(ax, "compute"))
    assert drawn == Counter(event_key(e, tl.start, 1000.0, 4) for e in tl.events)
    assert min(b["x0"] for b in bars(ax)) == pytest.approx(0.0)
    assert ax.get_xlim()[1] == pytest.approx(tl.makespan * 1000, rel=0.01)


def test_real_executor_step_drawn_and_compared_with_the_simulation():
    import torch

    from course_utils.models import MLP, loss_fn, partition, single_thread
    from course_utils.pipeline.executor import PipelineExecutor

    torch.manual_seed(0)
    model = MLP(16, 32, 5, depth=3)
    x, y = model.example_batch(8, torch.Generator().manual_seed(1))
    schedule = make_schedule("1f1b", 2, 4)
    with single_thread(), PipelineExecutor(partition(model, 2), 2, loss_fn) as ex:
        measured = ex.step(schedule, x, y).timeline
    assert measured.unit == "s" and measured.source == "measured"

    ax = chart(measured).axes[0]
    assert Counter(bar_key(b, 3) for b in bars(ax, "compute")) == Counter(
        event_key(e, measured.start, 1000.0, 3) for e in measured.events if e.action.is_compute
    )
    assert len(bars(ax, "comm")) == 8  # each micro-batch's activation and gradient transfer
    assert f"bubble {100 * measured.bubble_fraction:.1f}%" in ax.get_title(loc="left")

    simulated = simulate(schedule)
    fig = gantt.compare(simulated, measured, pyplot=False)
    top, bottom = fig.axes
    assert top.get_shared_x_axes().joined(top, bottom)
    assert top.get_xlim() == bottom.get_xlim()
    assert top.get_position().y0 > bottom.get_position().y0  # simulated above measured
    assert "simulated" in top.get_title(loc="left") and "1 unit = " in top.get_title(loc="left")
    assert "measured" in bottom.get_title(loc="left")
    assert bottom.get_xlabel() == "time (ms)" and top.get_xlabel() == ""
    # one calibration factor: the simulated bars add up to the measured compute time
    sim_total = sum(b["x1"] - b["x0"] for b in bars(top, "compute"))
    real_total = sum(b["x1"] - b["x0"] for b in bars(bottom, "compute"))
    assert sim_total == pytest.approx(real_total, rel=1e-6)
    # the simulated chart keeps its own bubble
    assert f"bubble {100 * simulated.bubble_fraction:.1f}%" in top.get_title(loc="left")


# ----------------------------------------------------------------------------- stacked


def test_stacked_charts_share_one_time_axis():
    a, b = sim("1f1b", 4, 4), sim("gpipe", 2, 4)  # the longer one on top
    assert a.makespan > b.makespan
    fig = chart([a, b], title=["1F1B", "GPipe"])
    top, bottom = fig.axes
    assert top.get_shared_x_axes().joined(top, bottom)
    assert top.get_xlim() == bottom.get_xlim()
    assert top.get_xlim()[1] >= a.makespan  # room for the longer timeline
    assert top.get_position().y0 > bottom.get_position().y0  # first in the list on top
    assert top.get_title(loc="left").startswith("1F1B — ")
    assert bottom.get_title(loc="left").startswith("GPipe — ")
    assert len(top.get_yticklabels()) == 4 and len(bottom.get_yticklabels()) == 2
    assert not top.xaxis.get_tick_params()["labelbottom"] and top.get_xlabel() == ""
    assert bottom.get_xlabel() == "time (units)"
    assert len(fig.legends) == 1  # one legend for the whole figure
    # different units: each chart keeps its own axis
    fig = chart([a, measured_like()])
    top, bottom = fig.axes
    assert not top.get_shared_x_axes().joined(top, bottom)
    assert (top.get_xlabel(), bottom.get_xlabel()) == ("time (units)", "time (ms)")


def test_compare_puts_the_simulation_above_the_measurement_on_one_axis():
    simulated, measured = sim("gpipe", 2, 2), measured_like()
    fig = gantt.compare(simulated, measured, pyplot=False)
    top, bottom = fig.axes
    assert top.get_shared_x_axes().joined(top, bottom)
    assert top.get_xlim() == bottom.get_xlim()
    assert top.get_xlim()[1] >= 1000 * measured.makespan
    assert top.get_position().y0 > bottom.get_position().y0
    assert (top.get_xlabel(), bottom.get_xlabel()) == ("", "time (ms)")
    # units -> ms with one factor: measured compute time / simulated compute time
    factor = sum(measured.busy(d) for d in range(2)) / sum(simulated.busy(d) for d in range(2))
    title = top.get_title(loc="left")
    assert title.startswith("GPipe, p=2, m=2 (simulated, 1 unit = ")
    assert f"1 unit = {1000 * factor:.3g} ms" in title
    assert f"makespan {1000 * factor * simulated.makespan:.1f} ms" in title
    assert f"bubble {100 * simulated.bubble_fraction:.1f}%" in title
    drawn = Counter(bar_key(b, 4) for b in bars(top, "compute"))
    assert drawn == Counter(event_key(e, 0.0, 1000 * factor, 4) for e in simulated.events)
    assert "(measured)" in bottom.get_title(loc="left")
    # same units: nothing is converted
    fig = gantt.compare(simulated, sim("1f1b", 2, 2), pyplot=False)
    assert fig.axes[0].get_title(loc="left") == gantt.title_for(simulated)


def test_cost_model_from_command_line_numbers():
    costs = CostModel.from_times(1.0, 2.0, None, 0.0)
    assert (costs.forward, costs.backward, costs.weight_fraction, costs.p2p) == (1, 2, 0.5, 0)
    assert CostModel.from_times(1.0, 4.0, 1.0, 0.5).weight_fraction == 0.25
    for args, words in [
        ((0.0, 2.0, None, 0.0), "forward cost must be a finite number > 0"),
        ((1.0, float("nan"), None, 0.0), "backward cost must be a finite number > 0"),
        ((1.0, 2.0, None, -1.0), "p2p cost must be a finite number >= 0"),
        ((1.0, 2.0, 2.5, 0.0), "weight cost must be between 0 and backward cost"),
        ((1.0, 2.0, float("inf"), 0.0), "weight cost must be between 0 and backward cost"),
    ]:
        with pytest.raises(CourseInputError, match=words):
            CostModel.from_times(*args)


def test_draw_into_a_given_axes():
    fig, (ax1, ax2) = plt.subplots(2, 1)
    tl = sim("zb-h1", 2, 2)
    assert gantt.draw(tl, ax=ax2) is fig
    assert not ax1.collections and ax2.collections
    assert [t.get_text() for t in ax2.get_legend().get_texts()][0] == "forward (F)"
    assert "makespan" in ax2.get_title(loc="left")


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda tl: gantt.draw([], pyplot=False), "non-empty list"),
        (lambda tl: gantt.draw("1f1b", pyplot=False), "Timeline"),
        (lambda tl: gantt.draw([tl, tl], title=["one"], pyplot=False), "2 strings"),
        (lambda tl: gantt.draw([tl, tl], ax=plt.gca()), "single timeline"),
        (lambda tl: gantt.compare(tl, Timeline([], 2, unit="s")), "compute events"),
    ],
)
def test_bad_draw_arguments_raise_course_input_error(call, words):
    with pytest.raises(CourseInputError, match=words):
        call(sim("gpipe", 2, 2))


# ----------------------------------------------------------------------------- files


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_save_png_svg_pdf(tmp_path):
    tl = sim("1f1b", 2, 4)
    fig = chart(tl)
    data = gantt.save(fig, tmp_path / "first.png").read_bytes()
    width, height = png_size(data)
    assert (width, height) == (
        round(fig.get_figwidth() * fig.dpi),
        round(fig.get_figheight() * fig.dpi),
    )
    assert len(data) > 5_000
    png = gantt.save(fig, tmp_path / "new" / "folder" / "chart.png")  # folders are created
    assert png.read_bytes()[:8] == PNG_SIGNATURE and png.stat().st_size > 5_000
    svg = gantt.save(fig, tmp_path / "chart.SVG")
    text = svg.read_text()
    assert "<svg" in text and "makespan" in text and "1F1B" in text  # text stays text
    assert gantt.save(fig, tmp_path / "chart.pdf").read_bytes()[:5] == b"%PDF-"
    with pytest.raises(CourseInputError, match=r"\.png, \.svg or \.pdf"):
        gantt.save(fig, tmp_path / "chart.jpg")
    assert not (tmp_path / "chart.jpg").exists()


# ----------------------------------------------------------------------------- CLI


@pytest.fixture
def cli(run_cli):
    """`python -m course_utils gantt ...` in this process: (exit code, stdout, stderr)."""
    return lambda *args: run_cli("gantt", *args)


def test_cli_writes_png_and_svg(cli, tmp_path):
    code, out, err = cli(
        "zb-h1", "--devices", "3", "--microbatches", "4", "-o", str(tmp_path / "c.png")
    )
    assert code == 0, err
    tl = sim("zb-h1", 3, 4)
    assert gantt.title_for(tl) in out and f"wrote {tmp_path / 'c.png'}" in out
    data = (tmp_path / "c.png").read_bytes()
    png_size(data)
    assert len(data) > 10_000

    args = ("interleaved", "--devices", "2", "--microbatches", "4", "--chunks", "2")
    code, out, err = cli(*args, "-o", str(tmp_path / "c.svg"))
    assert code == 0, err
    svg = (tmp_path / "c.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert "Interleaved 1F1B, p=2, m=4, v=2" in svg and "0F0" in svg  # title and labels
    code, out, err = cli(*args, "--no-labels", "-o", str(tmp_path / "plain.svg"))
    assert code == 0, err
    assert "0F0" not in (tmp_path / "plain.svg").read_text()


def test_cli_costs_change_the_chart(cli, tmp_path):
    path = str(tmp_path / "c.png")
    args = ("gpipe", "--devices", "2", "--microbatches", "2", "-o", path)
    assert "makespan 9 units, bubble 33.3%" in cli(*args)[1]  # (m + p - 1)(F + B)
    out = cli(*args, "--forward-cost", "2", "--backward-cost", "4")[1]
    assert "makespan 18.0 units" in out  # (m + p - 1)(F + B)
    out = cli(*args, "--p2p-cost", "0.5")[1]
    costs = CostModel(p2p=0.5)
    assert gantt.title_for(sim("gpipe", 2, 2, costs=costs)) in out
    out = cli("zb-h1", "--devices", "2", "--microbatches", "4", "-o", path, "--weight-cost", "0.5")[
        1
    ]
    costs = CostModel(weight_fraction=0.25)
    assert gantt.title_for(sim("zb-h1", 2, 4, costs=costs)) in out


BAD_INPUT = [
    (["gpipe", "--devices", "0", "--microbatches", "2"], "--devices"),
    (["gpipe", "--devices", "2", "--microbatches", "-3"], "--microbatches"),
    (["gpipe", "--devices", "2", "--microbatches", "2", "--chunks", "0"], "--chunks"),
    (["pipedream", "--devices", "2", "--microbatches", "2"], "schedule must be one of"),
    (["interleaved", "--devices", "4", "--microbatches", "6", "--chunks", "2"],
     "multiple of devices (4)"),
    (["1f1b", "--devices", "2", "--microbatches", "4", "--chunks", "2"],
     "chunks > 1 works only with"),
    (["gpipe", "--devices", "2", "--microbatches", "2", "--forward-cost", "0"],
     "--forward-cost must be a finite number > 0"),
    (["gpipe", "--devices", "2", "--microbatches", "2", "--backward-cost", "nan"],
     "--backward-cost must be a finite number > 0"),
    (["gpipe", "--devices", "2", "--microbatches", "2", "--p2p-cost", "-1"],
     "--p2p-cost must be a finite number >= 0"),
    (["zb-h1", "--devices", "2", "--microbatches", "2", "--weight-cost", "3"],
     "--weight-cost must be between 0 and --backward-cost"),
    (["gpipe", "--devices", "two", "--microbatches", "2"], "invalid int value"),
]  # fmt: skip


@pytest.mark.parametrize("args, words", BAD_INPUT)
def test_cli_bad_input_is_one_line_and_exit_2(cli, tmp_path, args, words):
    out_path = tmp_path / "chart.png"
    code, out, err = cli(*args, "-o", str(out_path))
    assert code == 2
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert words in lines[0]
    assert out == ""
    assert not out_path.exists()


@pytest.mark.parametrize("name", ["chart.jpg", "chart", "chart.png.txt"])
def test_cli_rejects_unsupported_output_extensions(cli, tmp_path, name):
    code, out, err = cli(
        "gpipe", "--devices", "2", "--microbatches", "2", "-o", str(tmp_path / name)
    )
    assert code == 2 and out == ""
    # named as typed: -o, not --output
    assert err.count("\n") == 1 and "-o must end in .png, .svg or .pdf" in err
    assert list(tmp_path.iterdir()) == []


def test_cli_unwritable_output_is_one_line(cli, tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    (tmp_path / "taken.png").mkdir()  # a folder where the file should go
    for target in (tmp_path / "a_file" / "chart.png", tmp_path / "taken.png"):
        code, out, err = cli("gpipe", "--devices", "2", "--microbatches", "2", "-o", str(target))
        assert code == 2, err
        assert "Traceback" not in err and err.count("\n") == 1, err
        assert str(target) in err and ("cannot be written" in err or "is a folder" in err)


def test_cli_end_to_end_in_a_subprocess(tmp_path):
    png = tmp_path / "chart.png"
    ok = run_module(
        "gantt", "1f1b", "--devices", "4", "--microbatches", "8", "-o", png, timeout=120
    )
    assert ok.returncode == 0, ok.stderr
    assert "1F1B, p=4, m=8 — makespan 33.0 units, bubble 27.3%" in ok.stdout
    assert png.read_bytes()[:8] == PNG_SIGNATURE and png.stat().st_size > 10_000
    bad = run_module(
        "gantt", "interleaved", "--devices", "4", "--microbatches", "6", "--chunks", "2",
        "-o", tmp_path / "bad.png", timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    assert "multiple of devices" in bad.stderr


def test_the_gantt_command_never_imports_torch(tmp_path):
    code = (
        "import sys, io, contextlib\n"
        "from course_utils.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main(['gantt', 'zb-h1', '--devices', '3', '--microbatches', '4', "
        f"'-o', {str(tmp_path / 'c.svg')!r}])\n"
        "print(rc, 'torch' in sys.modules, 'matplotlib.pyplot' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "False", "False"]  # no torch, no pyplot state
    assert (tmp_path / "c.svg").stat().st_size > 1_000


def test_waiting_for_an_all_reduce_is_not_drawn_as_pipeline_bubble():
    from course_utils.parallel.timelines import data_parallel_timeline

    step = data_parallel_timeline(2, 1.0, 2.0, grad_bytes=4e6, bandwidth=1e6, buckets=1)
    fig = gantt.draw(step, pyplot=False, colour="step")
    ax = fig.axes[0]
    wait = [b for b in bars(ax, "all") if b["fill"] == rgb(to_rgb(style.WAIT_COLOR))]
    comm_end = max(e.end for e in step.events if not e.action.is_compute)
    # each worker idles exactly while its all-reduce runs: a wait bar, no bubble there
    assert sorted(b["device"] for b in wait) == [0, 1]
    for b in wait:
        # seconds are drawn in ms
        assert b["x0"] == pytest.approx(3000.0) and b["x1"] == pytest.approx(1000 * comm_end)
    assert not [b for b in bars(ax, "bubble")]
    labels = legend_labels(fig)
    assert style.WAIT_LABEL in labels and style.BUBBLE_LABEL not in labels
    assert fig.legends[0].get_title().get_text() == "colour = step"
    # a pipeline's idle time stays the bubble, and the legend says micro-batch
    fig = gantt.draw(sim("gpipe", 2, 2), pyplot=False)
    assert fig.legends[0].get_title().get_text() == "colour = micro-batch"
    assert style.BUBBLE_LABEL in legend_labels(fig)


def test_a_collective_that_starts_a_rounding_error_late_leaves_no_idle_sliver():
    from course_utils.parallel.timelines import data_parallel_timeline

    # DDP-style buckets: the last all-reduce starts 6e-17 s after the backward ends
    step = data_parallel_timeline(4, 0.1, 0.2, 100e6, 1.25e9, buckets=4, overlap=True)
    fig = gantt.draw(step, pyplot=False, colour="step")
    assert not bars(fig.axes[0], "bubble")
    assert "idle" not in legend_labels(fig) and style.WAIT_LABEL in legend_labels(fig)


def test_a_title_counts_micro_batches_only_when_colour_means_micro_batch():
    from course_utils.parallel.timelines import data_parallel_timeline

    step = data_parallel_timeline(2, 1.0, 2.0, grad_bytes=4e6, bandwidth=1e6)
    title = gantt.draw(step, pyplot=False, colour="step").axes[0].get_title(loc="left")
    assert ", p=2 —" in title and "m=" not in title
    assert "idle " in title and "bubble" not in title  # waiting for the all-reduce
    assert title == gantt.title_for(step, colour="step")
    # a pipeline keeps its m
    assert ", m=2 " in gantt.draw(sim("gpipe", 2, 2), pyplot=False).axes[0].get_title(loc="left")
