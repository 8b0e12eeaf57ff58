"""The verdict of Exercise 8.2: ZeRO-2's optimizer step, written as the program every rank runs.

Each case's run (`rank_cases.ZeroCase`, `parallel.fsdp.zero_program`) comes back as evidence:
every rank's parameters after each step, the numbers its optimizer state held at the end, and
each collective with the bytes it sent. The verdict is computed here, in the grader, against
one device's SGD-with-momentum steps on the whole batch: every rank's parameters after every
step must be one device's; its optimizer state its shard only (ceil(numel / N) numbers); and
per step one reduce-scatter and one all-gather of (N-1) shards each (Rajbhandari et al. 2019,
arXiv 1910.02054: ZeRO-2 sends what plain data parallelism's all-reduce sends). The known
wrong programs each get their hint: an all-reduce and every parameter updated everywhere,
shards cut at other offsets than the reduce-scatter's, a sum where the mean is needed, no
all-gather, the momentum started again at every step, the whole optimizer state kept.
"""

from __future__ import annotations

from course_utils import checks
from course_utils.checks import fail, programs
from course_utils.checks.rank_cases import ZeroCase

STOPPED = {
    "deadlock": "A collective completes only when every rank calls it: every rank "
    "reduce-scatters the gradient, then all-gathers the parameters, once per step.",
    "": "Compare it with the three steps listed above the answer.",
}


