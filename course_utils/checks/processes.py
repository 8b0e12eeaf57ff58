"""Exercises whose answer is a worker file: run on real processes, judged on evidence.

Lesson 13's Builds pass a `Worker` (a function of a file the learner wrote with
`%%writefile`) to their check: `check.exercise_2(Worker("ring_worker.py", "ring_sum"))`.
Their cases, `RingCase` and `DDPCase`, are numbers (a seed, sizes), never objects, so that
they can be sent to a learner's kernel. Each case runs the worker on `world` fresh processes
(`distributed.workers.run_worker`) and comes back as the run's evidence, plain data: what each
rank returned, its arguments after the call (a model as its parameters), the
`torch.distributed` calls each rank made, the failure if any (`WorkerRun.evidence`).

Graded, the kernel makes that call (`wire.call_outcome`: the case says how to call the
answer, and that it needs `least_call_seconds` to start its processes) and only the evidence
crosses. The verdict is computed in the grader from it: the sums against the inputs the
grader drew, the parameters against one process training on the whole batch, computed here.

This module imports torch only when a case is run or judged.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from course_utils.checks import NotAnswered, each_call, fail

LR = 0.5  # plain SGD's learning rate in DDPCase: summed gradients move twice as far
RUN_TIMEOUT_S = 90.0  # a run's own limit: past it, the run says where each rank was
# Graded, each call gets this long at least, whatever the grader's limit per call: starting the
# processes alone takes seconds on a busy machine, and the run's own limit should come first.
LEAST_CALL_S = RUN_TIMEOUT_S + 10


def _whole_numbers(case: Any) -> None:
    for name, value in asdict(case).items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{type(case).__name__}.{name} must be a whole number >= 1")


def _run(case: Any, worker: Any, rank_args: list[tuple]) -> dict:
    """Run `worker` on `rank_args` (one tuple per rank); the run's evidence."""
    run = worker.run(rank_args=rank_args, timeout=RUN_TIMEOUT_S, echo=False, raise_failure=False)
    return run.evidence()


@dataclass(frozen=True)
class RingCase:
    """`world` ranks, each holding `size` whole numbers drawn from `seed`."""

    world: int
    size: int
    seed: int
    least_call_seconds: ClassVar[float] = LEAST_CALL_S

    def __post_init__(self) -> None:
        _whole_numbers(self)

    def __repr__(self) -> str:
        return f"{self.world} processes, {self.size} numbers each, seed {self.seed}"

    def inputs(self) -> list:
        """Each rank's tensor: whole numbers (as floats), so any order of adding is exact."""
        import torch

        g = torch.Generator().manual_seed(self.seed)
        return [torch.randint(-9, 10, (self.size,), generator=g).float() for _ in range(self.world)]

    def __course_call__(self, worker: Any) -> dict:
        return _run(self, worker, [(x,) for x in self.inputs()])


@dataclass(frozen=True)
class DDPCase:
    """`world` ranks training the course's MLP (8 inputs, `hidden` wide, 4 classes) made from
    `seed` for `steps` steps of SGD on a batch of `batch` rows, each rank on its own shard."""

    world: int
    batch: int
    hidden: int
    steps: int
    seed: int
    least_call_seconds: ClassVar[float] = LEAST_CALL_S

    def __post_init__(self) -> None:
        _whole_numbers(self)
        if self.batch % self.world:
            raise ValueError("DDPCase.batch must be a multiple of world")

    def __repr__(self) -> str:
        return (
            f"{self.world} processes, MLP 8-{self.hidden}x2-4, batch {self.batch}, "
            f"{self.steps} steps, seed {self.seed}"
        )

    def build(self):
        """(model, inputs, targets): the same numbers wherever they are made."""
        import torch

        from course_utils.models import MLP

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = MLP(8, self.hidden, 4, depth=2)
        x, y = model.example_batch(self.batch, torch.Generator().manual_seed(self.seed))
        return model, x, y

    def shards(self) -> list[tuple]:
        """Each rank's arguments: the model, its shard of the batch, the steps, the rate."""
        model, x, y = self.build()
        return [
            (model, xs, ys, self.steps, LR)
            for xs, ys in zip(x.chunk(self.world), y.chunk(self.world), strict=True)
        ]

    def __course_call__(self, worker: Any) -> dict:
        return _run(self, worker, self.shards())

    def trained(self) -> dict:
        """The parameters after `steps` steps of SGD on one process, on the whole batch: what
        every rank must end with."""
        import torch

        from course_utils.models import loss_fn

        model, x, y = self.build()
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        for _ in range(self.steps):
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    def replicas(self, combine: str | None) -> list[dict]:
        """Each rank's parameters after `steps` steps of SGD, simulated here: every replica on
        its own shard, combining, before each step, the gradients ("mean", "sum"), the
        parameters ("parameters": their mean), or nothing (None)."""
        import torch

        from course_utils.models import loss_fn

        model, x, y = self.build()
        models = [copy.deepcopy(model) for _ in range(self.world)]
        data = list(zip(x.chunk(self.world), y.chunk(self.world), strict=True))
        optimizers = [torch.optim.SGD(m.parameters(), lr=LR) for m in models]
        for _ in range(self.steps):
            for m, o, (xs, ys) in zip(models, optimizers, data, strict=True):
                o.zero_grad()
                loss_fn(m(xs), ys).backward()
            for group in zip(*(m.parameters() for m in models), strict=True):
                with torch.no_grad():
                    if combine in ("mean", "sum"):
                        total = sum(p.grad for p in group)
                        for p in group:
                            p.grad.copy_(total / (self.world if combine == "mean" else 1))
                    elif combine == "parameters":
                        mean = sum(p for p in group) / self.world
                        for p in group:
                            p.copy_(mean)
            for o in optimizers:
                o.step()
        return [{n: p.detach().clone() for n, p in m.named_parameters()} for m in models]

    def initial(self) -> dict:
        return {n: p.detach().clone() for n, p in self.build()[0].named_parameters()}


