"""Per-rank programs for the tests of Exercises 5.4 (breadth-first, two stages per rank), 11.3
(fill and drain on a V) and 12.9 (data x pipeline parallel on a grid of ranks): the
solutions, and each with the mistakes learners make written into it (`buildprograms.edit`).

`MISTAKES_54`, `MISTAKES_113` and `MISTAKES_129` map each exercise's commonest wrong programs
to words their hint must say (and no other's); `OTHERS_113` and `OTHERS_129` are further
wrong programs with the words of their hints.
"""

from __future__ import annotations

from buildprograms import edit
from pipeprograms import INTERLEAVED
from pipeprograms import interleaved as depth_first  # Exercise 5.7's order

V_GPIPE = """\
def v_gpipe_program(ctx):
    p, m, last = ctx.world, ctx.microbatches, 2 * ctx.world - 1

    def owner(s):  # the V: stage s on rank s going down, on rank 2p-1-s coming back up
        return s if s < p else last - s

    kept, turn = {}, {}  # turn: what crosses the bottom of the V, kept on its rank
    for chunk, s in enumerate(ctx.stage_ids):  # the down chunk's forwards, then the up chunk's
        for mb in range(m):
            if s == 0:
                x = ctx.inputs[mb]
            elif owner(s - 1) == ctx.rank:
                x = turn.pop(mb).detach().requires_grad_()
            else:
                x = ctx.recv(owner(s - 1), tag=("act", s, mb)).requires_grad_()
            with ctx.forward(mb, chunk):
                out = ctx.stages[chunk](x)
                if s == last:
                    out = ctx.loss(out, mb)
            if s < last and owner(s + 1) == ctx.rank:
                turn[mb] = out
            elif s < last:
                ctx.send(out, to=owner(s + 1), tag=("act", s + 1, mb))
            kept[s, mb] = (x, out)
    for chunk in (1, 0):  # the up chunk's gradients come first, from the loss
        s = ctx.stage_ids[chunk]
        for mb in range(m):
            x, out = kept.pop((s, mb))
            if s == last:
                grad = None
            elif owner(s + 1) == ctx.rank:
                grad = turn.pop(mb)
            else:
                grad = ctx.recv(owner(s + 1), tag=("grad", s, mb))
            with ctx.backward(mb, chunk):
                torch.autograd.backward(out, grad)
            if s > 0 and owner(s - 1) == ctx.rank:
                turn[mb] = x.grad
            elif s > 0:
                ctx.send(x.grad, to=owner(s - 1), tag=("grad", s - 1, mb))
"""

v_gpipe = edit(V_GPIPE, "v_gpipe")
v_lifo = edit(  # each chunk's backwards last in, first out: still fill and drain on a V
    V_GPIPE,
    "v_lifo",
    (
        "        for mb in range(m):\n            x, out",
        "        for mb in reversed(range(m)):\n            x, out",
    ),
)
looping = edit(  # stage s on rank s mod p, as interleaved 1F1B places it
    V_GPIPE, "looping", ("        return s if s < p else last - s", "        return s % p")
)
turn_sent = edit(  # the bottom of the V sends stage p-1's output to itself
    V_GPIPE,
    "turn_sent",
    ("            if s < last and owner(s + 1) == ctx.rank:", "            if False:"),
    (
        "            elif owner(s - 1) == ctx.rank:\n                x = turn",
        "            elif False:\n                x = turn",
    ),
)
down_first = edit(  # the backwards in the forwards' order: down chunk first
    V_GPIPE, "down_first", ("    for chunk in (1, 0):", "    for chunk in (0, 1):")
)
not_detached = edit(  # the turn hands stage p-1's output on with its graph
    V_GPIPE, "not_detached", ("turn.pop(mb).detach().requires_grad_()", "turn.pop(mb)")
)
mb_major = edit(  # each micro-batch down and back up before the next: valid, but slower
    V_GPIPE,
    "mb_major",
    (
        "    for chunk, s in enumerate(ctx.stage_ids):  # the down chunk's forwards, then the up"
        " chunk's\n        for mb in range(m):\n",
        "    for mb in range(m):\n        for chunk, s in enumerate(ctx.stage_ids):\n",
    ),
)
grad_onward = edit(  # the gradient sent on to the next stage's rank, not back
    V_GPIPE, "grad_onward", ("ctx.send(x.grad, to=owner(s - 1)", "ctx.send(x.grad, to=owner(s + 1)")
)

