"""The verdict on fill and drain on a V written as a per-rank program (Exercise 11.3).

Rank d holds stage d (its down chunk) and stage 2p-1-d (its up chunk): the micro-batches go
down the ranks and come back up, the turn between stages p-1 and p stays on rank p-1 and the
loss is on rank 0 (Qi et al. 2024, arXiv 2401.10241, place ZB-V's stages so). Judged from
the run's evidence (`programs.evidence`), in the grader: where each message went (the V's
neighbours, never looping placement's, the turn kept on its rank), one device's gradients
on every rank, each activation sent once, every forward before the first backward, the
order the ranks ran replayed by the simulator against `pipeline_cases.v_fill_drain`, and
rank 0's peak of saved activations. Only `checks.l11` and `checks.zbv_build` import this module.
"""

from __future__ import annotations

from course_utils.actions import Action
from course_utils.checks import fail, pipeline_hints
from course_utils.checks.pipeline_cases import VCase, v_target
from course_utils.checks.programs import evidence, replayed

ADVICE = {
    "deadlock": "Each rank runs its down chunk's forwards, then its up chunk's, then the "
    "backwards: receive what an action needs just before it and send what it made just after.",
    "tag": "Name each message alike on both sides (what it is, for which stage, for which "
    "micro-batch) and receive in the order the neighbour sends.",
}
V_NEIGHBOURS = (
    "In a V stage s lives on rank s going down and on rank 2p-1-s coming back up: an "
    "activation goes to the rank of the next stage, a gradient back to the rank of the one "
    "before."
)
LOOPING = (
    "that is where looping placement (stage s on rank s mod p) puts it. In a V stage s lives "
    "on rank s going down and on rank 2p-1-s coming back up"
)
TURN = (
    "Stages p-1 and p both live on rank p-1, the bottom of the V: the turn is no message. "
    "Keep stage p-1's output on the rank and give it to stage p as a fresh leaf "
    "(`out.detach().requires_grad_()`), and hand the up chunk's input gradient to the down "
    "chunk's backward the same way."
)
TURN_LEAF = (
    "Rank p-1's down chunk got no gradient from its up chunk: `.grad` is kept only on a "
    "leaf, so stage p's input at the turn must be a fresh leaf, `out.detach()."
    "requires_grad_()`, not stage p-1's output itself."
)
DOWN_FIRST = (
    "The first gradients come from the loss on rank 0, the top of the up side, and run back "
    "up the V before they come down: each rank's up chunk gets its gradients first, so it "
    "runs its up chunk's backwards before its down chunk's."
)


def wrong_neighbour(shown: str, run: dict, case: VCase) -> str | None:
    """A hint for a message sent to a rank that does not hold the stage it was for."""
    p = case.devices
    for rank, sends in enumerate(run["sends"]):
        for to, _, _, after in sends:
            if after is None:
                continue
            done = Action.parse(after)
            s = done.stage + (-1 if done.is_backward else 1)
            if not 0 <= s < 2 * p or to == case.owner(s):
                continue
            what = "gradient" if done.is_backward else "activation"
            if to == s % p:
                return (
                    f"{shown}: rank {rank} sent the {what} for stage {s} (after {after}) to "
                    f"rank {to}: {LOOPING}, here rank {case.owner(s)}."
                )
            return (
                f"{shown}: rank {rank} sent the {what} for stage {s} (after {after}) to rank "
                f"{to}; stage {s} lives on rank {case.owner(s)}. {V_NEIGHBOURS}"
            )
    return None


def stopped(shown: str, run: dict, case: VCase) -> str | None:
    """A hint for the V's own mistakes in a run that stopped."""
    failure, p = run["failure"], case.devices
    said = str(failure["message"]).rstrip(".")
    bottom = p - 1
    to_itself = (f"a message to rank {bottom};", f"a message from rank {bottom};")
    if failure.get("kind") == "peer" and failure.get("rank") == bottom:
        if any(words in said for words in to_itself):
            return f"{shown}: {said}. {TURN}"
    rank = failure.get("rank")
    scalar = "implicitly created only for scalar" in said
    if rank == bottom and scalar and f"in {bottom}B" in said:
        return f"{shown}: {said}. {TURN_LEAF}"
    if pipeline_hints.stuck_before_backwards(run, case):
        return f"{shown} stopped after every forward, before any backward: {said}. {DOWN_FIRST}"
    if failure.get("kind") == "peer":
        return f"{shown}: {said}. {V_NEIGHBOURS}"
    return None


def judge(got, shown: str, case: VCase) -> None:
    """Fail with the hint for the program's mistake, unless its run on `case` is fill and
    drain on a V with one device's gradients."""
    run = evidence(got, shown, case)
    hint = wrong_neighbour(shown, run, case)
    if hint is None and run["failure"] is not None:
        hint = stopped(shown, run, case)
    if hint:
        fail(hint)
    run = pipeline_hints.judged_run(got, shown, case, ADVICE)
    pipeline_hints.forwards_first(
        shown,
        run,
        ". Fill and drain runs every forward of a rank (down chunk, then up chunk) before its "
        "backwards.",
    )
    want, step = v_target(case), replayed(run, case).makespan
    if step > want.step * (1 + 1e-9):
        fail(
            f"{shown}: the order your ranks ran replays to a step of {step:.4g} units, fill "
            f"and drain on the V takes {want.step:.4g}. A rank that waits for a chunk whose "
            "input comes later idles: run the down chunk's forwards first, and the up chunk's "
            "backwards first."
        )
    gpipe = "Fill and drain holds every micro-batch on both chunks at the turn, no more."
    pipeline_hints.memory(shown, run, case, want.held[0], gpipe)
