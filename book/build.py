"""`make book`: the course as a static HTML book, from the notebook runs of `make test`.

    python -m book.build      # writes artifacts/book/html/ (open index.html)

Each lesson (notebooks/) and blank exercise notebook (exercises/) becomes a page holding the
outputs of its one run by `make test` (tests/notebook_runs.py keeps the executed copies in
artifacts/notebook-runs/ under a hash of the notebook and of the course's code). Nothing is
executed here: where a run for the current code is missing, the build says so in one line and
exits 2. Solutions are never read into the book. Sphinx (with MyST-NB, execution off) builds
the HTML with `-n -W` (any warning, such as a link to a page that does not exist, fails the
build); then every internal link and image of the built HTML is checked (book/verify.py).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "artifacts" / "book"
SOURCE, HTML, DOCTREES = OUT / "src", OUT / "html", OUT / "doctrees"

INDEX = """# Training large neural networks in parallel

The course's lessons and exercises, readable here with every chart and printed figure: each
page shows the outputs of one run of its notebook, made by the course's tests on one core (the
Binder case), and says when, on which machine and on which clock. Nothing here is interactive:
each page's *launch on Binder* link opens it in JupyterLab, where you run it and move the
sliders. The exercise pages are the blank notebooks: no answers.{runs}

```{{toctree}}
:caption: Lessons
:maxdepth: 1

{lessons}
```

```{{toctree}}
:caption: Exercises
:maxdepth: 1

{exercises}
```
"""


def _runs(paths: list[Path]) -> tuple[dict[Path, Path], str | None]:
    """({notebook: its run's summary}, the one-line reason the book cannot be built)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from notebook_runs import records  # type: ignore[import-not-found]  # tests/

    found = records(paths)
    missing = [p for p, summary in found.items() if summary is None]
    if missing:
        names = ", ".join(p.relative_to(ROOT).as_posix() for p in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        return {}, (
            f"make book: no run of {names}{more} for the code as it is now: run `make test` "
            "first (it runs every notebook once; the book shows those runs, it runs none)"
        )
    unsaved = [p for p, summary in found.items() if not summary.with_suffix(".ipynb").exists()]
    if unsaved:
        return {}, (
            f"make book: the run of {unsaved[0].relative_to(ROOT).as_posix()} saved no "
            "notebook (its kernel failed; `make test` says why)"
        )
    return {p: s for p, s in found.items() if s is not None}, None


def _write(path: Path, text: str) -> None:
    """Write only a change, so that Sphinx rebuilds only the pages whose run changed."""
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def sources(runs: dict[Path, Path]) -> list[Path]:
    """The book's sources under artifacts/book/src/: the index and a page per run."""
    from book.pages import page

    readme = (ROOT / "README.md").read_text()
    written, machines = [], []
    for notebook, summary in runs.items():
        name = notebook.relative_to(ROOT).as_posix()
        executed = nbformat.read(summary.with_suffix(".ipynb"), as_version=4)
        record = json.loads(summary.read_text())
        machines += [record["machine"]] if "machine" in record else []
        shown = page(executed, name, record, readme)
        written.append(SOURCE / name)
        _write(written[-1], nbformat.writes(shown))
    docs = {
        folder: [
            p.relative_to(SOURCE).with_suffix("").as_posix()
            for p in written
            if p.parent.name == folder
        ]
        for folder in ("notebooks", "exercises")
    }
    written.append(SOURCE / "index.md")
    _write(
        written[-1],
        INDEX.format(
            runs=_when_and_where(machines),
            lessons="\n".join(docs["notebooks"]),
            exercises="\n".join(docs["exercises"]),
        ),
    )
    for stale in SOURCE.rglob("*"):
        if stale.is_file() and stale not in written:
            stale.unlink()
    return written


def _when_and_where(machines: list[dict]) -> str:
    """A sentence on the runs behind the book: when, and on which CPUs."""
    if not machines:
        return ""
    times = sorted(m["finished"].replace("T", " ").replace("+00:00", "") for m in machines)
    cpus = sorted({f"{m['cpu']} ({m['cores']} cores)" for m in machines})
    return (
        f"\n\nThese runs finished between {times[0]} and {times[-1]} UTC on "
        f"{' and '.join(cpus)}, each notebook pinned to one core."
    )


def sphinx() -> int:
    from sphinx.cmd.build import build_main

    conf = str(ROOT / "book")
    return build_main(
        [
            "-b",
            "html",
            "-n",
            "-W",
            "--keep-going",
            "-q",
            "-c",
            conf,
            "-d",
            str(DOCTREES),
            str(SOURCE),
            str(HTML),
        ]  # fmt: skip
    )


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from book.verify import broken_links

    start = time.perf_counter()
    lessons = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    exercises = sorted((ROOT / "exercises").glob("[0-9][0-9]_*.ipynb"))
    runs, problem = _runs(lessons + exercises)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    written = sources(runs)
    if sphinx() != 0:
        print("make book: Sphinx failed (its warnings above)", file=sys.stderr)
        return 1
    broken = broken_links(HTML)
    for line in broken:
        print(f"make book: broken link: {line}", file=sys.stderr)
    if broken:
        return 1
    seconds = time.perf_counter() - start
    print(
        f"make book: {len(written) - 1} pages from the runs of `make test` in {seconds:.0f} s; "
        f"open {(HTML / 'index.html').relative_to(ROOT)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
