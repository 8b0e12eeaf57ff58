"""What a pipeline program's run says about its mistake: one hint per mistake learners make.

The Build exercises of lessons 02, 04 and 05 ask for a pipeline schedule written as a per-rank
program (GPipe, 1F1B, interleaved 1F1B). Their checks share the judging here, in the grader,
from the run's evidence (`programs.evidence`): a run that stopped is explained from its
failure (the last stage without its loss, a message to the wrong neighbour, a receive of the
wrong micro-batch, a deadlock, a leaf that does not want a gradient); a run that finished
must have marked every action once, computed one device's gradients on every rank and sent
each activation on and each gradient back exactly once. What is particular to a schedule
(its order, its memory) each lesson judges after `judged_run`, with `memory` for the peak of
saved activations. Only the check modules' exercise functions import this module.
"""

from __future__ import annotations

import re
from typing import Any

from course_utils.actions import KIND_NAMES
from course_utils.checks import fail
from course_utils.checks.programs import ProgramCase, evidence, gradients_off, replayed, target

_PEER = re.compile(r"(sent a message to|waited for a message from) rank (-?\d+)")

LEAF = (
    "What a rank receives is a plain tensor (a message carries no graph), so its gradient "
    "stays None: make it a leaf that wants one, `ctx.recv(...).requires_grad_()`."
)
LOSS = (
    "The last stage forgot the loss: no rank comes after it, so its forward ends with "
    "`ctx.loss(out, mb)` and its backward starts from that loss."
)


def _owner_of_last(case: ProgramCase) -> int:
    return case.owner(case.devices * case.chunks - 1)


def _peer(failure: dict, run: dict, case: ProgramCase) -> str:
    """The hint for a message to (or from) a rank that is not the neighbour it should be."""
    rank, found = failure.get("rank"), _PEER.search(str(failure["message"]))
    did, other = (found.group(1), int(found.group(2))) if found else ("", -1)
    done = run["actions"][rank] if isinstance(rank, int) and rank < len(run["actions"]) else []
    if case.chunks > 1:
        return (
            "With looping placement stage s lives on rank s mod p: the neighbour of a chunk "
            "is the rank of the stage next to it, and the last rank's first chunk hands on "
            "to rank 0."
        )
    if rank == _owner_of_last(case) and did.startswith("waited") and other >= case.devices:
        return LOSS
    if done and done[-1].is_backward:
        return (
            "A gradient sent to the wrong neighbour: a gradient goes back to the rank its "
            "activation came from, the one before, never on to the next."
        )
    return "An activation goes on to the next rank, a gradient back to the one before."


def failure_hint(shown: str, failure: dict, run: dict, case: ProgramCase, advice: dict) -> str:
    """The hint for a run that stopped with `failure` (its kind, rank and message); `advice`
    adds the exercise's own words for a deadlock ("deadlock") or a receive out of order
    ("tag")."""
    kind, rank, said = failure.get("kind"), failure.get("rank"), str(failure["message"])
    said = said.rstrip(".")
    if kind == "deadlock":
        return f"{shown} never finished: {said}. {advice['deadlock']}"
    if kind == "tag":
        return f"{shown}: {said}. {advice['tag']}"
    if kind == "peer":
        return f"{shown}: {said}. {_peer(failure, run, case)}"
    if kind == "not a tensor" and "None" in said:
        return f"{shown}: {said}. {LEAF}"
    if kind == "call" and "chunk" in said:
        return (
            f"{shown}: {said}. `ctx.forward(mb, chunk)` names the micro-batch and the chunk: "
            "the position of the stage among the rank's own, `ctx.stages`, not its number."
        )
    if "implicitly created only for scalar" in said:
        if rank == _owner_of_last(case):
            return f"{shown}: {said}. {LOSS}"
        return (
            f"{shown}: {said}. A rank before the last starts its backward from its output "
            "with the gradient that came back, `torch.autograd.backward(out, grad)`."
        )
    if "does not require grad" in said:
        return (
            f"{shown}: {said}. The output a rank keeps for its backward must keep its graph: "
            "`send` already sends a copy without it."
        )
    if "backward through the graph a second time" in said:
        return (
            f"{shown}: {said}. Each micro-batch's backward runs once per stage, on the output "
            "of that micro-batch's own forward."
        )
    if kind == "unreceived":
        return f"{shown}: {said}. Every message is received once, by the rank that needs it."
    return f"{shown}: {said}."


def _unmarked(shown: str, run: dict, case: ProgramCase) -> str | None:
    """A hint if the ranks did not mark exactly one F and one B per stage and micro-batch."""
    from course_utils.pipeline.simulate import structure_problems

    for rank, actions in enumerate(run["actions"]):
        kinds = {a.kind for a in actions}
        if not kinds >= {"F", "B"} and not kinds & {"I", "W"}:
            missing = " nor ".join(KIND_NAMES[k] for k in "FB" if k not in kinds)
            return (
                f"{shown}: rank {rank} marked no {missing}. Put each micro-batch's forward "
                "inside `with ctx.forward(mb):` and its backward inside `with "
                "ctx.backward(mb):`, so the harness sees (and times) them."
            )
    stages = case.devices * case.chunks
    problems = structure_problems(run["actions"], stages, case.microbatches)
    if problems:
        return (
            f"{shown}: the actions the ranks marked are not one step: {problems[0]}. Every "
            "stage runs one forward and one backward of every micro-batch, each marked once."
        )
    return None


