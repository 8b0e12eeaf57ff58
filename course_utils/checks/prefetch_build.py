"""The verdict of Exercise 8.4: FSDP's forward with prefetch depth k, as every rank's program.

Each case's run (`PrefetchCase`, `parallel.fsdp.prefetch_program`) comes back as evidence:
per rank its output and, in order, every all-gather it issued (which layer, blocking or
not), every wait, and at every layer it computed the gathered layers it still held. The
verdict is computed here, in the grader, from that evidence alone: every rank's output
equals the unsharded model's on its rows; every layer is gathered exactly once; at no
layer's compute does a rank hold more than k + 1 gathered layers (the k in flight and the
one computing: the memory price of prefetching, Zhao et al. 2023, arXiv 2304.11277); and
the gather of layer i + k is in flight (issued, not yet waited for) while layer i computes.
Never judged on time. The known wrong programs each get their hint: each gather waited for
at once (no overlap), a gathered layer never let go, every layer prefetched at the start, a
layer gathered twice, a prefetch shallower or deeper than k.
"""

from __future__ import annotations

from course_utils import checks
from course_utils.checks import fail, programs
from course_utils.checks.recorded_cases import PrefetchCase

STOPPED = {
    "deadlock": "An all-gather completes only when every rank calls it: every rank gathers "
    "every layer once, in the same order, and waits for each before computing it.",
    "": "Compare it with the steps listed above the answer.",
}


def _record(got, shown: str, case: PrefetchCase) -> dict:
    """`got` as a prefetch run's evidence, else a failure."""
    n = case.devices
    ok = isinstance(got, dict) and got.get("world") == n and "failure" in got
    ok = ok and all(
        isinstance(got.get(k), list) and len(got[k]) == n for k in ("events", "outputs")
    )
    ok = ok and all(isinstance(ev, list) and all(_event(e) for e in ev) for ev in got["events"])
    failure = got.get("failure") if ok else None
    ok = ok and (failure is None or (isinstance(failure, dict) and "message" in failure))
    if not ok:
        fail(f"{shown} did not come back as the record of a run: it cannot be judged.")
    return got


def _event(e) -> bool:
    if not (isinstance(e, list) and e and e[0] in ("gather", "wait", "compute")):
        return False
    whole = [e[1]] + (e[2] if e[0] == "compute" and isinstance(e[2], list) else e[2:])
    return all(isinstance(v, int) and not isinstance(v, bool) for v in whole)


def _output(shown: str, case: PrefetchCase, rank: int, got) -> None:
    """Rank `rank`'s output is the unsharded model's on its rows."""
    import torch

    model, x, _ = case.build()
    with torch.no_grad():
        want = model(x).chunk(case.devices)[rank]
    if not isinstance(got, torch.Tensor):
        fail(
            f"{shown}: rank {rank}'s program returned {type(got).__name__}, not a tensor: "
            "return the last layer's output, x, on the rank's rows."
        )
    if got.shape != want.shape or not torch.allclose(got.float(), want, rtol=1e-4, atol=1e-5):
        fail(
            f"{shown}: rank {rank}'s output is not the unsharded model's on its rows. Every "
            "layer computes, in order, on the previous layer's output, each with its own "
            "gathered parameters: the handle you wait for must be that layer's."
        )


def _gathered_once(shown: str, case: PrefetchCase, rank: int, events: list) -> None:
    gathers = [e[1] for e in events if e[0] == "gather"]
    if -1 in gathers:
        fail(
            f"{shown}: rank {rank} all-gathered a tensor that is not one of its shards: "
            "gather ctx.shards[i] itself, so every rank sends its own slice of layer i."
        )
    twice = sorted({j for j in gathers if gathers.count(j) > 1})
    if twice:
        fail(
            f"{shown}: rank {rank} gathered layer {twice[0]} {gathers.count(twice[0])} times. "
            "A layer fetched ahead is already on its way: keep its handle and wait for it "
            "when the layer's turn comes, rather than gathering it again. Each gather costs a "
            "whole layer's bytes on every link."
        )
    if sorted(gathers) != list(range(case.layers)):
        missing = sorted(set(range(case.layers)) - set(gathers))
        fail(f"{shown}: rank {rank} never gathered layer {missing[0]}: every layer once.")
    if gathers != sorted(gathers):
        fail(
            f"{shown}: rank {rank} gathered the layers in the order {gathers}: the forward "
            "needs them in layer order, so prefetching gathers them in that order too."
        )


