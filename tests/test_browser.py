"""JupyterLab in a real browser: headless Debian Chromium driven by Playwright.

Run with `make test-browser` (CI installs Debian's chromium with apt; no browser download).
Without chromium every test here is skipped (`needs_chromium`, tests/conftest.py), or fails
where COURSE_REQUIRE_OPTIONAL=1 or CI=true.
Opens the course index, the pipeline explorer lesson, the capstone and the lessons 08-11, runs
all cells, checks there is no error output, that the charts are visible, that moving the
micro-batch slider changes the chart and the bubble %, that lesson 02 draws torch.profiler's
trace beside its timeline, that the planner redraws, and that an exercise notebook's locked
cells can be neither edited nor deleted (its name cell can be edited, not deleted). Then two
pages of the
course book (`make book`, which CI runs before this): their charts load, no error output.
Screenshots go to `screenshots/` (git-ignored).
"""

from __future__ import annotations

import re
import shutil
import time

import pytest
from conftest import ROOT
from lab_server import jupyter_lab

pytestmark = [pytest.mark.browser, pytest.mark.needs_chromium]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]
EXPLORER_LESSON = "notebooks/02_microbatching_gpipe.ipynb"
SHOTS = ROOT / "screenshots"


@pytest.fixture(scope="module")
def lab():
    # The lessons run from the checkout itself: autosave off, or JupyterLab would write the
    # executed lesson 02 (outputs and all) over the committed one.
    settings = SHOTS / "user-settings"
    plugin = settings / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings"
    plugin.parent.mkdir(parents=True, exist_ok=True)
    plugin.write_text('{"autosave": false}\n')
    command = [
        str(ROOT / ".venv" / "bin" / "jupyter"),
        "lab",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.root_dir={ROOT}",
        "--allow-root",
        "--LabApp.expose_app_in_browser=True",
        # A fresh workspace each run, so no earlier layout or open tabs get in the way.
        "--LabApp.workspaces_dir=" + str(ROOT / "screenshots" / "workspaces"),
        f"--LabApp.user_settings_dir={settings}",
    ]
    with jupyter_lab(command) as server:
        yield server


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def _open_and_run_all(browser, lab, path: str, timeout_s: float = 240):
    base, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(60_000)
    page.goto(f"{base}/lab/tree/{path}?token={token}&reset")
    page.wait_for_selector(".jp-Notebook .jp-Cell", state="attached")
    # Wait for the kernel, then Run > Run All Cells through the menu, as a learner would.
    page.wait_for_function(
        "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
        " const k = w && w.sessionContext && w.sessionContext.session"
        " && w.sessionContext.session.kernel; return k && k.status === 'idle'; }"
    )
    page.click(".lm-MenuBar-itemLabel:text-is('Run')")
    page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = page.evaluate(
            "() => { const w = window.jupyterapp.shell.currentWidget;"
            " const cells = w.content.model.cells; let pending = 0, total = 0;"
            " for (let i = 0; i < cells.length; i++) { const c = cells.get(i);"
            "   if (c.type !== 'code') continue; total++;"
            "   if (c.executionCount === null || c.executionCount === undefined) pending++; }"
            " const busy = w.sessionContext.session.kernel.status !== 'idle';"
            " return {pending, total, busy}; }"
        )
        if state["pending"] == 0 and not state["busy"]:
            break
        time.sleep(1)
    else:
        page.screenshot(path=str(SHOTS / "timeout.png"), full_page=True)
        pytest.fail(f"{path}: cells still running after {timeout_s} s: {state}")
    return page


def _error_outputs(page) -> list[str]:
    return page.evaluate(
        "() => { const w = window.jupyterapp.shell.currentWidget;"
        " const cells = w.content.model.cells; const errors = [];"
        " for (let i = 0; i < cells.length; i++) { const c = cells.get(i);"
        "   if (c.type !== 'code') continue; const outs = c.outputs;"
        "   for (let j = 0; j < outs.length; j++) { const o = outs.get(j);"
        "     if (o.type === 'error') { const e = o.toJSON();"
        "       errors.push(`cell ${i}: ${e.ename}: ${e.evalue}`); } } }"
        " return errors; }"
    )


def test_course_index_runs_in_the_browser(browser, lab):
    page = _open_and_run_all(browser, lab, "notebooks/00_welcome.ipynb")
    page.screenshot(path=str(SHOTS / "00_welcome.png"), full_page=True)
    assert _error_outputs(page) == []
    assert page.locator(".jp-OutputArea-output:has-text('Two torch threads')").count() >= 1
    # `make` turns off JupyterLab's news pop-up, which would cover the lessons.
    assert page.locator("text=Jupyter news").count() == 0
    page.close()


