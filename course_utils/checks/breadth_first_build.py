"""The verdict on a breadth-first pipeline written as a per-rank program (Exercise 5.4).

Looping placement (stage s on rank s mod p), two stages per rank. Breadth-first
(Lamy-Poirier 2022, arXiv 2211.05953) takes every micro-batch through one local stage
before the next: all forwards, lowest local stage first, then all backwards, highest local
stage first. Depth-first (Megatron-LM's interleaved 1F1B, Exercise 5.7) has the same bubble
and starts backwards early. Judged from the run's evidence (`programs.evidence`), in the
grader: one device's gradients and each message once (`pipeline_hints.judged_run`), every
forward before the first backward, the stages in breadth-first order, and the order the
ranks ran replayed by the simulator against the course's `make_schedule("breadth-first",
...)`. Only `checks.l05` imports this module.
"""

from __future__ import annotations

from course_utils.checks import fail, pipeline_hints
from course_utils.checks.programs import ProgramCase, evidence, replayed, target

ADVICE = {
    "deadlock": "Run your rank's actions in breadth-first order, receiving what each needs "
    "just before it and sending what it made just after.",
    "tag": "A rank gets a neighbour's messages in the order they were sent: name each message "
    "alike on both sides (what it is, for which stage, for which micro-batch).",
}
HIGHEST_FIRST = (
    "The first gradient comes from the loss, after the model's last stage: on every rank the "
    "gradients reach the highest local stage first, so a rank runs its backwards from its "
    "highest stage down."
)


def judge(got, shown: str, case: ProgramCase) -> dict:
    """Fail with the hint for the program's mistake, unless its run on `case` is a
    breadth-first step with one device's gradients, as fast as the course's."""
    run = evidence(got, shown, case)
    if pipeline_hints.stuck_before_backwards(run, case):
        said = str(run["failure"]["message"]).rstrip(".")
        fail(f"{shown} stopped after every forward, before any backward: {said}. {HIGHEST_FIRST}")
    run = pipeline_hints.judged_run(got, shown, case, ADVICE)
    pipeline_hints.forwards_first(
        shown,
        run,
        ": that is the depth-first habit (interleaved 1F1B, Exercise 5.7). Breadth-first runs "
        "every forward of every local stage first.",
    )
    for rank, actions in enumerate(run["actions"]):
        forwards = [a.stage for a in actions if a.kind == "F"]
        backwards = [a.stage for a in actions if a.kind == "B"]
        if forwards != sorted(forwards) or backwards != sorted(backwards, reverse=True):
            fail(
                f"{shown}: rank {rank} mixes its stages: breadth-first takes every micro-batch "
                "through one local stage before it moves to the next (forwards: lowest stage "
                "first; backwards: highest stage first)."
            )
    want, step = target(case, "breadth-first"), replayed(run, case).makespan
    if step > want.step * (1 + 1e-9):
        fail(
            f"{shown}: the order your ranks ran replays to a step of {step:.4g} units, the "
            f"course's breadth-first takes {want.step:.4g}. Within a stage, take the "
            "micro-batches in the order they arrive: a rank that waits for one its "
            "neighbour only sends later idles."
        )
    return run