MISTAKES_113 = {
    looping: "looping placement",
    turn_sent: "the turn is no message",
    down_first: "runs its up chunk's backwards before its down chunk's",
}
OTHERS_113 = {
    not_detached: "got no gradient from its up chunk",
    mb_major: "the order your ranks ran replays to a step of",
    grad_onward: "a gradient back to the rank of the one before",
}


GRID = """\
def grid_program(ctx):
    S = ctx.world // 2  # stages per pipeline: two replicas of it
    stage, replica = ctx.rank % S, ctx.rank // S
    per = ctx.microbatches // 2
    mine = range(replica * per, (replica + 1) * per)  # this replica's micro-batches
    kept = {}
    for mb in mine:  # the pipeline of this replica, fill and drain
        if stage == 0:
            x = ctx.inputs[mb]
        else:
            x = ctx.recv(ctx.rank - 1, tag=("act", mb)).requires_grad_()
        with ctx.forward(mb):
            out = ctx.stage(x)
            if stage == S - 1:
                out = ctx.loss(out, mb)
        if stage < S - 1:
            ctx.send(out, to=ctx.rank + 1, tag=("act", mb))
        kept[mb] = (x, out)
    for mb in mine:
        x, out = kept.pop(mb)
        grad = None if stage == S - 1 else ctx.recv(ctx.rank + 1, tag=("grad", mb))
        with ctx.backward(mb):
            torch.autograd.backward(out, grad)
        if stage > 0:
            ctx.send(x.grad, to=ctx.rank - 1, tag=("grad", mb))
    partner = (ctx.rank + S) % ctx.world  # the same stage in the other replica
    for name, p in ctx.stage.named_parameters():
        ctx.send(p.grad, to=partner, tag=("sum", name))
    for name, p in ctx.stage.named_parameters():
        p.grad += ctx.recv(partner, tag=("sum", name))
"""
SUM = """\
    partner = (ctx.rank + S) % ctx.world  # the same stage in the other replica
    for name, p in ctx.stage.named_parameters():
        ctx.send(p.grad, to=partner, tag=("sum", name))
    for name, p in ctx.stage.named_parameters():
        p.grad += ctx.recv(partner, tag=("sum", name))
"""

grid = edit(GRID, "grid")
over_world = edit(  # every other rank's gradients added in: the whole world as one group
    GRID,
    "over_world",
    (
        SUM,
        """\
    others = [r for r in range(ctx.world) if r != ctx.rank]
    for r in others:
        for name, p in ctx.stage.named_parameters():
            ctx.send(p.grad, to=r, tag=("sum", name))
    for r in others:
        for name, p in ctx.stage.named_parameters():
            p.grad += ctx.recv(r, tag=("sum", name))
""",
    ),
)
world_collective = edit(  # ctx.comm's all-reduce: over all ranks
    GRID,
    "world_collective",
    (SUM, "    for p in ctx.stage.parameters():\n        ctx.comm.all_reduce(p.grad)\n"),
)
too_early = edit(  # the sum after each micro-batch's backward, inside the loop
    GRID,
    "too_early",
    (SUM, ""),
    (
        """            ctx.send(x.grad, to=ctx.rank - 1, tag=("grad", mb))
""",
        """            ctx.send(x.grad, to=ctx.rank - 1, tag=("grad", mb))
        partner = (ctx.rank + S) % ctx.world
        for name, p in ctx.stage.named_parameters():
            ctx.send(p.grad, to=partner, tag=("sum", name))
        for name, p in ctx.stage.named_parameters():
            p.grad += ctx.recv(partner, tag=("sum", name))
""",
    ),
)
averaged = edit(  # DDP's habit: the sum over the 2 replicas divided by 2
    GRID,
    "averaged",
    (
        '        p.grad += ctx.recv(partner, tag=("sum", name))',
        '        p.grad = (p.grad + ctx.recv(partner, tag=("sum", name))) / 2',
    ),
)
no_sum = edit(GRID, "no_sum", (SUM, ""))  # each replica keeps its own half
recv_first = edit(  # both partners wait for the other's gradients first
    GRID,
    "recv_first",
    (
        """    for name, p in ctx.stage.named_parameters():
        ctx.send(p.grad, to=partner, tag=("sum", name))
    for name, p in ctx.stage.named_parameters():
        p.grad += ctx.recv(partner, tag=("sum", name))
""",
        """    for name, p in ctx.stage.named_parameters():
        theirs = ctx.recv(partner, tag=("sum", name))
        ctx.send(p.grad, to=partner, tag=("sum", name))
        p.grad += theirs
""",
    ),
)

