"""Exercise 10.9's per-rank programs: DeepSeek-V3's bias update on every rank, and the
mistakes learners make, each the solution with one mistake written into it
(`buildprograms.edit`). `BIAS_MISTAKES` maps the commonest to words of their hints."""

from __future__ import annotations

from buildprograms import edit

BALANCE = """\
def balance(ctx):
    chosen = (ctx.scores + ctx.bias).argmax(dim=-1)
    load = torch.bincount(chosen, minlength=len(ctx.bias)).float()
    ctx.comm.all_reduce(load)
    new_bias = ctx.bias - ctx.gamma * torch.sign(load - load.mean())
    return chosen, new_bias
"""

balance = edit(BALANCE, "balance")
local_load = edit(BALANCE, "local_load", ("    ctx.comm.all_reduce(load)\n", ""))
unbiased = edit(BALANCE, "unbiased", ("(ctx.scores + ctx.bias).argmax", "ctx.scores.argmax"))
backwards = edit(BALANCE, "backwards", ("ctx.bias - ctx.gamma", "ctx.bias + ctx.gamma"))
proportional = edit(
    BALANCE, "proportional", ("torch.sign(load - load.mean())", "(load - load.mean())")
)
gathers_scores = edit(  # every rank gathers every score and counts the whole batch itself
    BALANCE,
    "gathers_scores",
    (
        "    load = torch.bincount(chosen, minlength=len(ctx.bias)).float()\n"
        "    ctx.comm.all_reduce(load)\n",
        "    every = (ctx.comm.all_gather(ctx.scores) + ctx.bias).argmax(dim=-1)\n"
        "    load = torch.bincount(every, minlength=len(ctx.bias)).float()\n",
    ),
)
rank_0_skips = edit(  # rank 0 does not share its counts: the others wait for it
    BALANCE,
    "rank_0_skips",
    (
        "    ctx.comm.all_reduce(load)\n",
        "    if ctx.rank > 0:\n        ctx.comm.all_reduce(load)\n",
    ),
)
bias_only = edit(BALANCE, "bias_only", ("    return chosen, new_bias\n", "    return new_bias\n"))

BIAS_MISTAKES = {  # the three commonest, each with the words its hint must say
    local_load: "the load of its own tokens only",
    unbiased: "chose by the scores alone",
    backwards: "moved the wrong way",
}
