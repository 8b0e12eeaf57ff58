"""The schedule explorer: move a slider, watch the pipeline's Gantt chart and bubble change.

    from course_utils.charts.explorer import show_explorer
    show_explorer("gpipe", devices=4, microbatches=8)

One update simulates the schedule and paints its chart. It must feel instant (under
100 ms for up to 16 devices and 64 micro-batches, see benchmarks/bench_explorer.py), so
the chart is painted by `course_utils.charts.raster`, not redrawn by matplotlib; it looks
like the static charts of gantt.py. The names, chunk rules and closed-form bubbles come
from the schedule registry (`course_utils.pipeline.schedules.SCHEDULES`).

Without a widget frontend (nbval, a plain notebook viewer, `print`), the explorer shows
its chart as a PNG and its numbers as text.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field, replace
from functools import lru_cache

from course_utils.charts.raster import paint
from course_utils.errors import CourseInputError, ScheduleError
from course_utils.pipeline.schedules import BASELINE, SCHEDULES, Case, make_schedule, schedule_info
from course_utils.pipeline.simulate import CostModel, simulate

MAX_DEVICES, MAX_MICROBATCHES, MAX_CHUNKS = 16, 64, 4
XLABEL = "time (units: one micro-batch forward on one device's share = 1)"


@dataclass(frozen=True)
class Settings:
    """What the explorer's controls say. Costs are per micro-batch on one device's share."""

    schedule: str = BASELINE
    devices: int = 4
    microbatches: int = 8
    chunks: int = 2  # used by interleaved and breadth-first only
    backward_ratio: float = 2.0  # backward time / forward time
    comm_cost: float = 0.0  # point-to-point transfer time, in forward units

    def validated(self) -> Settings:
        """These settings, or a CourseInputError naming the first bad one."""
        schedule_info(self.schedule)  # a one-line error for an unknown name
        for name, value, top in (
            ("devices", self.devices, MAX_DEVICES),
            ("microbatches", self.microbatches, MAX_MICROBATCHES),
            ("chunks", self.chunks, MAX_CHUNKS),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise CourseInputError(
                    f"{name} must be a whole number from 1 to {top}, not {value!r}"
                )
        if not 0.25 <= self.backward_ratio <= 8:
            raise CourseInputError(
                f"backward_ratio must be between 0.25 and 8, not {self.backward_ratio!r}"
            )
        if not 0 <= self.comm_cost <= 10:
            raise CourseInputError(f"comm_cost must be between 0 and 10, not {self.comm_cost!r}")
        return self

    @property
    def effective_chunks(self) -> int:
        return self.chunks if SCHEDULES[self.schedule].uses_chunks else 1


@dataclass
class View:
    """One state of the explorer: the numbers, the text a learner reads, and the chart."""

    settings: Settings
    makespan: float
    bubble_fraction: float
    formula: str | None  # the closed form that predicts this bubble, when one applies
    formula_value: float | None
    peak_activations: list[int]
    png: bytes = field(repr=False)

    @property
    def title(self) -> str:
        s = self.settings
        chunks = f", v={s.chunks}" if SCHEDULES[s.schedule].uses_chunks else ""
        return (
            f"{SCHEDULES[s.schedule].label} · p={s.devices}, m={s.microbatches}{chunks} — "
            f"makespan {self.makespan:.1f} units, bubble {100 * self.bubble_fraction:.1f}%"
        )

    @property
    def text(self) -> str:
        """The metrics in one or two plain lines (the widget shows the same)."""
        s = self.settings
        v = SCHEDULES[s.schedule].chunks(s.effective_chunks)
        first, last = (self._held(self.peak_activations[i], v) for i in (0, -1))
        lines = [
            f"{SCHEDULES[self.settings.schedule].label}: bubble {100 * self.bubble_fraction:.1f}% "
            f"of devices x makespan; makespan {self.makespan:.1f} units; peak activations held "
            f"on device 0: {first}, on the last device: {last}"
        ]
        if self.formula and self.formula_value is not None:  # set together (explorer_update)
            lines.append(f"closed form {self.formula} = {100 * self.formula_value:.1f}%")
        return "\n".join(lines)

    @staticmethod
    def _held(chunks_held: int, v: int) -> str:
        if v == 1:
            return f"{chunks_held} micro-batches"
        # Each chunk holds 1/v of a device's layers, so 1/v of a micro-batch's activations.
        return f"{chunks_held} chunks (= {chunks_held / v:g} micro-batches)"

    def html(self) -> str:
        text = html.escape(self.text).replace("\n", "<br>")
        bubble = f"bubble {100 * self.bubble_fraction:.1f}%"
        return text.replace(bubble, f"<b>{bubble}</b>", 1)


def closed_form(settings: Settings) -> tuple[str, float] | None:
    """The registry's bubble formula and its value, when it holds for these settings."""
    s = settings
    case = Case(
        s.devices, s.microbatches, s.effective_chunks, 1.0, s.backward_ratio, 0.5, s.comm_cost
    )
    form = SCHEDULES[s.schedule].bubble
    value = form(case)
    return None if value is None else (form.formula, value)


@lru_cache(maxsize=32)
def _schedule(name: str, p: int, m: int, v: int):
    """Schedules are immutable values: moving a cost slider back and forth reuses them."""
    return make_schedule(name, p, m, v)


