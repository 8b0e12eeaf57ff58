"""The per-worker program of one ZeRO step: which collectives are issued, waited for, computed.

The threads (`trainer`) and the simulator (`costs.simulate_fsdp`) run this same program,
so a measured and a predicted timeline differ only in the durations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from course_utils import validation
from course_utils.errors import CourseInputError

STAGES = (1, 2, 3)
MAX_WORKERS = 16
MAX_PREFETCH = 16
MAX_MICROBATCHES = 64


# -- the per-worker program: shared by the threads and by the simulator ----------------------


@dataclass(frozen=True)
class CommOp:
    """One collective a worker's communication thread runs: an all-gather or a reduce-scatter."""

    kind: str  # "UNSHARD" (all-gather of a layer) or "REDUCE_GRAD" (reduce-scatter of its grads)
    layer: int
    microbatch: int | None
    label: str


@dataclass(frozen=True)
class Instr:
    """One instruction of a worker's compute thread.

    op: "issue" (hand `comm` to the communication thread and go on), "wait" (until `comm`
    is done), "F" / "B" (forward / backward of `layer` on `microbatch`), "free" (reshard:
    drop the gathered copy of `layer`) or "optimizer" (Adam on this worker's shards).
    """

    op: str
    layer: int | None = None
    microbatch: int | None = None
    comm: int | None = None  # index into the program's list of CommOps


def fsdp_program(
    num_layers: int, stage: int, prefetch: int, microbatches: int = 1
) -> tuple[list[Instr], list[CommOp]]:
    """What every worker's compute thread does in one step, in order, and its collectives.

    All workers run the same program, so they issue the same collectives in the same order
    (as they must: a ring only completes when every rank takes part).

    Stage 3: every use of a layer (its forward, then its backward, per micro-batch) needs
    the layer gathered. Gathers are issued in order of use, up to `prefetch` uses ahead of
    the one being computed, but never for a layer whose previous gathered copy is still
    held (at the turn from forward to backward the last layer is freed and gathered
    again, as ZeRO-3 describes; FSDP2 by default does not reshard its root module after
    the forward, for this reason).
    """
    validation.integer(num_layers, "num_layers", 1, 10**6)
    check_one_of(stage, "stage", STAGES)
    validation.integer(prefetch, "prefetch", 0, MAX_PREFETCH)
    validation.integer(microbatches, "microbatches", 1, MAX_MICROBATCHES)
    program: list[Instr] = []
    comms: list[CommOp] = []
    last = num_layers - 1

    def issue(op: CommOp) -> int:
        comms.append(op)
        program.append(Instr("issue", op.layer, op.microbatch, len(comms) - 1))
        return len(comms) - 1

    reduce_scatters = []
    if stage == 3:
        uses = [
            (mb, kind, layer)
            for mb in range(microbatches)
            for kind, order in (("F", range(num_layers)), ("B", range(last, -1, -1)))
            for layer in order
        ]
        gather_of: dict[int, int] = {}  # use index -> comm index
        held: set[int] = set()  # layers gathered (or being gathered) and not yet freed
        next_use = 0

        def issue_gathers(up_to: int) -> None:
            nonlocal next_use
            while next_use <= min(up_to, len(uses) - 1) and uses[next_use][2] not in held:
                mb, kind, layer = uses[next_use]
                phase = "" if kind == "F" else " (bwd)"
                gather_of[next_use] = issue(
                    CommOp("UNSHARD", layer, mb, f"all-gather L{layer}{phase}")
                )
                held.add(layer)
                next_use += 1

        for i, (mb, kind, layer) in enumerate(uses):
            issue_gathers(i + prefetch)
            program.append(Instr("wait", layer, mb, gather_of[i]))
            program.append(Instr(kind, layer, mb))
            if kind == "B":
                op = CommOp("REDUCE_GRAD", layer, mb, f"reduce-scatter L{layer}")
                reduce_scatters.append(issue(op))
            program.append(Instr("free", layer, mb))
            held.discard(layer)
    else:
        for mb in range(microbatches):
            program += [Instr("F", layer, mb) for layer in range(num_layers)]
            for layer in range(last, -1, -1):
                program.append(Instr("B", layer, mb))
                # stage 1 keeps the full gradient and accumulates it over the micro-batches;
                # stage 2 frees it, so it reduce-scatters after every micro-batch
                if stage == 2 or mb == microbatches - 1:
                    op = CommOp("REDUCE_GRAD", layer, mb, f"reduce-scatter L{layer}")
                    reduce_scatters.append(issue(op))
    program += [Instr("wait", comms[c].layer, comms[c].microbatch, c) for c in reduce_scatters]
    program.append(Instr("optimizer"))
    if stage in (1, 2):  # everybody needs everybody's updated slice of the parameters
        gathers = [
            issue(CommOp("UNSHARD", layer, None, f"all-gather L{layer} params"))
            for layer in range(num_layers)
        ]
        program += [Instr("wait", comms[c].layer, None, c) for c in gathers]
    return program, comms


def check_one_of(value: object, name: str, allowed: Sequence[object]) -> None:
    """Refuse a `value` not in `allowed` (a bool is refused even where 0 or 1 is allowed)."""
    if isinstance(value, bool) or value not in allowed:
        raise CourseInputError(
            f"{name} must be one of {', '.join(map(str, allowed))}, got {value!r}"
        )
