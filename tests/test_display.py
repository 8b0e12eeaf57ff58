"""Widgets carry a text (and PNG) fallback for front ends that do not render widgets."""

from __future__ import annotations

import base64

import IPython.display
import ipywidgets as widgets

from course_utils.charts.display import WithFallback, fallback_bundle

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def test_bundle_keeps_the_widget_and_adds_text_and_png():
    slider = widgets.IntSlider(3)
    bundle = fallback_bundle(slider, "three", b"\x89PNG fake")
    assert WIDGET_MIME in bundle
    assert bundle[WIDGET_MIME]["model_id"] == slider.model_id
    assert bundle["text/plain"] == "three"
    assert base64.b64decode(bundle["image/png"]) == b"\x89PNG fake"
    assert "image/png" not in fallback_bundle(slider, "three")
    assert repr(WithFallback(slider, "three")) == "three"


def test_planner_widget_shows_its_starting_plan_as_text(monkeypatch):
    from course_utils import plan
    from course_utils.plan import widget as planner

    shown, estimated = [], []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.extend(objs))
    real = planner.estimate_from_sliders
    monkeypatch.setattr(
        planner, "estimate_from_sliders", lambda *a, **k: estimated.append(a) or real(*a, **k)
    )
    ui = plan.planner_widget(global_batch=256)
    fallbacks = [o for o in shown if isinstance(o, WithFallback)]
    assert len(fallbacks) == 1
    bundle = fallbacks[0]._repr_mimebundle_()
    assert "tp=8" in bundle["text/plain"] and "total" in bundle["text/plain"]
    assert base64.b64decode(bundle["image/png"]).startswith(b"\x89PNG")  # the chart too
    # The chart and the text of one setting come from one estimate.
    assert len(estimated) == 1
    tp = ui.children[0].children[0].children[3]
    assert tp.description == "tensor (tp)"
    tp.value = 4
    assert len(estimated) == 2 and "tp=4" in ui.children[2].value


def test_layout_explorer_says_why_a_layout_is_invalid_and_draws_no_chart(monkeypatch):
    from course_utils import plan

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.extend(objs))
    model = plan.MODEL_PRESETS["13B"]
    ui = plan.layout_explorer(model, global_batch=512, name="13B")
    (explorer,) = [o for o in shown if isinstance(o, WithFallback)]
    controls, chart, caption = ui.children
    assert explorer.png is not None and chart.layout.display is None
    tp = controls.children[2]
    tp.value = 8
    controls.children[3].value = 8  # 8 x 8 = 64 GPUs of model parallelism on 32 GPUs
    assert "not a valid layout" in caption.value
    assert chart.layout.display == "none"


def test_picker_redraws_on_change_and_falls_back_to_its_first_chart_and_text():
    import matplotlib.pyplot as plt

    from course_utils.charts.display import picker

    drawn, figures = [], []

    def draw(slope, name):
        drawn.append((slope, name))
        fig, ax = plt.subplots()
        ax.plot([0, 1], [0, slope])
        figures.append(fig)
        return fig

    slope = widgets.IntSlider(value=1, min=1, max=5)
    name = widgets.Dropdown(options=["a", "b"], value="a")
    shown = picker({"slope": slope, "name": name}, draw, lambda slope, name: f"{name} <{slope}>")
    first = shown.png
    assert first.startswith(b"\x89PNG")
    bundle = shown._repr_mimebundle_()
    assert base64.b64decode(bundle["image/png"]) == first
    assert bundle["text/plain"] == "a <1>"
    controls, chart, caption = shown.widget.children
    assert chart.value == first and "a &lt;1&gt;" in caption.value
    slope.value = 4
    name.value = "b"
    assert drawn == [(1, "a"), (4, "a"), (4, "b")]
    assert bytes(chart.value) != first and bytes(chart.value).startswith(b"\x89PNG")
    assert "b &lt;4&gt;" in caption.value
    # painted figures are closed, so pyplot does not show them a second time
    assert not any(plt.fignum_exists(f.number) for f in figures)


def test_the_picker_computes_its_text_before_it_sends_a_new_chart():
    # The browser shows each widget's change as it arrives: a chart sent before its text was
    # computed showed beside the old text for as long as `describe` took (a browser test
    # that read the text right after the chart changed failed on a busy CI machine).
    import matplotlib.pyplot as plt

    from course_utils.charts.display import picker

    described = []

    def draw(n):
        fig, ax = plt.subplots()
        ax.plot([0, 1], [0, n])
        return fig

    n = widgets.IntSlider(value=1)
    shown = picker({"n": n}, draw, lambda n: described.append(n) or f"n={n}")
    chart, caption = shown.widget.children[1:]
    seen_when_sent = []
    chart.observe(lambda _: seen_when_sent.append(list(described)), names="value")
    n.value = 2
    assert seen_when_sent == [[1, 2]], seen_when_sent
    assert "n=2" in caption.value


def test_a_text_only_picker_has_no_chart():
    from course_utils.charts.display import picker

    n = widgets.IntSlider(value=2)
    shown = picker({"n": n}, describe=lambda n: f"n={n}")
    assert shown.png is None and len(shown.widget.children) == 2
    n.value = 3
    assert "n=3" in shown.widget.children[1].value
    assert "image/png" not in shown._repr_mimebundle_()


def test_nothing_the_course_shows_goes_through_an_output_widget():
    # An Output widget (also inside interact and interactive) shows nothing where widgets are
    # not rendered, and nbclient's imitation of it can stall a cell (nbclient #312): lessons
    # and the package show controls with `picker` instead.
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    banned = re.compile(r"\bOutput\(|\binteract(ive|ive_output)?\(")
    sources = {
        f"{path.name} {cell.get('id')}": "".join(cell["source"])
        for folder in ("notebooks", "exercises", "solutions")
        for path in sorted((root / folder).glob("*.ipynb"))
        for cell in json.loads(path.read_text())["cells"]
        if cell["cell_type"] == "code"
    }
    sources |= {str(path): path.read_text() for path in (root / "course_utils").rglob("*.py")}
    assert len(sources) > 100
    offenders = [where for where, text in sources.items() if banned.search(text)]
    assert offenders == []
