"""Checks for lesson 13's exercises (the same computations on real `torch.distributed`
processes).

Exercises 13.2 and 13.3 are worker files the learner writes (`%%writefile`) and the check runs
on two real processes (the cases: `checks.processes`; the references: `checks.worker_runs`): a
ring that passes every rank's tensor around with `send`/`recv`, and data parallelism by hand
(or with `DistributedDataParallel`). Each is judged from what the processes sent back: the
sums against the inputs drawn here, the parameters against one process training on the
whole batch. A mean loss over B samples split into N equal shards has the average of the
shard gradients as its gradient (Li et al. 2020, "PyTorch Distributed", arXiv 2006.15704).
The all-reduce time is the ring's, at its slowest link (Patarasuk and Yuan 2009).
"""

from __future__ import annotations

from course_utils import checks
from course_utils.checks import (
    DEFAULT,
    OTHERWISE,
    Variant,
    exercise,
    fail,
    judge,
    numbers,
    pick,
    programs,
    worker_runs,
)
from course_utils.checks.processes import WorkerDDPCase, WorkerRingCase

for_student = checks.lesson_checks(__name__)

# --------------------------------------------------------------------------- 13.1 ranks

given_1 = numbers(
    pick("1", (2, 8, 1, 3), [(2, 4, 1, 2), (4, 8, 2, 5), (3, 4, 2, 1), (4, 2, 3, 1), (2, 8, 1, 6)],
         "nodes", "per_node", "node", "local_rank"),
)  # fmt: skip


@exercise(given_1, world_size="whole number", rank="whole number", partial=True)
def exercise_1(g, world_size, rank) -> str:
    """torchrun's WORLD_SIZE and RANK for a process, from the nodes and its LOCAL_RANK."""
    fields = checks.Fields()  # every wrong answer named at once
    fields.judge(
        world_size,
        g.nodes * g.per_node,
        "world_size",
        {
            f"`world_size` = {g.per_node} is one node's processes: torchrun calls that "
            "LOCAL_WORLD_SIZE. WORLD_SIZE counts every process of the job.": g.per_node,
            f"`world_size` = {g.nodes} counts the nodes. WORLD_SIZE counts processes: one per "
            "GPU on every node.": g.nodes,
            "`world_size` is not right yet: how many processes does the whole job start?": (
                OTHERWISE
            ),
        },
        rounding=False,
    )
    want = g.node * g.per_node + g.local_rank
    fields.judge(
        rank,
        want,
        "rank",
        {
            f"`rank` = {g.local_rank} is the LOCAL_RANK, the process's "
            "number inside its node; RANK numbers the processes of every node in one "
            "sequence.": g.local_rank,
            "`rank`: nodes and ranks are numbered from 0: node 0 holds ranks "
            f"0 to {g.per_node - 1}.": (g.node + 1) * g.per_node + g.local_rank,
            "`rank`: torchrun fills a node's ranks one after another: rank = "
            "node x processes per node + local rank, not the other way round.": (
                g.local_rank * g.nodes + g.node
            ),
            "`rank` is not right yet. How many ranks do the nodes before this one hold?": OTHERWISE,
        },
        rounding=False,
    )
    fields.verdict()
    return (
        f"Right: {world_size} processes, and this one is rank {rank}: node {g.node}'s ranks start "
        f"at {g.node * g.per_node}. Its LOCAL_RANK ({g.local_rank}) picks its GPU on the node."
    )


# --------------------------------------------------------------------------- 13.2 the ring

given_2 = numbers(size=pick("2", 6, [4, 5, 7, 8, 9]))