EVIDENCE = ("world", "returned", "arguments", "calls", "failure")


def evidence(got: Any, shown: str, case: RingCase | DDPCase) -> dict:
    """`got` as a worker run's evidence for `case`, else a failure: whatever else a kernel
    sends (a verdict of its own, a field too few) is not evidence. A run whose file was not
    written yet is not answered."""
    ok = isinstance(got, dict) and all(key in got for key in EVIDENCE)
    ok = ok and got["world"] == case.world
    ok = ok and all(isinstance(got[k], list) and len(got[k]) == case.world for k in EVIDENCE[1:4])
    failure = got.get("failure") if ok else None
    ok = ok and (failure is None or (isinstance(failure, dict) and "message" in failure))
    if not ok:
        fail(f"{shown} did not come back as the record of a run (run_worker): it cannot be judged.")
    if failure is not None and failure.get("kind") == "missing":
        raise NotAnswered(f"{failure['message']}.")
    return got


def each_run(worker: Any, cases: list[tuple]) -> Iterator[tuple[Any, str, dict]]:
    """A worker exercise's trials (`each_call`): (the case, the call as the learner would
    write it, the run's evidence), failing with its hint a run that stopped early."""
    for (case,), shown, got in each_call(worker, cases):
        run = evidence(got, shown, case)
        if run["failure"] is not None:
            fail(failed_run(shown, run["failure"]))
        yield case, shown, run


def model_parameters(run: dict, shown: str) -> list[dict]:
    """Each rank's model after the call (its first argument), as {name: parameter}."""
    found = [
        args[0] if isinstance(args, list | tuple) and args else None for args in run["arguments"]
    ]
    models = [p for p in found if isinstance(p, dict)]
    if len(models) != len(found):
        fail(f"{shown} did not come back as the record of a run (run_worker): it cannot be judged.")
    return models


def same(a: Any, b: Any) -> bool:
    """Two tensors (or dicts or lists of them) equal within float rounding."""
    import torch

    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.shape == b.shape
        and torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5)
    )


def tensor_like(value: Any, like: Any) -> bool:
    """Whether `value` is a tensor of the shape of `like`."""
    import torch

    return isinstance(value, torch.Tensor) and value.shape == like.shape


def point_to_point(calls: list[dict]) -> bool:
    """Whether a rank's calls include a send and a receive (blocking or not)."""
    ops = {c.get("op") for c in calls if isinstance(c, dict)}
    return bool(ops & {"send", "isend"}) and bool(ops & {"recv", "irecv"})


def failed_run(shown: str, failure: dict) -> str:
    """The hint for a run that stopped with `failure` (its kind, rank and message), whatever
    the worker was for."""
    kind, said = failure.get("kind"), str(failure["message"])
    if kind == "deadlock" and "has finished" in said:
        return (
            f"{shown} never finished, {said}. A rank returned while another still waited for "
            "it: every rank must make the same sends, receives and collectives, in an order "
            "that matches its peers'."
        )
    if kind == "deadlock":
        return (
            f"{shown} never finished, {said}. A blocking `dist.send` returns only once the "
            "other rank has received: if every rank sends first, every rank waits. Post the "
            "send with `dist.isend` (it returns at once) and wait for it after your `dist.recv`, "
            "or let even ranks send first and odd ranks receive first."
        )
    if "process group has not been initialized" in said:
        return (
            f"{shown}: {said.split(', please')[0]}. Each rank must join the group before its "
            'first call: `dist.init_process_group("gloo")` (the launcher sets RANK, '
            "WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as torchrun does)."
        )
    if "initialize the default process group twice" in said:
        return (
            f"{shown}: {said}. Join the group once per process, at the start of the function, "
            "and leave it (`dist.destroy_process_group()`) at its end."
        )
    if kind == "timeout":
        return f"{shown}: {said}. A rank that never finishes holds the others: look at its loop."
    return f"{shown}: {said}."