sum_sent_back = edit(  # the sum, once made, sent back again: twice the bytes
    GRID,
    "sum_sent_back",
    (
        SUM,
        SUM
        + """\
    for name, p in ctx.stage.named_parameters():
        ctx.send(p.grad, to=partner, tag=("again", name))
    for name, p in ctx.stage.named_parameters():
        p.grad = ctx.recv(partner, tag=("again", name))
""",
    ),
)

MISTAKES_129 = {
    over_world: "never the whole world",
    too_early: "complete only after its last micro-batch's backward",
    averaged: "an average over the wrong count",
}
OTHERS_129 = {
    world_collective: "a collective of `ctx.comm`",
    no_sum: "not one device's on the whole batch",
    recv_first: "never finished",
    sum_sent_back: "each rank sends its gradients (or its share of them) once",
}


BREADTH_FIRST = """\
def breadth_first_program(ctx):
    p, m, last = ctx.world, ctx.microbatches, len(ctx.stages) * ctx.world - 1
    kept = {}
    for chunk, s in enumerate(ctx.stage_ids):  # one local stage after the other, going up
        for mb in range(m):
            if s == 0:
                x = ctx.inputs[mb]
            else:  # stage s - 1 lives on rank (s - 1) mod p
                x = ctx.recv((s - 1) % p, tag=("act", s, mb)).requires_grad_()
            with ctx.forward(mb, chunk):
                out = ctx.stages[chunk](x)
                if s == last:
                    out = ctx.loss(out, mb)
            if s < last:
                ctx.send(out, to=(s + 1) % p, tag=("act", s + 1, mb))
            kept[s, mb] = (x, out)
    for chunk in reversed(range(len(ctx.stages))):  # then coming down: the highest first
        s = ctx.stage_ids[chunk]
        for mb in range(m):
            x, out = kept.pop((s, mb))
            grad = None if s == last else ctx.recv((s + 1) % p, tag=("grad", s, mb))
            with ctx.backward(mb, chunk):
                torch.autograd.backward(out, grad)
            if s > 0:
                ctx.send(x.grad, to=(s - 1) % p, tag=("grad", s - 1, mb))
"""

breadth_first = edit(BREADTH_FIRST, "breadth_first")
lowest_first = edit(  # the backwards in the forwards' order: lowest local stage first
    BREADTH_FIRST,
    "lowest_first",
    (
        "    for chunk in reversed(range(len(ctx.stages))):",
        "    for chunk in range(len(ctx.stages)):",
    ),
)
mixed = edit(  # breadth-first's actions, each micro-batch through both local stages in turn
    INTERLEAVED,
    "mixed",
    ('make_schedule("interleaved"', 'make_schedule("breadth-first"'),
    (
        "    for action in order.devices[ctx.rank]:",
        "    def depth(a):  # forwards, then backwards; micro-batch first, then its stages\n"
        "        return (a.kind == 'B', a.microbatch, -a.stage if a.kind == 'B' else a.stage)\n\n"
        "    for action in sorted(order.devices[ctx.rank], key=depth):",
    ),
)
MISTAKES_54 = {
    depth_first: "the depth-first habit",
    mixed: "mixes its stages",
    lowest_first: "from its highest stage down",
}
