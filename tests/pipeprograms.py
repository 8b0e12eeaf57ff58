"""Pipeline schedules as per-rank programs, for the tests of Exercises 2.8, 4.7 and 5.7: the
solutions, and each with the mistakes learners make written into it (`rankprograms.edit`).

`MISTAKES_K` maps each exercise's commonest wrong programs to words their hint must say (and
no other's); `OTHERS_K` are further wrong programs with the words of their hints.
"""

from __future__ import annotations

from rankprograms import edit

GPIPE = """\
def gpipe_program(ctx):
    r, last, m = ctx.rank, ctx.world - 1, ctx.microbatches
    kept = {}

    def forward(mb):
        if r == 0:
            x = ctx.inputs[mb]
        else:
            x = ctx.recv(r - 1, tag=("act", mb)).requires_grad_()
        with ctx.forward(mb):
            out = ctx.stage(x)
            if r == last:
                out = ctx.loss(out, mb)
        if r < last:
            ctx.send(out, to=r + 1, tag=("act", mb))
        kept[mb] = (x, out)

    def backward(mb):
        x, out = kept.pop(mb)
        grad = None if r == last else ctx.recv(r + 1, tag=("grad", mb))
        with ctx.backward(mb):
            torch.autograd.backward(out, grad)
        if r > 0:
            ctx.send(x.grad, to=r - 1, tag=("grad", mb))

    for mb in range(m):
        forward(mb)
    for mb in range(m):
        backward(mb)
"""
BACKWARDS = "    for mb in range(m):\n        backward(mb)\n"

gpipe = edit("gpipe", text=GPIPE)
lifo = edit(  # every rank runs its backwards last in, first out: a valid GPipe too
    "lifo", (BACKWARDS, BACKWARDS.replace("range(m)", "reversed(range(m))")), text=GPIPE
)
no_loss = edit(  # the last stage hands its output to the backward as it is
    "no_loss",
    ("            if r == last:\n                out = ctx.loss(out, mb)\n", ""),
    text=GPIPE,
)
grad_forward = edit(  # the gradient goes on to the next rank instead of back
    "grad_forward", ("ctx.send(x.grad, to=r - 1", "ctx.send(x.grad, to=r + 1"), text=GPIPE
)
no_leaf = edit("no_leaf", ('tag=("act", mb)).requires_grad_()', 'tag=("act", mb))'), text=GPIPE)
# each rank waits for its gradient before it sends the activation on (a deadlock)
WAITS_FIRST = (
    "        if r < last:\n",
    '        if r < last:\n            ctx.recv(r + 1, tag=("grad", mb))\n',
)
waits_first = edit("waits_first", WAITS_FIRST, text=GPIPE)
mixed_order = edit(  # the ranks before the last take the gradients back last in, first out
    "mixed_order",
    (BACKWARDS, BACKWARDS.replace("range(m)", "reversed(range(m)) if r < last else range(m)")),
    text=GPIPE,
)
mixed_untagged = edit(  # the same, without tags: nothing catches the mix-up
    "mixed_untagged", (', tag=("grad", mb)', ""), text=mixed_order.source
)
unmarked = edit("unmarked", ("with ctx.backward(mb):", "if True:"), text=GPIPE)
doubled = edit("doubled", ("out = ctx.loss(out, mb)", "out = 2 * ctx.loss(out, mb)"), text=GPIPE)
SEND = 'ctx.send(out, to=r + 1, tag=("act", mb))'
sent_twice = edit(  # each activation goes over twice; the next rank takes both
    "sent_twice",
    (SEND, f"{SEND}\n            {SEND}"),
    (
        "            x = ctx.recv(",
        '            ctx.recv(r - 1, tag=("act", mb))\n            x = ctx.recv(',
    ),
    text=GPIPE,
)

MISTAKES_8 = {
    no_loss: "The last stage forgot the loss",
    grad_forward: "A gradient sent to the wrong neighbour",
    no_leaf: "requires_grad_()",
}
OTHERS_8 = {
    waits_first: "Follow micro-batch 0 through your program",
    mixed_order: "Micro-batches received in the wrong order",
    mixed_untagged: "must go through the output of its own",
    unmarked: "marked no backward",
    doubled: "the last stage's gradients",
    sent_twice: "sends each micro-batch's activation on once",
}

ORDER_1F1B = """\
    warmup = min(last - r, m)
    for mb in range(warmup):
        forward(mb)
    for i in range(m - warmup):
        forward(warmup + i)
        backward(i)
    for mb in range(m - warmup, m):
        backward(mb)
"""
ONE_F_ONE_B = GPIPE.replace("def gpipe_program", "def one_f_one_b_program").replace(
    "    for mb in range(m):\n        forward(mb)\n" + BACKWARDS, ORDER_1F1B
)

one_f_one_b = edit("one_f_one_b", text=ONE_F_ONE_B)
gpipe_shaped = edit(  # all forwards, then all backwards
    "gpipe_shaped", ("    warmup = min(last - r, m)\n", "    warmup = m\n"), text=ONE_F_ONE_B
)
warmup_reversed = edit(  # rank r warms up with r forwards: counted from the wrong end
    "warmup_reversed", ("warmup = min(last - r, m)", "warmup = min(r, m)"), text=ONE_F_ONE_B
)
newest_first = edit(  # the steady state takes the newest micro-batch back, not the oldest
    "newest_first",
    ("        backward(i)\n", "        backward(max(kept))\n"),
    (
        "    for mb in range(m - warmup, m):\n        backward(mb)\n",
        "    while kept:\n        backward(max(kept))\n",
    ),
    text=ONE_F_ONE_B,
)
kept_after = edit(  # the graph (and what it saved) kept alive after each backward
    "kept_after",
    ("        x, out = kept.pop(mb)\n", "        x, out = kept[mb]\n"),
    ("torch.autograd.backward(out, grad)", "torch.autograd.backward(out, grad, retain_graph=True)"),
    text=ONE_F_ONE_B,
)
warmup_long = edit(  # one warm-up forward too many
    "warmup_long", ("warmup = min(last - r, m)", "warmup = min(last - r + 1, m)"), text=ONE_F_ONE_B
)

