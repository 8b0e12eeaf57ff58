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
