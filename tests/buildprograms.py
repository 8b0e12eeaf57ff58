"""Per-rank programs for the Builds of lessons 08, 09 and 10: the solutions, and the mistakes
learners make, each the solution with one mistake written into it (`edit`), so that it
reads as a learner's whole answer; `source(fn)` is its text, for a graded notebook's cell.
`MISTAKES` maps each exercise's wrong programs to words of their hints."""

from __future__ import annotations

import linecache
import re

import torch

FSDP_STEP = """\
def fsdp_step(ctx):
    comm, layers = ctx.comm, len(ctx.shards)
    x, inputs = ctx.inputs[ctx.rank], []
    with torch.no_grad():  # the forward keeps each layer's input, not its parameters
        for i in range(layers):
            inputs.append(x)
            full = comm.all_gather(ctx.shards[i])
            x = ctx.layer(i, full, x)
            del full
    grad = None
    for i in reversed(range(layers)):
        full = comm.all_gather(ctx.shards[i]).requires_grad_()
        x = inputs[i].requires_grad_()
        out = ctx.layer(i, full, x)
        if i == layers - 1:
            out = ctx.loss(out, ctx.rank)
        torch.autograd.backward(out, grad)
        grad = x.grad
        ctx.shards[i] -= ctx.lr * comm.reduce_scatter(full.grad)
        del full, out
"""

RING_ATTENTION = """\
def ring_attention(ctx):
    r, n, t = ctx.rank, ctx.world, len(ctx.q)
    k, v, out, lse = ctx.k, ctx.v, None, None
    for step in range(n):
        if step < n - 1:
            ctx.send(torch.stack([k, v]), to=(r + 1) % n)
        owner = (r - step) % n
        if owner <= r:
            mask = torch.ones(t, t, dtype=torch.bool).tril() if owner == r else None
            out_b, lse_b = ctx.attend(ctx.q, k, v, mask)
            if out is None:
                out, lse = out_b, lse_b
            else:
                new = torch.logaddexp(lse, lse_b)
                out = torch.exp(lse - new)[:, None] * out + torch.exp(lse_b - new)[:, None] * out_b
                lse = new
        if step < n - 1:
            k, v = ctx.recv((r - 1) % n)
    return out
"""

MOE_LAYER = """\
def moe_layer(ctx):
    n, per = ctx.world, ctx.num_experts // ctx.world
    tokens, k = ctx.experts_of.shape
    expert = ctx.experts_of.flatten()
    token = torch.arange(tokens).repeat_interleave(k)
    order = torch.argsort(expert, stable=True)
    expert, token, gate = expert[order], token[order], ctx.gates.flatten()[order]
    counts = torch.bincount(expert // per, minlength=n).tolist()
    received = ctx.comm.all_to_all(list(ctx.h[token].split(counts)))
    ids = ctx.comm.all_to_all(list(expert.split(counts)))
    outs = []
    for s in range(n):
        out = torch.zeros_like(received[s])
        for e, module in ctx.experts.items():
            rows = ids[s] == e
            out[rows] = module(received[s][rows])
        outs.append(out)
    back = torch.cat(ctx.comm.all_to_all(outs))
    return ctx.x.index_add(0, token, gate[:, None] * back)
"""


def edit(text: str, name: str, *changes: tuple[str, str]):
    """The program `text` with each (old, new) replaced, as a function whose __name__ is
    `name` (its source keeps the solution's function name, as a notebook cell would)."""
    from course_utils.pipeline import make_schedule

    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    namespace, filename = {"torch": torch, "make_schedule": make_schedule}, f"<{name}>"
    # as IPython does for a cell: tracebacks can show the program's own lines
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    exec(compile(text, filename, "exec"), namespace)
    answer = re.match(r"def (\w+)\(", text)
    assert answer is not None, text
    fn = namespace[answer.group(1)]
    fn.__name__, fn.source = name, text
    return fn


def source(fn) -> str:
    return fn.source


# -- 8.6: the FSDP step ---------------------------------------------------------------------

fsdp_step = edit(FSDP_STEP, "fsdp_step")
KEEPS_GATHERED = """\
def fsdp_step(ctx):
    comm = ctx.comm
    fulls = [comm.all_gather(shard).requires_grad_() for shard in ctx.shards]
    x = ctx.inputs[ctx.rank]
    for i, full in enumerate(fulls):
        x = ctx.layer(i, full, x)
    ctx.loss(x, ctx.rank).backward()
    for shard, full in zip(ctx.shards, fulls):
        shard -= ctx.lr * comm.reduce_scatter(full.grad)
"""
keeps_gathered = edit(KEEPS_GATHERED, "keeps_gathered")  # gathered once, kept to the end
graph_kept = edit(  # the forward with grad: autograd keeps every gathered layer
    FSDP_STEP, "graph_kept", ("with torch.no_grad():", "if True:")
)
all_reduce_grads = edit(
    FSDP_STEP,
    "all_reduce_grads",
    (
        "        ctx.shards[i] -= ctx.lr * comm.reduce_scatter(full.grad)\n",
        "        comm.all_reduce(full.grad)\n"
        "        ctx.shards[i] -= ctx.lr * full.grad.chunk(ctx.world)[ctx.rank]\n",
    ),
)
mean_of_grads = edit(
    FSDP_STEP,
    "mean_of_grads",
    ("reduce_scatter(full.grad)", 'reduce_scatter(full.grad, op="mean")'),
)
not_stored = edit(  # the new shard is a new tensor, never put back in ctx.shards
    FSDP_STEP, "not_stored", ("ctx.shards[i] -= ctx.lr *", "shard = ctx.shards[i] - ctx.lr *")
)
no_chain = edit(  # each layer's backward starts afresh, not from the next layer's gradient
    FSDP_STEP,
    "no_chain",
    ("torch.autograd.backward(out, grad)", "out.backward(torch.ones_like(out))"),
)
rank_0_leaves = edit(  # rank 0 skips the step: the others wait in their first all-gather
    FSDP_STEP,
    "rank_0_leaves",
    ("    comm, layers", "    if ctx.rank == 0:\n        return\n    comm, layers"),
)

