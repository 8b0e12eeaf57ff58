"""The verdict of Exercise 7.1: a column-parallel layer, written as the program every rank runs.

Each case's run (`rank_cases.ColumnCase`) comes back as evidence: every rank's output and its
shard's gradients, the collectives it called and the bytes it sent. The verdict is computed
here, in the grader, against the unsplit layer Y = XA + b on one device: every rank's output
must be the whole Y, its shard's gradients its columns of the unsplit layer's, with one
all-gather in the forward, nothing sent in the backward, and the bytes of a ring all-gather
of the output (each rank sends every block but one: (N-1)/N of Y when the blocks are even).
The known wrong programs each get their hint: a gather along the rows (tokens), blocks in
another order of ranks, an all-reduce where no sum is needed, a backward that keeps the
wrong columns or sums dL/dY again.
"""

from __future__ import annotations

import itertools
import re

from course_utils import checks
from course_utils.checks import fail, programs
from course_utils.checks.rank_cases import ColumnCase, close

STOPPED = {
    "deadlock": "Every rank must call the same all-gather, once, in its forward.",
    "": "The forward computes X A_r + b_r on the rank's own columns and all-gathers it along "
    "the last dimension; the backward keeps the rank's own columns of dL/dY.",
}
CHUNK = (
    "those from ctx.stage.lo to ctx.stage.hi (not all of dL/dY; and torch.chunk cuts elsewhere "
    "when the ranks do not divide the columns)."
)


def _reference(case: ColumnCase) -> dict:
    """The unsplit layer's output and gradients, each rank's columns, and its blocks."""
    import torch

    from course_utils.threads.collectives import chunk_bounds

    a, b, x, dy = case.build()
    a, b = a.clone().requires_grad_(), b.clone().requires_grad_()
    y = x @ a + b
    y.backward(dy)
    bounds = chunk_bounds(case.d_out, case.devices)
    blocks = [y.detach()[:, lo:hi] for lo, hi in bounds]
    return {
        "output": y.detach(),
        "blocks": blocks,
        "bounds": bounds,
        "a": [a.grad[:, lo:hi] for lo, hi in bounds],
        "b": [b.grad[lo:hi] for lo, hi in bounds],
        "sent": [  # every block but the right neighbour's (it arrives last, from the left)
            4 * case.tokens * (case.d_out - hi + lo) if case.devices > 1 else 0
            for lo, hi in bounds[1:] + bounds[:1]
        ],
        "stacked": torch.cat(blocks, dim=0) if len({t.shape for t in blocks}) == 1 else None,
    }


def _order(y, want: dict) -> tuple[int, ...] | None:
    """The order of ranks whose blocks, side by side, make `y` (another than 0, 1, ...)."""
    import torch

    blocks = want["blocks"]
    if len(blocks) > 5:
        return None
    for order in itertools.permutations(range(len(blocks))):
        if list(order) != sorted(order) and close(y, torch.cat([blocks[i] for i in order], -1)):
            return order
    return None


def _reduces(shown: str, r: int, calls: list[dict]) -> None:
    """An all-reduce in rank r's forward: the sum of a row-parallel layer, not this one's."""
    if any(c["op"] == "all_reduce" and c["in"] and "F" in c["in"] for c in calls):
        fail(
            f"{shown}: rank {r} all-reduces. An all-reduce adds the ranks' tensors, but a "
            "column-parallel layer's slices are different columns of Y, nothing to add: they "
            "go side by side. Even padded with zeros to make the sum right, an all-reduce "
            "sends twice the bytes of an all-gather (2(N-1)/N of Y, not (N-1)/N)."
        )


