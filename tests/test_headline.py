"""A headline: one measured ratio beside its prediction and the reference's (measure.headline)."""

from __future__ import annotations

import json

import pytest

from course_utils.measure import reference
from course_utils.measure.headline import HEADLINES_ENV, TOLERANCE, Headline, as_fast
from course_utils.measure.timing import Timing


def test_as_fast_reads_both_ways():
    assert as_fast("GPipe", "naive", 2.5) == "GPipe ran 2.50x as fast as naive"
    assert as_fast("the small MLP", "unsplit", 0.5) == "the small MLP took 2.00x as long as unsplit"


@pytest.mark.parametrize(
    "measured, predicted, spread, agrees",
    [
        (2.5, 2.45, 0.0, True),
        (2.5, 2.0, 0.0, False),
        (2.5, 2.0, 0.3, True),
        (1.09, 1.0, 0.05, True),
    ],
)
def test_agreement_is_within_the_spread_or_ten_percent(measured, predicted, spread, agrees):
    head = Headline("GPipe", "naive", measured, predicted, spread)
    assert head.agrees is agrees
    text = head.sentence()
    assert text.startswith(f"GPipe ran {measured:.2f}x as fast as naive on the virtual clock")
    assert f"predicted {predicted:.2f}x" in text
    assert ("They agree" in text) is agrees and ("more than 10%" in text) is (not agrees)


def test_a_slower_variant_is_read_in_one_direction():
    head = Headline("the small MLP", "unsplit", measured=0.5, predicted=0.52)
    text = head.sentence()
    assert text.startswith("The small MLP took 2.00x as long as unsplit")
    assert "predicted 1.92x" in text  # the prediction in the same direction, not 0.52x


def test_against_the_reference():
    head = Headline("GPipe", "naive", 2.5, 2.45, 0.02)
    assert "No reference recording" in head.against(None)
    close = head.against({"measured": 2.4, "predicted": 2.45}, "Intel, 2026-11-26")
    assert "measured a ratio of 2.40" in close and "within 10% of it" in close
    assert "Intel, 2026-11-26" in close
    far = head.against({"measured": 1.5, "predicted": 1.6})
    assert "67% away from it" in far


def test_from_runs_takes_best_over_best_and_the_larger_spread():
    class Run:
        def __init__(self, seconds):
            self.seconds = seconds
            self.timeline = type("T", (), {"meta": {"clock": "virtual"}})()

    runs = {
        "naive": Timing("naive", [0.30, 0.33], [Run(0.30), Run(0.33)]),
        "gpipe": Timing("gpipe", [0.10, 0.12], [Run(0.10), Run(0.12)]),
    }
    head = Headline.from_runs(runs, "gpipe", "naive", lambda r: r.seconds * 1.1, ("GPipe", "naive"))
    assert head.measured == pytest.approx(3.0) and head.predicted == pytest.approx(3.0)
    assert head.spread == pytest.approx(0.2) and head.what == "GPipe"


def test_headlines_are_logged_and_recorded(tmp_path, monkeypatch):
    log = tmp_path / "heads.jsonl"
    monkeypatch.setenv(HEADLINES_ENV, str(log))
    monkeypatch.setattr(reference, "FOLDER", tmp_path / "ref")
    monkeypatch.setenv(reference.RECORD_ENV, "1")
    head = Headline("ZB-H1", "1F1B", 1.2, 1.18, 0.03)
    rec = reference.twin("04-test", figures={"x": 1}, headline=head)
    assert rec is not None and rec.clock == "virtual" and rec.headline == head.to_dict()
    stored = json.loads((tmp_path / "ref" / "04-test.json").read_text())
    assert stored["clock"] == "virtual" and stored["headline"]["measured"] == 1.2
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert logged == [{"section": "04-test", **head.to_dict()}]
    assert TOLERANCE == 0.10
