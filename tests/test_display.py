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

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.extend(objs))
    monkeypatch.setattr(plan, "draw_plan", lambda *a, **k: None)  # no chart needed here
    monkeypatch.setattr("matplotlib.pyplot.show", lambda *a, **k: None)
    plan.planner_widget(global_batch=256)
    fallbacks = [o for o in shown if isinstance(o, WithFallback)]
    assert len(fallbacks) == 1
    text = fallbacks[0]._repr_mimebundle_()["text/plain"]
    assert text.startswith("Planner at its starting values")
    assert "tp=8" in text and "total" in text  # the layout and its step time
