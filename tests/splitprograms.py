"""The Builds of Exercises 7.1 (a column-parallel layer) and 8.2 (ZeRO-2's step) as learners
write them: the right programs, and each with the mistakes learners make written into it.

As in `dpprograms`: a program is the text of a whole answer cell; `edit(text, name,
(old, new), ...)` makes a wrong one; `MISTAKES` maps each Build's commonest wrong programs to
words of the hint each must get, and no other.
"""

from __future__ import annotations

from dpprograms import ANSWER, edit, load

COLUMN = """\
class GatherColumns(torch.autograd.Function):
    @staticmethod
    def forward(fctx, part, comm, lo, hi):
        fctx.lo, fctx.hi = lo, hi
        return comm.all_gather(part, dim=-1)

    @staticmethod
    def backward(fctx, grad):
        return grad[..., fctx.lo : fctx.hi], None, None, None


def column_parallel(ctx, x):
    s = ctx.stage
    part = x @ s.a + s.b
    return GatherColumns.apply(part, ctx.comm, s.lo, s.hi)
"""

ZERO = """\
def zero_step(ctx):
    n, r = ctx.world, ctx.rank
    numel = ctx.flat.numel()
    size = -(-numel // n)
    padded = torch.zeros(n * size)
    padded[:numel] = ctx.gradient()
    grad = ctx.comm.reduce_scatter(padded, op="mean")
    if "momentum" not in ctx.state:
        ctx.state["momentum"] = torch.zeros(size)
    m = ctx.state["momentum"]
    m.mul_(ctx.momentum).add_(grad)
    params = torch.zeros(n * size)
    params[:numel] = ctx.flat
    mine = params[r * size : (r + 1) * size] - ctx.lr * m
    ctx.flat = ctx.comm.all_gather(mine)[:numel]
"""
ANSWER.update({COLUMN: "column_parallel", ZERO: "zero_step"})  # so that `edit` knows them


column = load(COLUMN, "column", "column_parallel")
column_rows = edit(COLUMN, "column_rows", ("dim=-1", "dim=0"))
column_ring_order = edit(  # a ring of messages, the blocks kept in the order they arrive
    COLUMN,
    "column_ring_order",
    ("comm, lo, hi):", "ctx, lo, hi):"),
    (
        "        return comm.all_gather(part, dim=-1)",
        "        pieces, n, r = [part], ctx.world, ctx.rank\n"
        "        for _ in range(n - 1):\n"
        "            ctx.send(pieces[-1], to=(r + 1) % n)\n"
        "            pieces.append(ctx.recv((r - 1) % n))\n"
        "        return torch.cat(pieces, dim=-1)",
    ),
    ("part, ctx.comm, s.lo", "part, ctx, s.lo"),
)
column_all_reduce = edit(  # the ranks' slices added up, as after a row-parallel layer
    COLUMN,
    "column_all_reduce",
    (
        "        return comm.all_gather(part, dim=-1)",
        "        return comm.all_reduce(part.clone())",
    ),
    ("grad[..., fctx.lo : fctx.hi]", "grad"),
)
column_chunked_grad = edit(  # the backward's columns by torch.chunk, not lo:hi
    COLUMN,
    "column_chunked_grad",
    ("fctx.lo, fctx.hi = lo, hi", "fctx.n, fctx.r = comm.world_size, comm.rank"),
    ("grad[..., fctx.lo : fctx.hi]", "grad.chunk(fctx.n, dim=-1)[fctx.r]"),
)
column_sums_grad = edit(  # the backward all-reduces dL/dY, which every rank already holds
    COLUMN,
    "column_sums_grad",
    ("fctx.lo, fctx.hi = lo, hi", "fctx.lo, fctx.hi, fctx.comm = lo, hi, comm"),
    (
        "        return grad[..., fctx.lo : fctx.hi], None, None, None",
        "        grad = grad.clone()\n        fctx.comm.all_reduce(grad)\n"
        "        return grad[..., fctx.lo : fctx.hi], None, None, None",
    ),
)

