"""Judging a worker file's run (lesson 13): the evidence a kernel sent back, what one process
computes for the same case, and the hint for a run that stopped early. The grader's alone: a
graded kernel gets the cases (`checks.processes`) but not this.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from course_utils.checks import NotAnswered, each_call, fail
from course_utils.checks.processes import LR, WorkerDDPCase, WorkerRingCase
from course_utils.checks.rank_cases import close


def trained(case: WorkerDDPCase) -> dict:
    """The parameters after `steps` steps of SGD on one process, on the whole batch: what
    every rank must end with."""
    return replicas(case, "one process")[0]


def replicas(case: WorkerDDPCase, combine: str | None) -> list[dict]:
    """Each rank's parameters after `steps` steps of SGD, simulated here: every replica on
    its own shard, combining, before each step, the gradients ("mean", "sum"), the
    parameters ("parameters": their mean), or nothing (None); "one process": one replica on
    the whole batch."""
    import torch

    from course_utils.models import loss_fn

    model, x, y = case.build()
    world = 1 if combine == "one process" else case.world
    models = [copy.deepcopy(model) for _ in range(world)]
    data = list(zip(x.chunk(world), y.chunk(world), strict=True))
    optimizers = [torch.optim.SGD(m.parameters(), lr=LR) for m in models]
    for _ in range(case.steps):
        for m, o, (xs, ys) in zip(models, optimizers, data, strict=True):
            o.zero_grad()
            loss_fn(m(xs), ys).backward()
        for group in zip(*(m.parameters() for m in models), strict=True):
            with torch.no_grad():
                if combine in ("mean", "sum"):
                    total = sum(p.grad for p in group)
                    for p in group:
                        p.grad.copy_(total / (world if combine == "mean" else 1))
                elif combine == "parameters":
                    mean = sum(p for p in group) / world
                    for p in group:
                        p.copy_(mean)
        for o in optimizers:
            o.step()
    return [{n: p.detach().clone() for n, p in m.named_parameters()} for m in models]


def initial(case: WorkerDDPCase) -> dict:
    return {n: p.detach().clone() for n, p in case.build()[0].named_parameters()}


EVIDENCE = ("world", "returned", "arguments", "calls", "failure")


def evidence(got: Any, shown: str, case: WorkerRingCase | WorkerDDPCase) -> dict:
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
    ok = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
    return ok and close(a.float(), b.float())  # a learner's dtype may differ from ours


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
