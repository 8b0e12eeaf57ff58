"""Exercise 10.2's per-rank programs: the dispatch with capacity, and the mistakes learners
make, each the solution with one mistake written into it (`buildprograms.edit`).
`CAPACITY_MISTAKES` maps the commonest to words of their hints."""

from __future__ import annotations

from buildprograms import edit

CAPACITY_DISPATCH = """\
def capacity_dispatch(ctx):
    expert, gate = ctx.experts_of[:, 0], ctx.gates[:, 0]
    n, per = ctx.world, ctx.num_experts // ctx.world
    taken = [0] * ctx.num_experts
    kept = []
    for e in expert.tolist():
        kept.append(taken[e] < ctx.capacity)
        taken[e] += 1
    kept = torch.tensor(kept, dtype=torch.bool)
    dropped = torch.nonzero(~kept).flatten().tolist()
    token = torch.nonzero(kept).flatten()
    token = token[torch.argsort(expert[token], stable=True)]
    per_expert = torch.bincount(expert[token], minlength=ctx.num_experts)
    splits = per_expert.view(n, per)
    counts = ctx.comm.all_to_all(list(splits))
    received = ctx.comm.all_to_all(list(ctx.h[token].split(splits.sum(1).tolist())))
    outs = []
    for s in range(n):
        blocks = received[s].split(counts[s].tolist())
        mine = zip(sorted(ctx.experts), blocks, strict=True)
        outs.append(torch.cat([ctx.experts[e](b) for e, b in mine]))
    back = torch.cat(ctx.comm.all_to_all(outs))
    y = ctx.x.index_add(0, token, gate[token, None] * back)
    return y, dropped
"""

capacity_dispatch = edit(CAPACITY_DISPATCH, "capacity_dispatch")
by_index = edit(  # one chunk per expert, addressed by the expert's number, not its rank's
    CAPACITY_DISPATCH,
    "by_index",
    (
        "list(ctx.h[token].split(splits.sum(1).tolist()))",
        "list(ctx.h[token].split(per_expert.tolist()))",
    ),
)
after_sending = edit(  # every token travels; the capacity is applied when the outputs are back
    CAPACITY_DISPATCH,
    "after_sending",
    ("    token = torch.nonzero(kept).flatten()\n", "    token = torch.arange(len(expert))\n"),
    (
        "    y = ctx.x.index_add(0, token, gate[token, None] * back)\n",
        "    mine = kept[token]\n"
        "    y = ctx.x.index_add(0, token[mine], gate[token[mine], None] * back[mine])\n",
    ),
)
order_lost = edit(  # the outputs come back lined up by expert and are added in token order
    CAPACITY_DISPATCH,
    "order_lost",
    (
        "    y = ctx.x.index_add(0, token, gate[token, None] * back)\n",
        "    y = ctx.x.index_add(0, token.sort().values, gate[token, None] * back)\n",
    ),
)
no_capacity = edit(CAPACITY_DISPATCH, "no_capacity", ("taken[e] < ctx.capacity", "True"))
dropped_zeroed = edit(  # a dropped token's output is 0, not its residual x
    CAPACITY_DISPATCH,
    "dropped_zeroed",
    (
        "    y = ctx.x.index_add(0, token, gate[token, None] * back)\n",
        "    y = (ctx.x * kept[:, None]).index_add(0, token, gate[token, None] * back)\n",
    ),
)
last_come = edit(  # the last tokens keep the slots, not the first
    CAPACITY_DISPATCH,
    "last_come",
    ("    for e in expert.tolist():\n", "    for e in reversed(expert.tolist()):\n"),
    (
        "    kept = torch.tensor(kept, dtype=torch.bool)\n",
        "    kept = torch.tensor(kept[::-1], dtype=torch.bool)\n",
    ),
)
counts_only = edit(  # how many were dropped, not which
    CAPACITY_DISPATCH, "counts_only", ("    return y, dropped\n", "    return y, len(dropped)\n")
)
round_robin = edit(  # expert e on rank e % N, but rank r holds a contiguous block of them
    CAPACITY_DISPATCH,
    "round_robin",
    ("    splits = per_expert.view(n, per)\n", "    splits = per_expert.view(per, n).T\n"),
)
returns_y_only = edit(
    CAPACITY_DISPATCH, "returns_y_only", ("    return y, dropped\n", "    return y\n")
)
rank_0_skips = edit(  # rank 0 leaves before the combine: the others wait in it
    CAPACITY_DISPATCH,
    "rank_0_skips",
    (
        "    back = torch.cat(",
        "    if ctx.rank == 0:\n        return ctx.x, dropped\n    back = torch.cat(",
    ),
)

CAPACITY_MISTAKES = {  # the three commonest, each with the words its hint must say
    by_index: "one chunk per rank",
    after_sending: "before the dispatch",
    order_lost: "the row of the token it belongs to",
}