zero = load(ZERO, "zero", "zero_step")
zero_all_reduce = edit(  # plain data parallelism: every rank updates everything
    ZERO,
    "zero_all_reduce",
    (
        'grad = ctx.comm.reduce_scatter(padded, op="mean")',
        'grad = ctx.comm.all_reduce(padded, op="mean")',
    ),
    ("torch.zeros(size)", "torch.zeros(n * size)"),
    ("params[r * size : (r + 1) * size] - ctx.lr * m", "params - ctx.lr * m"),
    ("ctx.comm.all_gather(mine)[:numel]", "mine[:numel]"),
)
zero_unpadded_gradient = edit(  # the gradient cut as the reduce-scatter likes, not padded
    ZERO, "zero_unpadded_gradient", ("reduce_scatter(padded,", "reduce_scatter(ctx.gradient(),")
)
zero_sum = edit(ZERO, "zero_sum", ('reduce_scatter(padded, op="mean")', "reduce_scatter(padded)"))
zero_no_gather = edit(  # each rank writes its own shard back, and no more
    ZERO,
    "zero_no_gather",
    (
        "    ctx.flat = ctx.comm.all_gather(mine)[:numel]",
        "    params[r * size : (r + 1) * size] = mine\n    ctx.flat = params[:numel]",
    ),
)
zero_shifted = edit(  # the right slice of the gradient applied to the next rank's shard
    ZERO,
    "zero_shifted",
    (
        "mine = params[r * size : (r + 1) * size]",
        "s = (r + 1) % n\n    mine = params[s * size : (s + 1) * size]",
    ),
    ("all_gather(mine)[:numel]", "all_gather(mine).roll(size)[:numel]"),
)
zero_momentum_reset = edit(  # the momentum made afresh at every step
    ZERO, "zero_momentum_reset", ('    if "momentum" not in ctx.state:\n', "    if True:\n")
)
zero_whole_state = edit(  # the momentum of every parameter, though only a shard is updated
    ZERO,
    "zero_whole_state",
    ('ctx.state["momentum"] = torch.zeros(size)', 'ctx.state["momentum"] = torch.zeros(n * size)'),
    ('m = ctx.state["momentum"]', 'm = ctx.state["momentum"][r * size : (r + 1) * size]'),
)

MISTAKES = {  # each Build's commonest wrong programs, with words their hints must say
    "column": {
        column_rows: "along the rows",
        column_ring_order: "in the order of ranks",
        column_all_reduce: "An all-reduce adds",
        column_chunked_grad: "torch.chunk cuts elsewhere",
        column_sums_grad: "its backward summed dL/dY",
    },
    "zero": {
        zero_all_reduce: "plain data parallelism",
        zero_unpadded_gradient: "cut at different offsets",
        zero_sum: "summed over the",
        zero_no_gather: "all-gather them",
        zero_shifted: "on the wrong parameters",
        zero_momentum_reset: "started again from no momentum",
        zero_whole_state: "only the state of the parameters it updates",
    },
}

