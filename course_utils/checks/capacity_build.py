"""The verdict of Exercise 10.2: the MoE dispatch with capacity, written as a per-rank program.

Each rank routes its tokens top-1 (the router's choices are given), keeps the first
`capacity` tokens of each expert in token order and drops the rest (Switch Transformer,
Fedus et al. 2021, arXiv 2101.03961), sends each kept token to the rank that holds its
expert with an all-to-all whose split sizes it works out itself, and returns its tokens'
output and the positions it dropped. The run comes back as evidence (`rank_cases.CapacityCase`,
watched by `threads.watched`); everything is judged here, in the grader, against the MoE
layer on one device with the same capacity per rank's group (`MoE(x, groups=N)`): the
positions dropped, the byte matrices of the dispatch and the combine read from the run
(Exercise 10.8's `byte_matrix` of the kept tokens, and of the mistakes), the outputs.
"""

from __future__ import annotations

import functools

from course_utils import checks
from course_utils.checks import fail, programs
from course_utils.checks.builds import byte_matrix, carrying_tokens, matrices, rows_elsewhere

STOPPED = {
    "deadlock": "An all-to-all completes only when every rank calls it: every rank makes the "
    "same all-to-alls in the same order, each with a chunk (maybe empty) for every rank.",
}


def _targets(case) -> dict:
    """What one device computes for `case`: each rank's output and dropped positions, the
    kept tokens' byte matrix, and the byte matrices of two mistakes (every token sent; the
    experts dealt round-robin)."""
    import torch

    from course_utils.parallel.moe import route
    from course_utils.threads.collectives import chunk_bounds

    moe, x = case.build()
    n = case.devices
    with torch.no_grad():
        out = moe(x, groups=n)
        routings = [
            route(moe.router(moe.norm(x[lo:hi])), 1, moe.capacity_factor)
            for lo, hi in chunk_bounds(len(x), n)
        ]
    y = [out.output[lo:hi] for lo, hi in chunk_bounds(len(x), n)]
    return {
        "y": y,
        "x": [x[lo:hi] for lo, hi in chunk_bounds(len(x), n)],
        "dropped": [torch.nonzero(~r.kept[:, 0]).flatten().tolist() for r in routings],
        "capacity": routings[0].capacity,
        "kept": byte_matrix(out.routed, case.d_model, 4),
        "every": byte_matrix([r.counts() for r in routings], case.d_model, 4),
        "dealt": byte_matrix(out.routed, case.d_model, 4, lambda e, w: e % w),
        "saved": [
            sum(a) - sum(b)
            for a, b in zip(
                byte_matrix([r.counts() for r in routings], case.d_model, 4),
                byte_matrix(out.routed, case.d_model, 4),
                strict=True,
            )
        ],
    }


@functools.lru_cache(maxsize=512)  # a student's cases are drawn again at every check
def crosses_and_drops(case) -> bool:
    """Whether on `case`'s layer a rank drops a token and some kept token leaves its rank
    (so that a case tries both the capacity and the all-to-all)."""
    import torch

    moe, x = case.build()
    with torch.no_grad():
        out = moe(x, groups=case.devices)
    return out.dropped > 0 and any(map(any, byte_matrix(out.routed, 1, 1)))


def dropping_seed(n: int, experts: int, d: int, tokens: int, percent: int, seed: int) -> int:
    """The first seed from `seed` on whose layer a rank drops a token and tokens cross ranks."""
    from course_utils.checks.rank_cases import CapacityCase

    while not crosses_and_drops(CapacityCase(n, experts, d, tokens, percent, seed)):
        seed += 1
    return seed


def _raised_per_expert(shown: str, run: dict, case) -> None:
    """The hint for an all-to-all handed one chunk per expert (it raises, saying how many)."""
    failure = run["failure"]
    said = str(failure.get("message", "")) if failure else ""
    if "chunks must be a list of" in said and f"got {case.experts} chunks" in said:
        per = case.experts // case.devices
        fail(
            f"{shown}: the all-to-all was handed {case.experts} chunks, one per expert. It "
            f"takes one chunk per rank: here each rank holds {per} experts, so the tokens of "
            "all the experts a rank holds go into that rank's chunk. Which rank holds expert "
            "e? The split sizes are the tokens per rank, not per expert."
        )


