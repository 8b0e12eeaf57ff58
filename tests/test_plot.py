"""The lessons' data charts (charts.plot, charts.bars, charts.activations): each draws exactly
what it is given, with its title, axis labels and a legend that covers no data.

What the figures say, read back from the artists, not what the pixels look like.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # no display, in this process and before pyplot is imported

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from course_utils.charts.activations import held_chart, held_over_time  # noqa: E402
from course_utils.charts.bars import bar_chart, grouped_bars  # noqa: E402
from course_utils.charts.plot import REFERENCE_GREY, lines_chart, plot  # noqa: E402
from course_utils.errors import CourseInputError  # noqa: E402
from course_utils.pipeline.schedules import make_schedule  # noqa: E402
from course_utils.pipeline.simulate import CostModel, simulate  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _curves(ax) -> dict[str, tuple[list[float], list[float]]]:
    return {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
        for line in ax.get_lines()
    }


def _data_points_in_display(ax) -> np.ndarray:
    """Every plotted point and every bar corner, in display (pixel) coordinates."""
    points = [np.column_stack([line.get_xdata(), line.get_ydata()]) for line in ax.get_lines()]
    for patch in ax.patches:
        if isinstance(patch, Rectangle) and patch.get_label() != "_nolegend_":
            (x0, y0), (x1, y1) = patch.get_bbox().get_points()
            points.append(np.array([[x0, y0], [x1, y1], [x0, y1], [x1, y0]]))
    data = np.concatenate([p.astype(float) for p in points])
    data = data[np.all(np.isfinite(data), axis=1)]
    return ax.transData.transform(data)


def assert_legend_covers_no_data(fig, ax) -> None:
    fig.canvas.draw()
    legend = ax.get_legend()
    assert legend is not None, "no legend"
    box = legend.get_window_extent()
    inside = [
        (x, y)
        for x, y in _data_points_in_display(ax)
        if box.contains(x, y) and ax.bbox.contains(x, y)
    ]
    assert inside == [], f"the legend covers {len(inside)} data points"


# --------------------------------------------------------------------------- plot


def test_plot_draws_each_curve_it_is_given_with_its_title_labels_and_legend():
    xs = [1, 2, 3, 4]
    fig = plot(
        {"formula 1/p": (xs, [1, 1 / 2, 1 / 3, 1 / 4]), "this machine": ([1, 2], [0.9, 0.45])},
        hlines={"budget": 0.5},
        vlines={"a node's edge": 2.5},
        title="Utilization",
        xlabel="devices p",
        ylabel="busy / makespan",
    )
    ax = fig.axes[0]
    curves = _curves(ax)
    assert curves["formula 1/p"] == (xs, [1, 1 / 2, 1 / 3, 1 / 4])
    assert curves["this machine"] == ([1, 2], [0.9, 0.45])
    assert curves["budget"][1] == [0.5, 0.5]  # a horizontal line at the value
    assert curves["a node's edge"][0] == [2.5, 2.5]
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == (
        "Utilization",
        "devices p",
        "busy / makespan",
    )
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert texts == ["formula 1/p", "this machine", "budget", "a node's edge"]


def test_a_curves_label_decides_its_look_unless_a_format_says_otherwise():
    xs = [1, 2, 4]
    fig = plot(
        {
            "formula": (xs, [1, 2, 3]),
            "measured": (xs, [1, 2, 3]),
            "simulated": (xs, [1, 2, 3]),
            "reference": (xs, [1, 2, 3]),
            "mine": (xs, [1, 2, 3]),
        },
        fmts={"mine": "C2x:"},
    )
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert lines["formula"].get_linestyle() == "--"
    assert to_rgb(lines["formula"].get_color()) == to_rgb("crimson")
    assert (lines["measured"].get_linestyle(), lines["measured"].get_marker()) == ("-", "o")
    assert (lines["simulated"].get_linestyle(), lines["simulated"].get_marker()) == ("--", "s")
    assert to_rgb(lines["reference"].get_color()) == to_rgb(REFERENCE_GREY)
    assert (lines["mine"].get_linestyle(), lines["mine"].get_marker()) == (":", "x")
    assert to_rgb(lines["mine"].get_color()) == to_rgb(
        plt.rcParams["axes.prop_cycle"].by_key()["color"][2]
    )
    # formulas and references keep their own colours: the measured curves take the palette's
    assert lines["measured"].get_color() != lines["simulated"].get_color()


def test_plot_sets_scales_limits_and_ticks_and_draws_into_a_given_panel():
    fig, (left, right) = plt.subplots(1, 2)
    returned = plot(
        {"a": ([1, 2, 4, 8], [1, 4, 16, 64])},
        xscale="log2",
        yscale="log",
        ylim=(0.5, 100),
        xticks=[1, 2, 4, 8],
        ax=right,
        title="right",
    )
    assert returned is fig and left.get_lines() == [] and right.get_title() == "right"
    assert right.get_xscale() == "log" and right.xaxis.get_transform().base == 2
    assert right.get_yscale() == "log" and right.get_ylim() == (0.5, 100)
    assert list(right.get_xticks()) == [1, 2, 4, 8]


@pytest.mark.parametrize("where", ["best", "outside"])
def test_the_legend_of_a_line_chart_covers_no_data(where):
    xs = np.linspace(0, 10, 50)
    fig = plot(
        {"rising": (xs, xs), "falling": (xs, 10 - xs), "flat": (xs, np.full_like(xs, 5))},
        hlines={"limit": 8},
        legend=where,
    )
    assert_legend_covers_no_data(fig, fig.axes[0])
    if where == "outside":
        fig.canvas.draw()
        legend_box = fig.axes[0].get_legend().get_window_extent()
        assert legend_box.x0 >= fig.axes[0].bbox.x1  # right of the axes


def test_plot_without_a_legend_has_none():
    fig = plot({"a": ([0, 1], [0, 1])}, legend="none")
    assert fig.axes[0].get_legend() is None


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"curves": {}}, "curves"),
        ({"curves": {"a": ([1, 2], [1])}}, "'a'"),
        ({"curves": {"a": ([1], [1])}, "xscale": "log3"}, "xscale"),
        ({"curves": {"a": ([1], [1])}, "yscale": "ln"}, "yscale"),
        ({"curves": {"a": ([1], [1])}, "legend": "left"}, "legend"),
    ],
)
def test_plot_refuses_bad_input_in_one_line_naming_it(kwargs, named):
    with pytest.raises(CourseInputError, match=named) as err:
        plot(**kwargs)
    assert "\n" not in str(err.value)


def test_lines_chart_draws_series_against_shared_xs_and_references_in_grey():
    fig = lines_chart(
        [1, 2, 4],
        {"formula (p-1)/(m+p-1)": [0.5, 0.33, 0.2], "measured on this machine": [0.55, 0.4, 0.3]},
        reference={"reference": ([1, 2, 4], [0.52, 0.35, 0.22])},
        title="bubble",
        xlabel="m",
        ylabel="fraction",
    )
    ax = fig.axes[0]
    curves = _curves(ax)
    assert curves["measured on this machine"] == ([1, 2, 4], [0.55, 0.4, 0.3])
    assert curves["reference"] == ([1, 2, 4], [0.52, 0.35, 0.22])
    grey = next(line for line in ax.get_lines() if line.get_label() == "reference")
    assert to_rgb(grey.get_color()) == to_rgb(REFERENCE_GREY) and grey.get_linestyle() == ":"
    assert ax.get_xscale() == "log" and (ax.get_title(), ax.get_ylabel()) == ("bubble", "fraction")
    with pytest.raises(CourseInputError, match="as long as xs"):
        lines_chart([1, 2], {"a": [1]})


# --------------------------------------------------------------------------- bars


def _bars(ax, label):
    return [p for p in ax.patches if isinstance(p, Rectangle) and p.get_label() == label] or [
        p for c in ax.containers if c.get_label() == label for p in c.patches
    ]


def test_bar_chart_puts_series_side_by_side_one_bar_per_category():
    fig = bar_chart(
        ["device 0", "device 1", "device 2"],
        {"GPipe": [8, 8, 8], "1F1B": [3, 2, 1]},
        lines={"p = 3": 3},
        title="peaks",
        xlabel="device",
        ylabel="micro-batches held",
    )
    ax = fig.axes[0]
    gpipe, one_f = (_bars(ax, name) for name in ("GPipe", "1F1B"))
    assert [b.get_height() for b in gpipe] == [8, 8, 8]
    assert [b.get_height() for b in one_f] == [3, 2, 1]
    assert all(g.get_x() < o.get_x() for g, o in zip(gpipe, one_f, strict=True))  # side by side
    assert [t.get_text() for t in ax.get_xticklabels()] == ["device 0", "device 1", "device 2"]
    assert _curves(ax)["p = 3"][1] == [3, 3]
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == (
        "peaks",
        "device",
        "micro-batches held",
    )
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["p = 3", "GPipe", "1F1B"]


def test_stacked_bars_start_where_the_previous_part_ends_and_carry_their_totals():
    fig = bar_chart(
        ["fp32", "mixed"],
        {"parameters": [4, 2], "gradients": [4, 2], "optimizer": [8, 12]},
        stacked=True,
        bar_labels="{:g} B",
        totals="{:g} in all",
    )
    ax = fig.axes[0]
    optimizer = _bars(ax, "optimizer")
    assert [b.get_y() for b in optimizer] == [8, 4]  # on top of parameters + gradients
    assert [b.get_y() + b.get_height() for b in optimizer] == [16, 16]
    texts = [t.get_text() for t in ax.texts]
    assert {"4 B", "2 B", "8 B", "12 B"} <= set(texts)
    assert texts.count("16 in all") == 2


def test_horizontal_bars_list_the_categories_top_down_with_value_lines_across():
    fig = bar_chart(
        ["first", "second"],
        {"time": [1.0, 3.0]},
        horizontal=True,
        lines={"budget": 2.0},
        bar_labels="{:.1f} s",
        limit=(0, 4),
    )
    ax = fig.axes[0]
    bars = _bars(ax, "time")
    assert [b.get_width() for b in bars] == [1.0, 3.0]
    assert ax.yaxis_inverted()  # the first category on top
    assert _curves(ax)["budget"][0] == [2.0, 2.0]  # a vertical line at the value
    assert ax.get_xlim() == (0, 4)
    assert {"1.0 s", "3.0 s"} <= {t.get_text() for t in ax.texts}


def test_one_series_may_colour_each_bar_and_say_what_each_bar_means():
    colours = ["#8172b3", "#4c72b0", "#55a467"]
    fig = bar_chart(
        ["a", "b", "c"],
        {"peak": [1, 2, 3]},
        colors=colours,
        bar_labels={"peak": ["one", "two", "three"]},
    )
    ax = fig.axes[0]
    assert [to_rgb(b.get_facecolor()) for b in _bars(ax, "peak")] == [to_rgb(c) for c in colours]
    assert {"one", "two", "three"} <= {t.get_text() for t in ax.texts}


def test_the_legend_of_a_bar_chart_covers_no_bar():
    fig = bar_chart(
        [f"device {d}" for d in range(4)],
        {"GPipe": [8, 8, 8, 8], "1F1B": [4, 3, 2, 1]},
        lines={"p = 4": 4},
        legend="outside",
    )
    assert_legend_covers_no_data(fig, fig.axes[0])


@pytest.mark.parametrize(
    ("args", "kwargs", "named"),
    [
        ((["a", "b"], {}), {}, "series"),
        ((["a", "b"], {"s": [1]}), {}, "series"),
        ((["a", "b"], {"s": [1, 2], "t": [1, 2]}), {"colors": ["red"]}, "colors"),
        ((["a"], {"s": [1]}), {"legend": "somewhere"}, "legend"),
    ],
)
def test_bar_chart_refuses_bad_input_in_one_line_naming_it(args, kwargs, named):
    with pytest.raises(CourseInputError, match=named) as err:
        bar_chart(*args, **kwargs)
    assert "\n" not in str(err.value)


def test_grouped_bars_draws_one_panel_per_group_of_series():
    fig = grouped_bars(
        ["small", "large"],
        {
            "This machine": {"unsplit": [1.0, 4.0], "tensor parallel": [0.8, 2.5]},
            "Reference": {"unsplit": [1.1, 4.2], "tensor parallel": [0.7, 2.4]},
        },
        title="TP vs unsplit",
        ylabel="ms",
    )
    left, right = fig.axes
    assert (left.get_title(), right.get_title()) == ("This machine", "Reference")
    assert [b.get_height() for b in _bars(right, "tensor parallel")] == [0.7, 2.4]
    assert left.get_ylabel() == "ms" and fig.get_suptitle() == "TP vs unsplit"
    with pytest.raises(CourseInputError, match="one value per category"):
        grouped_bars(["a"], {"p": {"s": [1, 2]}})


# --------------------------------------------------------------------------- activations


def test_held_over_time_counts_forwards_in_and_backwards_out():
    timeline = simulate(make_schedule("gpipe", 2, 2), CostModel(forward=1.0, backward=2.0))
    times, held = held_over_time(timeline, 0)
    # device 0: F0 at 0, F1 at 1; B0 ends at 7 (after device 1's B0), B1 at 9
    assert (times, held) == ([0.0, 0.0, 1.0, 7.0, 9.0], [0, 1, 2, 1, 0])
    assert max(held) == timeline.peak_activations[0]


def test_held_chart_draws_one_step_curve_per_device_peaking_at_the_simulators_count():
    timeline = simulate(make_schedule("1f1b", 4, 8), CostModel(forward=1.0, backward=2.0))
    fig = held_chart(timeline, title="1F1B")
    ax = fig.axes[0]
    curves = _curves(ax)
    assert list(curves) == [f"device {d}" for d in range(4)]
    assert [max(curves[f"device {d}"][1]) for d in range(4)] == timeline.peak_activations
    assert (ax.get_title(), ax.get_ylabel()) == ("1F1B", "micro-batches held")
    assert_legend_covers_no_data(fig, ax)
