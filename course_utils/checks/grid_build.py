"""The verdict on data x pipeline parallelism written as a per-rank program (Exercise 12.9).

Two replicas of an S-stage pipeline on 2S ranks: rank r holds stage r mod S of replica
r // S (`pipeline_cases.GridCase`). Each replica runs its half of the micro-batches through
its pipeline, then the ranks that hold the same stage (its data-parallel group: r mod S,
r mod S + S) add their gradients, as Megatron-LM's 2-D (pipeline x data) layout does
(Narayanan et al. 2021, arXiv 2104.04473). Judged from the run's evidence, in the grader:
where every message went (a pipeline neighbour of the same replica, or the other rank of the
same stage; no collective over the whole world), each group's sum sent once after the
rank's last backward, the bytes it took, and every rank's gradients against one device's on
the whole batch. `checks.l12` imports its Exercise 12.9 from here.
"""

from __future__ import annotations

from course_utils import checks
from course_utils.checks import DEFAULT, Variant, exercise, fail, numbers, pick
from course_utils.checks.pipeline_cases import GridCase
from course_utils.checks.programs import as_program, evidence, stopped

ADVICE = {
    "deadlock": "Within a replica run the pipeline as GPipe does (each rank's forwards, "
    "then its backwards); only then swap gradients with the rank that holds your stage in "
    "the other replica: send yours first, then receive theirs.",
    "tag": "Name each message alike on both sides and receive in the order the other rank sends.",
    "": "",
}
WORLD = (
    "The step's all-reduce is over a data-parallel group: the ranks that hold the SAME "
    "stage (one per replica), never the whole world, whose ranks hold different stages."
)
EARLY = (
    "A rank's gradients are complete only after its last micro-batch's backward: add them "
    "up across the group once, after it (each backward adds to `.grad`)."
)


def _messages(shown: str, run: dict, case: GridCase) -> str | None:
    """A hint for a message outside the rank's pipeline and its data-parallel group."""
    S, per = case.stages, case.microbatches // case.replicas  # noqa: N806
    if any(run["collectives"][r] for r in range(case.devices)):
        return (
            f"{shown}: your ranks called a collective of `ctx.comm`, over all {case.devices} "
            f"ranks. {WORLD}"
        )
    for rank, sends in enumerate(run["sends"]):
        counts: dict[int, int] = {}
        for to, *_ in sends:
            counts[to] = counts.get(to, 0) + 1
        for to, n in sorted(counts.items()):
            neighbour = to // S == rank // S and abs(to - rank) == 1
            if to == case.partner(rank) or (neighbour and n <= per):
                continue
            return (
                f"{shown}: rank {rank} (stage {rank % S}) sent rank {to} (stage {to % S}) "
                f"{n} message{'s' if n > 1 else ''}. {WORLD}"
            )
    return None


def _early(shown: str, run: dict, case: GridCase) -> str | None:
    """A hint for a gradient sum sent before the rank's last backward."""
    per = case.microbatches // case.replicas
    for rank, sends in enumerate(run["sends"]):
        names = [str(a) for a in run["actions"][rank]]
        for to, _, _, after in sends:
            done = names[: names.index(after) + 1] if after in names else []
            backwards = sum(1 for a in run["actions"][rank][: len(done)] if a.is_backward)
            if to == case.partner(rank) and backwards < per:
                return (
                    f"{shown}: rank {rank} sent its gradients to rank {to} after {after}, "
                    f"{backwards} of its {per} micro-batches' backwards. {EARLY}"
                )
    return None