def _dispatch(shown: str, run: dict, case, want: dict) -> None:
    """Fail unless every rank sent its kept tokens, and only them, to their experts' ranks
    and got their outputs back by a second all-to-all (the combine)."""
    sent = [carrying_tokens(w, case.d_model) for w in run["watched"]]
    if any(len(calls) < 2 for calls in sent):
        if run["failure"] is not None and not any(sent):
            return  # failed before any: the failure says why
        fail(
            f"{shown}: a rank made {min(len(c) for c in sent)} all-to-all(s) of tokens "
            f"({case.d_model} numbers wide). The kept tokens go to their experts' ranks in "
            "one all-to-all (the dispatch) and the outputs come back in another (the combine)."
        )
    matrix = [calls[0] for calls in sent]
    if matrix == want["every"] and matrix != want["kept"]:
        fail(
            f"{shown}: the dispatch sent the byte matrix {matrix}: every routed token "
            "travelled, those over capacity too, and came back for nothing. A dropped token "
            "never leaves its rank: apply the capacity before the dispatch, and send only the "
            "tokens that got a slot."
        )
    if matrix == want["dealt"] and matrix != want["kept"]:
        fail(
            f"{shown}: the tokens went to rank e mod N for expert e, as if the experts were "
            "dealt out round-robin. Rank d holds a contiguous block of experts, d x E/N up to "
            "(d+1) x E/N - 1."
        )
    matrices(shown, sent, want["kept"], "the kept tokens make", "keeps for")


def _dropped(shown: str, rank: int, got, want: list[int], capacity: int) -> None:
    if got == want:
        return
    if isinstance(got, str) and got.startswith("only "):
        fail(
            f"{shown}: rank {rank} returned {got.removeprefix('only ')}, not the pair (y, "
            "dropped): return its tokens' output and the positions of the tokens it dropped."
        )
    if isinstance(got, str):
        fail(
            f"{shown}: rank {rank} returned {got} as its dropped tokens; return their "
            "positions, a list such as [5, 9] (counting from 0), beside the output."
        )
    if len(got) != len(want):
        fail(
            f"{shown}: rank {rank} dropped {len(got)} token(s). Each expert keeps "
            f"{capacity} of this rank's tokens (ctx.capacity) and drops the rest: how many "
            "are left over for each expert?"
        )
    fail(
        f"{shown}: rank {rank} dropped {len(got)} tokens, the right number but not the right "
        "ones. Slots go first come, first served in token order: an expert's first "
        "ctx.capacity tokens keep theirs."
    )


def _outputs(shown: str, run: dict, want: dict) -> None:
    import torch

    for rank, (out, right) in enumerate(zip(run["outputs"], want["y"], strict=True)):
        if not isinstance(out, torch.Tensor) or out.shape != right.shape:
            what = out if isinstance(out, str) else f"shape {tuple(out.shape)}"
            fail(
                f"{shown}: rank {rank} returned {what} as its output; the program returns "
                f"(y, dropped), y its tokens' output, {tuple(right.shape)}."
            )
        out, x = out.float(), want["x"][rank]
        if torch.allclose(out, right, rtol=1e-4, atol=1e-5):
            continue
        lost = want["dropped"][rank]
        if lost and torch.allclose(out[lost], torch.zeros_like(out[lost]), atol=1e-6):
            fail(
                f"{shown}: rank {rank}'s dropped tokens come out as 0. A dropped token is not "
                "lost: the residual carries it through the layer unchanged, y = x."
            )
        if rows_elsewhere(out - x, right - x):
            fail(
                f"{shown}: rank {rank}'s expert outputs are there, but added at other tokens' "
                "rows. They come back in the order you sent the tokens, lined up by expert: "
                "add each at the row of the token it belongs to."
            )
        fail(
            f"{shown}: rank {rank}'s output is not the MoE layer's, x + gate x expert(h) for a "
            "kept token and x for a dropped one."
        )


def capacity_dispatch(program, cases: list[tuple]) -> str:
    """Exercise 10.2: the dispatch with capacity, judged on what each case's run did."""
    first = None
    for (case,), shown, got in checks.each_call(program, cases):
        run = programs.watched(got, shown, case, "outputs")
        if not isinstance(run.get("dropped"), list) or len(run["dropped"]) != case.devices:
            fail(
                f"{shown} did not come back as the record of a run (run_ranks): it cannot be "
                "judged."
            )
        want = _targets(case)
        first = first or want
        _raised_per_expert(shown, run, case)
        if run["failure"] is None or run["failure"].get("kind") == "raised":
            _dispatch(shown, run, case, want)
        if run["failure"] is not None:
            fail(programs.stopped(shown, run["failure"], STOPPED))
        for rank, got_dropped in enumerate(run["dropped"]):
            _dropped(shown, rank, got_dropped, want["dropped"][rank], want["capacity"])
        _outputs(shown, run, want)
    mine = first or _targets(cases[0][0])
    lost = sum(len(d) for d in mine["dropped"])
    sent = [sum(row) for row in mine["kept"]]
    return (
        f"Right on {len(cases)} layers: every rank's output equals the MoE layer on one device "
        f"with the same drops. On yours the ranks dropped {lost} token(s) (capacity "
        f"{mine['capacity']} per expert and rank) and their dispatches sent {sent} bytes, "
        f"{mine['saved']} fewer than sending every routed token: a dropped token costs no "
        "bytes and no compute, only its expert's say in its output."
    )