def _bubble_percent(page) -> str:
    text = page.locator(".explorer-metrics").first.inner_text()
    match = re.search(r"bubble[^0-9]*([0-9]+(?:\.[0-9]+)?)\s*%", text, re.I)
    assert match, f"no bubble % in the explorer's metrics: {text!r}"
    return match.group(1)


def test_explorer_slider_changes_chart_and_bubble(browser, lab):
    committed = (ROOT / EXPLORER_LESSON).read_bytes()
    page = _open_and_run_all(browser, lab, EXPLORER_LESSON)
    assert _error_outputs(page) == []
    chart = page.locator("img.explorer-chart, .explorer-chart img").first
    chart.scroll_into_view_if_needed()
    assert chart.is_visible()
    box = chart.bounding_box()
    assert box and box["width"] > 200 and box["height"] > 100, box
    # The image really loaded (a decoded PNG, not a broken icon).
    assert chart.evaluate("img => img.complete && img.naturalWidth > 200")
    page.screenshot(path=str(SHOTS / "explorer_before.png"), full_page=False)
    src_before, bubble_before = chart.get_attribute("src"), _bubble_percent(page)
    metrics_before = page.locator(".explorer-metrics").first.inner_text()

    slider = page.locator(".explorer-microbatches").first
    handle = slider.locator(".noUi-handle").first
    handle.focus()
    for _ in range(4):
        page.keyboard.press("ArrowRight")
    # The chart and the metrics are two widgets, each updated by its own message: wait for both.
    page.wait_for_function(
        "([sel, src, text]) => { const img = document.querySelector(sel);"
        " const metrics = document.querySelector('.explorer-metrics');"
        " return img && img.src !== src && metrics && metrics.innerText !== text; }",
        arg=["img.explorer-chart, .explorer-chart img", src_before, metrics_before],
        timeout=30_000,
    )
    page.screenshot(path=str(SHOTS / "explorer_after.png"), full_page=False)
    bubble_after = _bubble_percent(page)
    assert bubble_after != bubble_before, (bubble_before, bubble_after)
    assert chart.evaluate("img => img.complete && img.naturalWidth > 200")
    assert _error_outputs(page) == []
    # Section 7 of the same lesson: torch.profiler's trace, drawn beside the course's timeline
    # in the cell that wrote it (issue 48)
    traced = page.locator(".jp-CodeCell:has(.jp-OutputArea-output:has-text('gpipe_torch.json'))")
    picture = traced.locator(".jp-OutputArea-output img").first
    picture.scroll_into_view_if_needed()
    assert picture.is_visible()
    assert picture.evaluate("img => img.complete && img.naturalWidth > 200")
    page.screenshot(path=str(SHOTS / "profiler_trace.png"), full_page=False)
    page.close()
    assert (ROOT / EXPLORER_LESSON).read_bytes() == committed, "the lesson was saved over"


def test_the_planner_redraws_its_chart_and_text_in_the_browser(browser, lab):
    # Lesson 12's planner is a `picker`: a PNG in an Image widget and a text, no Output widget.
    page = _open_and_run_all(browser, lab, "notebooks/12_capstone_planning.ipynb")
    assert _error_outputs(page) == []
    planner = page.locator(".course-picker").first
    planner.scroll_into_view_if_needed()
    chart = planner.locator(".course-picker-chart").first
    assert chart.evaluate("img => img.complete && img.naturalWidth > 200")
    text_before = planner.locator(".course-picker-text").first.inner_text()
    src_before = chart.get_attribute("src")
    planner.locator("select").first.select_option("70B")
    # The chart and the text are two widgets, each updated by its own message: wait for both.
    page.wait_for_function(
        "([src, text]) => { const img = document.querySelector('.course-picker-chart');"
        " const caption = document.querySelector('.course-picker-text');"
        " return img && img.src !== src && caption && caption.innerText !== text; }",
        arg=[src_before, text_before],
        timeout=30_000,
    )
    text_after = planner.locator(".course-picker-text").first.inner_text()
    assert text_after != text_before, text_after[:200]
    assert chart.evaluate("img => img.complete && img.naturalWidth > 200")
    page.screenshot(path=str(SHOTS / "planner_after.png"), full_page=False)
    assert _error_outputs(page) == []
    page.close()


# The lessons of the newer dimensions, each run top to bottom as a learner would.
NEW_DIMENSIONS = [
    "notebooks/08_sharded_data_parallelism.ipynb",
    "notebooks/09_sequence_context_parallelism.ipynb",
    "notebooks/10_mixture_of_experts.ipynb",
    "notebooks/11_v_shaped_schedules.ipynb",
]


