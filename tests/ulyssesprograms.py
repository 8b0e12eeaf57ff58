"""Exercise 9.7's Build (Ulysses attention per rank) as learners write it: the right program,
and the mistakes learners make written into it (`dpprograms.edit`). `MISTAKES` maps each
wrong program to words of the hint it must get, and no other."""

from __future__ import annotations

from dpprograms import ANSWER, edit, load

ULYSSES = """\
def ulysses(ctx):
    n, length = ctx.world, ctx.world * ctx.q.shape[1]
    qkv = torch.stack([ctx.q, ctx.k, ctx.v])  # (3, H, t, d): this rank's tokens
    parts = ctx.comm.all_to_all(list(qkv.chunk(n, dim=1)))  # head group j to rank j
    q, k, v = torch.cat(parts, dim=2)  # rank s sent its tokens: join along the sequence
    mask = torch.ones(length, length, dtype=torch.bool).tril() if ctx.causal else None
    out, _ = ctx.attend(q, k, v, mask)  # H/N heads of the whole sequence
    back = ctx.comm.all_to_all(list(out.chunk(n, dim=1)))  # slice i back to rank i
    return torch.cat(back, dim=0)  # rank j sent head group j
"""
ANSWER[ULYSSES] = "ulysses"
right = load(ULYSSES, "ulysses", "ulysses")

splits_sequence = edit(  # the first all-to-all cuts the sequence again, not the heads
    ULYSSES,
    "splits_sequence",
    ("list(qkv.chunk(n, dim=1)))  # head", "list(qkv.chunk(n, dim=2)))  # head"),
    ("torch.ones(length, length,", "torch.ones(q.shape[1], q.shape[1],"),
)
no_second = edit(  # the head split returned: no all-to-all back
    ULYSSES,
    "no_second",
    ("    back = ctx.comm.all_to_all(list(out.chunk(n, dim=1)))  # slice i back to rank i\n", ""),
    ("return torch.cat(back, dim=0)", "return out"),
)
joined_on_sequence = edit(  # the second all-to-all's parts joined along the sequence
    ULYSSES, "joined_on_sequence", ("torch.cat(back, dim=0)", "torch.cat(back, dim=1)")
)
heads_reversed = edit(  # the second all-to-all's parts joined in the wrong order
    ULYSSES, "heads_reversed", ("torch.cat(back, dim=0)", "torch.cat(back[::-1], dim=0)")
)
local_mask = edit(  # the causal mask over the rank's own shard's positions, as in 9.2
    ULYSSES,
    "local_mask",
    ("torch.ones(length, length,", "torch.ones(ctx.q.shape[1], ctx.q.shape[1],"),
)
no_mask = edit(ULYSSES, "no_mask", (" if ctx.causal else None", " if False else None"))
always_masked = edit(ULYSSES, "always_masked", (" if ctx.causal else None", ""))
one_rank_only = edit(  # only rank 0 brings the output back: the others wait for it
    ULYSSES,
    "one_rank_only",
    ("    back = ", "    if ctx.rank:\n        return out\n    back = "),
)

MISTAKES = {
    splits_sequence: "it split the sequence again",
    no_second: "A second all-to-all takes the output back",
    joined_on_sequence: "joined what the second all-to-all brought along the sequence",
    heads_reversed: "right heads in the wrong order",
    local_mask: "the positions of the rank's own shard",
    no_mask: "attended without the causal mask",
    always_masked: "the case is not causal",
}
