"""ZB-H1 written as a per-rank program (Exercise 4.4): the case, the evidence and the verdict.

Zero bubble (Qi et al., ICLR 2024, arXiv 2401.10241) splits each backward in two: I, the
gradient of the stage's input, which the rank before waits for, and W, the gradients of the
stage's weights, which nobody waits for. ZB-H1 keeps 1F1B's order with I in place of B and
puts each W later, where the rank would otherwise wait: its idle time per rank falls from
(p-1)(F+B) to (p-1)(F+I-W) (while W <= min(F, I)), with no more than p micro-batches held.

The learner's program runs on the course's devices (`SplitCase`). Besides the run's evidence
(`programs.evidence`), the case records, for every I and W a rank ran, whether the
parameters' gradients changed inside it: an I that changes them computed W with it. The
grader judges: the gradients against one device's; every W after its own I; I's that leave
the weights alone; the most micro-batches each rank held against ZB-H1's; the order replayed
by the simulator with the model's costs (W half of the backward) against ZB-H1's step. Only
l04 imports this module.
"""

from __future__ import annotations

import re

from course_utils.checks import fail
from course_utils.checks.pipeline_cases import SplitCase
from course_utils.checks.programs import evidence, target


def _early_weight(actions: list) -> str | None:
    """The first W a rank ran before its own I, if any (as text)."""
    done = set()
    for a in actions:
        if a.kind == "I":
            done.add((a.stage, a.microbatch))
        if a.kind == "W" and (a.stage, a.microbatch) not in done:
            return str(a)
    return None


def before_run(got, shown: str, case: SplitCase) -> dict:
    """The run's evidence, once the mistakes only a split backward makes are ruled out: a W
    before its I, an I that does not keep the graph for its W, a backward left whole."""
    run = evidence(got, shown, case, per_rank=("split",))
    split_mistakes(
        shown,
        run,
        ". Split each backward in two, each marked: `with ctx.backward_input(mb):` for I and "
        "`with ctx.backward_weight(mb):` for W.",
    )
    return run


def split_mistakes(shown: str, run: dict, whole: str) -> None:
    """Fail on the mistakes only a split backward makes (4.4's ZB-H1, 11.2's ZB-V): a W
    before its I, a graph freed by I, a backward left whole (`whole` ends that hint)."""
    for rank, actions in enumerate(run["actions"]):
        early = _early_weight(actions)
        if early:
            fail(
                f"{shown}: rank {rank} ran {early} before its I. W needs what I left: the "
                "gradient that came back for that micro-batch. Each W runs after its own I; "
                "what may wait is W, never I."
            )
    failure = run["failure"]
    said = str(failure["message"]) if failure else ""
    if "backward through the graph a second time" in said:
        where = re.search(r"\((in|after) [^()]*\)$", said)
        fail(
            f"{shown}: rank {failure['rank']} went back through a graph autograd had already "
            f"freed{' (' + where.group(0)[1:-1] + ')' if where else ''}. An I frees the "
            "graph unless told to keep it, and its W still needs that graph: I keeps it "
            "(`retain_graph=True`), W, the last to use it, lets it go."
        )
    if failure is None:
        for rank, actions in enumerate(run["actions"]):
            b = next((a for a in actions if a.kind == "B"), None)
            if b is not None:
                fail(f"{shown}: rank {rank} ran {b}, a whole backward{whole}")


def weights_left_alone(shown: str, run: dict) -> None:
    """Fail unless every I left the weights' gradients alone (the case's notes)."""
    for rank, notes in enumerate(run["split"]):
        if not all(isinstance(n, list | tuple) and len(n) == 2 for n in notes):
            fail(f"{shown} did not come back as the record of a run: it cannot be judged.")
        changed = next((str(a) for a, touched in notes if "I" in str(a) and touched), None)
        if changed:
            fail(
                f"{shown}: rank {rank}'s {changed} changed the weights' gradients: that I "
                "computed W with it, and the gradient's trip back waited for W's work too. I "
                "asks autograd for the gradient of the stage's input alone "
                "(`torch.autograd.grad`); the weights' gradients wait for W."
            )


def judge(shown: str, run: dict, case: SplitCase) -> None:
    """Fail unless every I left the weights alone, no rank held more than under ZB-H1, and
    the order replays to ZB-H1's step (`run`: judged whole already, with one device's
    gradients, by `pipeline_hints.judged_run`)."""
    weights_left_alone(shown, run)
    want = target(case, "zb-h1")
    for rank, held in enumerate(run["saved_microbatches"]):
        if held > want.held[rank]:
            fail(
                f"{shown}: rank {rank} held the activations of {held} micro-batches at once; "
                f"under ZB-H1 it holds at most {want.held[rank]}. A micro-batch's activations "
                "stay until its W: a W put off longer than the gaps it fills only holds "
                "memory."
            )
    delays = [_delays(acts) for acts in run["actions"]]
    if all(d <= {0} for d in delays):
        why = (
            "Each W ran right after its I: that is 1F1B with its backward cut in two, with "
            "1F1B's bubble. ZB-H1 puts a rank's W's later, into the gaps where it would wait "
            "for a gradient; how many gaps has rank r?"
        )
    else:
        why = (
            f"Your ranks ran {[max(d, default=0) for d in delays]} I's at most between an I "
            "and its W. ZB-H1 keeps 1F1B's order with I in place of B, and each rank puts "
            "its W's off just enough to fill the gaps it would wait in."
        )
    from course_utils.checks.pipeline_hints import order

    order(shown, run, case, "zb-h1", why)


def _delays(actions: list) -> set[int]:
    """For each W of a rank, how many I's the rank ran between its own I and it."""
    seen: list[tuple] = []
    delays = set()
    for a in actions:
        if a.kind == "I":
            seen.append((a.stage, a.microbatch))
        elif a.kind == "W" and (a.stage, a.microbatch) in seen:
            delays.add(len(seen) - 1 - seen.index((a.stage, a.microbatch)))
    return delays
