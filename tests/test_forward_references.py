"""No lesson leans on a term before the course teaches it: at most one forward reference per
lesson for each of the terms of tests/forward_references.py, and each term is taught where
TAUGHT says (the cell names it, and the collectives' primer draws its picture)."""

from __future__ import annotations

import json
import re

import forward_references as fr
import pytest


def test_every_lesson_points_ahead_to_a_term_at_most_once():
    over = {
        f"lesson {n}, {term}": cells
        for n, terms in fr.forward_references().items()
        for term, cells in terms.items()
        if len(cells) > fr.AT_MOST
    }
    assert over == {}, f"teach these first, or point ahead once: {over}"


@pytest.mark.parametrize("term", fr.TERMS)
def test_the_cell_that_teaches_a_term_names_it(term):
    lesson, cell = fr.TAUGHT[term]
    path = next(p for p in fr.lessons() if p.name.startswith(lesson))
    text = dict(fr.markdown(path))[cell]
    pattern = fr.TERMS[term]
    if fr.TAUGHT[term] == fr.PRIMER:  # the primer's list follows its picture
        cells = json.loads(path.read_text())["cells"]
        at = [c.get("id") for c in cells].index(cell)
        assert "collectives_primer" in "".join(cells[at + 1]["source"]), "the primer's picture"
        text += "".join(cells[at + 2]["source"])
    assert re.search(pattern, text), f"{term}: not named in lesson {lesson}'s cell {cell}"


def test_a_second_reference_ahead_is_found(tmp_path, monkeypatch):
    lesson = {
        "cells": [
            {
                "cell_type": "markdown",
                "id": "a",
                "source": ["Data parallelism needs an all-reduce."],
            },
            {"cell_type": "markdown", "id": "b", "source": ["Then ZeRO, and an allreduce again."]},
        ]
    }
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "02_x.ipynb").write_text(json.dumps(lesson))
    monkeypatch.setattr(fr, "ROOT", tmp_path)
    assert fr.forward_references() == {"02": {"all-reduce": ["a", "b"], "ZeRO": ["b"]}}