def _gradients(shown: str, run: dict, case: GridCase, want: dict) -> str | None:
    import torch

    S = case.stages  # noqa: N806
    for rank in range(case.devices):
        theirs = run["grads"][rank]
        mine = {k.split(".", 1)[1]: g for k, g in want.items() if int(k.split(".")[0]) == rank % S}
        got = {k.split(".", 1)[1]: g for k, g in theirs.items()}
        if set(got) != set(mine) or any(g is None for g in got.values()):
            return (
                f"{shown}: rank {rank}'s gradients are None: its backward never reached its stage."
            )
        if all(torch.allclose(got[k].float(), g, rtol=1e-4, atol=1e-6) for k, g in mine.items()):
            continue
        ratios = {
            round(float((got[k] * g).sum() / (g * g).sum()), 3)
            for k, g in mine.items()
            if float((g * g).sum()) > 0
        }
        if len(ratios) == 1 and (ratio := ratios.pop()) not in (0.0, 1.0):
            return (
                f"{shown}: rank {rank}'s gradients are {ratio:g} times one device's: an "
                "average over the wrong count. `ctx.loss` already divides each micro-batch's "
                "loss by all the micro-batches of the whole batch, so each replica's gradients "
                "are its share of one mean: what does the group do with shares?"
            )
        return (
            f"{shown}: rank {rank}'s gradients are not one device's on the whole batch. Each "
            "rank's sum must cover its stage's gradients from every replica, each once."
        )
    return None


def judge(got, shown: str, case: GridCase) -> dict:
    """Fail with the hint for the program's mistake, unless its run on `case` gives every
    rank one device's gradients, each group summed once with the bytes it needs."""
    run = evidence(got, shown, case)
    for hint in (_messages(shown, run, case), _early(shown, run, case)):
        if hint:
            fail(hint)
    if run["failure"] is not None:
        fail(stopped(shown, run["failure"], ADVICE))
    want = case.reference()["grads"]
    hint = _gradients(shown, run, case, want)
    if hint:
        fail(hint)
    S = case.stages  # noqa: N806
    for rank, sends in enumerate(run["sends"]):
        summed = sum(n for to, _, n, _ in sends if to == case.partner(rank))
        need = sum(
            g.numel() * g.element_size()
            for k, g in want.items()
            if int(k.split(".")[0]) == rank % S
        )
        if summed != need:
            fail(
                f"{shown}: rank {rank} sent {summed} bytes of gradients to its group; its "
                f"stage's gradients are {need} bytes. With two replicas each rank sends its "
                "gradients (or its share of them) once."
            )
    return run


def group_bytes(run, case: GridCase) -> list[int]:
    """The bytes each rank sent to its data-parallel group (a `RankRun` or its evidence)."""
    sends = run["sends"] if isinstance(run, dict) else run.sends
    return [sum(n for to, _, n, _ in s if to == case.partner(r)) for r, s in enumerate(sends)]


# --------------------------------------------------------------------------- Exercise 12.9

given_9 = numbers(m=pick("9m", 4, [2, 6, 8]))


def case_9(g) -> GridCase:
    """The learner's own grid: 2 replicas x 2 stages on 4 ranks, `g.m` micro-batches."""
    return GridCase(
        devices=4, stages=2, microbatches=g.m, batch=2 * g.m, hidden=16, depth=3, seed=12
    )


def cases_9(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own grid, then two more: 2 x 2 and 2 replicas of 3 stages (6 ranks),
    other sizes and seeds: drawn from the student's name in a notebook, secret in the grader."""
    rng = variant.cases("9")
    cases = [case_9(given_9(variant))]
    for stages in (2, 3):
        m = 2 * rng.randint(1, 3)
        cases.append(
            GridCase(
                devices=2 * stages,
                stages=stages,
                microbatches=m,
                batch=m * rng.choice([1, 2, 3]),
                hidden=rng.choice([8, 12, 20]),
                depth=stages + rng.randint(0, 2),
                seed=rng.randint(1, 10**6),
            )
        )
    return {"grid_program": [(case,) for case in cases]}


@exercise(given_9, grid_program=as_program, points=3, partial=True, lesson=12)
def exercise_9(grid_program, variant) -> str:
    """Build data x pipeline parallelism: 2 replicas of a pipeline, gradients summed per stage."""
    cases = cases_9(variant)["grid_program"]
    runs = [
        judge(got, shown, case) for (case,), shown, got in checks.each_call(grid_program, cases)
    ]
    mine = group_bytes(runs[0], cases[0][0])
    return (
        f"Right: on your 2 x 2 grid and two others every rank's gradients equal one device's on "
        f"the whole batch; each rank summed its stage with the other replica only, after its "
        f"last backward, sending {mine} bytes (its stage's gradients, once)."
    )
