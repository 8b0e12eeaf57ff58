"""The verdict of Exercise 6.5: the hierarchical all-reduce, written as a per-rank program.

Each rank averages its tensor over all N ranks of `nodes` nodes of G ranks in three
collectives (`parallel.hierarchical`): a reduce-scatter inside its node (`ctx.node`), an
all-reduce across the nodes between the ranks that hold the same shard (`ctx.cross`), an
all-gather inside its node. The run comes back as evidence (`rank_cases.HierarchyCase`): what
every rank returned, and each collective it called with the bytes it sent to every rank.
It is judged here, in the grader: the mean against the one computed from the case's data,
the collectives in order, the bytes of each against the ring's formulas, and the bytes that
crossed between nodes against a flat ring's.
"""

from __future__ import annotations

from course_utils import checks
from course_utils.checks import fail, programs

STEPS = [["node", "reduce_scatter"], ["cross", "all_reduce"], ["node", "all_gather"]]
ADVICE = {
    "deadlock": "A collective completes only when every rank of its group calls it: every "
    "rank calls the same collectives of ctx.node and ctx.cross, in the same order.",
}


def formula(case) -> dict[str, int]:
    """The bytes one rank sends in each step, the ring's formulas with S = 4 L bytes: (G-1)/G
    S in each step inside the node, 2(M-1)/M S/G across the M nodes; and what one rank of a
    flat ring over all N ranks sends, 2(N-1)/N S, all of which crosses where the ring does."""
    g, m, s = case.per_node, case.nodes, 4 * case.length
    n = g * m
    return {
        "reduce_scatter": (g - 1) * s // g,
        "all_reduce": 2 * (m - 1) * s // (m * g),
        "all_gather": (g - 1) * s // g,
        "flat": 2 * (n - 1) * s // n,
    }


def _calls(run: dict, shown: str, case) -> list[list]:
    """Each rank's recorded collectives, as [group, collective, bytes to each rank]."""
    calls = run.get("calls")
    if not isinstance(calls, list):
        calls = []
    ok = len(calls) == case.devices
    ok = ok and all(
        isinstance(c, list)
        and len(c) == 3
        and isinstance(c[2], list)
        and len(c[2]) == case.devices
        and all(isinstance(b, int) and not isinstance(b, bool) for b in c[2])
        for rank in calls
        for c in rank
    )
    if not ok:
        fail(f"{shown} did not come back as the record of a run (run_ranks): it cannot be judged.")
    return calls


def _crossed(calls: list, rank: int, case) -> int:
    g = case.per_node
    return sum(b for c in calls for d, b in enumerate(c[2]) if d // g != rank // g)


def _means(shown: str, case, results: list) -> None:
    import torch

    data = case.data()
    n = case.devices
    want = sum(data) / n
    for r, got in enumerate(results):
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            what = "nothing" if got is None else got if isinstance(got, str) else "a tensor"
            fail(
                f"{shown}: rank {r} returned {what}, not a tensor of {case.length} numbers: "
                "return the mean over all the ranks."
            )
        if torch.allclose(got, want, rtol=1e-5, atol=1e-6):
            continue
        ratio = {n: "the sum, not the mean", 1 / n: "the mean divided by N once more"}
        ratio |= {case.per_node: "", case.nodes: "", 1 / case.per_node: "", 1 / case.nodes: ""}
        for factor, what in ratio.items():
            if factor != 1 and torch.allclose(got, want * factor, rtol=1e-5, atol=1e-6):
                if factor == 1 / n:
                    fail(
                        f"{shown}: rank {r} holds the mean divided by N = {n} once more: the "
                        "mean was taken twice. op='mean' divides by its own group's size, G "
                        "inside a node, M across: together they already divide by N = G x M."
                    )
                if factor == n:
                    fail(
                        f"{shown}: rank {r} holds {what}. Data parallelism averages the "
                        "gradients over the N ranks: divide by N once (op='mean' divides by "
                        "its group's size)."
                    )
                fail(
                    f"{shown}: rank {r} holds the mean x {factor:g}: it was divided by the size "
                    "of one group only, or by one too many. Each op='mean' divides by its own "
                    "group's size; over all N ranks the sum is divided by N once."
                )
        fail(
            f"{shown}: rank {r}'s numbers are not the mean over the ranks. After the node's "
            "reduce-scatter a rank holds one shard of its node's sum: that shard, and only "
            "it, goes across to the ranks of the other nodes that hold the same shard."
        )


def _steps(shown: str, case, calls: list, run: dict) -> None:
    """Fail unless every rank ran the three steps, in their groups, with the ring's bytes."""
    want = formula(case)
    for r, mine in enumerate(calls):
        elsewhere = run["bytes_sent"][r] - sum(sum(c[2]) for c in mine)
        if elsewhere > 0:
            fail(
                f"{shown}: rank {r} sent {elsewhere:,} bytes outside ctx.node and ctx.cross "
                "(ctx.comm or ctx.send reach all N ranks). The step across nodes runs only "
                "between the ranks that hold the same shard: their group is ctx.cross."
            )
        steps = [c[:2] for c in mine]
        if steps == [STEPS[0], STEPS[2], STEPS[1]]:
            crossed = _crossed(mine, r, case)
            fail(
                f"{shown}: rank {r} gathered inside its node before crossing, so its all-reduce "
                f"across nodes carried the whole tensor: {crossed:,} bytes across, where its "
                f"shard alone would be {want['all_reduce']:,}. Cross with the shard, then "
                "gather."
            )
        if steps != STEPS:
            said = ", then ".join(f"ctx.{g}.{k}" for g, k in steps) or "no collective"
            fail(
                f"{shown}: rank {r} called {said}. The hierarchical all-reduce is three steps: "
                "a reduce-scatter inside the node, an all-reduce across the nodes, an "
                "all-gather inside the node."
            )
        for (_, kind, sent), name in zip(
            mine, ("reduce_scatter", "all_reduce", "all_gather"), strict=True
        ):
            if sum(sent) != want[name]:
                fail(
                    f"{shown}: rank {r}'s {kind.replace('_', '-')} sent {sum(sent):,} bytes; "
                    f"the ring's formula gives {want[name]:,} for what that step must carry. "
                    "Inside the node the whole tensor is reduce-scattered and the shard "
                    "gathered; across the nodes only the shard travels."
                )


def hierarchical_all_reduce(program, cases: list[tuple]) -> str:
    """Exercise 6.5: the mean over all ranks by the hierarchical all-reduce, judged on runs."""
    tried = []
    for (case,), shown, got in checks.each_call(program, cases):
        run = programs.evidence(got, shown, case, ("results",))
        calls = _calls(run, shown, case)
        if run["failure"] is not None:
            fail(programs.stopped(shown, run["failure"], ADVICE))
        _steps(shown, case, calls, run)
        _means(shown, case, run["results"])
        tried.append(f"{case.nodes}x{case.per_node}")
    first = cases[0][0]
    want = formula(first)
    inside = want["reduce_scatter"] + want["all_gather"]
    return (
        f"Right on {len(cases)} clusters (nodes x ranks: {', '.join(tried)}): every rank holds "
        f"the mean. On yours each rank sent {inside:,} bytes inside its node and only "
        f"{want['all_reduce']:,} to the other node. A flat ring over all {first.devices} ranks "
        f"has every rank send {want['flat']:,} bytes to its neighbour, and two of those "
        "neighbours sit across the nodes: each link between the nodes carries "
        f"{want['flat'] / want['all_reduce']:.3g}x what it carries here. The slow links set "
        "the pace of the ring; the hierarchical all-reduce gives them only a shard."
    )
