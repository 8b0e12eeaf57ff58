"""Gradient accumulation (Exercise 2.6), GPipe in rounds under a memory budget (3.4) and ZB-H1
(4.4) as per-rank programs, for `tests/test_budget_builds.py`: the solutions, and each with
the mistakes learners make written into it (`rankprograms.edit`).

`MISTAKES_K` maps each exercise's commonest wrong programs to words their hint must say (and
no other's); `OTHERS_K` are further wrong programs with the words of their hints.
"""

from __future__ import annotations

from pipeprograms import BACKWARDS, GPIPE, WAITS_FIRST
from rankprograms import edit

ROUNDS = GPIPE.replace("def gpipe_program(ctx):", "def rounds_program(ctx, budget):").replace(
    "    for mb in range(m):\n        forward(mb)\n" + BACKWARDS,
    """\
    for start in range(0, m, budget):
        group = range(start, min(start + budget, m))
        for mb in group:
            forward(mb)
        for mb in group:
            backward(mb)
""",
)
ROUND = "    for start in range(0, m, budget):\n"

rounds = edit("rounds_program", text=ROUNDS)
all_at_once = edit(  # one GPipe step of every micro-batch: the budget ignored
    "all_at_once",
    ("range(0, m, budget)", "range(0, m, m)"),
    ("start + budget", "start + m"),
    text=ROUNDS,
)
cleared = edit(  # the gradients cleared at the start of every round
    "cleared", (ROUND, ROUND + "        ctx.stage.zero_grad()\n"), text=ROUNDS
)
one_too_many = edit(  # rounds of budget + 1 micro-batches
    "one_too_many",
    ("range(0, m, budget)", "range(0, m, budget + 1)"),
    ("start + budget", "start + budget + 1"),
    text=ROUNDS,
)
one_at_a_time = edit(  # every micro-batch its own round: lesson 01's naive step, m times
    "one_at_a_time",
    ("range(0, m, budget)", "range(m)"),
    ("start + budget", "start + 1"),
    text=ROUNDS,
)
kept_after = edit(  # each graph (and what it saved) kept alive after its backward
    "kept_after",
    ("        x, out = kept.pop(mb)\n", "        x, out = kept[mb]\n"),
    ("torch.autograd.backward(out, grad)", "torch.autograd.backward(out, grad, retain_graph=True)"),
    text=ROUNDS,
)
lifo_rounds = edit(  # the rounds taken from the last micro-batches first
    "lifo_rounds", ("range(0, m, budget)", "reversed(range(0, m, budget))"), text=ROUNDS
)

waits_first_rounds = edit("waits_first_rounds", WAITS_FIRST, text=ROUNDS)  # waits before it sends
mixed_rounds = edit(  # the ranks before the last take the gradients back last in, first out
    "mixed_rounds",
    (
        "        for mb in group:\n            backward(mb)\n",
        "        for mb in reversed(group) if r < last else group:\n            backward(mb)\n",
    ),
    text=ROUNDS,
)

MISTAKES_34 = {
    all_at_once: "one GPipe step",
    cleared: "cleared between rounds",
    one_too_many: "no round may have more than the budget",
    one_at_a_time: "fewer rounds would too",
}
OTHERS_34 = {
    kept_after: "activations kept after their backward",
}

ZB_H1 = (
    GPIPE[: GPIPE.index("    def backward(mb):")].replace(
        "def gpipe_program(ctx):", "def zb_h1_program(ctx):"
    )
    + """\
    def backward_input(mb):
        x, out = kept[mb]
        grad = None if r == last else ctx.recv(r + 1, tag=("grad", mb))
        with ctx.backward_input(mb):
            if r > 0:
                (gx,) = torch.autograd.grad(out, x, grad, retain_graph=True)
        if r > 0:
            ctx.send(gx, to=r - 1, tag=("grad", mb))
        kept[mb] = (x, out, grad)

    def backward_weight(mb):
        x, out, grad = kept.pop(mb)
        with ctx.backward_weight(mb):
            torch.autograd.backward(out, grad, inputs=list(ctx.stage.parameters()))

    warmup = min(last - r, m)
    for mb in range(warmup):
        forward(mb)
    for i in range(m):
        if warmup + i < m:
            forward(warmup + i)
        backward_input(i)
        if i - r >= 0:
            backward_weight(i - r)
    for mb in range(max(m - r, 0), m):
        backward_weight(mb)
"""
)

