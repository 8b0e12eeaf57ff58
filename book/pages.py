"""One executed notebook as a page of the book: its outputs as the run left them, a note
saying where they come from (the run, the machine, the clock) and how to run it, widgets as
their last image, and, on an exercise page, no answer and no check's verdict.

The run (tests/notebook_runs.py) executed the notebook without a front end, so no slider
ever moved: a widget's state at the end of the run is the one it was displayed with, unless
the lesson's own code changed it. The notebook keeps that state (nbclient stores it in the
metadata); a page shows its images, its texts and where its controls stood.
"""

from __future__ import annotations

import copy
import html
import json
import re
from pathlib import Path
from urllib.parse import quote

import nbformat

from course_utils.grading.notebook_tools import is_check_cell, tags

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
REFERENCE = Path(__file__).resolve().parents[1] / "course_utils" / "data" / "reference"
CLOCKS = {
    "virtual": "the **virtual clock** (each compute action's own CPU time on its thread; the "
    "links between devices emulated)",
    "wall": "the **wall clock** (real timestamps on that machine)",
}
# Widgets that show something rather than being moved: never listed among the controls.
SHOWN = {"ImageModel", "HTMLModel", "HTMLMathModel", "LabelModel", "OutputModel"}
PROGRESS = {"FloatProgressModel", "IntProgressModel"}


def binder_url(readme: str, path: str) -> str:
    """The README's Binder badge URL, opening `path` (e.g. "notebooks/02_x.ipynb")."""
    match = re.search(r"\((https://mybinder\.org/v2/gh/[^)?]+)\?urlpath=[^)]*\)", readme)
    if match is None:
        raise ValueError("README.md has no Binder badge (https://mybinder.org/v2/gh/...)")
    return f"{match.group(1)}?urlpath={quote(f'lab/tree/{path}', safe='/')}"


def clocks(nb: nbformat.NotebookNode, summary: dict) -> list[str]:
    """The clocks this run names: its headlines', its printed lines', and those of the
    reference recordings and executors its code uses."""
    named = {h["clock"] for h in summary.get("headlines", []) if h.get("clock")}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        named |= set(re.findall(r"clock\s*=\s*[\"'](virtual|wall)[\"']", cell.source))
        for name in re.findall(r"[\"'](\d\d-[a-z0-9-]+)[\"']", cell.source):
            recording = REFERENCE / f"{name}.json"
            if recording.is_file():
                named.add(json.loads(recording.read_text()).get("clock", "wall"))
        for output in cell.get("outputs", []):
            text = output.get("text", "") + str(output.get("data", {}).get("text/plain", ""))
            named |= {m.lower() for m in re.findall(r"\b(virtual|wall) clock\b", text, re.I)}
    return [c for c in CLOCKS if c in named]


def provenance(
    source: str, summary: dict, named_clocks: list[str], binder: str, *, charts: bool, widgets: bool
) -> str:
    """The note at the top of a page: where every output below comes from."""
    machine = summary.get("machine")
    if machine:
        used = machine["cores_used"]
        cores = (
            "pinned to one core (the Binder case)"
            if machine.get("pinned", used == 1)
            else f"free to use {used} cores"
        )
        where = (
            f"{cores} of a {machine['cores']}-core machine, {machine['cpu']} "
            f"({machine['system']}, Python {machine['python']}, torch {machine['torch']}), "
            f"finished {machine['finished'].replace('T', ' ').replace('+00:00', ' UTC')}"
        )
    else:
        where = "on a machine this run did not record (a run made before runs recorded it)"
    took = f"; it took {summary['seconds']:.0f} s" if summary.get("seconds") else ""
    if named_clocks:
        clock = "Its measured charts are timed on " + " and on ".join(
            CLOCKS[c] for c in named_clocks
        )
    else:
        clock = "This run names neither of the course's two clocks"
    text = [
        "```{admonition} The outputs on this page come from one run",
        ":class: book-provenance",
        "",
        f"Every chart, table and printed figure below is what `{source}` showed when `make test` "
        f"ran it top to bottom in a fresh kernel, {where}{took}.",
        f"{clock}"
        + (
            "; each measured chart names its clock, and a chart marked *reference* is the "
            "recording the course ships, made where its label says."
            if charts
            else "."
        ),
        "Its sliders and menus are drawn as they stood at the end of that run. " if widgets else "",
    ]
    text[-1] += f"[Launch on Binder]({binder}) to run it yourself" + (
        " and move them." if widgets else "."
    )
    if summary.get("error"):
        text.append(f"\n**This run stopped with an error:** {_plain(summary['error'])}")
    return "\n".join(text) + "\n```"


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text).strip()


def _widget_state(nb: nbformat.NotebookNode) -> dict:
    return nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})


def _children(state: dict) -> list[str]:
    refs = state.get("children", [])
    return [r.removeprefix("IPY_MODEL_") for r in refs if isinstance(r, str)]


