"""Programs for Exercise 11.2 (ZB-V on the course's devices): the right one and the commonest
wrong ones, each a `program(ctx)` every rank runs (tests/test_zbv_build.py)."""

from __future__ import annotations

import torch

from course_utils.pipeline import make_schedule


def make(order=None, whole=False, w_in_i=False, turn_message=False, stash=True):
    """A ZB-V program. `order(p, m, rank)` gives a rank's actions (default: the course's
    ZB-V); `whole` runs each backward whole (B); `w_in_i` computes the weights' gradients
    inside I; `turn_message` sends the turn between stages p-1 and p as a message; without
    `stash` each receive takes the next message whatever it is."""

    def program(ctx):
        p, m, last = ctx.world, ctx.microbatches, 2 * ctx.world - 1

        def owner(s):  # the V: stage s on rank s going down, on rank 2p-1-s coming back up
            return s if s < p else last - s

        def local(s):
            return owner(s) == ctx.rank and not turn_message

        kept, turn, early = {}, {}, {}
        rows = [
            order(p, m, r) if order else make_schedule("zb-v", p, m).devices[r] for r in range(p)
        ]
        steps = rows[ctx.rank]

        def sent(a):  # (to, tag) of what action a sends, if it sends anything
            s = a.stage
            if a.kind == "F" and s < last and not local_to(owner(s), s + 1):
                return owner(s + 1), ("act", s + 1, a.microbatch)
            if a.kind == "I" and s > 0 and not local_to(owner(s), s - 1):
                return owner(s - 1), ("grad", s - 1, a.microbatch)
            return None

        def local_to(rank, s):
            return owner(s) == rank and not turn_message

        # a link delivers in the order sent: the tags each neighbour sends me, in its order
        coming = {
            q: [t for a in rows[q] if (x := sent(a)) and x[0] == ctx.rank for t in [x[1]]]
            for q in range(p)
        }

        def receive(frm, tag):  # what comes before `tag` on the link waits in `early`
            if not stash:
                return ctx.recv(frm, tag=tag)
            while tag not in early:
                nxt = coming[frm].pop(0)
                early[nxt] = ctx.recv(frm, tag=nxt)
            return early.pop(tag)

        for a in steps:
            s, mb = a.stage, a.microbatch
            chunk = ctx.stage_ids.index(s)
            if a.kind == "F":
                if s == 0:
                    x = ctx.inputs[mb]
                elif local(s - 1):
                    x = turn.pop(("act", mb)).detach().requires_grad_()
                else:
                    x = receive(owner(s - 1), ("act", s, mb)).requires_grad_()
                with ctx.forward(mb, chunk):
                    out = ctx.stages[chunk](x)
                    if s == last:
                        out = ctx.loss(out, mb)
                if s < last and local(s + 1):
                    turn[("act", mb)] = out
                elif s < last:
                    ctx.send(out, to=owner(s + 1), tag=("act", s + 1, mb))
                kept[s, mb] = (x, out)
            elif a.kind == "I":
                x, out = kept[s, mb]
                if s == last:
                    grad = None
                elif local(s + 1):
                    grad = turn.pop(("grad", mb))
                else:
                    grad = receive(owner(s + 1), ("grad", s, mb))
                if whole:
                    with ctx.backward(mb, chunk):
                        torch.autograd.backward(out, grad)
                    gx = x.grad if s > 0 else None
                else:
                    with ctx.backward_input(mb, chunk):
                        if w_in_i:
                            torch.autograd.backward(out, grad)
                            gx = x.grad if s > 0 else None
                        elif s > 0:
                            (gx,) = torch.autograd.grad(out, x, grad, retain_graph=True)
                kept[s, mb] = (x, out, grad)
                if s > 0 and local(s - 1):
                    turn[("grad", mb)] = gx
                elif s > 0:
                    ctx.send(gx, to=owner(s - 1), tag=("grad", s - 1, mb))
            elif a.kind == "W" and not whole:
                x, out, *rest = kept.pop((s, mb))
                grad = rest[0] if rest else None
                with ctx.backward_weight(mb, chunk):
                    if not w_in_i:
                        params = list(ctx.stages[chunk].parameters())
                        torch.autograd.backward(out, grad, inputs=params)

    return program


def _zbv(p, m, rank):
    return list(make_schedule("zb-v", p, m).devices[rank])


def eager_w(p, m, rank):
    """ZB-V with every W straight after its I."""
    rows = [a for a in _zbv(p, m, rank) if a.kind != "W"]
    out = []
    for a in rows:
        out.append(a)
        if a.kind == "I":
            out.append(type(a)(a.stage, "W", a.microbatch))
    return out


def w_at_end(p, m, rank):
    """ZB-V with every W left to the end of the step."""
    acts = _zbv(p, m, rank)
    return [a for a in acts if a.kind != "W"] + [a for a in acts if a.kind == "W"]


def w_first(p, m, rank):
    """ZB-V with rank 0's first W moved before its own I."""
    acts = _zbv(p, m, rank)
    if rank:
        return acts
    i = next(k for k, a in enumerate(acts) if a.kind == "I")
    w = next(k for k, a in enumerate(acts) if a.kind == "W")
    acts[i], acts[w] = acts[w], acts[i]
    return acts


RIGHT = make()
WHOLE = make(whole=True)
W_IN_I = make(w_in_i=True)
TURN_MESSAGE = make(turn_message=True)
EAGER_W = make(order=eager_w)
W_AT_END = make(order=w_at_end)
W_FIRST = make(order=w_first)
NO_STASH = make(stash=False)
