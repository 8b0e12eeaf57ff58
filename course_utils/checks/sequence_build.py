"""The verdict of Exercise 9.1: Megatron's sequence parallelism, written as the program every
rank runs (Korthikanti et al. 2022, arXiv 2205.05198).

Each case's run (`rank_cases.SequenceCase`, `parallel.sp_program`) comes back as evidence:
every rank's output and input gradient (its tokens only), its shard's gradients, the
collectives it called and the bytes it sent, the activations autograd saved, and what the
harness's hooks saw: the shape of every LayerNorm input and what the column-parallel layer
was given. The verdict is computed here, in the grader, against the unsplit block on one
device: the LayerNorm runs on the rank's tokens only; the first linear gets the whole
sequence, in order; every output and input gradient equals the unsplit block's rows; the
forward's collectives are one all-gather then one reduce-scatter, the backward's their
conjugates, with the bytes of two ring all-gathers and two reduce-scatters, which is what
tensor parallelism's two all-reduces send. The known wrong programs each get their hint: an
all-reduce in place of the reduce-scatter (or in g's backward), the LayerNorm on the whole
sequence after the gather, the sequence gathered out of order or along the features, b2
added before the sum, a backward that keeps a slice instead of summing.
"""

from __future__ import annotations

import itertools

from course_utils import checks
from course_utils.checks import fail, programs
from course_utils.checks.rank_cases import SequenceCase, close

STOPPED = {
    "deadlock": "Every rank calls the same collectives in the same order: in the forward one "
    "all-gather (g) then one reduce-scatter (g-bar); in the backward their conjugates.",
    "": "Rank r gets its own tokens x[lo:hi]: LayerNorm them, all-gather along the sequence "
    "(dim 0), run its columns and rows of the MLP, reduce-scatter along the sequence, add the "
    "residual and b2, and return its tokens of the output.",
}


def reference(case: SequenceCase) -> dict:
    """The unsplit block's output, gradients and LayerNorm output, each rank's share of
    them, and the activations it and tensor parallelism alone save."""
    import copy

    import torch
    import torch.nn.functional as F

    from course_utils.parallel.sp_program import block_on_one_device, sp_shards
    from course_utils.threads.collectives import chunk_bounds
    from course_utils.threads.saved import SavedActivations

    norm, linear1, linear2, x, dy = case.build()
    n, rows = case.devices, chunk_bounds(case.tokens, case.devices)
    norms = [copy.deepcopy(norm) for _ in range(n)]  # one copy per rank: its tokens' share
    b2s = [linear2.bias.detach().clone().requires_grad_() for _ in range(n)]
    w1, b1, w2 = (
        t.detach().clone().requires_grad_() for t in (linear1.weight, linear1.bias, linear2.weight)
    )
    xr = x.clone().requires_grad_()
    z = torch.cat([norms[r](xr[lo:hi]) for r, (lo, hi) in enumerate(rows)])
    bias = torch.cat([b2s[r].expand(hi - lo, -1) for r, (lo, hi) in enumerate(rows)])
    y = xr + F.linear(F.gelu(F.linear(z, w1, b1)), w2) + bias
    y.backward(dy)
    shards = sp_shards(norm, linear1, linear2, n, case.tokens)
    grads = []
    for r, shard in enumerate(shards):
        c0, c1 = shard.cols
        grads.append(
            {
                f"{r}.norm.weight": norms[r].weight.grad,
                f"{r}.norm.bias": norms[r].bias.grad,
                f"{r}.up.weight": w1.grad[c0:c1],
                f"{r}.up.bias": b1.grad[c0:c1],
                f"{r}.down.weight": w2.grad[:, c0:c1],
                f"{r}.b2": b2s[r].grad,
            }
        )
    one = SavedActivations([norm, linear1, linear2])
    with one.counting(0):
        kept = block_on_one_device(norm, linear1, linear2, x.clone().requires_grad_())
    tp_only = []
    for shard in shards:  # tensor parallelism alone: the whole sequence, the rank's columns
        meter = SavedActivations([shard])
        with meter.counting(0):
            held = x.clone().requires_grad_() + shard.down(F.gelu(shard.up(shard.norm(x))))
        tp_only.append(meter.peak_bytes)
        del held
    del kept
    return {
        "rows": rows,
        "output": y.detach(),
        "input_grad": xr.grad,
        "z": z.detach(),
        "grads": grads,
        "b2": linear2.bias.detach(),
        "unsplit_saved": one.peak_bytes,
        "tp_saved": tp_only,
    }


def _said(calls: list[dict]) -> list[tuple[str, str]]:
    """(op, "F" or "B" or "") of each collective, in the order called."""
    from course_utils.actions import Action

    return [(c["op"], Action.parse(c["in"]).kind if c["in"] else "") for c in calls]


