"""The per-rank Builds of lessons 06 and 07 as learners write them: the right programs, and
each with the mistakes learners make written into it.

A program is the text of a whole answer cell (`RING`, `DDP`, `TP`); `edit(text, name,
(old, new), ...)` makes a wrong one from a right one, `load(text, name)` runs the text as a
cell would and gives the answer's function, whose `.source` is the text (for a notebook of a
graded submission). `MISTAKES` maps each Build's three commonest wrong programs to words of
the hint each must get, and no other.
"""

from __future__ import annotations

import contextlib
import linecache

import torch
import torch.nn.functional as F

from course_utils.threads.collectives import chunk_bounds

RING = """\
def ring_all_reduce(ctx, data):
    n, rank = ctx.world, ctx.rank
    bounds = chunk_bounds(len(data), n)
    right, left = (rank + 1) % n, (rank - 1) % n
    chunk = rank  # reduce-scatter, step 0: every rank sends its own-numbered chunk
    for _ in range(n - 1):  # reduce-scatter
        a, b = bounds[chunk]
        ctx.send(data[a:b], to=right)
        chunk = (chunk - 1) % n  # what arrives: the left neighbour's chunk, one lower
        a, b = bounds[chunk]
        data[a:b] += ctx.recv(left)
    # chunk is the one just completed here: the all-gather passes it on first
    for _ in range(n - 1):  # all-gather
        a, b = bounds[chunk]
        ctx.send(data[a:b], to=right)
        chunk = (chunk - 1) % n
        a, b = bounds[chunk]
        data[a:b] = ctx.recv(left)
    return data
"""

DDP = """\
class BucketedDDP:
    def __init__(self, ctx, bucket_cap):
        self.ctx = ctx
        self.syncing = True
        self.work = []
        self.buckets, bucket = [], []
        for p in reversed(list(ctx.stage.parameters())):  # ready last layer first
            if bucket and sum(q.numel() for q in bucket) + p.numel() > bucket_cap:
                self.buckets.append(bucket)
                bucket = []
            bucket.append(p)
        self.buckets.append(bucket)
        self.missing = [len(b) for b in self.buckets]
        for i, bucket in enumerate(self.buckets):
            for p in bucket:
                p.register_post_accumulate_grad_hook(lambda p, i=i: self.one_more(i))

    def one_more(self, i):
        if not self.syncing:
            return
        self.missing[i] -= 1
        if self.missing[i] == 0:
            grads = [p.grad for p in self.buckets[i]]
            self.work.append(self.ctx.comm.all_reduce(grads, op="mean", async_op=True))

    @contextlib.contextmanager
    def no_sync(self):
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True

    def finish(self):
        for work in self.work:
            work.wait()
        self.work = []
        self.missing = [len(b) for b in self.buckets]


def ddp_program(ctx, bucket_cap):
    ddp = BucketedDDP(ctx, bucket_cap)
    last = ctx.microbatches - 1
    for mb in range(ctx.microbatches):
        with ddp.no_sync() if mb < last else contextlib.nullcontext():
            with ctx.forward(mb):
                loss = ctx.loss(ctx.stage(ctx.inputs[mb]), mb)
            with ctx.backward(mb):
                loss.backward()
    ddp.finish()
"""

TP = """\
class CopyF(torch.autograd.Function):
    @staticmethod
    def forward(fctx, x, comm):
        fctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(fctx, grad):
        grad = grad.clone()
        fctx.comm.all_reduce(grad)
        return grad, None


class SumG(torch.autograd.Function):
    @staticmethod
    def forward(fctx, partial, comm):
        fctx.comm = comm
        out = partial.clone()
        comm.all_reduce(out)
        return out

    @staticmethod
    def backward(fctx, grad):
        return grad, None


def tp_mlp(ctx, x):
    s = ctx.stage
    h = F.gelu(F.linear(CopyF.apply(x, ctx.comm), s.w1, s.b1))
    return SumG.apply(F.linear(h, s.w2), ctx.comm) + s.b2
"""

ANSWER = {RING: "ring_all_reduce", DDP: "ddp_program", TP: "tp_mlp"}

# Pieces of code the wrong programs put in (a line of the text each).
REDUCE_OUT = "        out = x.clone()\n        comm.all_reduce(out)\n        return out"
REDUCE_GRAD = (
    "        grad = grad.clone()\n        fctx.comm.all_reduce(grad)\n        return grad, None"
)
G_BACKWARD = "    def backward(fctx, grad):\n        return grad, None\n\n\ndef"


def load(text: str, name: str, answer: str):
    """The answer function of the cell `text`, as the notebook defines it."""
    namespace = {
        "torch": torch,
        "F": F,
        "chunk_bounds": chunk_bounds,
        "contextlib": contextlib,
    }
    filename = f"<{name}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    exec(compile(text, filename, "exec"), namespace)
    fn = namespace[answer]
    fn.__name__, fn.source = name, text
    return fn