def _reference(case: ZeroCase) -> dict:
    """One device's parameters after each step, and what the known mistakes give."""
    from course_utils.parallel.fsdp.zero_program import LR, flatten, gradient_at, one_device_flats

    model, x, y = case.build()
    start, right = flatten(model), one_device_flats(model, x, y, case.steps)
    numel, n = start.numel(), case.devices
    return {
        "start": start,
        "right": right,
        "numel": numel,
        "shard": -(-numel // n),
        "reset": right[0] - LR * gradient_at(model, right[0], x, y),  # step 2, no momentum
    }


def _close(got, want) -> bool:
    import torch

    ok = isinstance(got, torch.Tensor) and got.shape == want.shape
    return ok and torch.allclose(got, want, rtol=1e-4, atol=1e-6)


def _elsewhere(step, moved, n: int, size: int) -> bool:
    """Some shard of `step` is the right step of another shard (zero-padded to n x size)."""
    import torch

    def shards(v):
        return torch.cat([v, v.new_zeros(n * size - v.numel())]).view(n, size)

    got, right = shards(step), shards(moved)
    return any(
        _close(got[k], right[j]) and not _close(got[k], right[k])
        for k in range(n)
        for j in range(n)
        if j != k
    )


def _first_step(shown: str, case: ZeroCase, r: int, got, want: dict) -> None:
    """Rank r's parameters after the first step, naming what went wrong."""
    import torch

    start, right, n, numel = want["start"], want["right"][0], case.devices, want["numel"]
    if _close(got, right):
        return
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != (numel,):
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else got
        fail(
            f"{shown}: after the first step rank {r}'s ctx.flat is {shape}, not the model's "
            f"{numel} parameters as one vector: cut the padding off after the all-gather."
        )
    step, moved = got - start, right - start
    if _close(step, n * moved):
        fail(
            f"{shown}: every parameter moved {n} times one device's step: the gradients were "
            f"summed over the {n} ranks. Each rank's ctx.gradient() is the mean over its own "
            "rows; the batch's gradient is the mean of the ranks' (op=\"mean\")."
        )
    size, mine = want["shard"], slice(r * want["shard"], (r + 1) * want["shard"])
    others = torch.ones(numel, dtype=torch.bool)
    others[mine] = False
    if _close(got[mine], right[mine]) and _close(got[others], start[others]):
        fail(
            f"{shown}: rank {r} updated its own shard of the parameters, but the others are "
            "as they were before the step: the next forward needs them all new. Every rank "
            "updated one shard: all-gather them."
        )
    if _elsewhere(step, moved, n, size):
        fail(
            f"{shown}: rank {r}'s parameters moved by the right steps, but on the wrong "
            "parameters: a shard was updated at other offsets than those its gradient came "
            f"from. Rank r's slice of the reduce-scatter is elements r·s to (r+1)·s (s = "
            f"{size}) of the padded vector: update exactly those parameters."
        )
    fail(
        f"{shown}: rank {r}'s parameters after the first step are not one device's. Each "
        "rank updates its shard with its slice of the batch's mean gradient: m = momentum x "
        "m + g, p -= lr x m."
    )


def _collectives(shown: str, case: ZeroCase, r: int, watch: dict, shard: int) -> None:
    """No all-reduce: each rank updates only its shard."""
    kinds = [str(c[0]) for c in watch["collectives"]]
    if "all_reduce" in kinds:
        fail(
            f"{shown}: rank {r} all-reduces, so it holds the whole summed gradient and can "
            "update every parameter, with the whole optimizer state: that is plain data "
            "parallelism. ZeRO has each rank update only its shard: which collective leaves "
            "each rank just its slice of the gradient's sum?"
        )


def _bytes(shown: str, case: ZeroCase, r: int, watch: dict, shard: int) -> None:
    """Per step one reduce-scatter and one all-gather of (N-1) shards each."""
    each = 4 * (case.devices - 1) * shard * case.steps
    sent = {k: sum(sum(c[1]) for c in watch["collectives"] if c[0] == k) for k in KINDS}
    if sent != dict.fromkeys(KINDS, each):
        fail(
            f"{shown}: in its {case.steps} steps rank {r} sent {sent['reduce_scatter']:,} bytes "
            f"in reduce-scatters and {sent['all_gather']:,} in all-gathers; ZeRO-2 sends "
            f"{each:,} in each: per step, in each, N-1 = {case.devices - 1} shards of "
            f"{shard} float32 numbers. Reduce-scatter the padded gradient once and all-gather "
            "the updated shard once per step."
        )


KINDS = ("reduce_scatter", "all_gather")


def zero_step(program, cases: list[tuple]) -> str:
    """Exercise 8.2: ZeRO-2's step, judged on what each case's run did."""
    for (case,), shown, got in checks.each_call(program, cases):
        run = programs.watched(got, shown, case, "flats")
        state = run.get("state")
        if not (isinstance(state, list) and len(state) == case.devices):
            fail(f"{shown} did not come back as the record of a run: it cannot be judged.")
        want = _reference(case)
        if run["failure"] is not None:
            if "must match the size" in str(run["failure"]["message"]):
                fail(
                    f"{shown}: {run['failure']['message']}. A rank's slice of the gradient and "
                    "its shard of the parameters differ in length: they were cut at different "
                    "offsets. Pad both to a multiple of N and cut both into N equal shards."
                )
            fail(programs.stopped(shown, run["failure"], STOPPED))
        for r, watch in enumerate(run["watched"]):
            _collectives(shown, case, r, watch, want["shard"])
        for r, flats in enumerate(run["flats"]):
            _first_step(shown, case, r, flats[0], want)
            if case.steps > 1 and not _close(flats[1], want["right"][1]):
                reset = _close(flats[1], want["reset"])
                fail(
                    f"{shown}: rank {r}'s first step is right, its second is not"
                    + (
                        ": it started again from no momentum. The optimizer state lives from "
                        "step to step: keep it in ctx.state."
                        if reset
                        else ". The momentum of the first step carries over to the second."
                    )
                )
            if state[r] != want["shard"]:
                fail(
                    f"{shown}: at the end rank {r}'s optimizer state (ctx.state) holds "
                    f"{state[r]:,} numbers; its shard of the momentum is {want['shard']:,}. "
                    + (
                        "ZeRO's saving is that each rank keeps only the state of the "
                        "parameters it updates."
                        if state[r] > want["shard"]
                        else "Keep the momentum of your shard in ctx.state."
                    )
                )
        for r, watch in enumerate(run["watched"]):
            _bytes(shown, case, r, watch, want["shard"])
    mine, case = _reference(cases[0][0]), cases[0][0]
    each = 4 * (case.devices - 1) * mine["shard"]
    return (
        f"Right on your model and fresh ones: after every step every rank's parameters equal "
        f"one device's, each rank keeps {mine['shard']:,} numbers of momentum instead of "
        f"{mine['numel']:,}, and on yours each rank sent {each:,} bytes per step in its "
        f"reduce-scatter and as many in its all-gather: together what one all-reduce sends."
    )
