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

A pipeline schedule written as a program (Exercises 2.8, 4.7, 5.7) is judged on its order
too: `replayed` gives the simulator's step for the order each rank ran, with the model's own
stage costs (`ProgramCase.costs`), and `target` the step and memory of the registry's schedule
on the same case, which the notebook prints before the learner starts (the LLM-Training-
Puzzles way) and against the learner's run after (`scorecard`).

The Builds of lessons 08 to 10 have cases of their own, drawn from numbers too: `ShardCase`
(an FSDP step: the MLP sharded over the ranks, `parallel.fsdp.rank_program`), `AttentionCase`
(ring attention over a sequence split in blocks, `parallel.context_parallel.rank_program`)
and `DispatchCase` (an MoE layer's experts over the ranks, `parallel.moe.rank_program`).
Their runs are watched (`threads.watched`): the evidence adds, per rank, each collective
with the bytes it sent to every rank, each message with what it carried, and the buffers
the rank held at every moment; and what the program left (its shards) or returned.

This module imports torch only when a case is run or judged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from course_utils.checks import check_function, fail
from course_utils.checks.rank_cases import seeded_mlp, whole_numbers
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
        whole_numbers(self)

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
        from course_utils.models import partition

        model, x, y = seeded_mlp(
            self.seed, self.d_in, self.hidden, self.classes, self.depth, self.batch
        )
        return partition(model, self.devices * self.chunks), x, y

    def run(self, program: Callable, microbatches: int | None = None, raise_failure=True):
        """`run_ranks(program, ...)` on this case (looping placement): the `RankRun`; with
        `microbatches=1` the whole batch goes through as one piece."""
        from course_utils.threads.ranks import run_ranks

        stages, x, y = self.build()
        m = self.microbatches if microbatches is None else microbatches
        return run_ranks(program, self.devices, stages, x, y, m, raise_failure=raise_failure)

    def __course_call__(self, program: Callable) -> dict:
        """Run `program` on this case; the run's evidence (`wire.call_outcome` calls this)."""
        return self.run(program, raise_failure=False).evidence()

    def owner(self, stage: int) -> int:
        """The rank that holds `stage` (looping placement)."""
        return stage % self.devices

    def costs(self):
        """The simulator's costs for this model: a stage's forward in proportion to its
        parameters (the mean stage's forward is 1 unit), its backward twice that."""
        from course_utils.pipeline import CostModel

        stages, _, _ = self.build()
        sizes = [sum(p.numel() for p in stage.parameters()) for stage in stages]
        forward = [n * len(sizes) / sum(sizes) for n in sizes]
        return CostModel(stage_forward=forward, stage_backward=[2 * f for f in forward])

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


@dataclass(frozen=True)
class ShardCase:
    """One trial of an FSDP step (Exercise 8.6): the course's MLP (`d_in` inputs, `depth`
    blocks of `hidden`, `classes` outputs) made from `seed`, sharded over `devices` ranks,
    each with `batch` / `devices` rows of the batch."""

    devices: int
    batch: int
    hidden: int
    seed: int
    depth: int = 2
    d_in: int = 16
    classes: int = 10

    def __post_init__(self) -> None:
        whole_numbers(self)

    def __repr__(self) -> str:
        shape = f"MLP {self.d_in}-{self.hidden}x{self.depth}-{self.classes}"
        return f"{self.devices} ranks, {shape}, batch {self.batch}, seed {self.seed}"

    def build(self):
        """(model, inputs, targets)."""
        return seeded_mlp(self.seed, self.d_in, self.hidden, self.classes, self.depth, self.batch)

    def __course_call__(self, program: Callable) -> dict:
        from course_utils.parallel.fsdp.rank_program import run_fsdp_program, shards

        model, x, y = self.build()
        run = run_fsdp_program(program, model, self.devices, x, y, raise_failure=False)
        return run.evidence() | {"shards": shards(run)}


@dataclass(frozen=True)
class AttentionCase:
    """One trial of causal ring attention (Exercise 9.2): `devices` ranks holding `tokens`
    tokens each of dimension `dim`, made from `seed`; with `sharp` > 1 the queries are
    scaled by it (sharp attention: log-sum-exps far above float32's exp range)."""

    devices: int
    tokens: int
    dim: int
    seed: int
    sharp: int = 1

    def __post_init__(self) -> None:
        whole_numbers(self)

    def __repr__(self) -> str:
        sharp = f", queries x {self.sharp} (sharp attention)" if self.sharp > 1 else ""
        return (
            f"{self.devices} ranks, {self.tokens} tokens each of dim {self.dim}, causal, "
            f"seed {self.seed}{sharp}"
        )

    def build(self):
        """(q, k, v), each (devices x tokens, dim)."""
        import torch

        gen = torch.Generator().manual_seed(self.seed)
        shape = (self.devices * self.tokens, self.dim)
        q, k, v = (torch.randn(shape, generator=gen) for _ in range(3))
        return q * self.sharp, k, v

    def __course_call__(self, program: Callable) -> dict:
        from course_utils.parallel.context_parallel.rank_program import outputs, run_ring_program

        q, k, v = self.build()
        run = run_ring_program(program, q, k, v, self.devices, raise_failure=False)
        return run.evidence() | {"outputs": _returned(outputs(run))}


@dataclass(frozen=True)
class DispatchCase:
    """One trial of an expert-parallel MoE layer (Exercise 10.8): `experts` experts of an MoE
    block (`d_model`, hidden 2 d_model, top-`top_k`, router leaning to expert 0) made from
    `seed`, over `devices` ranks holding `tokens` tokens each."""

    devices: int
    experts: int
    top_k: int
    d_model: int
    tokens: int
    seed: int

    def __post_init__(self) -> None:
        whole_numbers(self)

    def __repr__(self) -> str:
        return (
            f"{self.devices} ranks, {self.experts} experts, top-{self.top_k}, d_model "
            f"{self.d_model}, {self.tokens} tokens per rank, seed {self.seed}"
        )

    def build(self):
        """(moe, x): the block (no capacity: no token is dropped) and every rank's tokens."""
        import torch

        from course_utils.parallel.moe import MoE

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            moe = MoE(self.d_model, 2 * self.d_model, self.experts, self.top_k, None, skew=0.5)
        gen = torch.Generator().manual_seed(self.seed)
        return moe, torch.randn(self.devices * self.tokens, self.d_model, generator=gen)

    def __course_call__(self, program: Callable) -> dict:
        from course_utils.parallel.moe.rank_program import run_moe_program

        moe, x = self.build()
        run = run_moe_program(program, moe, x, self.devices, raise_failure=False)
        return run.evidence() | {"outputs": _returned(run.results)}


def _returned(values: list) -> list:
    """What the ranks' programs returned, as data: a tensor, or the name of what else it was."""
    import torch

    return [
        v.detach().clone() if isinstance(v, torch.Tensor) else f"a {type(v).__name__}"
        for v in values
    ]


def as_program(value: Any, what: str) -> Callable[[ProgramCase], Any]:
    """The shape of a rank-program answer (`exercise(naive_program=as_program)`): a function
    of a case that gives the run's evidence. Graded, `value` is already that (a `Replay` of
    the evidence the learner's kernel sent); in a notebook, the case runs the program."""
    call = check_function(value, what)
    if isinstance(value, Replay):
        return call
    return check_function(lambda case: case.__course_call__(value), what)


EVIDENCE = ("world", "actions", "grads", "bytes_sent", "bytes_received", "sends")
COUNTS = ("bytes_sent", "bytes_received", "saved_bytes", "saved_microbatches")


def evidence(got: Any, shown: str, case: Any, per_rank: tuple[str, ...] = ()) -> dict:
    """`got` as a run's evidence for `case` (its `devices` ranks), else a failure: whatever
    else a kernel sends (a verdict of its own, a field too few) is not evidence. `per_rank`:
    more fields it must hold, each a list with one item per rank."""
    from course_utils.actions import Action

    ranks = case.devices

    def one_each(value: Any) -> bool:
        return isinstance(value, list) and len(value) == ranks

    fields = [*EVIDENCE[1:], *COUNTS, *per_rank]
    ok = isinstance(got, dict) and all(key in got for key in (*EVIDENCE, *COUNTS, "failure"))
    ok = ok and all(key in got for key in per_rank)
    ok = ok and got["world"] == ranks and all(one_each(got[k]) for k in fields)
    ok = ok and all(isinstance(a, Action) for acts in got["actions"] for a in acts)
    ok = ok and all(isinstance(g, dict) for g in got["grads"])
    ok = ok and all(isinstance(n, int) and not isinstance(n, bool) for k in COUNTS for n in got[k])
    failure = got.get("failure") if ok else None
    ok = ok and (failure is None or (isinstance(failure, dict) and "message" in failure))
    if not ok:
        fail(f"{shown} did not come back as the record of a run (run_ranks): it cannot be judged.")
    return got


WATCHED = ("collectives", "messages", "buffers", "snapshots", "fixed")


def watched(got: Any, shown: str, case: Any, left: str) -> dict:
    """`got` as a watched run's evidence for `case` (`threads.watched`), with what the
    program left per rank under `left` ("shards", "outputs"), else a failure."""
    ranks = case.devices
    ok = isinstance(got, dict) and got.get("world") == ranks and "failure" in got
    ok = ok and all(
        isinstance(got.get(k), list) and len(got[k]) == ranks for k in ("watched", left)
    )
    ok = ok and all(isinstance(w, dict) and all(k in w for k in WATCHED) for w in got["watched"])
    ok = ok and all(_readable(w) for w in got["watched"])
    failure = got.get("failure") if ok else None
    ok = ok and (failure is None or (isinstance(failure, dict) and "message" in failure))
    if not ok:
        fail(f"{shown} did not come back as the record of a run (run_ranks): it cannot be judged.")
    return got


def _readable(watch: dict) -> bool:
    """Every number of a watch's evidence a whole number, where a number goes."""
    try:
        numbers = [b for c in watch["collectives"] for b in c[1]] + [watch["fixed"]]
        numbers += [n for m in watch["messages"] for n in (m[0], m[2])]
        numbers += [b[1] for b in watch["buffers"]]
        held = [h for snap in watch["snapshots"] for h in snap]
        numbers += [n for h in held for n in h]
        ok = all(0 <= h[0] < len(watch["buffers"]) for h in held)
    except (TypeError, IndexError, KeyError):
        return False
    return ok and all(isinstance(n, int) and not isinstance(n, bool) for n in numbers)


def stopped(shown: str, failure: dict, advice: dict[str, str]) -> str:
    """The hint for a run that stopped with `failure`: what it says, then the `advice` for
    its kind ("deadlock", "unreceived", ...; under "" the advice for any other kind)."""
    kind, said = failure.get("kind"), str(failure["message"])
    start = f"{shown} never finished" if kind == "deadlock" else shown
    return f"{start}: {said}. {advice.get(str(kind), advice.get('', ''))}".rstrip()


def held_at_peak(watch: dict) -> tuple[int, list[str]]:
    """(the most bytes a rank held at once, what it held then), from its snapshots."""
    best, names = int(watch["fixed"]), []
    for snap in watch["snapshots"]:
        total = int(watch["fixed"]) + sum(int(n) for _, n in snap)
        if total > best:
            best, names = total, [str(watch["buffers"][int(i)][0]) for i, _ in snap]
    return best, names


def gradients_off(got: dict, case: ProgramCase, want: dict) -> dict[int, str]:
    """{rank: "none" | "zero" | "wrong"} for each rank whose gradients are not one device's
    (within float rounding); a rank holds the gradients of the stages it owns."""
    import torch

    owner = {s: case.owner(s) for s in range(case.devices * case.chunks)}
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


# --------------------------------------------------------------------------- pipelines


def drawn_case(rng, devices: int, microbatches: int, chunks: int = 1) -> ProgramCase:
    """A pipeline of `devices` ranks of `chunks` stages and `microbatches` micro-batches,
    whose model (width, depth, seed) and rows per micro-batch `rng` draws."""
    return ProgramCase(
        devices=devices,
        chunks=chunks,
        microbatches=microbatches,
        batch=microbatches * rng.choice([1, 2, 3]),
        hidden=rng.choice([8, 12, 20]),
        depth=devices * chunks - 1 + rng.randint(0, 2),
        seed=rng.randint(1, 10**6),
    )


def _actions(run) -> list[list]:
    return run["actions"] if isinstance(run, dict) else run.actions


def recorded(run, case: ProgramCase):
    """The order each rank ran (a `RankRun` or its evidence) as a `Schedule`."""
    from course_utils.actions import Schedule

    actions = tuple(tuple(acts) for acts in _actions(run))
    return Schedule("your program", case.devices * case.chunks, case.microbatches, actions)


def replayed(run, case: ProgramCase):
    """The simulator's timeline of the order each rank ran, with the model's costs (raises
    `ScheduleError` saying what cannot run: an action missing or twice, a wait for ever)."""
    from course_utils.pipeline import simulate

    return simulate(recorded(run, case), case.costs())


@dataclass(frozen=True)
class Target:
    """What schedule `label` gives on a case: its simulated step (units of the model's
    costs) and the most (chunk, micro-batch)s each rank holds at once."""

    label: str
    step: float
    held: tuple[int, ...]
    chunks: int = 1

    def __str__(self) -> str:
        what = "micro-batch chunks" if self.chunks > 1 else "micro-batches"
        return (
            f"Target ({self.label}, simulated with this model's stage costs): a step of "
            f"{self.step:.4g} units; rank 0 holds at most {self.held[0]} {what} at once."
        )


def target(case: ProgramCase, name: str) -> Target:
    """Schedule `name`'s target on `case` (the registry's schedule, simulated)."""
    from course_utils.pipeline import SCHEDULES, make_schedule, simulate

    schedule = make_schedule(name, case.devices, case.microbatches, case.chunks)
    timeline = simulate(schedule, case.costs())
    held = tuple(int(h) for h in timeline.peak_activations or ())
    return Target(SCHEDULES[name].label, timeline.makespan, held, case.chunks)


def scorecard(run, case: ProgramCase, name: str | Target, naive=None) -> str:
    """A run of the learner's program (`RankRun`) against `name`'s target (or a `Target`),
    as lines of text: the replayed step, rank 0's peak of saved activations, the measured
    step, and with `naive` (the same program with one micro-batch) the measured speed-up."""
    want = name if isinstance(name, Target) else target(case, name)
    try:
        step = f"{replayed(run, case).makespan:.4g} units"
    except Exception as exc:  # noqa: BLE001 - an order that cannot be replayed says why
        step = f"cannot be replayed ({exc})"
    kib = run.saved_bytes[0] / 1024
    lines = [
        f"{'':24}{'yours':<30}target ({want.label})",
        f"{'step, order replayed':<24}{step:<30}{want.step:.4g} units",
        f"{'rank 0 holds at most':<24}{f'{run.saved_microbatches[0]} ({kib:.1f} KiB)':<30}"
        f"{want.held[0]}",
        f"measured on the virtual clock: a step of {1e3 * run.timeline.makespan:.2f} ms",
    ]
    if naive is not None:
        from course_utils.pipeline import make_schedule, simulate

        ratio = naive.timeline.makespan / run.timeline.makespan
        ideal = make_schedule("naive", case.devices, case.microbatches)
        predicted = simulate(ideal, case.costs()).makespan / want.step
        lines.append(
            f"with one micro-batch (lesson 01's naive schedule) {1e3 * naive.timeline.makespan:.2f}"
            f" ms: a speed-up of {ratio:.2f}x measured, {predicted:.2f}x simulated"
        )
    return "\n".join(lines)
