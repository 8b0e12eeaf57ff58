"""What one device computes for the trials of lessons 06 and 07's per-rank Builds, and what the
known wrong programs compute: the grader's alone (a graded kernel gets `rank_cases`, the
trials, but not this), so that a check can name the mistake it sees."""

from __future__ import annotations

from course_utils.checks.rank_cases import DDPCase, TPCase


def ring_result(data: list, rank: int, gather_from: int = 1, add_in_gather: bool = False):
    """What rank `rank` holds after a ring all-reduce of `data` (every rank's tensor) in which
    rank r first sends its chunk r, then passes on what it has just added into; the
    all-gather starts from chunk r + `gather_from` (1 is right: the one that is complete) and
    adds (`add_in_gather`, a mistake) or copies what arrives."""
    from course_utils.threads.collectives import chunk_bounds

    n = len(data)
    bufs = [t.clone() for t in data]
    bounds = chunk_bounds(len(bufs[0]), n)
    for phase, start in (("reduce-scatter", 0), ("all-gather", gather_from)):
        add = phase == "reduce-scatter" or add_in_gather
        for step in range(n - 1):
            chunks = [(r + start - step) % n for r in range(n)]
            sent = [bufs[r][slice(*bounds[chunks[r]])].clone() for r in range(n)]
            for r in range(n):
                a, b = bounds[chunks[(r - 1) % n]]
                bufs[r][a:b] = bufs[r][a:b] + sent[(r - 1) % n] if add else sent[(r - 1) % n]
    return bufs[rank]


def ddp_reference(case: DDPCase) -> dict:
    """One worker on the whole batch: its gradients and its weights after the SGD step;
    and `early`, the gradients all ranks would agree on had the last micro-batch's
    contribution been left out (a bucket sent before its gradients were ready)."""
    import torch

    from course_utils.models import loss_fn
    from course_utils.parallel.rank_programs import LR

    model, x, y = case.build()
    loss_fn(model(x), y).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    early = {n: torch.zeros_like(g) for n, g in grads.items()}
    m, n_ranks = case.microbatches, case.devices
    for xs, ys in zip(x.chunk(n_ranks), y.chunk(n_ranks), strict=True):
        for xb, yb in list(zip(xs.chunk(m), ys.chunk(m), strict=True))[:-1]:
            model.zero_grad()
            (loss_fn(model(xb), yb) / m / n_ranks).backward()
            for name, p in model.named_parameters():
                early[name] += p.grad
    weights = {n: p.detach() - LR * grads[n] for n, p in model.named_parameters()}
    return {"grads": grads, "weights": weights, "early": early}


def tp_reference(case: TPCase) -> dict:
    """The unsplit MLP's output, input gradient and each rank's share of the weight
    gradients ("r.w1", ...); and the outputs of the known wrong programs, per rank:
    `swapped` (f all-reduces forward, g does not), `bias` (b2 added on every rank before
    the sum), `mean` (g averages)."""
    import torch
    import torch.nn.functional as F

    from course_utils.threads.collectives import chunk_bounds

    linear1, linear2, x, dy = case.build()
    x = x.clone().requires_grad_()
    y = linear2(F.gelu(linear1(x)))
    y.backward(dy)
    n, b2 = case.devices, linear2.bias.detach()
    grads, swapped = {}, []
    with torch.no_grad():
        for r, (lo, hi) in enumerate(chunk_bounds(case.hidden, n)):
            grads[f"{r}.w1"] = linear1.weight.grad[lo:hi]
            grads[f"{r}.b1"] = linear1.bias.grad[lo:hi]
            grads[f"{r}.w2"] = linear2.weight.grad[:, lo:hi]
            grads[f"{r}.b2"] = linear2.bias.grad
            h = F.gelu(F.linear(n * x, linear1.weight[lo:hi], linear1.bias[lo:hi]))
            swapped.append(F.linear(h, linear2.weight[:, lo:hi]) + b2)
        out = y.detach()
    return {
        "output": out,
        "input_grad": x.grad.detach(),
        "grads": grads,
        "swapped": swapped,
        "bias": out + (n - 1) * b2,
        "mean": (out - b2) / n + b2,
    }