def _forward(shown: str, r: int, y, want: dict) -> None:
    """Rank r's output against the unsplit layer's, naming what went wrong."""
    import torch

    if not isinstance(y, torch.Tensor):
        fail(f"{shown}: rank {r}'s forward returned {y}, not a tensor.")
    if close(y, want["output"]):
        return
    if want["stacked"] is not None and close(y, want["stacked"]):
        fail(
            f"{shown}: rank {r}'s output has shape {tuple(y.shape)}: the slices are stacked "
            "along the rows (the tokens), as if each rank held rows of Y. Each rank holds "
            "some columns (output features) of Y for every token: gather along the last "
            "dimension."
        )
    order = _order(y, want)
    if order is not None:
        fail(
            f"{shown}: rank {r}'s output holds the right blocks of columns in the order of "
            f"ranks {list(order)}. Y's columns are rank 0's, then rank 1's, ...: put each "
            "rank's block where its columns are, whatever order the blocks arrive in."
        )
    if tuple(y.shape) != tuple(want["output"].shape):
        fail(
            f"{shown}: rank {r}'s output has shape {tuple(y.shape)}; the layer's output "
            f"has {tuple(want['output'].shape)}: every rank ends with the whole Y."
        )
    fail(
        f"{shown}: rank {r}'s output has the shape of Y = XA + b but not its values: rank r "
        "computes X A_r + b_r with its own columns only."
    )


def _backward(shown: str, case: ColumnCase, r: int, grads: dict, want: dict) -> None:
    """Rank r's shard gradients against its columns of the unsplit layer's."""
    got_a, got_b = grads.get(f"{r}.a"), grads.get(f"{r}.b")
    if close(got_a, want["a"][r]) and close(got_b, want["b"][r]):
        return
    if close(got_a, case.devices * want["a"][r]):
        fail(
            f"{shown}: rank {r}'s gradients are {case.devices} times its columns' share: its "
            "backward summed dL/dY over the ranks. Every rank already holds the whole dL/dY "
            "(the output was gathered, not split): the all-gather's backward only keeps the "
            "rank's own columns of it, with no communication."
        )
    fail(
        f"{shown}: rank {r}'s gradient of its `a` is not its columns' share of the unsplit "
        f"layer's. The all-gather's backward gives rank r the columns of dL/dY it computed, {CHUNK}"
    )


def _bytes(shown: str, case: ColumnCase, run: dict, want: dict) -> None:
    """One all-gather in the forward, nothing in the backward, a ring all-gather's bytes."""
    for r, calls in enumerate(run["collectives"]):
        if any(c["in"] and "B" in c["in"] for c in calls) or any(
            s[3] is not None
            for s in run["sends"][r]  # the forward is its first action
        ):
            fail(
                f"{shown}: rank {r} communicates in its backward. Every rank already holds "
                "the whole dL/dY: the gradient of its own columns needs nothing from the "
                "others."
            )
        sent, right = run["bytes_sent"][r], want["sent"][r]
        if sent != right:
            fail(
                f"{shown}: rank {r} sent {sent:,} bytes; a ring all-gather of the output "
                f"sends {right:,}: every block of Y but one, once (each rank's block travels "
                "N-1 links). Send each rank's slice of the output, once, nothing else."
            )


def column_parallel(program, cases: list[tuple]) -> str:
    """Exercise 7.1: a column-parallel layer, judged on what each case's run did."""
    sizes = []
    for (case,), shown, got in checks.each_call(program, cases):
        run = programs.evidence(got, shown, case, ("collectives", "outputs", "input_grads"))
        want = _reference(case)
        for r, calls in enumerate(run["collectives"]):
            _reduces(shown, r, calls)
        for r, y in enumerate(run["outputs"]):
            if y is not None:  # a run that stopped in its backward still shows its forward
                _forward(shown, r, y, want)
        if run["failure"] is not None:
            message = str(run["failure"]["message"])
            if re.search(r"\(in \d+B0\)$", message) and run["failure"]["kind"] == "raised":
                fail(
                    f"{shown}: {message}. The all-gather's backward gives back a gradient "
                    f"of the shape of its input: the rank's own columns of dL/dY, {CHUNK}"
                )
            fail(programs.stopped(shown, run["failure"], STOPPED))
        for r in range(case.devices):
            _backward(shown, case, r, run["grads"][r], want)
        _bytes(shown, case, run, want)
        sizes.append(f"{case.devices} ranks, {case.d_out} columns")
    mine = _reference(cases[0][0])
    return (
        f"Right on your layer and fresh ones ({'; '.join(sizes)}): every rank's output is the "
        "whole Y = XA + b, every shard's gradients are its columns of the unsplit layer's, "
        f"with one all-gather and nothing sent in the backward. On yours rank 0 sent "
        f"{mine['sent'][0]:,} bytes: every block of Y but one."
    )
