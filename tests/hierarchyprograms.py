"""Exercise 6.5's per-rank programs: the hierarchical all-reduce, and the mistakes learners
make, each the solution with one mistake written into it (`buildprograms.edit`).
`HIERARCHY_MISTAKES` maps the commonest to words of their hints."""

from __future__ import annotations

from buildprograms import edit

HIERARCHICAL = """\
def hierarchical_all_reduce(ctx, data):
    shard = ctx.node.reduce_scatter(data)
    ctx.cross.all_reduce(shard)
    return ctx.node.all_gather(shard) / ctx.world
"""

hierarchical = edit(HIERARCHICAL, "hierarchical_all_reduce")
over_all_ranks = edit(  # the step across nodes over every rank, not the shard's holders
    HIERARCHICAL, "over_all_ranks", ("ctx.cross.all_reduce(shard)", "ctx.comm.all_reduce(shard)")
)
gather_first = edit(  # the whole tensor crosses between the nodes
    HIERARCHICAL,
    "gather_first",
    (
        "    ctx.cross.all_reduce(shard)\n    return ctx.node.all_gather(shard) / ctx.world\n",
        "    full = ctx.node.all_gather(shard)\n    ctx.cross.all_reduce(full)\n"
        "    return full / ctx.world\n",
    ),
)
mean_twice = edit(  # op="mean" in both steps, and divided by N again
    HIERARCHICAL,
    "mean_twice",
    ("reduce_scatter(data)", 'reduce_scatter(data, op="mean")'),
    ("all_reduce(shard)", 'all_reduce(shard, op="mean")'),
)
summed = edit(HIERARCHICAL, "summed", (" / ctx.world", ""))
node_mean_only = edit(  # the mean inside the node, the sum across
    HIERARCHICAL,
    "node_mean_only",
    ("reduce_scatter(data)", 'reduce_scatter(data, op="mean")'),
    (" / ctx.world", ""),
)
cross_whole = edit(  # the whole tensor across, after the reduce-scatter: wrong sums
    HIERARCHICAL, "cross_whole", ("ctx.cross.all_reduce(shard)", "ctx.cross.all_reduce(data)")
)
skip_cross = edit(HIERARCHICAL, "skip_cross", ("    ctx.cross.all_reduce(shard)\n", ""))
rank_0_leaves = edit(  # rank 0 returns before the all-gather: its node waits for it
    HIERARCHICAL,
    "rank_0_leaves",
    ("    return ctx.node", "    if ctx.rank == 0:\n        return data\n    return ctx.node"),
)

HIERARCHY_MISTAKES = {  # the three commonest, each with the words its hint must say
    over_all_ranks: "outside ctx.node and ctx.cross",
    gather_first: "gathered inside its node before crossing",
    mean_twice: "the mean was taken twice",
}