@pytest.mark.parametrize("path", NEW_DIMENSIONS, ids=lambda p: p.split("/")[-1][:2])
def test_new_dimension_lessons_run_in_the_browser(browser, lab, path):
    assert (ROOT / path).exists(), f"{path} is missing"
    page = _open_and_run_all(browser, lab, path)
    name = path.split("/")[-1].removesuffix(".ipynb")
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=False)
    assert _error_outputs(page) == []
    # Every lesson draws charts: at least one rendered image is on the page.
    images = page.locator(".jp-OutputArea-output img")
    assert images.count() >= 1
    assert images.first.evaluate("img => img.complete && img.naturalWidth > 100")
    page.close()


def test_locked_cells_cannot_be_edited_or_deleted_in_jupyterlab(browser, lab):
    # A copy of an exercise notebook (JupyterLab may autosave it), as a learner opens it.
    copy = SHOTS / "locked" / "03_bubble_tradeoff.ipynb"
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ROOT / "exercises" / copy.name, copy)
    base, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(60_000)
    page.goto(f"{base}/lab/tree/{copy.relative_to(ROOT)}?token={token}&reset")
    cells_js = "window.jupyterapp.shell.currentWidget.content.widgets"
    page.wait_for_function(  # the whole notebook, not the empty cell shown while it loads
        f"() => {{ try {{ return {cells_js}.some(c => c.model.id === 'check-03-6'); }}"
        " catch (e) { return false; } }"
    )

    def index(cell_id: str) -> int:
        return page.evaluate(f"() => {cells_js}.findIndex(c => c.model.id === '{cell_id}')")

    def source(cell_id: str) -> str:
        return page.evaluate(
            f"() => {cells_js}.find(c => c.model.id === '{cell_id}').model.sharedModel.getSource()"
        )

    def type_into(cell_id: str) -> None:
        editor = page.locator(".jp-Notebook .jp-Cell").nth(index(cell_id)).locator(".cm-content")
        editor.scroll_into_view_if_needed()
        editor.click()
        page.keyboard.press("End")
        page.keyboard.type("  # changed")

    def delete(cell_id: str) -> None:
        page.evaluate(
            f"() => {{ const w = window.jupyterapp.shell.currentWidget;"
            f" w.content.activeCellIndex = {index(cell_id)}; w.content.mode = 'command';"
            " return window.jupyterapp.commands.execute('notebook:delete-cell'); }"
        )

    count = "() => window.jupyterapp.shell.currentWidget.content.widgets.length"
    before = page.evaluate(count)
    for locked in ("check-03-1", "given-03-1"):
        text = source(locked)
        type_into(locked)
        delete(locked)
        assert source(locked) == text and index(locked) >= 0, locked
    type_into("s03-code-02")  # the name cell: a learner on their own writes their name there
    delete("s03-code-02")
    assert "# changed" in source("s03-code-02") and index("s03-code-02") >= 0
    type_into("answer-03-1")  # an answer cell takes the learner's typing...
    assert "# changed" in source("answer-03-1")
    delete("answer-03-1")  # ...but is not deleted (as nbgrader does)
    assert index("answer-03-1") >= 0 and page.evaluate(count) == before
    delete("s03-md-03")  # a plain markdown cell can be deleted: the deletions did run
    assert index("s03-md-03") < 0 and page.evaluate(count) == before - 1
    page.screenshot(path=str(SHOTS / "locked_cells.png"))
    page.close()


# Two pages of the course book (artifacts/book/html/, `make book`): the explorer's lesson and
# the capstone, read as static files with the network cut off (the charts are the book's own).
BOOK = ROOT / "artifacts" / "book" / "html"
BOOK_PAGES = ["notebooks/02_microbatching_gpipe.html", "notebooks/12_capstone_planning.html"]


@pytest.mark.parametrize("name", BOOK_PAGES, ids=lambda p: p.split("/")[-1][:2])
def test_a_book_page_shows_its_charts_and_no_error(browser, name):
    if not (BOOK / name).exists():
        pytest.fail(f"the course book has no {name}: run make test, then make book (.ci/run does)")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort())
    page.goto((BOOK / name).as_uri())
    charts = page.locator("div.cell_output img")
    assert charts.count() >= 3, charts.count()
    charts.first.scroll_into_view_if_needed()
    assert charts.first.is_visible()
    assert page.evaluate(  # every chart a decoded image, none a broken icon
        "() => [...document.querySelectorAll('div.cell_output img')]"
        ".every(img => img.complete && img.naturalWidth > 100)"
    )
    assert page.locator("div.output.traceback, div.output.stderr").count() == 0
    assert page.locator("text=The outputs on this page come from one run").count() == 1
    assert page.locator("text=run it to move the sliders").count() >= 1
    binder = page.locator("a:has-text('Launch on Binder')").first.get_attribute("href")
    assert binder.endswith(f"urlpath=lab/tree/{name.removesuffix('.html')}.ipynb"), binder
    page.screenshot(path=str(SHOTS / f"book_{name.split('/')[-1][:2]}.png"), full_page=False)
    assert errors == []
    page.close()