own_loss = edit(  # each rank's own mean loss: the summed gradients are N times the batch's
    FSDP_STEP,
    "own_loss",
    (
        "out = ctx.loss(out, ctx.rank)",
        "out = torch.nn.functional.cross_entropy(out, ctx.targets[ctx.rank])",
    ),
)
shard_not_gathered = edit(  # computes with its shard: the layer needs all of it
    FSDP_STEP,
    "shard_not_gathered",
    ("            full = comm.all_gather(ctx.shards[i])\n", "            full = ctx.shards[i]\n"),
)
spreads_update = edit(  # ZeRO-2's habit: all-gathers the updated shards, which nobody needs
    FSDP_STEP,
    "spreads_update",
    ("        del full, out\n", "        del full, out\n        comm.all_gather(ctx.shards[i])\n"),
)

FSDP_MISTAKES = {  # the three commonest, each with the words its hint must say
    keeps_gathered: "layer 0's gathered parameters",
    all_reduce_grads: "which collective leaves each rank just its slice",
    mean_of_grads: "sum them, do not average",
}


# -- 9.2: causal ring attention --------------------------------------------------------------

PAD = " " * 16
MERGE = (
    PAD + "out = torch.exp(lse - new)[:, None] * out + torch.exp(lse_b - new)[:, None] * out_b\n"
)
ring_attention = edit(RING_ATTENTION, "ring_attention")
wrong_owner = edit(RING_ATTENTION, "wrong_owner", ("(r - step) % n", "(r + step) % n"))
averaged = edit(RING_ATTENTION, "averaged", (MERGE, "                out = (out + out_b) / 2\n"))
unmasked_diagonal = edit(
    RING_ATTENTION, "unmasked_diagonal", ("if owner == r else", "if False else")
)
not_causal = edit(RING_ATTENTION, "not_causal", ("if owner <= r:", "if True:"))
overflows = edit(
    RING_ATTENTION,
    "overflows",
    (
        MERGE,
        "                out = (torch.exp(lse)[:, None] * out + torch.exp(lse_b)[:, None] * out_b)"
        " / torch.exp(new)[:, None]\n",
    ),
)
unnormalised = edit(
    RING_ATTENTION,
    "unnormalised",
    (
        MERGE,
        "                out = torch.exp(lse)[:, None] * out + torch.exp(lse_b)[:, None] * out_b\n",
    ),
)
swapped = edit(
    RING_ATTENTION,
    "swapped",
    (
        MERGE,
        PAD
        + "out = torch.exp(lse_b - new)[:, None] * out + torch.exp(lse - new)[:, None] * out_b\n",
    ),
)
larger_lse = edit(
    RING_ATTENTION,
    "larger_lse",
    ("new = torch.logaddexp(lse, lse_b)", "new = torch.maximum(lse, lse_b)"),
)
summed_lse = edit(
    RING_ATTENTION, "summed_lse", ("new = torch.logaddexp(lse, lse_b)", "new = lse + lse_b")
)
own_block_sent = edit(
    RING_ATTENTION,
    "own_block_sent",
    ("ctx.send(torch.stack([k, v])", "ctx.send(torch.stack([ctx.k, ctx.v])"),
)
sent_left = edit(
    RING_ATTENTION,
    "sent_left",
    ("to=(r + 1) % n", "to=(r - 1) % n"),
    ("ctx.recv((r - 1) % n)", "ctx.recv((r + 1) % n)"),
)
sends_last = edit(
    RING_ATTENTION,
    "sends_last",
    ("        if step < n - 1:\n            ctx.send(", "        if True:\n            ctx.send("),
)
waits_first = edit(  # every rank waits for a block before it sends its own: nobody sends
    RING_ATTENTION,
    "waits_first",
    (
        "        if step < n - 1:\n            ctx.send(",
        "        if step > 0:\n            k, v = ctx.recv((r - 1) % n)\n"
        "        if step < n - 1:\n            ctx.send(",
    ),
)
sends_queries = edit(  # the queries travel with the block: more bytes, and not a K/V block
    RING_ATTENTION,
    "sends_queries",
    ("ctx.send(torch.stack([k, v])", "ctx.send(torch.stack([ctx.q, k, v])"),
    ("k, v = ctx.recv((r - 1) % n)", "_, k, v = ctx.recv((r - 1) % n)"),
)
starts_at_zero = edit(  # the running lse starts at 0, not -inf: a phantom block of weight 1
    RING_ATTENTION,
    "starts_at_zero",
    (
        "k, v, out, lse = ctx.k, ctx.v, None, None",
        "k, v, out, lse = ctx.k, ctx.v, 0 * ctx.q, torch.zeros(t)",
    ),
    ("if out is None:", "if False:"),
)
returns_nothing = edit(RING_ATTENTION, "returns_nothing", ("    return out\n", "    pass\n"))