def _gradients(shown: str, run: dict, case: ProgramCase, want: dict) -> str | None:
    off = gradients_off(run, case, want)
    last = _owner_of_last(case)
    if off.get(last) not in (None, "none"):
        return (
            f"{shown}: the last stage's gradients (rank {last}) are not one device's. Each "
            "micro-batch's loss is `ctx.loss(out, mb)`, which divides by the number of "
            "micro-batches, and each is backpropagated once."
        )
    for rank, how in sorted(off.items()):
        if how == "none":
            return (
                f"{shown}: rank {rank}'s gradients are None: its backward never reached its "
                "stage. It starts from the output it kept, with the gradient that came back: "
                "`torch.autograd.backward(out, grad)`."
            )
        if how == "zero":
            return (
                f"{shown}: rank {rank}'s gradients are all zero: the gradients it got back "
                f"were zeros. {LEAF}"
            )
        return (
            f"{shown}: rank {rank}'s gradients are not one device's while the last stage's "
            "are right: a gradient that comes back must go through the output of its own "
            "micro-batch. Keep each micro-batch's output apart, and tag messages with the "
            "micro-batch so a mix-up is caught."
        )
    return None


def _bytes(shown: str, run: dict, case: ProgramCase, handed: list[int]) -> str | None:
    """A hint unless each activation went on once and each gradient back once."""
    stages, m = case.devices * case.chunks, case.microbatches
    want = [0] * case.devices
    for s in range(stages - 1):  # a boundary inside a rank sends nothing
        here, there = case.owner(s), case.owner(s + 1)
        if here != there:
            want[here] += m * handed[s]  # the activation on
            want[there] += m * handed[s]  # its gradient back
    if run["bytes_sent"] != want:
        return (
            f"{shown}: the ranks sent {run['bytes_sent']} bytes. A step sends each "
            "micro-batch's activation on once and its gradient back once at every stage "
            f"boundary: {want} bytes."
        )
    return None


def judged_run(got: Any, shown: str, case: ProgramCase, advice: dict) -> dict:
    """The run's evidence, once it shows a whole step with one device's gradients and each
    message sent once; else fails with the hint for its mistake."""
    run = evidence(got, shown, case)
    if run["failure"] is not None:
        fail(failure_hint(shown, run["failure"], run, case, advice))
    one_device = case.reference()
    for hint in (
        _unmarked(shown, run, case),
        _gradients(shown, run, case, one_device["grads"]),
        _bytes(shown, run, case, one_device["handed"]),
    ):
        if hint:
            fail(hint)
    return run


def early_backward(run: dict) -> int | None:
    """The first rank that runs a backward before its last forward (None: the run is
    GPipe-shaped, every rank's forwards before its backwards)."""
    for rank, actions in enumerate(run["actions"]):
        kinds = [a.kind for a in actions]
        if "B" in kinds and "F" in kinds[kinds.index("B") :]:
            return rank
    return None


def forwards_first(shown: str, run: dict, why: str) -> None:
    """Fail unless every rank ran all its forwards before its first backward; `why` says
    which schedule asks for that."""
    rank = early_backward(run)
    if rank is not None:
        fail(f"{shown}: rank {rank} started a backward before its last forward{why}")


def stuck_before_backwards(run: dict, case: ProgramCase) -> bool:
    """The run stopped with no backward run anywhere, its failing rank (not the loss's
    backward) after all of its forwards: a rank waits for a gradient that only a backward
    it has not run yet would start (a wrong order of its chunks' backwards)."""
    failure = run["failure"]
    if failure is None:
        return False
    rank, said = failure.get("rank"), str(failure["message"])
    done = run["actions"][rank] if isinstance(rank, int) and 0 <= rank < case.devices else []
    no_backward = not any(a.is_backward for acts in run["actions"] for a in acts)
    at_loss = f"in {case.devices * case.chunks - 1}B" in said
    return no_backward and len(done) == case.chunks * case.microbatches and not at_loss


def memory(shown: str, run: dict, case: ProgramCase, most: int, gpipe: str) -> None:
    """Fail unless rank 0 held at most `most` (chunk, micro-batch)s of saved activations at
    once, naming why: the order of GPipe (`gpipe` says what to change), activations kept
    after their backward, or too long a warm-up."""
    held, kib = run["saved_microbatches"][0], run["saved_bytes"][0] / 1024
    if held <= most:
        return
    what = f"{shown}: rank 0 held the activations of {held} micro-batch"
    what += f"{' chunks' if case.chunks > 1 else 'es'} at once ({kib:.1f} KiB), more than {most}"
    if early_backward(run) is None:
        fail(f"{what}: every forward before the first backward, as GPipe does. {gpipe}")
    ordered = replayed(run, case).peak_activations[0]
    if ordered <= most:
        fail(
            f"{what}, though its order holds {ordered}: activations kept after their "
            "backward. A backward frees what its forward saved unless told to keep it "
            "(`retain_graph=True`): let each backward free its micro-batch."
        )
    warmup = next((i for i, a in enumerate(run["actions"][0]) if a.is_backward), 0)
    fail(
        f"{what}: it ran {warmup} forwards before its first backward. A backward can start "
        "once its micro-batch has gone down the pipeline and its gradient has come back: "
        "how many forwards does rank 0 need before that?"
    )


def order(shown: str, run: dict, case: ProgramCase, name: str, why: str) -> None:
    """Fail unless the order the ranks ran, replayed by the simulator with the model's
    costs, gives schedule `name`'s step; `why` says what to look at."""
    want, step = target(case, name), replayed(run, case).makespan
    if abs(step - want.step) > 1e-9 * want.step:
        fail(
            f"{shown}: the order your ranks ran replays to a step of {step:.4g} units, "
            f"{want.label}'s is {want.step:.4g}. {why}"
        )
