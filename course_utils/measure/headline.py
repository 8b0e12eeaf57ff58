"""A headline: the one ratio a measured section of a lesson is about, measured and predicted.

Every measured section of the course shows one effect: GPipe against the naive schedule,
prefetching against none, a skewed router against a balanced one. Its headline is the
ratio of two step times (the baseline's over the variant's, so above 1 means the variant
was faster), measured on the virtual clock and predicted by the simulator from the same
run's measured costs, plus the runs' spread:

    head = Headline("GPipe", "naive", measured=naive_s / gpipe_s, predicted=..., spread=...)
    print(head.sentence())
    print(head.against(ref))        # the reference recording's headline

The **spread** of a set of timed runs is (slowest - fastest) / fastest: how much the same
work varied from run to run. A measured ratio and its prediction "agree" when they differ by
no more than the spread, or by no more than 10% (`TOLERANCE`), whichever is larger.
`tests/test_constrained.py` runs every lesson on one busy core and checks every headline
against its prediction with the same rule.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass

TOLERANCE = 0.10  # ratios on the virtual clock agree with their prediction within this
HEADLINES_ENV = "COURSE_HEADLINES"  # a file: every headline a lesson prints is appended


def as_fast(what: str, baseline: str, ratio: float) -> str:
    """'GPipe ran 2.45x as fast as naive', or 'took 1.43x as long as' below 1."""
    if ratio >= 1:
        return f"{what} ran {ratio:.2f}x as fast as {baseline}"
    return f"{what} took {1 / ratio:.2f}x as long as {baseline}"


@dataclass(frozen=True)
class Headline:
    """`measured` and `predicted` = the baseline's step time / `what`'s step time."""

    what: str
    baseline: str
    measured: float
    predicted: float
    spread: float = 0.0
    clock: str = "virtual"

    @property
    def gap(self) -> float:
        """measured / predicted - 1: how far the measurement is from the prediction."""
        return self.measured / self.predicted - 1 if self.predicted > 0 else float("inf")

    @property
    def agrees(self) -> bool:
        return abs(self.gap) <= max(self.spread, TOLERANCE)

    def sentence(self) -> str:
        """The measurement against its prediction, in words computed from the numbers."""
        # the prediction in the measurement's direction: "as fast" above 1, "as long" below
        said = self.predicted if self.measured >= 1 else 1 / self.predicted
        ran = as_fast(self.what, self.baseline, self.measured)
        text = (
            f"{ran[0].upper()}{ran[1:]} on the {self.clock} clock; "
            f"the simulator, given this run's measured costs, predicted {said:.2f}x. "
        )
        if self.agrees:
            return text + (
                f"They agree: {abs(self.gap):.0%} apart, within the runs' spread "
                f"({self.spread:.0%}) or 10%, whichever is larger."
            )
        return text + (
            f"They are {abs(self.gap):.0%} apart, more than the runs' spread ({self.spread:.0%}) "
            "and more than 10%: the run did something the simulator leaves out."
        )

    def against(self, reference_headline: dict | None, describe: str = "") -> str:
        """This run's ratio beside the reference recording's (a dict as stored)."""
        if not reference_headline:
            return "No reference recording of this headline in this copy of the course yet."
        ref = float(reference_headline["measured"])
        apart = self.measured / ref - 1
        close = "within 10% of it, as ratios on the virtual clock should be on any machine"
        verdict = close if abs(apart) <= TOLERANCE else f"{abs(apart):.0%} away from it"
        where = f" ({describe})" if describe else ""
        return (
            f"The reference machine{where} measured a ratio of {ref:.2f} (predicted "
            f"{float(reference_headline['predicted']):.2f}); this run's {self.measured:.2f} "
            f"is {verdict}."
        )

    @classmethod
    def from_runs(
        cls,
        runs: dict,
        what: str,
        baseline: str,
        predict: Callable[[object], float],
        names: tuple[str, str] | None = None,
    ) -> Headline:
        """The headline of two variants timed by `timing.compare(..., time_of=step_time)`.

        `runs[what]` and `runs[baseline]` are their Timings (keys may differ from the words
        printed: `names` = (what, baseline) as printed); `predict(result)` is the
        simulator's step time for a run, from that run's measured costs. The measured ratio
        is best over best; the spread the larger of the two variants'.
        """
        fast, slow = runs[what], runs[baseline]
        clock = fast.best_result.timeline.meta.get("clock", "wall")
        printed = names or (what, baseline)
        return cls(
            printed[0],
            printed[1],
            measured=slow.best / fast.best,
            predicted=predict(slow.best_result) / predict(fast.best_result),
            spread=max(fast.spread, slow.spread),
            clock=clock,
        )

    def to_dict(self) -> dict:
        return asdict(self)

    def log(self, section: str) -> None:
        """Append this headline to the file named by $COURSE_HEADLINES (tests read it)."""
        target = os.environ.get(HEADLINES_ENV)
        if target:
            with open(target, "a", encoding="utf-8") as out:
                out.write(json.dumps({"section": section, **self.to_dict()}) + "\n")
