"""Exercises whose answer is a per-rank program: run on the course's devices, judged on evidence.

A Build exercise of this kind passes the learner's program to its check, e.g.
`check.exercise_7(naive_program)`. The check's cases are `ProgramCase`s: a model, a batch
and a number of ranks, all drawn from numbers (a seed), never objects, so that they can be
sent to a learner's kernel. Each case runs the program with `threads.ranks.run_ranks` and
comes back as the run's evidence, plain data: gradients per rank, bytes, actions, saved
activations, the failure if any (`RankRun.evidence`).

Graded, the kernel makes that call (`wire.call_outcome` sees that a `ProgramCase` says how to
call the answer) and only the evidence crosses. The verdict is computed here, in the
grader, from it: the gradients against those the grader computes itself on one device for
the same case (`reference`), the actions in order, the bytes. A kernel that claims anything
else ("passed", a made-up field) claims nothing: only what the check reads counts, and
evidence of the wrong shape fails.

This module imports torch only when a case is run or judged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from course_utils.checks import check_function, fail
from course_utils.checks.wire import Replay


@dataclass(frozen=True)
class ProgramCase:
    """One trial of a rank program: `devices` ranks, the course's MLP (`d_in` inputs,
    `depth` blocks of `hidden`, `classes` outputs) made from `seed` and cut into
    `devices * chunks` stages, a batch of `batch` rows cut into `microbatches`."""

    devices: int
    batch: int
    hidden: int
    seed: int
    depth: int = 3
    d_in: int = 16
    classes: int = 10
    microbatches: int = 1
    chunks: int = 1

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ProgramCase.{name} must be a whole number >= 1, got {value!r}")

    def __repr__(self) -> str:  # what a learner reads in a message; unique per case (`Replay`)
        shape = f"MLP {self.d_in}-{self.hidden}x{self.depth}-{self.classes}"
        cut = f"{self.chunks} chunks per rank, " if self.chunks > 1 else ""
        return (
            f"{self.devices} ranks, {cut}{shape}, batch {self.batch} in {self.microbatches} "
            f"micro-batch{'es' if self.microbatches > 1 else ''}, seed {self.seed}"
        )

    def build(self):
        """(stages, inputs, targets): the same numbers in every process, whatever the caller's
        own random state (left as it was)."""
        import torch

        from course_utils.models import MLP, partition

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = MLP(self.d_in, self.hidden, self.classes, self.depth)
            x, y = model.example_batch(self.batch, torch.Generator().manual_seed(self.seed))
        return partition(model, self.devices * self.chunks), x, y

    def __course_call__(self, program: Callable) -> dict:
        """Run `program` on this case; the run's evidence (`wire.call_outcome` calls this)."""
        from course_utils.threads.ranks import run_ranks

        stages, x, y = self.build()
        run = run_ranks(program, self.devices, stages, x, y, self.microbatches, raise_failure=False)
        return run.evidence()

    def reference(self) -> dict:
        """What one device computes for this case: each stage's gradients ("stage.name"),
        and the bytes of the activation each stage hands on, per micro-batch."""
        from course_utils.models import loss_fn

        stages, x, y = self.build()
        out, handed = x, []
        for stage in stages:
            out = stage(out)
            handed.append(out.numel() * out.element_size() // self.microbatches)
        loss_fn(out, y).backward()
        grads = {
            f"{s}.{name}": p.grad.detach().clone()
            for s, stage in enumerate(stages)
            for name, p in stage.named_parameters()
        }
        return {"grads": grads, "handed": handed[:-1]}


def as_program(value: Any, what: str) -> Callable[[ProgramCase], Any]:
    """The shape of a rank-program answer (`exercise(naive_program=as_program)`): a function
    of a case that gives the run's evidence. Graded, `value` is already that (a `Replay` of
    the evidence the learner's kernel sent); in a notebook, the case runs the program."""
    call = check_function(value, what)
    if isinstance(value, Replay):
        return call
    return check_function(lambda case: case.__course_call__(value), what)


EVIDENCE = ("world", "actions", "grads", "bytes_sent", "bytes_received", "failure")


def evidence(got: Any, shown: str, case: Any, per_rank: tuple[str, ...] = ()) -> dict:
    """`got` as a run's evidence for `case` (its `devices` ranks), else a failure: whatever
    else a kernel sends (a verdict of its own, a field too few) is not evidence. `per_rank`:
    more fields it must hold, each a list with one item per rank."""
    from course_utils.actions import Action

    ranks = case.devices

    def one_each(value: Any) -> bool:
        return isinstance(value, list) and len(value) == ranks

    fields = [*EVIDENCE[1:5], *per_rank]
    ok = isinstance(got, dict) and all(key in got for key in (*EVIDENCE, *per_rank))
    ok = ok and got["world"] == ranks and all(one_each(got[k]) for k in fields)
    ok = ok and all(isinstance(a, Action) for acts in got["actions"] for a in acts)
    ok = ok and all(isinstance(g, dict) for g in got["grads"])
    ok = ok and all(isinstance(n, int) for k in ("bytes_sent", "bytes_received") for n in got[k])
    failure = got.get("failure") if ok else None
    ok = ok and (failure is None or (isinstance(failure, dict) and "message" in failure))
    if not ok:
        fail(f"{shown} did not come back as the record of a run (run_ranks): it cannot be judged.")
    return got


def gradients_off(got: dict, case: ProgramCase, want: dict) -> dict[int, str]:
    """{rank: "none" | "zero" | "wrong"} for each rank whose gradients are not one device's
    (within float rounding); a rank holds the gradients of the stages it owns."""
    import torch

    owner = {s: s % case.devices for s in range(case.devices * case.chunks)}
    off: dict[int, str] = {}
    for rank in range(case.devices):
        mine = {k: g for k, g in want.items() if owner[int(k.split(".")[0])] == rank}
        theirs = got["grads"][rank]
        if set(theirs) != set(mine) or all(theirs[k] is None for k in mine):
            off[rank] = "none"
            continue
        for k, g in mine.items():
            t = theirs[k]
            if not isinstance(t, torch.Tensor) or t.shape != g.shape:
                off[rank] = "wrong"
            elif not torch.allclose(t.float(), g, rtol=1e-4, atol=1e-6):
                off[rank] = "zero" if not t.any() else "wrong"
            if rank in off:
                break
    return off