def cases_2(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """One run of two processes, each with `size` numbers drawn fresh (the grader draws its
    own): starting processes costs seconds, and numbers nobody knows in advance need one."""
    size = given_2(variant).size
    return {"ring_worker": [(WorkerRingCase(2, size, variant.cases("2").randint(1, 10**6)),)]}


@exercise(given_2, ring_worker=programs.as_program)
def exercise_2(ring_worker, variant) -> str:
    """Build a ring on two processes with send/recv; judged on what each rank returned."""
    for case, shown, run in worker_runs.each_run(ring_worker, cases_2(variant)["ring_worker"]):
        inputs = case.inputs()
        total = sum(inputs)
        for rank, returned in enumerate(run["returned"]):
            mine = inputs[rank]
            if not worker_runs.tensor_like(returned, total):
                fail(
                    f"{shown}: rank {rank} returned {type(returned).__name__} "
                    f"{str(returned)[:40]}; `ring_sum` returns a tensor of the shape of `x` "
                    f"({case.size} numbers)."
                )
            if worker_runs.same(returned, mine):
                fail(
                    f"{shown}: rank {rank} returned its own tensor: nothing it received was "
                    "added. Add what arrives from the left neighbour to a running total."
                )
            if worker_runs.same(returned, total - mine):
                fail(
                    f"{shown}: rank {rank} returned the others' tensors without its own: "
                    "start the total from its own `x`."
                )
            if not worker_runs.same(returned, total):
                fail(
                    f"{shown}: rank {rank}'s result is not the sum of every rank's `x`. Each "
                    "of the world - 1 steps sends what the rank last received (its own `x` "
                    "first) to the right and adds what arrives from the left."
                )
        if not all(worker_runs.point_to_point(calls) for calls in run["calls"]):
            fail(
                f"{shown}: the sums are right, but the ranks never sent and received: "
                "`dist.all_reduce` did the work. This exercise is the ring itself, with "
                "`dist.send`/`dist.isend` and `dist.recv`."
            )
    return (
        "Right: on two real processes every rank ends with the sum of all ranks' tensors, "
        "passed around the ring with sends and receives and no deadlock: a sender that does "
        "not wait (isend), or ranks that take turns, is what keeps a ring moving."
    )


# --------------------------------------------------------------------------- 13.3 DDP by hand

given_3 = numbers(pick("3", (8, 16), [(4, 16), (12, 8), (16, 12), (8, 24)], "batch", "hidden"))
STEPS = 3


def cases_3(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """One run of two processes on the learner's sizes, a model and data drawn fresh."""
    g = given_3(variant)
    seed = variant.cases("3").randint(1, 10**6)
    return {"ddp_worker": [(WorkerDDPCase(2, g.batch, g.hidden, STEPS, seed),)]}


@exercise(given_3, ddp_worker=programs.as_program)
def exercise_3(ddp_worker, variant) -> str:
    """Build data parallelism on two processes; judged on each rank's parameters."""
    for case, shown, run in worker_runs.each_run(ddp_worker, cases_3(variant)["ddp_worker"]):
        params = worker_runs.model_parameters(run, shown)
        want, start = worker_runs.trained(case), worker_runs.initial(case)
        if all(worker_runs.same(p, start) for p in params):
            fail(
                f"{shown}: the parameters never changed. Train the `model` the function is "
                "given, in place (not a copy), with `torch.optim.SGD(model.parameters(), lr)`."
            )
        if not all(worker_runs.same(p, params[0]) for p in params):
            if worker_runs.same(params, worker_runs.replicas(case, None)):
                fail(
                    f"{shown}: each rank's parameters are those of training on its own shard "
                    "alone: the gradients were never combined. All-reduce each parameter's "
                    "gradient, `p.grad`, after `backward()` and before `optimizer.step()`."
                )
            if worker_runs.same(params, worker_runs.replicas(case, "parameters")):
                fail(
                    f"{shown}: the ranks averaged their parameters, then each stepped with its "
                    "own shard's gradient, so they drift apart at every step. Average the "
                    "gradients (`p.grad`), not the parameters (`p.data`): then every rank "
                    "takes the same step."
                )
            fail(
                f"{shown}: the ranks end with different parameters. Data parallelism keeps "
                "every replica the same: every rank must step with the same averaged gradient."
            )
        if worker_runs.same(params[0], want):
            continue
        if worker_runs.same(params[0], worker_runs.replicas(case, "sum")[0]):
            fail(
                f"{shown}: the ranks agree, but they moved {case.world} times too far: "
                "`all_reduce` sums the gradients. Divide by the world size "
                "(`p.grad /= dist.get_world_size()`) to get the average, one process's gradient."
            )
        fail(
            f"{shown}: the ranks agree, but not with one process training on the whole batch. "
            f"Each of the {case.steps} steps: zero the gradients, the mean loss of this rank's "
            "shard, backward, all-reduce and average every `p.grad`, then step."
        )
    return (
        "Right: two processes, each on half the batch, end every step with the parameters of "
        "one process on the whole batch. Averaging the gradients is all DistributedDataParallel "
        "does to the numbers; the rest is doing it in buckets, during the backward pass."
    )


# --------------------------------------------------------------------------- 13.4 a hang


@exercise(
    problem={
        "b": checks.RIGHT,
        "a": "The print only reads rank 0's loss after its own all-reduce returned: it may be "
        "late, never stuck. What does rank 1 do while rank 0 all-reduces the loss?",
        "c": "gloo all-reduces a tensor of any shape, a single number too. Count the "
        "collective calls each rank makes.",
        "d": "Dividing before or after the sum gives the same average; it cannot hang a run. "
        "Count the collective calls each rank makes.",
    },
    fix={
        "a": checks.RIGHT,
        "b": "A barrier is one more collective every rank must call in the same order: rank 0 "
        "still makes one call more than rank 1.",
        "c": "`async_op=True` returns before the all-reduce is done, but it is still a "
        "collective that rank 1 never joins: rank 0 waits for it at the end.",
        "d": "Rank 0 would still make one collective call more than rank 1, only later: its "
        "last call would wait for ever.",
    },
    partial=True,
)
def exercise_4(problem, fix) -> str:
    """Diagnose a two-rank worker that hangs: a collective only rank 0 calls."""
    return (
        "Right: ranks pair collective calls by their order, not by the tensor or the line: "
        "rank 0's extra all-reduce takes rank 1's first gradient as its partner, and rank 0's "
        "last call waits for a partner that never comes. Every rank makes every collective call."
    )


# --------------------------------------------------------------------------- 13.5 the network

given_5 = numbers(
    pick("5", (1.3, 16, 50), [(7, 16, 50), (13, 32, 50), (1.3, 16, 12.5), (70, 64, 50)],
         "billions", "gpus", "gbs"),
)  # fmt: skip


@exercise(given_5, allreduce_ms="number")
def exercise_5(g, allreduce_ms) -> str:
    """One ring all-reduce of the bf16 gradients over GPUs on two nodes, in ms."""
    nbytes, n, bandwidth = 2 * g.billions * 1e9, g.gpus, g.gbs * 1e9
    ms = 1e3 * 2 * (n - 1) / n * nbytes / bandwidth
    hints = {
        "That is half of it: either 1 byte per parameter (bf16 takes 2), or one of the "
        "ring's two phases (the reduce-scatter and the all-gather each move (N-1)/N of the "
        "bytes).": ms / 2,
        "That moves the gradients across the slowest link once. A ring all-reduce is a "
        "reduce-scatter then an all-gather: each moves (N-1)/N of the bytes through every "
        "link.": ms / (2 * (n - 1) / n),
        f"{allreduce_ms:g} ms is not it yet. Time = 2(N-1)/N x bytes / bandwidth of the "
        "slowest link, with bf16's 2 bytes per parameter.": OTHERWISE,
    }
    judge(allreduce_ms, ms, "allreduce_ms", hints, unit="ms")
    return (
        f"Right: {allreduce_ms:.3g} ms per step, for the all-reduce alone. Inside one node, "
        f"NVLink's 450 GB/s would be about {450 / g.gbs:.0f}x faster: keep the chattiest "
        "parallelism inside nodes."
    )
