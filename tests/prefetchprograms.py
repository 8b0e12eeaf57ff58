"""Exercise 8.4's programs: FSDP's forward with prefetch depth k, right and the commonest
wrong ones (tests/test_prefetch_build.py, tests/test_checks_l08.py)."""

from __future__ import annotations


def _forward(ctx, ahead, keep=None, twice=False):
    """Prefetch `ahead` layers (ctx.prefetch when None); `keep`: a list that keeps every
    gathered layer; `twice`: gather each layer again instead of waiting for the prefetched."""
    layers = len(ctx.shards)
    works = {j: ctx.comm.all_gather(ctx.shards[j], async_op=True) for j in range(ahead)}
    x = ctx.inputs[ctx.rank]
    for i in range(layers):
        if i + ahead < layers:
            works[i + ahead] = ctx.comm.all_gather(ctx.shards[i + ahead], async_op=True)
        if twice:
            full = ctx.comm.all_gather(ctx.shards[i])
        else:
            full = works.pop(i).wait()
        if keep is not None:
            keep.append(full)
        x = ctx.layer(i, full, x)
        del full
    return x


def right(ctx):
    return _forward(ctx, ctx.prefetch)


def waits_at_once(ctx):
    """Issues each gather ahead, but waits for it on the spot: nothing overlaps."""
    layers, k = len(ctx.shards), ctx.prefetch
    full = {j: ctx.comm.all_gather(ctx.shards[j], async_op=True).wait() for j in range(k)}
    x = ctx.inputs[ctx.rank]
    for i in range(layers):
        if i + k < layers:
            full[i + k] = ctx.comm.all_gather(ctx.shards[i + k], async_op=True).wait()
        x = ctx.layer(i, full.pop(i), x)
    return x


def never_freed(ctx):
    return _forward(ctx, ctx.prefetch, keep=[])


def all_at_once(ctx):
    return _forward(ctx, len(ctx.shards))


def gathers_twice(ctx):
    return _forward(ctx, ctx.prefetch, twice=True)


def one_too_few(ctx):
    return _forward(ctx, max(ctx.prefetch - 1, 0))


def one_too_many(ctx):
    return _forward(ctx, min(ctx.prefetch + 1, len(ctx.shards) - 1))


MISTAKES = {
    waits_at_once: "no overlap",
    never_freed: "let its gathered tensor go",
    all_at_once: "held every layer at once",
    gathers_twice: "rather than gathering it again",
    one_too_few: "had not been issued",
    one_too_many: "not one further ahead",
}
