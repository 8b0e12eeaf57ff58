"""Widgets that still say something where widgets are not rendered.

JupyterLab draws an ipywidget; nbval, nbconvert, GitHub's viewer and a terminal do not,
and would show only `VBox(children=...)`. A display bundle can carry several versions of
one output, and each front end picks the richest it understands: here the widget, a PNG
of its chart and its numbers as text.
"""

from __future__ import annotations

import base64


def fallback_bundle(widget, text: str, png: bytes | None = None, **kwargs) -> dict:
    """The widget's display bundle plus a plain-text (and optionally PNG) fallback."""
    bundle = dict(widget._repr_mimebundle_(**kwargs) or {})
    bundle["text/plain"] = text
    if png is not None:
        bundle["image/png"] = base64.b64encode(png).decode("ascii")
    return bundle


class WithFallback:
    """Display `widget` in JupyterLab and `text` (and `png`) everywhere else."""

    def __init__(self, widget, text: str, png: bytes | None = None) -> None:
        self.widget, self.text, self.png = widget, text, png

    def _repr_mimebundle_(self, **kwargs) -> dict:
        return fallback_bundle(self.widget, self.text, self.png, **kwargs)

    def __repr__(self) -> str:
        return self.text


def figure_png(fig) -> bytes:
    """A Matplotlib figure as PNG bytes, on white, at the course's resolution."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", facecolor="white", bbox_inches="tight")
    return buf.getvalue()


def picker(controls: dict, draw=None, describe=None, box=None) -> WithFallback:
    """Controls and what they show, redrawn whenever one of them moves.

    `controls` maps each keyword of `draw`/`describe` to its widget; `draw(**values)` returns
    a Figure (shown as a PNG) or None (no chart for these values, e.g. an invalid layout),
    `describe(**values)` a text (shown under it). Give one or both. `box` lays the controls
    out (default: one column).

    Nothing goes through an Output widget: nothing depends on a front end capturing output
    (nbclient's imitation of Output widgets can stall a cell, nbclient #312), and where
    widgets are not rendered (nbval, nbconvert, GitHub, a printout) the chart and text at
    the controls' first values show instead. Each Figure is closed once painted, so pyplot
    does not show it a second time.
    """
    import html

    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    if draw is None and describe is None:
        raise TypeError("picker needs draw, describe or both")

    def values() -> dict:
        return {name: control.value for name, control in controls.items()}

    def paint() -> bytes | None:
        fig = draw(**values())
        if fig is None:
            return None
        try:
            return figure_png(fig)
        finally:
            plt.close(fig)

    chart: widgets.Image | None = None
    caption: widgets.HTML | None = None
    parts = [box if box is not None else widgets.VBox(list(controls.values()))]
    if draw is not None:
        chart = widgets.Image(format="png")
        chart.add_class("course-picker-chart")  # the classes are for the browser test
        parts.append(chart)
    if describe is not None:
        caption = widgets.HTML()
        caption.add_class("course-picker-text")
        parts.append(caption)

    def refresh(_change=None) -> tuple[bytes | None, str | None]:
        # Both are computed before either is sent, so the chart and its text change together.
        png = paint() if chart is not None else None
        text = describe(**values()) if caption is not None else None
        if chart is not None:
            chart.value = png or b""
            chart.layout.display = None if png else "none"  # no chart: no empty frame
        if caption is not None and text is not None:
            caption.value = f"<pre style='margin: 0'>{html.escape(text)}</pre>"
        return png, text

    first_png, first_text = refresh()
    for control in controls.values():
        control.observe(refresh, names="value")
    shown = widgets.VBox(parts)
    shown.add_class("course-picker")
    text = first_text or "(the chart at its first settings; move the controls in JupyterLab)"
    return WithFallback(shown, text, first_png)


def show_source(obj) -> None:
    """Show the source code of a function, method or class of the course, highlighted.

    Lessons use it to put the library's real code in front of the learner where it is the
    lesson's mechanism (e.g. the executor's zero-bubble split of the backward pass).
    """
    import inspect
    import textwrap

    from IPython.display import Code, display

    source = textwrap.dedent(inspect.getsource(obj))
    # getsource also reads objects defined in a notebook cell, whose file is '<ipython-...>'
    path = inspect.getsourcefile(obj) or inspect.getfile(obj)
    where = f"# {path.split('course_utils', 1)[-1].lstrip('/')}"
    display(Code(f"{where}\n{source}", language="python"))