MISTAKES_7 = {
    gpipe_shaped: "as GPipe does",
    warmup_reversed: "warm-up",
    newest_first: "Micro-batches received in the wrong order",
    kept_after: "activations kept after their backward",
}
warmup_short = edit(  # one warm-up forward too few: no deadlock, but a longer step
    "warmup_short",
    ("warmup = min(last - r, m)", "warmup = max(0, min(last - r, m) - 1)"),
    text=ONE_F_ONE_B,
)

OTHERS_7 = {
    warmup_long: "forwards before its first backward",
    warmup_short: "Each rank warms up with as many forwards",
}

INTERLEAVED = """\
def interleaved_program(ctx):
    p, last = ctx.world, len(ctx.stages) * ctx.world - 1
    order = make_schedule("interleaved", p, ctx.microbatches, chunks=len(ctx.stages))
    kept = {}
    for action in order.devices[ctx.rank]:
        s, mb = action.stage, action.microbatch
        chunk = ctx.stage_ids.index(s)
        if action.kind == "F":
            if s == 0:
                x = ctx.inputs[mb]
            else:
                x = ctx.recv((s - 1) % p, tag=("act", s, mb)).requires_grad_()
            with ctx.forward(mb, chunk):
                out = ctx.stages[chunk](x)
                if s == last:
                    out = ctx.loss(out, mb)
            if s < last:
                ctx.send(out, to=(s + 1) % p, tag=("act", s + 1, mb))
            kept[s, mb] = (x, out)
        else:
            x, out = kept.pop((s, mb))
            grad = None if s == last else ctx.recv((s + 1) % p, tag=("grad", s, mb))
            with ctx.backward(mb, chunk):
                torch.autograd.backward(out, grad)
            if s > 0:
                ctx.send(x.grad, to=(s - 1) % p, tag=("grad", s - 1, mb))
"""

interleaved = edit("interleaved", text=INTERLEAVED)
next_rank = edit(  # r + 1 and r - 1, as with one stage per rank
    "next_rank",
    ("ctx.send(out, to=(s + 1) % p", "ctx.send(out, to=ctx.rank + 1"),
    ("ctx.recv((s - 1) % p", "ctx.recv(ctx.rank - 1"),
    ("ctx.recv((s + 1) % p", "ctx.recv(ctx.rank + 1"),
    ("ctx.send(x.grad, to=(s - 1) % p", "ctx.send(x.grad, to=ctx.rank - 1"),
    text=INTERLEAVED,
)
stage_as_chunk = edit(  # the stage's number where its chunk is meant
    "stage_as_chunk",
    ("        chunk = ctx.stage_ids.index(s)\n", "        chunk = s\n"),
    text=INTERLEAVED,
)
untold = edit(  # one tag per micro-batch: activations and gradients look alike
    "untold",
    ('tag=("act", s, mb)', "tag=mb"),
    ('tag=("act", s + 1, mb)', "tag=mb"),
    ('tag=("grad", s, mb)', "tag=mb"),
    ('tag=("grad", s - 1, mb)', "tag=mb"),
    text=INTERLEAVED,
)
breadth_first = edit(  # all micro-batches through a chunk before the next: GPipe's memory
    "breadth_first",
    ('make_schedule("interleaved"', 'make_schedule("breadth-first"'),
    text=INTERLEAVED,
)

MISTAKES_57 = {
    next_rank: "looping placement",
    stage_as_chunk: "not its number",
    untold: "tell",
}
misnamed = edit(  # the sender names the activation by its own stage, the receiver by its
    "misnamed", ('tag=("act", s + 1, mb)', 'tag=("act", s, mb)'), text=INTERLEAVED
)
stage_by_stage = edit(  # each stage's forwards and backwards before the next stage's
    "stage_by_stage",
    (
        "for action in order.devices[ctx.rank]:",
        "for action in sorted(order.devices[ctx.rank], key=lambda a: a.stage):",
    ),
    text=INTERLEAVED,
)

waits_for_gradient = edit(  # a chunk waits for its gradient before it hands its output on
    "waits_for_gradient",
    (
        "            if s < last:\n                ctx.send(",
        "            if s < last:\n"
        '                ctx.recv((s + 1) % p, tag=("grad", s, mb))\n                ctx.send(',
    ),
    text=INTERLEAVED,
)

OTHERS_57 = {
    breadth_first: "as GPipe does",
    misnamed: "name each message alike on both sides",
    stage_by_stage: "in the schedule's order",
    waits_for_gradient: "receiving what each needs just before it",
}


def reordered(check, k: int, answer: str, program):
    """Exercise k's answer as the grader gets it (a `Replay` of the evidence the kernel sent),
    from `program`'s runs with rank 0's first two actions swapped in each record: a record
    whose order is not the one its ranks could have run (what only a forged record shows)."""
    from checkskit import Later

    from course_utils.checks.wire import Replay, encode

    def make():
        cases = getattr(check, f"cases_{k}")()[answer]
        outcomes = []
        for (case,) in cases:
            record = case.__course_call__(program)
            first, second, *rest = record["actions"][0]
            record["actions"][0] = [second, first, *rest]
            outcomes.append({"result": encode(record)})
        return [Replay(answer, cases, outcomes)]

    return Later(make)