def edit(right: str, name: str, *changes: tuple[str, str]):
    """The program `right` with each (old, new) text replaced, as a function called `name`."""
    text = right
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    return load(text, name, ANSWER[right])


ring = load(RING, "ring", "ring_all_reduce")
ring_restarts_gather = edit(  # the all-gather starts again from the rank's own chunk
    RING,
    "ring_restarts_gather",
    (
        "    for _ in range(n - 1):  # all-gather",
        "    chunk = rank\n    for _ in range(n - 1):  # all-gather",
    ),
)
ring_adds_twice = edit(
    RING, "ring_adds_twice", ("data[a:b] = ctx.recv(left)", "data[a:b] += ctx.recv(left)")
)
ring_mean = edit(RING, "ring_mean", ("    return data\n", "    return data / n\n"))
RS_STEP = """\
        ctx.send(data[a:b], to=right)
        chunk = (chunk - 1) % n  # what arrives: the left neighbour's chunk, one lower
        a, b = bounds[chunk]
        data[a:b] += ctx.recv(left)"""
ring_receives_first = edit(  # every rank waits for its left neighbour: nobody sends
    RING,
    "ring_receives_first",
    (RS_STEP, RS_STEP.replace("        ctx.send", "        x = ctx.recv(left)\n        ctx.send")),
    ("data[a:b] += ctx.recv(left)", "data[a:b] += x"),
)
ring_whole = edit(  # passes the whole tensor on in every step
    RING,
    "ring_whole",
    (
        RS_STEP,
        RS_STEP.replace("data[a:b], to", "data, to").replace("recv(left)", "recv(left)[a:b]"),
    ),
)
ring_in_turn = edit(  # rank 0 sends first, the others receive before they send: right, slow
    RING,
    "ring_in_turn",
    (
        RS_STEP,
        RS_STEP.replace(
            "        ctx.send(data[a:b], to=right)",
            "        out = data[a:b].clone()\n"
            "        x = ctx.recv(left) if rank else None\n"
            "        ctx.send(out, to=right)\n"
            "        x = ctx.recv(left) if x is None else x",
        ).replace("+= ctx.recv(left)", "+= x"),
    ),
)
ring_wrong_direction = edit(  # passes on the chunk one higher: not the one it added into
    RING,
    "ring_wrong_direction",
    ("        chunk = (chunk - 1) % n  # what", "        chunk = (chunk + 1) % n  # what"),
)
ring_no_gather = edit(  # stops after the reduce-scatter
    RING,
    "ring_no_gather",
    (
        "    for _ in range(n - 1):  # all-gather",
        "    return data\n    for _ in range(n - 1):  # all-gather",
    ),
)
ring_other_start = edit(  # a ring that starts from the next chunk: right sums, other bytes
    RING, "ring_other_start", ("    chunk = rank  # reduce", "    chunk = (rank + 1) % n  # reduce")
)
ring_library = load(  # the library's all-reduce
    "def ring_all_reduce(ctx, data):\n    ctx.comm.all_reduce(data)\n    return data\n",
    "ring_library",
    "ring_all_reduce",
)
ring_returns_nothing = edit(
    RING, "ring_returns_nothing", ("    return data\n", "    return None\n")
)

ddp = load(DDP, "ddp", "ddp_program")
NO_SYNC = "with ddp.no_sync() if mb < last else contextlib.nullcontext():"
ddp_every_microbatch = edit(  # no no_sync: all-reduces in every micro-batch's backward
    DDP, "ddp_every_microbatch", (NO_SYNC, "if True:")
)
ddp_sum = edit(DDP, "ddp_sum", ('op="mean", async_op=True', 'op="sum", async_op=True'))
ddp_early = edit(  # sends the bucket when its first gradient is ready
    DDP,
    "ddp_early",
    ("        if self.missing[i] == 0:", "        if self.missing[i] == len(self.buckets[i]) - 1:"),
)
ddp_twice = edit(  # all-reduces every bucket again after the backward
    DDP,
    "ddp_twice",
    (
        "        for work in self.work:\n            work.wait()\n",
        "        for work in self.work:\n            work.wait()\n"
        "        for bucket in self.buckets:\n"
        '            self.ctx.comm.all_reduce([p.grad for p in bucket], op="mean")\n',
    ),
)
ddp_blocking = edit(  # a blocking all-reduce in the hook: the backward waits for it
    DDP,
    "ddp_blocking",
    (
        'self.work.append(self.ctx.comm.all_reduce(grads, op="mean", async_op=True))',
        'self.ctx.comm.all_reduce(grads, op="mean")',
    ),
)
ddp_no_wait = edit(DDP, "ddp_no_wait", ("            work.wait()\n", "            pass\n"))
ddp_after_backward = edit(  # issues every bucket after the backward: nothing overlaps
    DDP,
    "ddp_after_backward",
    ("        if self.missing[i] == 0:\n            grads", "        if False:\n            grads"),
    (
        "    def finish(self):\n",
        "    def finish(self):\n        for bucket in self.buckets:\n"
        "            grads = [p.grad for p in bucket]\n"
        '            self.work.append(self.ctx.comm.all_reduce(grads, op="mean", async_op=True))\n',
    ),
)
ddp_per_parameter = edit(DDP, "ddp_per_parameter", ("> bucket_cap", "> 0"))
ddp_early_everywhere = edit(  # sends early, and in every micro-batch: a gradient still None
    DDP,
    "ddp_early_everywhere",
    ("        if self.missing[i] == 0:", "        if self.missing[i] == len(self.buckets[i]) - 1:"),
    (NO_SYNC, "if True:"),
)
ddp_one_rank = edit(  # only rank 0 all-reduces: its peer never joins
    DDP,
    "ddp_one_rank",
    ("        if self.missing[i] == 0:", "        if self.missing[i] == 0 and self.ctx.rank == 0:"),
)
ddp_mean_twice = edit(  # divides the loss by the ranks too, then averages
    DDP,
    "ddp_mean_twice",
    (
        "loss = ctx.loss(ctx.stage(ctx.inputs[mb]), mb)",
        "loss = ctx.loss(ctx.stage(ctx.inputs[mb]), mb) / ctx.world",
    ),
)
ddp_scaled = edit(DDP, "ddp_scaled", ("loss = ctx.loss(", "loss = 3 * ctx.loss("))