GRID = """\
def grid_groups(ctx, tp, dp):
    mine = {}
    for d in range(dp):  # tensor-parallel groups: tp neighbouring ranks, one replica
        group = ctx.new_group([t + tp * d for t in range(tp)])
        if group is not None:
            mine["tensor"] = group
    for t in range(tp):  # data-parallel groups: one tensor rank in every replica
        group = ctx.new_group([t + tp * d for d in range(dp)])
        if group is not None:
            mine["data"] = group
    tensor_sum = mine["tensor"].all_reduce(ctx.value.clone())
    data_sum = mine["data"].all_reduce(ctx.value.clone())
    return {"tensor": tensor_sum, "data": data_sum}
"""
ANSWER[GRID] = "grid_groups"
grid = load(GRID, "grid", "grid_groups")
grid_strided = edit(  # the tensor groups made the data groups' way, and the other way round
    GRID,
    "grid_strided",
    ('mine["tensor"] = group', 'mine["data"] = group'),
    (
        '            mine["data"] = group\n    tensor',
        '            mine["tensor"] = group\n    tensor',
    ),
)
grid_from_itself = edit(  # each rank's tensor group starts from the rank itself
    GRID,
    "grid_from_itself",
    (
        "    for d in range(dp):  # tensor-parallel groups: tp neighbouring ranks, one replica\n"
        "        group = ctx.new_group([t + tp * d for t in range(tp)])\n"
        "        if group is not None:\n"
        '            mine["tensor"] = group\n',
        '    mine["tensor"] = ctx.new_group([(ctx.rank + t) % ctx.world for t in range(tp)])\n',
    ),
)
grid_in_place = edit(
    GRID,
    "grid_in_place",
    ('mine["tensor"].all_reduce(ctx.value.clone())', 'mine["tensor"].all_reduce(ctx.value)'),
    ('mine["data"].all_reduce(ctx.value.clone())', 'mine["data"].all_reduce(ctx.value)'),
)
grid_world = edit(
    GRID,
    "grid_world",
    ('mine["data"].all_reduce(ctx.value.clone())', "ctx.comm.all_reduce(ctx.value.clone())"),
)
MISTAKES["grid"] = {
    grid_strided: "the shape of its data-parallel group",
    grid_from_itself: "is in two tensor-parallel groups",
    grid_in_place: "works in place",
    grid_world: "spans every rank",
}
grid_rank0_leaves = edit(  # rank 0 never joins its data-parallel all-reduce
    GRID,
    "grid_rank0_leaves",
    (
        '    data_sum = mine["data"]',
        '    if ctx.rank == 0:\n        return {"tensor": tensor_sum}\n    data_sum = mine["data"]',
    ),
)

ZIGZAG = """\
def zigzag_ring(ctx):
    n, r = ctx.world, ctx.rank
    c = ctx.q.shape[1]  # tokens per chunk
    out, lse = [None, None], [None, None]
    kv = torch.stack([ctx.k, ctx.v])  # this rank's two chunks' keys and values
    for step in range(n):
        owner = (r - step) % n
        theirs = (owner, 2 * n - 1 - owner)  # the chunk numbers in hand
        for i, a in enumerate(ctx.chunks):
            for j, b in enumerate(theirs):
                if b > a:  # a later chunk: the mask hides it all
                    continue
                mask = torch.ones(c, c, dtype=torch.bool).tril() if a == b else None
                o, s = ctx.attend(ctx.q[i], kv[0, j], kv[1, j], mask)
                if out[i] is None:
                    out[i], lse[i] = o, s
                else:
                    out[i], lse[i] = ctx.merge(out[i], lse[i], o, s)
        if step < n - 1:
            ctx.send(kv, to=(r + 1) % n)
            kv = ctx.recv((r - 1) % n)
    return torch.cat(out)
"""
ANSWER[ZIGZAG] = "zigzag_ring"
zigzag = load(ZIGZAG, "zigzag", "zigzag_ring")
zigzag_everything = edit(  # every product computed, the hidden ones with an all-False mask
    ZIGZAG,
    "zigzag_everything",
    (
        "                if b > a:  # a later chunk: the mask hides it all\n"
        "                    continue\n"
        "                mask = torch.ones(c, c, dtype=torch.bool).tril() if a == b else None\n",
        "                mask = torch.ones(c, c, dtype=torch.bool).tril() if a == b else None\n"
        "                if b > a:\n"
        "                    mask = torch.zeros(c, c, dtype=torch.bool)\n",
    ),
)
zigzag_plain_skip = edit(  # the blocks of later ranks skipped whole, as in the plain split
    ZIGZAG,
    "zigzag_plain_skip",
    (
        "        for i, a in enumerate(ctx.chunks):\n",
        "        for i, a in enumerate(ctx.chunks if owner <= r else ()):\n",
    ),
)
zigzag_unmasked = edit(
    ZIGZAG,
    "zigzag_unmasked",
    ("torch.ones(c, c, dtype=torch.bool).tril() if a == b else None", "None"),
)
zigzag_late_first = edit(ZIGZAG, "zigzag_late_first", ("torch.cat(out)", "torch.cat(out[::-1])"))
MISTAKES["zigzag"] = {
    zigzag_everything: "which the mask hides whole",
    zigzag_plain_skip: "as in the plain split",
    zigzag_unmasked: "needs the lower-triangular mask",
    zigzag_late_first: "late chunk's output first",
}
