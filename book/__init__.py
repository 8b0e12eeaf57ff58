"""The course book: every lesson and blank exercise notebook as a static web page, with the
outputs of the one run of it that `make test` made (tests/notebook_runs.py), never a second.

    make book     # after make test; then open artifacts/book/html/index.html

`build` finds the runs and builds the book (Sphinx with MyST-NB, docs/book.md says why),
`pages` turns an executed notebook into a page, `verify` checks the built HTML (internal
links; no solution anywhere). Not part of the learner's package: a maintainer's tool.
"""

# Before anything imports nbformat: course_utils.grading spares it jsonschema's slow formats
# (2 s and more of every `make book`; see there).
import course_utils.grading  # noqa: E402, F401