def _reduces(shown: str, r: int, calls: list[dict]) -> None:
    """An all-reduce where sequence parallelism reduce-scatters."""
    said = _said(calls)
    if ("all_reduce", "F") in said:
        fail(
            f"{shown}: rank {r} all-reduces in its forward. An all-reduce leaves the whole "
            "sequence's sum on every rank, but the residual, dropout and the next "
            "LayerNorm need only the rank's own tokens: g-bar is a reduce-scatter along the "
            "sequence, half the all-reduce's bytes, each rank keeping its tokens' sum."
        )
    if ("all_reduce", "B") in said:
        fail(
            f"{shown}: rank {r} all-reduces in its backward. g's backward must sum every "
            "rank's share of dL/dZ, but each rank needs only its own tokens' sum (its "
            "LayerNorm saw only those): a reduce-scatter along the sequence, half the bytes."
        )


def _wire(shown: str, case: SequenceCase, run: dict) -> None:
    """The collectives each rank called, in order, and the bytes it sent."""
    from course_utils.threads.ring import ring_all_gather_bytes, ring_reduce_scatter_bytes

    for r, calls in enumerate(run["collectives"]):
        said = _said(calls)
        want = [("all_gather", "F"), ("reduce_scatter", "F")]
        if [c for c in said if c[1] == "F"] != want:
            fail(
                f"{shown}: rank {r}'s forward called {[c[0] for c in said if c[1] == 'F']}; "
                "sequence parallelism's forward is one all-gather along the sequence (g, "
                "before the column-parallel layer) then one reduce-scatter (g-bar, after the "
                "row-parallel one)."
            )
        if sorted(c for c in said if c[1] == "B") != [("all_gather", "B"), ("reduce_scatter", "B")]:
            fail(
                f"{shown}: rank {r}'s backward called {[c[0] for c in said if c[1] == 'B']}. "
                "Each collective's backward is its conjugate: g-bar's backward all-gathers "
                "dL/dY along the sequence, g's backward reduce-scatters dL/dZ."
            )
    numel = [(hi - lo) * case.d_model for lo, hi in _rows(case)]
    per_pass = [
        a + b
        for a, b in zip(ring_all_gather_bytes(numel), ring_reduce_scatter_bytes(numel), strict=True)
    ]
    for r, sent in enumerate(run["bytes_sent"]):
        if sent != 2 * per_pass[r]:
            fail(
                f"{shown}: rank {r} sent {sent:,} bytes; two ring all-gathers and two "
                f"reduce-scatters of the [{case.tokens}, {case.d_model}] sequence send "
                f"{2 * per_pass[r]:,}. Gather and scatter the sequence itself, along dim 0, "
                "once each way, nothing more."
            )


def _rows(case: SequenceCase) -> list[tuple[int, int]]:
    from course_utils.threads.collectives import chunk_bounds

    return chunk_bounds(case.tokens, case.devices)


def _norm(shown: str, case: SequenceCase, r: int, shapes: list) -> None:
    """Rank r's LayerNorm ran on its own tokens, once."""
    lo, hi = _rows(case)[r]
    if not shapes:
        fail(
            f"{shown}: rank {r} never called ctx.stage.norm: the block starts with the "
            "LayerNorm, on the rank's own tokens."
        )
    if any(s[0] == case.tokens and case.tokens != hi - lo for s in shapes):
        fail(
            f"{shown}: rank {r}'s LayerNorm ran on the whole sequence ({case.tokens} tokens) "
            "after the gather. Its output is right, but every rank then computes and keeps the "
            "whole sequence's LayerNorm, which is what sequence parallelism removes: the "
            f"LayerNorm is per token, so run it on the rank's {hi - lo} tokens, before g."
        )
    if [list(s) for s in shapes] != [[hi - lo, case.d_model]]:
        fail(
            f"{shown}: rank {r}'s LayerNorm saw inputs of shapes {shapes}; it runs once, on the "
            f"rank's tokens x[lo:hi], shape [{hi - lo}, {case.d_model}]."
        )