def explorer_update(settings: Settings | None = None, **changes) -> View:
    """Simulate the schedule the settings describe and paint its chart.

    Raises CourseInputError for settings no schedule accepts (e.g. interleaved with m not
    a multiple of p); the widget shows that message instead of a chart.
    """
    s = replace(settings or Settings(), **changes).validated()
    try:
        schedule = _schedule(s.schedule, s.devices, s.microbatches, s.effective_chunks)
        timeline = simulate(
            schedule, CostModel.from_times(1.0, s.backward_ratio, None, s.comm_cost)
        )
    except ScheduleError as exc:  # cannot happen for the course's schedules; say so if it does
        raise CourseInputError(str(exc)) from exc
    form = closed_form(s)
    view = View(
        settings=s,
        makespan=timeline.makespan,
        bubble_fraction=timeline.bubble_fraction,
        formula=form[0] if form else None,
        formula_value=form[1] if form else None,
        peak_activations=list(timeline.peak_activations or []),
        png=b"",
    )
    view.png = paint(timeline, view.title, XLABEL)
    return view


# ------------------------------------------------------------------------------ the widget


class ScheduleExplorer:
    """The widget: a drop-down, five sliders, the chart and the metrics, kept in sync.

    Displayed in JupyterLab it is interactive; elsewhere it shows the PNG and the text.
    """

    def __init__(self, settings: Settings) -> None:
        import ipywidgets as widgets

        self.view = explorer_update(settings)
        s = self.view.settings
        wide = {"description_width": "150px"}
        layout = widgets.Layout(width="460px")
        self.schedule = widgets.Dropdown(
            options=[(info.label, name) for name, info in SCHEDULES.items()],
            value=s.schedule,
            description="schedule",
            style=wide,
            layout=layout,
        )
        self.devices = widgets.IntSlider(
            s.devices, 1, MAX_DEVICES, description="devices p", style=wide, layout=layout
        )
        self.microbatches = widgets.IntSlider(
            s.microbatches, 1, MAX_MICROBATCHES, description="micro-batches m", style=wide,
            layout=layout,
        )  # fmt: skip
        self.chunks = widgets.IntSlider(
            s.chunks, 1, MAX_CHUNKS, description="chunks per device v", style=wide, layout=layout
        )
        self.backward = widgets.FloatSlider(
            s.backward_ratio, min=0.5, max=4.0, step=0.25, description="backward / forward",
            style=wide, layout=layout,
        )  # fmt: skip
        self.comm = widgets.FloatSlider(
            s.comm_cost, min=0.0, max=2.0, step=0.05, description="transfer cost",
            style=wide, layout=layout,
        )  # fmt: skip
        self.chart = widgets.Image(value=self.view.png, format="png")
        self.metrics = widgets.HTML(self.view.html())
        for widget, name in (
            (self.schedule, "schedule"),
            (self.devices, "devices"),
            (self.microbatches, "microbatches"),
            (self.chunks, "chunks"),
            (self.backward, "backward"),
            (self.comm, "comm"),
            (self.chart, "chart"),
            (self.metrics, "metrics"),
        ):
            widget.add_class(f"explorer-{name}")
        self._sync_enabled()
        for control in self.controls:
            control.observe(self._on_change, names="value")
        self.ui = widgets.VBox(
            [
                widgets.HBox(
                    [
                        widgets.VBox([self.schedule, self.devices, self.microbatches]),
                        widgets.VBox([self.chunks, self.backward, self.comm]),
                    ]
                ),
                self.metrics,
                self.chart,
            ]
        )
        self.ui.add_class("schedule-explorer")

    @property
    def controls(self) -> tuple:
        return (
            self.schedule,
            self.devices,
            self.microbatches,
            self.chunks,
            self.backward,
            self.comm,
        )

    def settings(self) -> Settings:
        return Settings(
            schedule=self.schedule.value,
            devices=self.devices.value,
            microbatches=self.microbatches.value,
            chunks=self.chunks.value,
            backward_ratio=float(self.backward.value),
            comm_cost=float(self.comm.value),
        )

    def _sync_enabled(self) -> None:
        self.chunks.disabled = not SCHEDULES[self.schedule.value].uses_chunks

    def _on_change(self, _change=None) -> None:
        self._sync_enabled()
        try:
            self.view = explorer_update(self.settings())
        except CourseInputError as exc:  # keep the last chart; say what to change
            self.metrics.value = f"<b>⚠ {html.escape(str(exc))}</b>"
            return
        self.chart.value = self.view.png
        self.metrics.value = self.view.html()

    def _repr_mimebundle_(self, **kwargs) -> dict:
        from course_utils.charts.display import fallback_bundle

        return fallback_bundle(self.ui, self.view.text, self.view.png, **kwargs)

    def __repr__(self) -> str:
        return self.view.text


def schedule_explorer(
    schedule: str = BASELINE,
    devices: int = 4,
    microbatches: int = 8,
    chunks: int = 2,
    backward_ratio: float = 2.0,
    comm_cost: float = 0.0,
    *,
    stages: int | None = None,
) -> ScheduleExplorer:
    """Build the explorer (display it, or use `show_explorer`). `stages=` is the older
    spelling of `devices=` (the devices p; a device holds `chunks` stages)."""
    if stages is not None:
        devices = stages
    return ScheduleExplorer(
        Settings(schedule, devices, microbatches, chunks, backward_ratio, comm_cost).validated()
    )


def show_explorer(*args, **kwargs) -> ScheduleExplorer:
    """Build and display the explorer; the same arguments as `schedule_explorer`."""
    from IPython.display import display

    explorer = schedule_explorer(*args, **kwargs)
    display(explorer)
    return explorer
