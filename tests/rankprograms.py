"""Per-rank programs for the tests: lesson 01's naive program, and the mistakes learners make.

Each wrong program is the right one, `NAIVE`, with one mistake written into it (`edit`), so
that it reads as a learner's whole answer; `source(fn)` is its text, for a notebook cell of
a graded submission. `MISTAKES` maps the issue's four mistakes to words of their hints.
"""

from __future__ import annotations

import buildprograms

NAIVE = """\
def naive_program(ctx):
    if ctx.rank == 0:
        with ctx.forward(0):
            out = ctx.stage(ctx.inputs[0])
        ctx.send(out, to=1)
        grad = ctx.recv(1)
        with ctx.backward(0):
            torch.autograd.backward(out, grad)
    else:
        x = ctx.recv(0).requires_grad_()
        with ctx.forward(0):
            loss = ctx.loss(ctx.stage(x), 0)
        with ctx.backward(0):
            loss.backward()
        ctx.send(x.grad, to=0)
"""


def edit(name: str, *changes: tuple[str, str], text: str = NAIVE):
    """The program `text` (the naive one unless given) with each (old, new) text replaced,
    as a function called `name` (its own name in the text is the answer's)."""
    return buildprograms.edit(text, name, *changes)


def source(fn) -> str:
    """The program as a notebook's answer cell holds it (a function named as the answer)."""
    return fn.source


RANK_1_LEAF = "x = ctx.recv(0).requires_grad_()"
RESUME = "torch.autograd.backward(out, grad)"

naive = edit("naive")
forgot_requires_grad = edit("forgot_requires_grad", (RANK_1_LEAF, "x = ctx.recv(0)"))
own_output = edit("own_output", (RESUME, "out.sum().backward()"))
recvs_swapped = edit(  # rank 0 waits for the gradient before it sends the activation
    "recvs_swapped",
    (
        "ctx.send(out, to=1)\n        grad = ctx.recv(1)",
        "grad = ctx.recv(1)\n        ctx.send(out, to=1)",
    ),
)
sent_detached = edit(  # rank 0 keeps (and sends) a detached activation: no graph to resume
    "sent_detached", ("out = ctx.stage(ctx.inputs[0])", "out = ctx.stage(ctx.inputs[0]).detach()")
)
output_backward = edit("output_backward", (RESUME, "out.backward()"))
no_backward_on_rank_0 = edit("no_backward_on_rank_0", (RESUME, "pass"))
zeros_back = edit(  # rank 1 sends zeros where x.grad was None
    "zeros_back",
    (RANK_1_LEAF, "x = ctx.recv(0)"),
    ("ctx.send(x.grad, to=0)", "ctx.send(torch.zeros_like(x) if x.grad is None else x.grad, to=0)"),
)
doubled_loss = edit("doubled_loss", ("loss = ctx.loss(", "loss = 2 * ctx.loss("))
unmarked = edit(  # right, but no action marked: the harness sees none
    "unmarked", ("with ctx.forward(0):", "if True:"), ("with ctx.backward(0):", "if True:")
)
sent_twice = edit(  # the activation goes over twice; rank 1 takes both
    "sent_twice",
    ("ctx.send(out, to=1)", "ctx.send(out, to=1)\n        ctx.send(out, to=1)"),
    (RANK_1_LEAF, f"ctx.recv(0)\n        {RANK_1_LEAF}"),
)


def to_itself(ctx):
    ctx.send(ctx.inputs[0], to=ctx.rank)


def forever(ctx):  # rank 1 loops in pure Python and never looks at anything
    if ctx.rank == 1:
        n = 0
        while True:
            n += 1
    ctx.recv(1)


def stub(ctx):
    raise NotImplementedError()


MISTAKES = {  # the four, each with the words its hint must say
    forgot_requires_grad: "requires_grad_()",
    own_output: "not from its own output",
    recvs_swapped: "rank 0 must send its activation before it waits for the gradient",
    sent_detached: "it was detached",
}