tp = load(TP, "tp", "tp_mlp")
tp_swapped = edit(  # the all-reduce in f's forward instead of g's
    TP,
    "tp_swapped",
    (
        "        fctx.comm = comm\n        return x.view_as(x)",
        "        fctx.comm = comm\n" + REDUCE_OUT,
    ),
    (
        REDUCE_GRAD,
        "        return grad, None",
    ),
    (
        "        out = partial.clone()\n        comm.all_reduce(out)\n        return out",
        "        return partial.view_as(partial)",
    ),
    (
        "    def backward(fctx, grad):\n        return grad, None\n\n\ndef",
        G_BACKWARD.replace("        return grad, None", REDUCE_GRAD),
    ),
)
tp_bias_each_rank = edit(  # b2 added on every rank before the sum
    TP,
    "tp_bias_each_rank",
    (
        "SumG.apply(F.linear(h, s.w2), ctx.comm) + s.b2",
        "SumG.apply(F.linear(h, s.w2) + s.b2, ctx.comm)",
    ),
)
tp_reduces_twice = edit(  # g's backward all-reduces the gradient again
    TP,
    "tp_reduces_twice",
    (
        "    def backward(fctx, grad):\n        return grad, None\n\n\ndef",
        G_BACKWARD.replace("        return grad, None", REDUCE_GRAD),
    ),
)
tp_no_f = edit(
    TP, "tp_no_f", ("F.linear(CopyF.apply(x, ctx.comm), s.w1, s.b1)", "F.linear(x, s.w1, s.b1)")
)
tp_skips_on_rank1 = edit(  # rank 1 takes a shortcut: rank 0 waits for it in g
    TP,
    "tp_skips_on_rank1",
    (
        "    s = ctx.stage\n",
        "    s = ctx.stage\n    if ctx.rank == 1:\n        return x * 0 + s.b2\n",
    ),
)
tp_f_forward_too = edit(  # f all-reduces in its forward as well as its backward
    TP,
    "tp_f_forward_too",
    (
        "        fctx.comm = comm\n        return x.view_as(x)",
        "        fctx.comm = comm\n" + REDUCE_OUT,
    ),
)
tp_relu = edit(TP, "tp_relu", ("h = F.gelu(", "h = F.relu("))
tp_f_mean = edit(
    TP,
    "tp_f_mean",
    (
        "        fctx.comm.all_reduce(grad)\n        return grad, None\n\n\nclass SumG",
        '        fctx.comm.all_reduce(grad, op="mean")\n        return grad, None\n\n\nclass SumG',
    ),
)
tp_detached_w1 = edit(TP, "tp_detached_w1", ("s.w1, s.b1", "s.w1.detach(), s.b1"))
tp_mean = edit(
    TP, "tp_mean", ("        comm.all_reduce(out)\n", '        comm.all_reduce(out, op="mean")\n')
)

MISTAKES = {  # each Build's three commonest wrong programs, with words their hints must say
    "ring": {
        ring_restarts_gather: "which chunk is complete on each rank",
        ring_adds_twice: "reducing a second time",
        ring_mean: "holds the mean; this exercise asks for the sum",
    },
    "ddp": {
        ddp_every_microbatch: "no_sync",
        ddp_sum: "summed",
        ddp_early: "before all its gradients were ready",
    },
    "tp": {
        tp_swapped: "the all-reduce is in f",
        tp_bias_each_rank: "bias",
        tp_reduces_twice: "reduced twice",
    },
}
