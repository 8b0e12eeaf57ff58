"""The Build of Exercise 9.1 (Megatron's sequence parallelism) as learners write it: the right
program, and each with a mistake learners make written into it (as in `dpprograms`:
`edit(text, name, (old, new), ...)`); `MISTAKES` maps each wrong program to words of the
hint it must get, and no other."""

from __future__ import annotations

from dpprograms import ANSWER, edit, load

SP = """\
class GatherSequence(torch.autograd.Function):  # g
    @staticmethod
    def forward(fctx, part, comm):
        fctx.comm = comm
        return comm.all_gather(part, dim=0)

    @staticmethod
    def backward(fctx, grad):
        return fctx.comm.reduce_scatter(grad, dim=0), None


class ScatterSequence(torch.autograd.Function):  # g-bar
    @staticmethod
    def forward(fctx, partial, comm):
        fctx.comm = comm
        return comm.reduce_scatter(partial, dim=0)

    @staticmethod
    def backward(fctx, grad):
        return fctx.comm.all_gather(grad, dim=0), None


def sp_block(ctx, x):
    s = ctx.stage
    z = GatherSequence.apply(s.norm(x), ctx.comm)
    partial = s.down(F.gelu(s.up(z)))
    return x + ScatterSequence.apply(partial, ctx.comm) + s.b2
"""
ANSWER[SP] = "sp_block"

sp = load(SP, "sp", "sp_block")
sp_all_reduce = edit(  # tensor parallelism's g: the whole sequence's sum, then the own rows kept
    SP,
    "sp_all_reduce",
    (
        "        return comm.reduce_scatter(partial, dim=0)",
        "        fctx.lo, fctx.hi = ctx_rows(comm, partial)\n"
        "        return comm.all_reduce(partial.clone())[fctx.lo : fctx.hi]",
    ),
    (
        "        return fctx.comm.all_gather(grad, dim=0), None",
        "        return fctx.comm.all_gather(grad, dim=0), None\n\n\n"
        "def ctx_rows(comm, t):\n"
        "    return chunk_bounds(len(t), comm.world_size)[comm.rank]",
    ),
)
sp_norm_after = edit(  # the residual's tokens gathered, the LayerNorm on the whole sequence
    SP,
    "sp_norm_after",
    ("GatherSequence.apply(s.norm(x), ctx.comm)", "s.norm(GatherSequence.apply(x, ctx.comm))"),
)
sp_ring_order = edit(  # a ring by hand, the shards kept in the order they arrive
    SP,
    "sp_ring_order",
    (
        "        return comm.all_gather(part, dim=0)",
        "        n, r = comm.world_size, comm.rank\n"
        "        pieces = [part.detach()]\n"
        "        for _ in range(n - 1):\n"
        "            comm.send((r + 1) % n, pieces[-1])\n"
        "            pieces.append(comm.recv((r - 1) % n))\n"
        "        return torch.cat(pieces, dim=0)",
    ),
)
sp_bias_before = edit(  # b2 added by every rank before the sum
    SP,
    "sp_bias_before",
    ("partial = s.down(F.gelu(s.up(z)))", "partial = s.down(F.gelu(s.up(z))) + s.b2"),
    ("ScatterSequence.apply(partial, ctx.comm) + s.b2", "ScatterSequence.apply(partial, ctx.comm)"),
)
sp_slice_backward = edit(  # g's backward keeps the own rows of dL/dZ, as a column layer's does
    SP,
    "sp_slice_backward",
    (
        "        return fctx.comm.reduce_scatter(grad, dim=0), None\n",
        "        lo, hi = chunk_bounds(len(grad), fctx.comm.world_size)[fctx.comm.rank]\n"
        "        return grad[lo:hi], None\n",
    ),
)
sp_no_gather = edit(  # each rank's columns of W1 on its own tokens only
    SP,
    "sp_no_gather",
    ("        return comm.all_gather(part, dim=0)", "        return part.clone()"),
    ("        return fctx.comm.reduce_scatter(grad, dim=0), None", "        return grad, None"),
)
sp_reduce_grad = edit(  # g's backward sums dL/dZ everywhere, then keeps the own rows
    SP,
    "sp_reduce_grad",
    (
        "        return fctx.comm.reduce_scatter(grad, dim=0), None\n",
        "        lo, hi = chunk_bounds(len(grad), fctx.comm.world_size)[fctx.comm.rank]\n"
        "        return fctx.comm.all_reduce(grad.clone())[lo:hi], None\n",
    ),
)

MISTAKES = {
    sp_all_reduce: "all-reduces in its forward",
    sp_norm_after: "ran on the whole sequence",
    sp_ring_order: "in the order of ranks",
    sp_bias_before: "times b2",
    sp_slice_backward: "g's backward sums every rank's share",
    sp_no_gather: "saw only the rank's",
    sp_reduce_grad: "all-reduces in its backward",
}