RING_MISTAKES = {  # the three commonest, each with the words its hint must say
    wrong_owner: "Whose block is in hand at step s?",
    averaged: "as if each block held the same share of the softmax",
    unmasked_diagonal: "its own without the mask",
}


# -- 10.8: the expert-parallel MoE layer ------------------------------------------------------

moe_layer = edit(MOE_LAYER, "moe_layer")
BACK = "    back = torch.cat(ctx.comm.all_to_all(outs))\n"
wrong_rank = edit(  # each local expert's outputs go to the rank of its number, not home
    MOE_LAYER,
    "wrong_rank",
    (
        "    outs = []\n"
        "    for s in range(n):\n"
        "        out = torch.zeros_like(received[s])\n"
        "        for e, module in ctx.experts.items():\n"
        "            rows = ids[s] == e\n"
        "            out[rows] = module(received[s][rows])\n"
        "        outs.append(out)\n",
        "    outs = []\n"
        "    for e, module in ctx.experts.items():\n"
        "        mine = [received[s][ids[s] == e] for s in range(n)]\n"
        "        outs.append(module(torch.cat(mine)))\n",
    ),
)
ungated = edit(MOE_LAYER, "ungated", ("gate[:, None] * back", "back"))
one_expert = edit(  # the receiving rank runs every token through its first expert
    MOE_LAYER,
    "one_expert",
    (
        "        for e, module in ctx.experts.items():\n"
        "            rows = ids[s] == e\n"
        "            out[rows] = module(received[s][rows])\n",
        "        out = next(iter(ctx.experts.values()))(received[s])\n",
    ),
)
no_residual = edit(
    MOE_LAYER, "no_residual", ("ctx.x.index_add(", "torch.zeros_like(ctx.x).index_add(")
)
unsorted_rows = edit(  # top-1: the outputs added in the order they were sent, not to their tokens
    MOE_LAYER,
    "unsorted_rows",
    ("ctx.x.index_add(0, token, gate[:, None] * back)", "ctx.x + gate[:, None] * back"),
)
first_choice = edit(  # top-1's program on a top-k router: only each token's first expert
    MOE_LAYER,
    "first_choice",
    ("ctx.experts_of.flatten()", "ctx.experts_of[:, 0]"),
    ("torch.arange(tokens).repeat_interleave(k)", "torch.arange(tokens)"),
    ("ctx.gates.flatten()[order]", "ctx.gates[:, 0][order]"),
)
no_combine = edit(  # the outputs come back by messages, not by an all-to-all
    MOE_LAYER,
    "no_combine",
    (BACK, "    back = torch.cat([outs[s] for s in range(n)])\n"),
)
round_robin = edit(  # expert e on rank e % N, but rank r holds a contiguous block of them
    MOE_LAYER,
    "round_robin",
    ("torch.bincount(expert // per, minlength=n)", "torch.bincount(expert % n, minlength=n)"),
)
unnormed = edit(MOE_LAYER, "unnormed", ("ctx.h[token]", "ctx.x[token]"))  # experts take h
returns_nothing_moe = edit(
    MOE_LAYER, "returns_nothing", ("    return ctx.x.index_add(", "    ctx.x.index_add(")
)
BROADCAST = """\
def moe_layer(ctx):
    n, (tokens, k) = ctx.world, ctx.experts_of.shape
    received = ctx.comm.all_to_all([ctx.h] * n)  # every token to every rank
    choices = ctx.comm.all_to_all([ctx.experts_of] * n)
    weights = ctx.comm.all_to_all([ctx.gates] * n)
    outs = []
    for h, chosen, gates in zip(received, choices, weights):
        out = torch.zeros_like(h)
        for e, module in ctx.experts.items():
            for j in range(k):
                rows = chosen[:, j] == e
                out[rows] += gates[rows, j, None] * module(h[rows])
        outs.append(out)
    return ctx.x + sum(ctx.comm.all_to_all(outs))
"""
broadcast = edit(BROADCAST, "broadcast")
rank_0_skips = edit(  # rank 0 leaves before the combine: the others wait in it
    MOE_LAYER, "rank_0_skips", (BACK, "    if ctx.rank == 0:\n        return ctx.x\n" + BACK)
)

MOE_MISTAKES = {  # the three commonest, each with the words its hint must say
    wrong_rank: "went back to the wrong ranks",
    ungated: "weigh each by its gate",
    one_expert: "which of its experts each token chose",
}
