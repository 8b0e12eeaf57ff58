"""The course book (`make book`, book/): pages from the runs of `make test`, never a second run.

The tests without a mark run in `make test` on small made-up inputs: the link checker and
the solution search find what they must, widgets become their last image, exercise pages
lose their answers' outputs, and a missing run stops the build in one line. The tests marked
`book` read the built book; `make book` runs them right after building it: no solution
anywhere in it, every lesson page holds its run's charts, each page names its run's machine,
clock and Binder link, and no internal link is broken.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

from book import build
from book.pages import WIDGET_STATE, WIDGET_VIEW, page
from book.verify import (
    broken_links,
    html_words,
    needles,
    solution_blocks,
    solution_leaks,
    words,
)

LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("[0-9][0-9]_*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
README = (ROOT / "README.md").read_text()
PNG_FIRST, PNG_LAST = b"\x89PNG first", b"\x89PNG last"
MACHINE = {
    "finished": "2026-11-28T20:31:07+00:00",
    "cpu": "Test CPU 9000",
    "cores": 2,
    "pinned": True,
    "cores_used": 1,
    "system": "Linux 6.1",
    "python": "3.11.7",
    "torch": "2.13.0+cpu",
}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# --- the link checker and the solution search, on made-up books --------------------------


def test_broken_links_names_each_missing_page_image_and_anchor(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.html").write_text("<h1 id='here'>A</h1><a href='../index.html'>up</a>")
    (tmp_path / "pic.png").write_bytes(b"png")
    (tmp_path / "index.html").write_text(
        "<a href='sub/a.html'>ok</a> <a href='sub/a.html#here'>ok</a> <img src='pic.png'>"
        "<a href='https://mybinder.org/v2/gh/x'>external</a> <a href='#top'>top</a>"
        "<span id='top'></span> <a href='mailto:x@y'>mail</a> <a href='#'>nothing</a>"
        "<a href='sub/b.html'>gone</a> <a href='sub/a.html#nowhere'>bad anchor</a>"
        "<img src='missing.png'> <a href='../outside.html'>outside</a>"
    )
    (tmp_path.parent / "outside.html").write_text("not in the book")
    expected = [
        "index.html: sub/b.html (no such file in the book)",
        "index.html: sub/a.html#nowhere (no id 'nowhere' on that page)",
        "index.html: missing.png (no such file in the book)",
        "index.html: ../outside.html (no such file in the book)",
    ]
    assert broken_links(tmp_path) == expected
    monkeypatch.chdir(tmp_path.parent)
    assert broken_links(Path(tmp_path.name)) == expected  # a relative path: the same


def test_every_answer_cell_of_every_solution_has_text_to_search_for():
    shown = words("\n".join(c.source for p in LESSONS + EXERCISES for c in _cells(p)))
    blocks = solution_blocks(SOLUTIONS)
    assert len(blocks) >= len(SOLUTIONS), "no answer cells found in solutions/"
    empty = [where for where, block in blocks.items() if not needles(block, shown)]
    assert not empty, f"answer cells with nothing the book could be searched for: {empty}"


def _cells(path: Path) -> list:
    return nbformat.read(path, as_version=4).cells


@pytest.mark.parametrize("where", ["page", "search index"])
def test_a_solution_line_is_found_in_any_file_of_the_book_whatever_its_markup(tmp_path, where):
    shown = words("\n".join(c.source for p in LESSONS + EXERCISES for c in _cells(p)))
    block = next(iter(solution_blocks(SOLUTIONS[1:2]).values()))
    needle = needles(block, shown)[0].split()
    # as Pygments highlights code: each word in its own span, quotes escaped
    marked = " ".join(f"<span class='n'>{w}</span>&#39;" for w in needle)
    clean = "<div class='highlight'><pre>print(&#39;no answer here&#39;)</pre></div>"
    (tmp_path / "index.html").write_text(clean)
    assert solution_leaks(tmp_path, SOLUTIONS[1:2], LESSONS + EXERCISES) == []
    name = "page.html" if where == "page" else "searchindex.js"
    (tmp_path / name).write_text(f"<p>{marked}</p>" if where == "page" else f'["{marked}"]')
    leaks = solution_leaks(tmp_path, SOLUTIONS[1:2], LESSONS + EXERCISES)
    assert leaks and leaks[0].startswith(f"solutions/{SOLUTIONS[1].name}, "), leaks


# --- pages: widgets, exercises and the note on where the outputs come from ---------------


def _widget_notebook() -> nbformat.NotebookNode:
    """A cell that displayed a picker: a slider, an image (moved on since its first PNG) and
    a caption; then a tqdm bar, which has no control."""
    models = {
        "box": ("VBoxModel", {"children": ["IPY_MODEL_slider", "IPY_MODEL_menu",
                                           "IPY_MODEL_image", "IPY_MODEL_caption"]}),
        "slider": ("IntSliderModel", {"description": "micro-batches m", "value": 8}),
        "menu": ("DropdownModel", {"description": "model", "index": 1,
                                   "_options_labels": ["7B", "70B"]}),
        "image": ("ImageModel", {"format": "png", "layout": "IPY_MODEL_shown"}),
        "shown": ("LayoutModel", {"display": None}),
        "caption": ("HTMLModel", {"value": "<pre>bubble 27.3%</pre>"}),
        "bar": ("HBoxModel", {"children": ["IPY_MODEL_done", "IPY_MODEL_progress"]}),
        "done": ("HTMLModel", {"value": "200/200 [00:18]"}),
        "progress": ("FloatProgressModel", {"value": 200.0, "max": 200.0}),
    }  # fmt: skip
    state = {mid: {"model_name": name, "state": s} for mid, (name, s) in models.items()}
    state["image"]["buffers"] = [{"data": _b64(PNG_LAST), "encoding": "base64", "path": ["value"]}]
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {WIDGET_STATE: {"state": state}}
    view = {"model_id": "box", "version_major": 2, "version_minor": 0}
    bar = {"model_id": "bar", "version_major": 2, "version_minor": 0}
    cell = nbformat.v4.new_code_cell("explorer()")
    cell.outputs = [
        nbformat.v4.new_output("display_data", data={WIDGET_VIEW: view, "text/plain": "at m = 8",
                                                      "image/png": _b64(PNG_FIRST)}),
        nbformat.v4.new_output("display_data", data={WIDGET_VIEW: bar, "text/plain": "0%"}),
    ]  # fmt: skip
    nb.cells = [nbformat.v4.new_markdown_cell("# Lesson\n\nintro"), cell]
    return nb


def test_a_widget_is_its_last_image_with_where_its_controls_stood():
    shown = page(_widget_notebook(), "notebooks/02_x.ipynb", {"headlines": []}, README)
    outputs = shown.cells[-1].outputs
    mimes = [next(iter(o.data)) for o in outputs]
    assert mimes == ["text/html", "image/png", "text/html", "text/html"], mimes
    note = outputs[0].data["text/html"]
    assert "run it to move the sliders" in note
    assert "micro-batches m = 8; model = 70B" in note  # a menu by its label, not its index
    assert "urlpath=lab/tree/notebooks/02_x.ipynb" in note
    assert base64.b64decode(outputs[1].data["image/png"]) == PNG_LAST  # not the first PNG
    assert outputs[2].data["text/html"] == "<pre>bubble 27.3%</pre>"
    assert outputs[3].data["text/html"] == "200/200 [00:18]"  # a progress bar: no note
    assert "widgets" not in shown.metadata
    outputs = [o for c in shown.cells for o in c.get("outputs", [])]
    assert not any(WIDGET_VIEW in o.get("data", {}) for o in outputs)


def test_a_widget_without_an_image_in_its_state_shows_its_png_fallback():
    nb = _widget_notebook()
    del nb.metadata["widgets"][WIDGET_STATE]["state"]["image"]["buffers"]
    outputs = page(nb, "notebooks/02_x.ipynb", {}, README).cells[-1].outputs
    pngs = [base64.b64decode(o.data["image/png"]) for o in outputs if "image/png" in o.data]
    assert pngs == [PNG_FIRST]


def _exercise_run() -> nbformat.NotebookNode:
    source = nbformat.read(EXERCISES[1], as_version=4)
    error = nbformat.v4.new_output("error", ename="NotImplementedError", evalue="", traceback=[])
    for cell in source.cells:
        if cell.cell_type == "code":
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="given\n"), error]
    return source


def test_an_exercise_page_shows_no_answer_output_and_no_verdict():
    shown = page(_exercise_run(), f"exercises/{EXERCISES[1].name}", {}, README)
    code = [c for c in shown.cells if c.cell_type == "code"]
    answers = [c for c in code if "answer" in c.metadata.get("tags", [])]
    checks = [c for c in code if c.get("id", "").startswith("check-")]
    assert answers and checks
    assert all(c.outputs == [] for c in answers)
    for check in checks:
        [note] = check.outputs
        assert "feedback on your answer when you run it" in note.data["text/html"]
        assert f"urlpath=lab/tree/exercises/{EXERCISES[1].name}" in note.data["text/html"]
    others = [c for c in code if c not in answers and c not in checks]
    assert all([o.output_type for o in c.outputs] == ["stream"] for c in others)


def test_the_note_names_the_run_the_machine_the_clock_and_binder():
    nb = _widget_notebook()
    summary = {"seconds": 44.6, "machine": MACHINE, "error": None,
               "headlines": [{"clock": "virtual", "measured": 2.0, "predicted": 2.0}]}  # fmt: skip
    shown = page(nb, "notebooks/02_microbatching_gpipe.ipynb", summary, README)
    assert shown.cells[0].source.startswith("# Lesson")  # the note comes after the title
    note = shown.cells[1].source
    for said in ("`notebooks/02_microbatching_gpipe.ipynb`", "pinned to one core", "2-core machine",
                 "Test CPU 9000", "torch 2.13.0+cpu", "2026-11-28 20:31:07 UTC", "it took 45 s",
                 "**virtual clock**", "Launch on Binder"):  # fmt: skip
        assert said in note, said
    assert "wall clock" not in note
    assert "sliders and menus are drawn as they stood" in note and "and move them." in note
    badge = re.search(r"\((https://mybinder\.org/v2/gh/[^)?]+)\?", README).group(1)
    assert f"({badge}?urlpath=lab/tree/notebooks/02_microbatching_gpipe.ipynb)" in note


def test_a_wall_clock_lesson_is_said_to_be_on_the_wall_clock():
    lesson = nbformat.read(LESSONS[1], as_version=4)  # lesson 01 times on the wall clock
    note = page(lesson, f"notebooks/{LESSONS[1].name}", {}, README).cells
    text = "\n".join(c.source for c in note if "book-provenance" in c.source)
    assert "**wall clock**" in text and "virtual clock" not in text
    assert "did not record" in text  # no machine in this summary: said, not made up
    # a lesson not run yet has no chart and no slider: the note does not speak of them
    assert "to run it yourself." in text and "slider" not in text and "reference" not in text


def test_make_book_without_the_runs_says_so_in_one_line_and_exits_2(tmp_path, monkeypatch, capsys):
    import notebook_runs

    monkeypatch.setattr(notebook_runs, "FOLDER", tmp_path)
    monkeypatch.setattr(build, "OUT", tmp_path / "book")
    assert build.main() == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run `make test` first" in err, err
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing was written


def test_the_book_never_executes_a_notebook():
    conf: dict = {}
    exec((ROOT / "book" / "conf.py").read_text(), conf)
    assert conf["nb_execution_mode"] == "off"  # MyST-NB shows the outputs the run stored
    assert "nbclient" not in (ROOT / "book" / "build.py").read_text()


# --- the built book (`make book` runs these after building it) ----------------------------

HTML = build.HTML
book = pytest.mark.book


def _page(source: Path) -> str:
    path = HTML / source.parent.name / f"{source.stem}.html"
    assert path.exists(), f"{path} is missing: run `make book` (after `make test`)"
    return path.read_text()


def _runs() -> dict[Path, dict]:
    import notebook_runs

    found = notebook_runs.records(LESSONS + EXERCISES)
    assert all(found.values()), "no run for the code as it is: run `make test`, then `make book`"
    return {p: json.loads(s.read_text()) for p, s in found.items() if s is not None}


def _error_outputs(text: str) -> int:
    """How many error (traceback) or stderr outputs a page built by MyST-NB shows."""
    return len(re.findall(r'<div class="[^"]*\boutput (?:traceback|stderr)\b', text))


@book
def test_no_solution_is_anywhere_in_the_book():
    assert (HTML / "index.html").exists(), "run `make book` first"
    assert solution_leaks(HTML, SOLUTIONS, LESSONS + EXERCISES) == []


@book
def test_the_book_has_no_broken_internal_link():
    assert (HTML / "index.html").exists(), "run `make book` first"
    assert broken_links(HTML) == []


@book
@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_every_lesson_page_holds_its_runs_charts_and_printed_lines(lesson):
    import notebook_runs

    summary = notebook_runs.records([lesson])[lesson]
    assert summary is not None, "no run for the code as it is: run `make test`, then `make book`"
    run = nbformat.read(summary.with_suffix(".ipynb"), as_version=4)

    def pngs(nb: nbformat.NotebookNode) -> int:
        return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))

    drawn = pngs(run)  # each chart the run drew (a widget's counts once: its PNG fallback)
    images = pngs(page(run, f"notebooks/{lesson.name}", {}, README))
    text = _page(lesson)
    shown = len(re.findall(r'<img [^>]*src="[^"]*_images/[^"]*"', text))
    assert shown == images >= drawn, f"{lesson.name}: {shown} charts shown, {drawn} drawn"
    assert drawn > 0 or lesson.name.startswith("00_"), f"{lesson.name}: no chart in its run"
    assert _error_outputs(text) == 0, f"{lesson.name}: an error or stderr output on its page"
    page_text = html_words(text)
    for line in json.loads(summary.read_text())["stdout"].splitlines()[:50]:
        if len(line.strip()) > 20:  # the same run: its printed lines, word for word
            assert words(line) in page_text, line


@book
def test_every_page_names_its_run_machine_clock_and_binder():
    for notebook, summary in _runs().items():
        text = _page(notebook)
        name = f"{notebook.parent.name}/{notebook.name}"
        assert "The outputs on this page come from one run" in text, name
        assert summary["machine"]["cpu"] in text, name
        assert re.search(r"(virtual|wall) clock</strong>|names neither of the course", text), name
        assert f"urlpath=lab/tree/{name}" in text, name


@book
def test_widgets_say_run_it_to_move_the_sliders():
    text = _page(ROOT / "notebooks" / "02_microbatching_gpipe.ipynb")
    assert "run it to move the sliders" in text


@book
@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # myst-parser on Sphinx 9
def test_the_books_sphinx_fails_on_a_missing_page_and_shows_errors_as_the_test_finds_them(
    tmp_path,
):
    """-n -W stops the build on a link to a page that is not there, and a page's error and
    stderr outputs are what the lesson pages' test above counts."""
    from sphinx.cmd.build import build_main

    args = ["-b", "html", "-n", "-W", "-q", "-c", str(ROOT / "book"), str(tmp_path)]
    (tmp_path / "index.md").write_text("# Book\n\nSee [a lesson](01_missing.ipynb).\n")
    assert build_main([*args, str(tmp_path / "out")]) != 0
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Lesson")])
    nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3"}
    cell = nbformat.v4.new_code_cell("1 / 0")
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stderr", text="a warning\n"),
        nbformat.v4.new_output(
            "error", ename="ZeroDivisionError", evalue="division by zero", traceback=["Zero"]
        ),
    ]
    nb.cells.append(cell)
    nbformat.write(nb, tmp_path / "lesson.ipynb")
    (tmp_path / "index.md").write_text("# Book\n\n```{toctree}\nlesson\n```\n")
    assert build_main([*args, str(tmp_path / "out2")]) == 0
    assert _error_outputs((tmp_path / "out2" / "lesson.html").read_text()) == 2