def _gathered(shown: str, case: SequenceCase, r: int, up_in, want: dict) -> None:
    """What rank r's column-parallel layer was given: the whole sequence's LayerNorm, in order."""
    import torch

    z = want["z"]
    if not isinstance(up_in, torch.Tensor):
        fail(f"{shown}: rank {r} never called ctx.stage.up (the column-parallel layer W1).")
    if close(up_in, z):
        return
    rows = want["rows"]
    if up_in.shape == z.shape and len(rows) <= 5:
        blocks = [z[lo:hi] for lo, hi in rows]
        for order in itertools.permutations(range(len(rows))):
            if list(order) != sorted(order) and close(up_in, torch.cat([blocks[i] for i in order])):
                fail(
                    f"{shown}: rank {r} gave W1 the ranks' tokens in the order of ranks "
                    f"{list(order)}. The sequence is rank 0's tokens, then rank 1's, ...: "
                    "each token's row must be where it is in the sequence, whatever order "
                    "the shards arrive in."
                )
    lo, hi = rows[r]
    if up_in.shape[0] == hi - lo:
        fail(
            f"{shown}: rank {r}'s W1 saw only the rank's {hi - lo} tokens. Its columns of W1 "
            "need every token: all-gather the LayerNorm's output along the sequence (g) first."
        )
    fail(
        f"{shown}: rank {r}'s W1 was given a tensor of shape {tuple(up_in.shape)}, not the "
        f"whole sequence's LayerNorm output, shape {tuple(z.shape)}: gather along dim 0."
    )


def _outputs(shown: str, case: SequenceCase, run: dict, want: dict) -> None:
    """Every rank's tokens of the output and of dL/dX against the unsplit block's."""
    n = case.devices
    for r, (lo, hi) in enumerate(want["rows"]):
        y, dx = run["outputs"][r], run["input_grads"][r]
        if close(y, want["output"][lo:hi]):
            pass
        elif close(y, want["output"][lo:hi] + (n - 1) * want["b2"]):
            fail(
                f"{shown}: rank {r}'s output is the block's plus {n - 1} times b2: each of "
                f"the {n} ranks added it before the reduce-scatter summed them. Add b2 once, "
                "after g-bar, like the residual."
            )
        else:
            fail(
                f"{shown}: rank {r}'s output is not the unsplit block's for its tokens "
                f"{lo}:{hi}: x + W2 GeLU(W1 LN(x) + b1) + b2, with the residual of its own "
                "tokens."
            )
        if not close(dx, want["input_grad"][lo:hi]):
            fail(
                f"{shown}: rank {r}'s gradient of its tokens x[lo:hi] is not the unsplit "
                "block's: g's backward sums every rank's share of dL/dZ (each rank's columns "
                "of W1 give part of it) and keeps the rank's own tokens: a reduce-scatter."
            )
        for key, grad in want["grads"][r].items():
            if not close(run["grads"][r].get(key), grad):
                name = key.split(".", 1)[1]
                fail(
                    f"{shown}: rank {r}'s gradient of `{name}` is not its share of the "
                    "unsplit block's (for the LayerNorm and b2: from the rank's own tokens)."
                )


def sequence_parallel(program, cases: list[tuple]) -> str:
    """Exercise 9.1: Megatron's sequence parallelism, judged on each case's run."""
    per_rank = ("collectives", "outputs", "input_grads", "norm_inputs", "up_inputs")
    mine: tuple = ()
    for (case,), shown, got in checks.each_call(program, cases):
        run = programs.evidence(got, shown, case, per_rank)
        want = reference(case)
        for r in range(case.devices):
            shapes = run["norm_inputs"][r]
            if not (isinstance(shapes, list) and all(isinstance(s, list) for s in shapes)):
                fail(f"{shown} did not come back as the record of a run: it cannot be judged.")
        for r, calls in enumerate(run["collectives"]):
            _reduces(shown, r, calls)
        for r in range(case.devices):
            _norm(shown, case, r, run["norm_inputs"][r])
            _gathered(shown, case, r, run["up_inputs"][r], want)
        if run["failure"] is not None:
            fail(programs.stopped(shown, run["failure"], STOPPED))
        _outputs(shown, case, run, want)
        _wire(shown, case, run)
        mine = mine or (case, run, want)  # the learner's own block comes first
    return summary(*mine)


def summary(case: SequenceCase, run: dict, want: dict) -> str:
    """The verdict's last words: what the learner's own run sent and kept."""
    from course_utils.threads.ring import ring_bytes_per_rank

    lo, hi = want["rows"][0]
    reduce = 2 * ring_bytes_per_rank(case.tokens * case.d_model, case.devices)[0]
    return (
        "Right on your block and fresh ones: every rank's tokens of the output and of dL/dX "
        "equal the unsplit block's, with one all-gather and one reduce-scatter each way. On "
        f"yours ({case.devices} ranks) rank 0 sent {run['bytes_sent'][0]:,} bytes, what "
        f"tensor parallelism's two all-reduces send ({reduce:,}); its LayerNorm held {hi - lo} "
        f"of the {case.tokens} tokens, and it saved {run['saved_bytes'][0]:,} bytes of "
        f"activations where tensor parallelism alone saves {want['tp_saved'][0]:,} and one "
        f"device {want['unsplit_saved']:,}."
    )