def _control_value(state: dict) -> str:
    labels, index = state.get("_options_labels"), state.get("index")
    if labels is not None and isinstance(index, int) and 0 <= index < len(labels):
        return str(labels[index])
    value = state.get("value")
    return f"{value:g}" if isinstance(value, float) else str(value)


def _hidden(model: dict, models: dict) -> bool:
    layout = models.get(str(model["state"].get("layout", "")).removeprefix("IPY_MODEL_"), {})
    return layout.get("state", {}).get("display") == "none"


def widget_parts(model_id: str, models: dict) -> tuple[list[dict], list[str]]:
    """(outputs, controls) of the widget `model_id` as the run left it: an image output per
    Image, an HTML output per HTML or Label, and 'description = value' per control."""
    outputs: list[dict] = []
    controls: list[str] = []

    def walk(mid: str) -> None:
        model = models.get(mid)
        if model is None or _hidden(model, models):
            return
        name, state = model["model_name"], model["state"]
        if name == "ImageModel":
            data = next((b["data"] for b in model.get("buffers", []) if b["path"] == ["value"]), "")
            if data:
                mime = f"image/{state.get('format', 'png')}"
                outputs.append(_display({mime: data, "text/plain": "(the widget's image)"}))
        elif name in ("HTMLModel", "HTMLMathModel") and state.get("value"):
            outputs.append(_display({"text/html": state["value"]}))
        elif name == "LabelModel" and state.get("value"):
            outputs.append(_display({"text/html": f"<p>{html.escape(state['value'])}</p>"}))
        elif name == "OutputModel":
            outputs.extend(copy.deepcopy(state.get("outputs", [])))
        elif name not in SHOWN | PROGRESS and ("value" in state or "index" in state):
            controls.append(f"{state.get('description') or 'value'} = {_control_value(state)}")
        for child in _children(state):
            walk(child)

    walk(model_id)
    return outputs, controls


def _display(data: dict) -> dict:
    return nbformat.v4.new_output("display_data", data=data)


def widget_note(controls: list[str], binder: str) -> dict:
    where = "; ".join(html.escape(c) for c in controls)
    return _display(
        {
            "text/html": "<p class='book-widget-note'>An interactive chart: run it to move the "
            f"sliders (<a href='{html.escape(binder)}'>launch on Binder</a>). Shown as it stood "
            f"at the end of the run: {where}.</p>"
        }
    )


def _static_outputs(outputs: list, models: dict, binder: str) -> list:
    """Each widget output replaced by its last image and texts; the rest as it was."""
    static = []
    for output in outputs:
        view = output.get("data", {}).get(WIDGET_VIEW)
        if view is None:
            static.append(output)
            continue
        parts, controls = widget_parts(view["model_id"], models)
        data = output["data"]
        if not any("image/png" in p.get("data", {}) for p in parts) and "image/png" in data:
            parts.insert(0, _display({"image/png": data["image/png"], "text/plain": ""}))
        if not parts and "text/plain" in data:
            parts = [nbformat.v4.new_output("stream", name="stdout", text=data["text/plain"])]
        static += ([widget_note(controls, binder)] if controls else []) + parts
    return static


def _check_note(binder: str) -> dict:
    return _display(
        {
            "text/html": "<p class='book-check-note'>This check gives feedback on your answer "
            f"when you run it (<a href='{html.escape(binder)}'>launch on Binder</a>).</p>"
        }
    )


def page(
    nb: nbformat.NotebookNode, source: str, summary: dict, readme: str
) -> nbformat.NotebookNode:
    """The page of the executed notebook `nb` (run of `source`, e.g. "exercises/02_x.ipynb";
    `summary` is the run's record). On an exercise page the answer cells show no output and
    each check cell a line on how to get its verdict."""
    nb = copy.deepcopy(nb)
    binder = binder_url(readme, source)
    models = _widget_state(nb)
    exercise = not source.startswith("notebooks/")
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs = _static_outputs(cell.get("outputs", []), models, binder)
        if exercise:
            if "answer" in tags(cell):
                outputs = []
            elif is_check_cell(cell):
                outputs = [_check_note(binder)]
            else:  # a blank exercise's errors come from its unanswered cells
                outputs = [o for o in outputs if o.get("output_type") != "error"]
        cell.outputs = outputs
    nb.metadata.pop("widgets", None)  # no widget JavaScript: the page is static
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    charts = any(k.startswith("image/") for o in outputs for k in o.get("data", {}))
    widgets = any("book-widget-note" in o.get("data", {}).get("text/html", "") for o in outputs)
    note = nbformat.v4.new_markdown_cell(
        provenance(source, summary, clocks(nb, summary), binder, charts=charts, widgets=widgets)
    )
    title = next(
        (i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and _has_title(c.source)),
        -1,
    )
    nb.cells.insert(title + 1, note)
    return nb


def _has_title(markdown: str) -> bool:
    return any(line.startswith("# ") for line in markdown.splitlines())
