"""The verdict of Exercise 7.5: a tensor x data-parallel grid's process groups, built by the
program every rank runs.

Each case's run (`rank_cases.GroupsCase`, `parallel.grid_program`) comes back as evidence: per
rank, the group collectives it called with the ranks of each group, and the two sums it
returned. The verdict is computed here, in the grader, from the lesson's numbering (rank
t + tp d, tensor parallelism innermost): each rank's first all-reduce must span its
tensor-parallel group (the tp neighbouring ranks of its replica), its second its
data-parallel group (the ranks with its tensor rank in every replica, tp apart), and each
sum must be that group's. The known wrong programs each get their hint: the groups of one
kind overlapping (a rank in two of them), tensor groups strided (the data groups' shape), an
all-reduce over every rank, a second all-reduce that adds sums already made.
"""

from __future__ import annotations

from course_utils import checks
from course_utils.checks import fail, programs
from course_utils.checks.rank_cases import GroupsCase

KINDS = ("tensor", "data")
STOPPED = {
    "deadlock": "Every member of a group must all-reduce in it, and the ranks that name the "
    "same ranks share one group: do the ranks agree on their groups?",
    "": "Compare it with the steps listed above the answer.",
}


def groups_of(case: GroupsCase, rank: int) -> dict[str, list[int]]:
    """The tensor- and data-parallel groups of `rank` (rank = t + tp d)."""
    tp, dp = case.tp, case.dp
    t, d = rank % tp, rank // tp
    return {"tensor": [x + tp * d for x in range(tp)], "data": [t + tp * x for x in range(dp)]}


def _overlapping(shown: str, run: dict) -> None:
    """Two different groups of one kind that share a rank (kind by order: tensor first)."""
    for i, kind in enumerate(KINDS):
        used = {tuple(calls[i]["ranks"]) for calls in run["groups"] if len(calls) > i}
        for a in sorted(used):
            for b in sorted(used):
                shared = sorted(set(a) & set(b))
                if a < b and shared:
                    fail(
                        f"{shown}: rank {shared[0]} is in two {kind}-parallel groups, "
                        f"{list(a)} and {list(b)}. The groups of one kind cut the ranks into "
                        "disjoint sets: every rank in exactly one. Start each group from the "
                        "first rank of its block, not from the rank itself."
                    )


def _members(shown: str, case: GroupsCase, r: int, calls: list[dict]) -> None:
    want = groups_of(case, r)
    if len(calls) != 2:
        fail(
            f"{shown}: rank {r} called {len(calls)} group all-reduces; the program calls two, "
            "first in its tensor-parallel group, then in its data-parallel group."
        )
    for call, kind in zip(calls, KINDS, strict=True):
        got = list(call["ranks"])
        if got == want[kind]:
            continue
        other = KINDS[1 - KINDS.index(kind)]
        if got == want[other] and kind == "tensor":
            fail(
                f"{shown}: rank {r}'s tensor-parallel all-reduce went over the ranks {got}: "
                "tp apart, the shape of its data-parallel group. Tensor parallelism is "
                "innermost: a tensor-parallel group is tp neighbouring ranks, those of one "
                "replica."
            )
        if got == want[other]:
            fail(
                f"{shown}: rank {r}'s data-parallel all-reduce went over the ranks {got}, its "
                "tensor-parallel group. A data-parallel group holds the same tensor rank in "
                "every replica: ranks tp apart."
            )
        fail(
            f"{shown}: rank {r}'s {kind}-parallel all-reduce went over the ranks {got}. "
            f"Work out its coordinates first: t = rank % tp, d = rank // tp "
            f"(rank = t + tp d)."
        )


def _sums(shown: str, case: GroupsCase, r: int, got, values: list) -> None:
    import torch

    if not isinstance(got, dict) or any(not torch.is_tensor(got.get(k)) for k in KINDS):
        fail(
            f"{shown}: rank {r} returned {got if isinstance(got, str) else 'a dict'}; it "
            'returns {"tensor": ..., "data": ...}, the sum in each group.'
        )
    want = groups_of(case, r)
    for kind in KINDS:
        right = sum(values[x] for x in want[kind])
        if got[kind].shape == right.shape and torch.equal(got[kind], right):
            continue
        if torch.equal(got[kind], sum(values)):
            fail(
                f"{shown}: rank {r}'s {kind}-parallel sum is the sum over every rank: an "
                "all-reduce works in place: the second one added up the first one's sums. "
                "Give each all-reduce its own copy of ctx.value."
            )
        fail(
            f"{shown}: rank {r}'s {kind}-parallel sum is not the sum of ctx.value over its "
            f"{kind}-parallel group. Reduce a copy of ctx.value, with op sum."
        )


def _calls(calls, world: int) -> bool:
    """A rank's group calls as the harness writes them: dicts naming ranks of the grid."""
    return isinstance(calls, list) and all(
        isinstance(c, dict)
        and isinstance(c.get("ranks"), list)
        and all(isinstance(x, int) and 0 <= x < world for x in c["ranks"])
        for c in calls
    )


def grid_groups(program, cases: list[tuple]) -> str:
    """Exercise 7.5: a grid's process groups, judged on what each case's run did."""
    for (case,), shown, got in checks.each_call(program, cases):
        run = programs.evidence(got, shown, case, ("groups", "results", "collectives"))
        if not all(_calls(calls, case.devices) for calls in run["groups"]):
            fail(f"{shown} did not come back as the record of a run: it cannot be judged.")
        for r, calls in enumerate(run["collectives"]):
            if calls:
                fail(
                    f"{shown}: rank {r} called ctx.comm's {calls[0]['op']}, which spans every "
                    f"rank of the grid ({case.devices}); each all-reduce here runs in a group, "
                    "through the handle ctx.new_group gave."
                )
        _overlapping(shown, run)
        if run["failure"] is not None:
            fail(programs.stopped(shown, run["failure"], STOPPED))
        values = case.values()
        for r in range(case.devices):
            _members(shown, case, r, run["groups"][r])
            _sums(shown, case, r, run["results"][r], values)
    grids = ", ".join(f"{c.tp} x {c.dp}" for (c,) in cases)
    return (
        f"Right on the grids tp x dp = {grids}: every rank's first all-reduce spanned its "
        "tensor-parallel group (neighbouring ranks), its second its data-parallel group (ranks "
        "tp apart), with the right sums. The tensor group talks in every layer, so it is the "
        "one to keep inside a node."
    )
