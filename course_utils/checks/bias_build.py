"""The verdict of Exercise 10.9: DeepSeek-V3's bias balancing, written as a per-rank program.

Every rank routes its own tokens by score + bias and moves its copy of the bias by gamma
against the load (DeepSeek-AI 2024, arXiv 2412.19437, section 2.1.2). The copies stay one
router only if every rank counts the whole batch's load: its counts all-reduced. The run
comes back as evidence (`rank_cases.BiasCase`): each rank's choices and new bias, and the
collectives it called with their bytes. Judged here, in the grader, against the update on
one device over the whole batch (`moe.update_bias`), with a hint per mistake worked out from
what each rank returned.
"""

from __future__ import annotations

import functools

from course_utils import checks
from course_utils.checks import Variant, fail, numbers, pick, programs
from course_utils.checks.rank_cases import BiasCase

given = numbers(
    N=pick("9n", 2, [2, 3, 4]),
    experts=4,
    tokens=pick("9t", 6, [5, 6, 8]),
    gamma=pick("9g", 0.01, [0.01, 0.02, 0.05]),
)
ADVICE = {
    "deadlock": "A collective completes only when every rank calls it: every rank shares its "
    "counts in the same call, before it updates its bias.",
}


def _updates(case: BiasCase) -> dict:
    """What one device computes: each rank's choices, the bias after the whole batch's
    update, and each rank's bias had it counted only its own tokens (and other mistakes)."""
    import torch

    from course_utils.parallel.moe import update_bias
    from course_utils.threads.collectives import chunk_bounds

    scores, bias, gamma = case.build()
    chosen = (scores + bias).argmax(dim=-1)
    load = torch.bincount(chosen, minlength=case.experts)
    bounds = chunk_bounds(len(scores), case.devices)
    mean = load.float().mean()
    return {
        "chosen": [chosen[lo:hi] for lo, hi in bounds],
        "unbiased": [scores[lo:hi].argmax(dim=-1) for lo, hi in bounds],
        "bias": update_bias(load, bias, gamma),
        "backwards": update_bias(load, bias, gamma) * -1 + 2 * bias,
        "proportional": bias - gamma * (load - mean),
        "local": [
            update_bias(torch.bincount(chosen[lo:hi], minlength=case.experts), bias, gamma)
            for lo, hi in bounds
        ],
    }


@functools.lru_cache(maxsize=256)
def telling(case: BiasCase) -> bool:
    """On `case` the bias changes a choice, and some rank's own load would move its bias
    differently from the whole batch's (so that both mistakes show)."""
    import torch

    want = _updates(case)
    moved = any(
        not torch.equal(a, b) for a, b in zip(want["chosen"], want["unbiased"], strict=True)
    )
    return moved and any(not torch.allclose(b, want["bias"]) for b in want["local"])


def telling_case(n: int, experts: int, tokens: int, gamma: float, seed: int) -> BiasCase:
    """The first case from `seed` on where both mistakes show."""
    while not telling(BiasCase(n, experts, tokens, round(1000 * gamma), seed)):
        seed += 1
    return BiasCase(n, experts, tokens, round(1000 * gamma), seed)


def cases(variant: Variant) -> dict[str, list[tuple]]:
    """The learner's own ranks and numbers (seed from 9), then two drawn afresh."""
    g, rng = given(variant), variant.cases("9")
    drawn = [telling_case(g.N, g.experts, g.tokens, g.gamma, 9)]
    for n in (rng.choice([2, 3]), 4):
        drawn.append(telling_case(n, 4, rng.choice([4, 6, 8]), 0.02, rng.randint(1, 10**6)))
    return {"balance": [(case,) for case in drawn]}


def _close(a, b) -> bool:
    import torch

    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a.float(), b)


def _choices(shown: str, r: int, got: list, want: dict, case: BiasCase) -> None:
    import torch

    chosen, new = got
    if new == "not a pair (chosen, new_bias)":
        fail(f"{shown}: rank {r} returned {chosen}, not the pair (chosen, new_bias).")
    if not isinstance(chosen, torch.Tensor) or chosen.shape != want["chosen"][r].shape:
        fail(
            f"{shown}: rank {r} returned {chosen if isinstance(chosen, str) else 'a tensor'} as "
            f"its choices; chosen holds one expert per token ({case.tokens} here)."
        )
    if not torch.equal(chosen.long(), want["chosen"][r]):
        if torch.equal(chosen.long(), want["unbiased"][r]):
            fail(
                f"{shown}: rank {r} chose by the scores alone. The bias is added to each "
                "expert's score to choose (only to choose): the largest score + bias wins."
            )
        fail(f"{shown}: rank {r}'s choices are not each token's largest score + bias.")


def _bias(shown: str, r: int, new, want: dict) -> None:
    import torch

    if not isinstance(new, torch.Tensor) or new.shape != want["bias"].shape:
        what = new if isinstance(new, str) else "a tensor"
        fail(f"{shown}: rank {r} returned {what} as its new bias, not one number per expert.")
    if _close(new, want["bias"]):
        return
    if _close(new, want["local"][r]):
        fail(
            f"{shown}: rank {r} moved its bias by the load of its own tokens only, so the ranks' "
            "copies of the router no longer agree. Every copy must move the same way: by the "
            "load of the whole batch, every rank's counts added up."
        )
    if _close(new, want["backwards"]):
        fail(
            f"{shown}: rank {r}'s bias moved the wrong way: an expert with more than the mean "
            "load must become less attractive, its bias down by gamma."
        )
    if _close(new, want["proportional"]):
        fail(
            f"{shown}: rank {r} moved each bias in proportion to its excess load. The update "
            "moves by a fixed gamma, down or up: only the sign of the excess counts."
        )
    fail(
        f"{shown}: rank {r}'s new bias is not the update of the whole batch's load: b - gamma "
        "above the mean load, b + gamma below it, unchanged at it."
    )


def judged(program, drawn: list[tuple]) -> str:
    """Exercise 10.9: the bias update on every rank, judged on what each case's run did."""
    for (case,), shown, got in checks.each_call(program, drawn):
        run = programs.evidence(got, shown, case, ("results", "collectives"))
        if run["failure"] is not None:
            fail(programs.stopped(shown, run["failure"], ADVICE))
        want = _updates(case)
        results = run["results"]
        if not all(isinstance(result, list) and len(result) == 2 for result in results):
            fail(f"{shown} did not come back as the record of a run: it cannot be judged.")
        for r, result in enumerate(results):  # every rank's choices first: they set the load
            _choices(shown, r, result, want, case)
        for r, result in enumerate(results):
            _bias(shown, r, result[1], want)
        limit = 2 * case.experts * 8  # a ring all-reduce of E counts, int64 at most
        for r, sent in enumerate(run["bytes_sent"]):
            if sent > limit:
                fail(
                    f"{shown}: every bias is right, but rank {r} sent {sent:,} bytes. What "
                    f"the ranks must share is {case.experts} counts, one per expert: "
                    "all-reduce them, not the scores or the choices."
                )
    first = drawn[0][0]
    return (
        f"Right on {len(drawn)} batches: every rank's copy of the bias moved exactly as one "
        f"device's over the whole batch, for {first.experts} counts per rank sent in one "
        "all-reduce. A rank that counted its own tokens only would have drifted from the others."
    )