def _memory(shown: str, case: PrefetchCase, rank: int, events: list) -> None:
    """At no compute more than k + 1 gathered layers held."""
    k, most = case.prefetch, case.prefetch + 1
    for e in events:
        if e[0] != "compute" or len(e[2]) <= most:
            continue
        i, held = e[1], e[2]
        done = [j for j in held if j < i]
        if done:
            fail(
                f"{shown}: while computing layer {i} rank {rank} still held layer {done[0]}'s "
                f"gathered parameters ({len(held)} gathered layers at once; prefetch {k} "
                f"needs at most {most}). Once a layer is computed, let its gathered tensor "
                "go: keep no name, list entry or handle that refers to it (del it, or pop "
                "the handle before waiting), so only the shard stays."
            )
        if i == 0 and len(held) == case.layers:
            fail(
                f"{shown}: rank {rank} issued all {case.layers} gathers before computing "
                f"layer 0, so it held every layer at once: the whole model, which FSDP "
                f"exists to avoid. Prefetch {k} issues only k gathers ahead: layer i + k's "
                "just before layer i computes."
            )
        fail(
            f"{shown}: while computing layer {i} rank {rank} held {len(held)} gathered "
            f"layers ({held}); prefetch {k} holds at most {most}: the {k} in flight and the "
            "one computing. Issue layer i + k's gather before layer i, not one further ahead."
        )


def _ahead(shown: str, case: PrefetchCase, rank: int, events: list) -> None:
    """Layer i + k's gather is in flight (issued, not yet waited) while layer i computes."""
    k, layers = case.prefetch, case.layers
    issued: set[int] = set()
    waited: set[int] = set()
    for e in events:
        if e[0] == "gather":
            issued.add(e[1])
            if not e[2]:
                waited.add(e[1])
        elif e[0] == "wait":
            waited.add(e[1])
        elif 0 <= e[1] < layers:
            i = e[1]
            if i not in waited:
                fail(f"{shown}: rank {rank} computed layer {i} without waiting for its gather.")
            j = i + k
            if k == 0 or j >= layers or (j in issued and j not in waited):
                continue
            if j in issued:  # issued in time, but already waited for: nothing overlaps
                fail(
                    f"{shown}: rank {rank} waited for layer {j}'s gather before computing "
                    f"layer {i}, so the gather never ran while a layer computed: no overlap. "
                    "Issue each gather with async_op=True and call wait() on its handle only "
                    "just before the layer that needs it."
                )
            ahead = max((g - i for g in issued), default=0)
            fail(
                f"{shown}: when rank {rank} began layer {i}, its gathers ran {ahead} layer"
                f"{'s' if ahead != 1 else ''} ahead, not {k}: layer {j}'s gather had not "
                f"been issued. With prefetch k = ctx.prefetch ({k} here), issue layer i + k's "
                "gather before computing layer i (and layers 0 to k - 1 before the loop)."
            )


def prefetch_forward(program, cases: list[tuple]) -> str:
    """Exercise 8.4: the forward with prefetch, judged on what each case's run did."""
    held: list[int] = []
    for (case,), shown, got in checks.each_call(program, cases):
        run = _record(got, shown, case)
        if run["failure"] is not None:
            fail(programs.stopped(shown, run["failure"], STOPPED))
        for rank in range(case.devices):
            events = run["events"][rank]
            _output(shown, case, rank, run["outputs"][rank])
            _gathered_once(shown, case, rank, events)
            _memory(shown, case, rank, events)
            _ahead(shown, case, rank, events)
        held.append(max(len(e[2]) for e in run["events"][0] if e[0] == "compute"))
    k = cases[0][0].prefetch
    return (
        f"Right on your model and fresh ones: every rank's output equals the unsharded "
        f"model's, every layer gathered once, and layer i + k's gather in flight while layer "
        f"i computes. On yours (prefetch {k}) rank 0 held up to {held[0]} gathered layers at "
        "once: k + 1, the memory prefetching costs whether or not the gathers needed hiding."
    )