zb_h1 = edit("zb_h1_program", text=ZB_H1)
w_with_i = edit(  # I runs the whole backward; W has nothing left to do
    "w_with_i",
    (
        "(gx,) = torch.autograd.grad(out, x, grad, retain_graph=True)",
        "torch.autograd.backward(out, grad)\n                gx = x.grad",
    ),
    (
        "            if r > 0:\n                torch.autograd.backward(out, grad)",
        "            torch.autograd.backward(out, grad)\n            if r > 0:",
    ),
    (
        "            torch.autograd.backward(out, grad, inputs=list(ctx.stage.parameters()))",
        "            pass",
    ),
    text=ZB_H1,
)
w_first = edit(  # each W put before its own I: the gradient it needs is fetched by W
    "w_first",
    (
        "        backward_input(i)\n        if i - r >= 0:\n            backward_weight(i - r)\n",
        "        kept[i] = (*kept[i], None if r == last else ctx.recv(r + 1, tag=('grad', i)))\n"
        "        backward_weight(i)\n",
    ),
    ("    for mb in range(max(m - r, 0), m):\n        backward_weight(mb)\n", ""),
    ("        x, out, grad = kept.pop(mb)\n", "        x, out, grad = kept[mb]\n"),
    text=ZB_H1,
)
no_retain = edit(  # I lets the graph go: its W has nothing to go back through
    "no_retain", ("(out, x, grad, retain_graph=True)", "(out, x, grad)"), text=ZB_H1
)
w_right_after = edit(  # each W right after its I: 1F1B with the backward cut in two
    "w_right_after",
    (
        "        if i - r >= 0:\n            backward_weight(i - r)\n",
        "        backward_weight(i)\n",
    ),
    ("    for mb in range(max(m - r, 0), m):\n        backward_weight(mb)\n", ""),
    text=ZB_H1,
)
w_at_the_end = edit(  # every W left to the end of the step
    "w_at_the_end",
    ("        if i - r >= 0:\n            backward_weight(i - r)\n", ""),
    ("range(max(m - r, 0), m)", "range(m)"),
    text=ZB_H1,
)
whole_backward = edit(  # the 1F1B program's whole backward kept, marked B
    "whole_backward",
    (
        "        with ctx.backward_input(mb):\n            if r > 0:\n"
        "                (gx,) = torch.autograd.grad(out, x, grad, retain_graph=True)\n",
        "        with ctx.backward(mb):\n            torch.autograd.backward(out, grad)\n"
        "            gx = x.grad\n",
    ),
    (
        "        with ctx.backward_weight(mb):\n"
        "            torch.autograd.backward(out, grad, inputs=list(ctx.stage.parameters()))\n",
        "        pass\n",
    ),
    text=ZB_H1,
)

waits_first_zb = edit("waits_first_zb", WAITS_FIRST, text=ZB_H1)  # waits before it sends
mixed_zb = edit(  # rank 0 runs its warm-up forwards last first
    "mixed_zb",
    (
        "    for mb in range(warmup):\n",
        "    for mb in reversed(range(warmup)) if r == 0 else range(warmup):\n",
    ),
    text=ZB_H1,
)

MISTAKES_44 = {
    w_with_i: "computed W with it",
    w_first: "before its I",
    no_retain: "retain_graph=True",
    w_right_after: "1F1B with its backward cut in two",
}
OTHERS_44 = {
    w_at_the_end: "a W put off longer than the gaps it fills",
    whole_backward: "a whole backward",
}

ACCUMULATE = """\
def accumulate_program(ctx):
    r, last, m = ctx.rank, ctx.world - 1, ctx.microbatches
    for mb in range(m):
        if r == 0:
            x = ctx.inputs[mb]
        else:
            x = ctx.recv(r - 1, tag=("act", mb)).requires_grad_()
        with ctx.forward(mb):
            out = ctx.stage(x)
            if r == last:
                out = ctx.mean_loss(out, mb) / m
        if r < last:
            ctx.send(out, to=r + 1, tag=("act", mb))
        grad = None if r == last else ctx.recv(r + 1, tag=("grad", mb))
        with ctx.backward(mb):
            torch.autograd.backward(out, grad)
        if r > 0:
            ctx.send(x.grad, to=r - 1, tag=("grad", mb))
"""
SCALED = "out = ctx.mean_loss(out, mb) / m"

accumulate = edit("accumulate_program", text=ACCUMULATE)
unscaled = edit("unscaled", (SCALED, "out = ctx.mean_loss(out, mb)"), text=ACCUMULATE)
by_ranks = edit("by_ranks", (SCALED, "out = ctx.mean_loss(out, mb) / ctx.world"), text=ACCUMULATE)
cleared_each = edit(  # the gradients cleared before every micro-batch
    "cleared_each",
    ("    for mb in range(m):\n", "    for mb in range(m):\n        ctx.stage.zero_grad()\n"),
    text=ACCUMULATE,
)
by_rows = edit(  # divided by the rows of a micro-batch: the mean already did that
    "by_rows", (SCALED, "out = ctx.mean_loss(out, mb) / len(ctx.inputs[mb])"), text=ACCUMULATE
)
old_loss = edit("old_loss", (SCALED, "out = ctx.loss(out, mb)"), text=ACCUMULATE)

MISTAKES_26 = {
    unscaled: "means added up",
    by_ranks: "divided by the number of ranks",
    cleared_each: "cleared between micro-batches",
}
OTHERS_26 = {
    by_rows: "Write the mean over all",
    old_loss: "the loss is yours to scale",
}
