"""Checks for lesson 06's exercises (data parallelism).

The traffic figures are those of the ring all-reduce (Patarasuk & Yuan 2009): every worker
sends 2(N-1)/N of the gradient; the naive all-reduce (gather on rank 0, then broadcast) makes
rank 0 send (N-1) copies; Exercise 6.5's hierarchical all-reduce over nodes is a program every
rank runs (`rank_cases.HierarchyCase`), judged in `hierarchical_build`. The scaling of 6.6 is
lesson 06's two-level model: a ring runs at its slowest link, NVLink inside a node, the
network between nodes (`course_utils.plan`).
"""

from __future__ import annotations

import math

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
)
from course_utils.checks.rank_cases import RING_LINKS, DDPCase, HierarchyCase, RingCase, close

for_student = checks.lesson_checks(__name__)


given_1 = numbers(
    pick("1e", (1024, 16), [(512, 8), (2048, 32), (768, 12)], "batch", "workers"),
    pick("1o", (100, 8), [(90, 8), (75, 6), (130, 12)], "odd_batch", "odd_workers"),
)


@exercise(given_1, per_worker="number", shards="list", partial=True)
def exercise_1(g, per_worker, shards) -> str:
    """The given batch over its workers; then the shard sizes of the odd batch."""
    batch, workers, odd_batch, odd_workers = g.values()
    hints = {
        f"`per_worker` multiplies batch and workers. The mini-batch of {batch} is *shared* by "
        f"the {workers} workers: each gets a part of it.": batch * workers,
        "`per_worker` is the whole mini-batch. Every worker holds the whole *model*, but only "
        "its own shard of the samples.": batch,
        f"`per_worker` is not right yet. Hint: the {workers} shards are disjoint and cover "
        "the batch.": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    fields.judge(per_worker, batch // workers, "per_worker", hints)
    with fields.judging():
        if len(shards) != odd_workers:
            fail(
                f"`shards` should list one shard size per worker: {odd_workers} numbers, not "
                f"{len(shards)}."
            )
        sizes = [checks.as_number(s, f"shards[{i}]") for i, s in enumerate(shards)]
        for i, s in enumerate(sizes):
            if not s.is_integer():
                fail(
                    f"`shards[{i}]` is {s:g}: a worker gets whole samples, so every shard size "
                    "is a whole number. Some workers will get one sample more than others."
                )
            if s < 1:
                fail(f"`shards[{i}]` is {s:g}: every worker should get at least one sample.")
        if sum(sizes) != odd_batch:
            fail(
                f"Your `shards` add up to {sum(sizes):g} samples, but the mini-batch has "
                f"{odd_batch}. Shards are disjoint and together cover every sample exactly once "
                "(none dropped)."
            )
        if max(sizes) - min(sizes) > 1:
            fail(
                f"Your `shards` add up to {odd_batch}, but they are uneven: the slowest (largest) "
                "shard sets the pace of the step. Spread the samples so sizes differ by at most "
                "one."
            )
    fields.verdict()
    base, extra = divmod(odd_batch, odd_workers)
    split = (
        f"{extra} x {base + 1} + {odd_workers - extra} x {base}"
        if extra
        else f"{odd_workers} x {base}"
    )
    return (
        f"Right: {batch // workers} samples per worker; {odd_batch} = {split}. With uneven "
        "shards each worker's loss must be weighted by its share n_r / B (the lesson's "
        "section 3)."
    )


@exercise(
    after_backward={
        "b": checks.RIGHT,
        "a": "If every worker steps with its own gradient, the replicas get different "
        "updates and stop being copies of one model after the first step. What keeps them "
        "equal?",
        "c": "Moving the samples around would make every worker redo the whole batch: no "
        "work would be saved. What is small enough to exchange, and enough to agree on?",
        "d": "Worker 0's gradient only saw worker 0's shard: the other shards' samples "
        "would be wasted. The update should use every sample of the mini-batch.",
    },
)
def exercise_2(after_backward) -> str:
    """What must happen after every worker has finished its local backward pass?"""
    return (
        "Right: an all-reduce combines the gradients, so every replica applies the same update "
        "and the replicas stay identical."
    )


# a all-reduce, b forward, c split, d optimizer step, e backward, f broadcast the weights
EVENTS = ("a", "b", "c", "d", "e", "f")


@exercise(order=checks.sequence(item=lambda x, name: checks.as_choice(x, EVENTS, name)))
def exercise_3(order) -> str:
    """Order the events of one data-parallel step (split and broadcast may come in any order)."""
    if sorted(order) != sorted(EVENTS):
        missing = sorted(set(EVENTS) - set(order))
        fail(
            "`order` should use each of the letters 'a' to 'f' exactly once"
            + (f" (missing: {', '.join(missing)})." if missing else ".")
        )
    pos = {event: i for i, event in enumerate(order)}
    if pos["b"] < max(pos["c"], pos["f"]):
        fail(
            "The forward pass comes too early: what does a worker need before it can run "
            "its forward? (Some data, and the model's weights.)"
        )
    if pos["e"] < pos["b"]:
        fail("The backward pass needs the activations that the forward pass saved.")
    if pos["a"] < pos["e"]:
        fail("The all-reduce combines gradients: which event produces them?")
    if pos["d"] < pos["a"]:
        fail(
            "The optimizer step comes before the all-reduce: then every replica would step "
            "with its own gradient, and the replicas would drift apart."
        )
    return (
        "Right: split the batch and make the replicas identical, then forward, backward, "
        "all-reduce, and the same optimizer step everywhere."
    )


# --------------------------------------------------------------------------- 6.4: the ring

given_4 = numbers(ranks=pick("4n", 4, [3, 5, 6]), length=pick("4l", 10, [7, 11, 13]))


def cases_4(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own numbers, then fresh ones: chunks that do not divide evenly, fewer
    numbers than ranks, and a single rank."""
    g, rng = given_4(variant), variant.cases("4")
    cases = [
        RingCase(g.ranks, g.length, seed=4),
        RingCase(rng.randint(2, 3), rng.randint(5, 13), rng.randint(1, 10**6)),
        RingCase(rng.randint(5, 7), rng.randint(8, 30), rng.randint(1, 10**6)),
        RingCase(rng.randint(3, 6), rng.randint(1, 2), rng.randint(1, 10**6)),
        RingCase(1, rng.randint(1, 5), rng.randint(1, 10**6)),
    ]
    return {"ring_all_reduce": [(case,) for case in cases]}


CHUNK_HINT = (
    "In each reduce-scatter step a rank passes on the chunk it has just added into. After "
    "the reduce-scatter, which chunk is complete on each rank? That is the chunk it must pass "
    "on first in the all-gather."
)


def _ring_failed(shown: str, failure: dict) -> str:
    said = str(failure["message"])
    if failure.get("kind") == "deadlock":
        return (
            f"{shown} never finished: {said}. Every rank waits for its left neighbour before "
            "anybody has sent: in each step a rank sends first, then receives (a send never "
            "waits)."
        )
    if "must match the size" in said:
        return (
            f"{shown}: {said}. A chunk index is off: what arrives has the size of the chunk "
            f"the left neighbour sent, which is not the one this rank added it to. {CHUNK_HINT}"
        )
    return f"{shown}: {said}."


def _ring_sums(shown: str, case: RingCase, results: list) -> None:
    import torch

    from course_utils.checks import rank_references  # the grader's only: not in a kernel

    data = case.data()
    want, n = sum(data), case.devices
    for r, got in enumerate(results):
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            what = "nothing" if got is None else got if isinstance(got, str) else "a tensor"
            fail(
                f"{shown}: rank {r} returned {what}, not a tensor of {case.length} numbers. "
                "Return `data`, holding the sum."
            )
        if torch.equal(got, want):
            continue
        if n > 1 and torch.allclose(got, want / n):
            fail(f"{shown}: rank {r} holds the mean; this exercise asks for the sum.")
        if torch.equal(got, rank_references.ring_result(data, r, add_in_gather=True)):
            fail(
                f"{shown}: rank {r}'s numbers are too large: the all-gather added what arrived "
                "(reducing a second time). A chunk that travels in the all-gather is already "
                "the finished sum: keep it, do not add it to your copy."
            )
        if torch.equal(got, rank_references.ring_result(data, r, gather_from=0)):
            fail(
                f"{shown}: rank {r}'s sums are incomplete: its all-gather began with its chunk "
                f"{r}, which is not finished there. {CHUNK_HINT}"
            )
        bad = int((got != want).nonzero()[0, 0])
        fail(
            f"{shown}: rank {r}'s number {bad} is {got[bad]:g}, not the sum over the ranks "
            f"({want[bad]:g}). {CHUNK_HINT}"
        )


@exercise(given_4, ring_all_reduce=programs.as_program, points=3, partial=True)
def exercise_4(ring_all_reduce, variant) -> str:
    """Build ring_all_reduce(ctx, data) on the devices: every rank's sum, the ring's bytes
    and, replayed over the links without compute, the ring formula's time."""
    from course_utils.threads.clock import replay_messages
    from course_utils.threads.collectives import ring_bytes_per_rank

    tried, timing = [], ""
    cases = cases_4(variant)["ring_all_reduce"]
    for (case,), shown, got in checks.each_call(ring_all_reduce, cases):
        run = programs.evidence(got, shown, case, ("results", "collectives"))
        n = case.devices
        if run["failure"] is not None:
            fail(_ring_failed(shown, run["failure"]))
        if any(run["collectives"]):
            fail(
                f"{shown} called a collective of `ctx.comm`: the point is to build the "
                "all-reduce yourself, with `ctx.send` and `ctx.recv` only."
            )
        _ring_sums(shown, case, run["results"])
        want, sent = ring_bytes_per_rank(case.length, n), run["bytes_sent"]
        if sum(sent) > sum(want):
            fail(
                f"{shown} gives the right sums, but the ranks sent {sent} bytes where a ring "
                f"sends {want}: one chunk per step (`chunk_bounds(len(data), N)`), not more."
            )
        for r, (mine, ring) in enumerate(zip(sent, want, strict=True)):
            if mine != ring:
                fail(
                    f"{shown} gives the right sums, but rank {r} sent {mine} bytes where the "
                    f"ring sends {ring} (chunks differ in size here): 2(N-1) chunks, one per "
                    f"step, the first its own chunk {r}."
                )
        seconds, formula = replay_messages(run["messages"], RING_LINKS), case.seconds()
        if not math.isclose(seconds, formula, rel_tol=1e-6, abs_tol=1e-12):
            fail(
                f"{shown} sends the ring's bytes, but its messages take {seconds * 1e6:.3g} us "
                f"on the links, where the ring takes {formula * 1e6:.3g} us: the ranks waited "
                "for each other. In every step all ranks send at once, then receive; a rank "
                "that receives before it sends holds up its right neighbour for a whole step."
            )
        tried.append(f"{n}x{case.length}")
        timing = timing or (
            f" Your own case took {seconds * 1e6:.3g} us on the grader's {RING_LINKS.describe()}"
            ": 2(N-1) x (latency + largest chunk / bandwidth)."
        )
    return (
        f"Right on your numbers and fresh ones (ranks x numbers) {', '.join(tried)}: every "
        "rank holds the sum, sends 2(N-1) chunks, and the messages alone take exactly the "
        f"ring formula's time.{timing}"
    )


given_5 = numbers(
    pick("5", (4, 16), [(2, 8), (2, 12), (3, 12), (3, 18), (4, 24)], "per_node", "length"),
    nodes=2,
)


def cases_5(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own cluster, then fresh ones: another width of node, and three nodes."""
    g, rng = given_5(variant), variant.cases("5")
    other = 3 if g.per_node == 2 else 2  # ranks per node
    cases = [
        HierarchyCase(g.nodes, g.per_node, g.length, seed=5),
        HierarchyCase(2, other, 2 * other * rng.randint(1, 3), rng.randint(1, 10**6)),
        HierarchyCase(3, 2, 6 * rng.randint(1, 4), rng.randint(1, 10**6)),
    ]
    return {"hierarchical_all_reduce": [(case,) for case in cases]}


@exercise(given_5, hierarchical_all_reduce=programs.as_program, points=3, partial=True)
def exercise_5(hierarchical_all_reduce, variant) -> str:
    """Build the hierarchical all-reduce over nodes: every rank's mean, the bytes of each
    collective, and what crossed between the nodes against a flat ring."""
    from course_utils.checks.hierarchical_build import hierarchical_all_reduce as judged

    return judged(hierarchical_all_reduce, cases_5(variant)["hierarchical_all_reduce"])


SCALING_WORKERS = (1, 2, 4, 8, 16)
# (seconds for the global batch on one GPU, GB of fp32 gradients, GB/s per GPU of the network
# between nodes): every triple gives nearly N inside a node of 8 and about 10x at 16, across two.
SCALING_SETUPS = [(1.8, 1.2, 25.0), (3.0, 1.6, 25.0), (3.6, 1.0, 12.5), (2.0, 2.0, 50.0)]
given_6 = numbers(
    pick("6", (2.4, 1.2, 25.0), SCALING_SETUPS, "compute_1", "grad_gb", "inter_gbs"),
    gpus_per_node=8,
    intra_gbs=300.0,  # NVLink, per GPU
)


def scaling_table(variant: Variant = DEFAULT) -> list[tuple[int, float, float]]:
    """(workers, compute seconds per step, all-reduce seconds per step) of Exercise 6.6."""
    from course_utils.parallel.costs import ring_allreduce_time
    from course_utils.plan import Hardware

    g = given_6(variant)
    hw = Hardware(
        gpus_per_node=g["gpus_per_node"],
        intra_node_gbs=g["intra_gbs"],
        inter_node_gbs=g["inter_gbs"],
    )
    return [
        (n, g["compute_1"] / n, ring_allreduce_time(g["grad_gb"] * 1e9, n, hw.bandwidth(n)))
        for n in SCALING_WORKERS
    ]


CAUSE_6 = {
    "b": "The learning rate changes how well the model learns per step, not how long a step "
    "takes; the table shows time per step.",
    "c": "Check the ring formula: each worker sends 2(N-1)/N of the gradient, which hardly "
    "grows from 8 to 16 workers (1.75 S to 1.875 S). Compare the links instead.",
    "d": "Nothing in the table is about memory; each worker holds the same replica.",
}
FIX_6 = {
    "b": "The naive all-reduce sends more from rank 0, not less: it would make this worse.",
    "c": "A smaller batch per worker shrinks the compute further while the all-reduce stays: "
    "communication's share would grow.",
    "d": "More synchronization points add waiting; they hide nothing.",
}


@exercise(efficiency_16="number", cause="letter", fix="letter", partial=True)
def exercise_6(efficiency_16, cause, fix, variant) -> str:
    """Read the scaling table: efficiency at 16 workers, the main cause and a fix; every
    wrong answer is named at once."""
    rows = {n: (c, a) for n, c, a in scaling_table(variant)}
    speedup = sum(rows[1]) / sum(rows[16])
    want = speedup / 16
    hints = {
        "`efficiency_16` looks like a speed-up. Efficiency is speed-up / number of workers: a "
        "fraction, 1 for perfect scaling.": speedup,
        "`efficiency_16` leaves out the all-reduce: a step on 16 workers is their compute plus "
        "the all-reduce.": sum(rows[1]) / rows[16][0] / 16,
        "`efficiency_16` is not right yet. Speed-up = step time on 1 worker / step time on 16 "
        "(compute + all-reduce); efficiency = speed-up / 16.": OTHERWISE,
    }
    fields = checks.Fields()
    with fields.judging():
        judge(efficiency_16, want, "efficiency_16", hints, unit="fraction")
    with fields.judging():
        checks.expect_choice(cause, "a", CAUSE_6, "`cause` = {got!r} is not it. {hint}")
    with fields.judging():
        checks.expect_choice(fix, "a", FIX_6, "`fix` = {got!r} is not it. {hint}")
    fields.verdict()
    return (
        f"Right: {sum(rows[1]) / sum(rows[8]):.1f}x on 8 workers inside a node, {speedup:.1f}x "
        f"on 16 across two nodes, {want:.1%} efficiency. Past one node the ring runs at the "
        "slow link's speed; hiding the all-reduce behind the backward pass wins much of it back."
    )


STRATEGY_ANSWERS = (True, False, True, True, False)
# Each hint names the idea to check and where the lesson has it, never the verdict.
STRATEGY_HINTS = (
    "Strategy 1: write the mean over the 512 samples with the 8 shard means in it, and "
    "remember that a gradient is linear in the loss.",
    "Strategy 2: with shards of 13 and 12 samples, is one sample of a 12-sample shard given "
    "the same weight as one of a 13-sample shard? Write out the weights.",
    "Strategy 3: what does each worker hold after its two micro-batches, next to strategy 1's "
    "worker? (lesson 02 on scaling a micro-batch's loss; lesson 06 on `no_sync`.)",
    "Strategy 4: write the reference's mean over the 100 samples as a sum over the 8 shards, "
    "then compare it with what the strategy all-reduces and divides.",
    "Strategy 5: its reference is the single worker on batches of 64. The 8 workers take "
    "each step on 512 samples: with the same number of steps and learning rate, is that the "
    "same sequence of weights as steps on 64? (Goyal et al. 2017 scale the learning rate "
    "with the batch.)",
)


def _as_bool(value, what: str) -> bool:
    checks.require(value, what)
    if not isinstance(value, bool):
        fail(f"`{what}` should be True or False, but it is {value!r}.")
    return value


@exercise(exact=checks.sequence(item=_as_bool, length=len(STRATEGY_ANSWERS)))
def exercise_7(exact) -> str:
    """For 5 strategies: does it compute exactly the weights of the single-worker run named?"""
    wrong = [i for i, (a, b) in enumerate(zip(exact, STRATEGY_ANSWERS, strict=True)) if a != b]
    if len(wrong) == 1:
        fail(f"1 answer is not right yet. Look again at {STRATEGY_HINTS[wrong[0]]}")
    if wrong:  # every wrong strategy named at once, each with its own hint
        said = "\n".join(f"- {STRATEGY_HINTS[i]}" for i in wrong)
        fail(f"{len(wrong)} answers are not right yet. Look again at:\n{said}")
    return (
        "Right: only a properly weighted all-reduce of gradients taken at the same weights is "
        "exactly large-batch gradient descent; and a bigger global batch is a different run."
    )


# --------------------------------------------------------------------------- 6.8: DDP


given_8 = numbers(bucket_cap=pick("8c", 600, [400, 800, 1200]), microbatches=pick("8m", 2, [3, 4]))


def cases_8(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own bucket size and micro-batches on a 2-rank MLP, then fresh ones:
    more ranks, other models and bucket sizes, no accumulation at all."""
    g, rng = given_8(variant), variant.cases("8")
    m = g.microbatches
    cases = [DDPCase(2, 64 * m, 32, 3, m, g.bucket_cap, seed=8)]  # 32 rows a micro-batch
    for microbatches in (rng.randint(2, 3), 1):
        devices = rng.randint(2, 4)
        cases.append(
            DDPCase(
                devices,
                devices * microbatches * rng.randint(2, 4),
                rng.choice([16, 24, 40]),
                rng.randint(1, 3),
                microbatches,
                rng.randint(200, 1500),
                rng.randint(1, 10**6),
            )
        )
    return {"ddp_program": [(case,) for case in cases]}


def _ddp_failed(shown: str, failure: dict) -> str:
    kind, said = failure.get("kind"), str(failure["message"])
    if kind == "not a tensor" and "all_reduce" in said:
        return (
            f"{shown}: {said}. A bucket was sent before all its gradients were ready: send it "
            "from the hook of the last of its gradients to arrive (count them), not the first."
        )
    if kind == "deadlock":
        return (
            f"{shown} never finished: {said}. Every rank must issue the same all-reduces, in "
            "the same order: the same buckets, from the same hooks, in the same micro-batch."
        )
    return f"{shown}: {said}."


def _ddp_calls(shown: str, case: DDPCase, calls: list[dict]) -> None:
    """The all-reduces of one rank against the buckets the case implies."""
    from course_utils.actions import Action

    want, last = case.bucket_sizes(), case.microbatches - 1
    sizes = [c["numel"] for c in calls]
    during = [Action.parse(c["in"]) for c in calls if c["in"] is not None]
    early = sorted({a.microbatch or 0 for a in during if a.microbatch != last})
    if early:
        fail(
            f"{shown} all-reduced during micro-batch {early[0]}'s backward: with gradient "
            "accumulation only the last micro-batch communicates. Run the others inside "
            "`with ddp.no_sync():`, which keeps the hooks from all-reducing."
        )
    if sorted(sizes) == sorted(want + want):
        fail(
            f"{shown} reduced twice: {len(sizes)} all-reduces for {len(want)} buckets, each "
            "bucket twice. The hooks' all-reduces are all there is: `finish` only waits."
        )
    if sizes != want:
        fail(
            f"{shown} all-reduced {len(sizes)} times, {sizes} numbers, where buckets of at most "
            f"{case.bucket_cap} numbers, filled in the order the gradients are ready (last "
            f"layer first), hold {want}. A bucket takes the next parameter unless it would go "
            "past the cap; then a new one starts."
        )
    if not all(c["async"] for c in calls):
        fail(
            f"{shown} called a blocking all-reduce: the backward stops until it is done, and "
            "nothing overlaps. Issue it with `async_op=True` and wait in `finish`."
        )
    if len(during) < len(calls) or any(not a.is_backward for a in during):
        fail(
            f"{shown} issued its all-reduces after the backward had ended: nothing overlaps. "
            "A bucket's hook issues it during the backward, as soon as the bucket is full."
        )
    if not all(c["waited"] for c in calls):
        fail(
            f"{shown} never waited for some all-reduces: their results arrive at `wait()`. "
            "`finish` waits for every handle before the optimizer step."
        )


def _ddp_weights(shown: str, case: DDPCase, run: dict) -> None:
    """Every replica's weights against one worker's on the whole batch, and if they differ,
    the mistake the gradients show."""
    from course_utils.checks.rank_references import ddp_reference  # the grader's only

    want, n = ddp_reference(case), case.devices
    for r, weights in enumerate(run["weights"]):
        if all(close(weights.get(k), w) for k, w in want["weights"].items()):
            continue
        grads = {k.split(".", 1)[1]: g for k, g in run["grads"][r].items()}
        if all(close(grads.get(k), n * g) for k, g in want["grads"].items()):
            fail(
                f"{shown}: rank {r}'s gradients are {n} times one worker's: they were summed. "
                "`ctx.loss` is the mean over this rank's micro-batches; the ranks must then "
                'average (`op="mean"`), not sum.'
            )
        if all(close(grads.get(k), g / n) for k, g in want["grads"].items()):
            fail(
                f"{shown}: rank {r}'s gradients are 1/{n} of one worker's: they were averaged "
                "twice. Average once, in the all-reduce."
            )
        early = [
            k
            for k, g in want["early"].items()
            if close(grads.get(k), g) and not close(grads.get(k), want["grads"][k])
        ]
        if case.microbatches > 1 and early:
            fail(
                f"{shown}: rank {r}'s gradient of `{early[0]}` lacks the last micro-batch: its "
                "bucket was sent before all its gradients were ready. Send a bucket from the "
                "hook of the last of its gradients to arrive."
            )
        fail(
            f"{shown}: rank {r}'s weights after the step are not one worker's on the whole "
            "batch. Every gradient must be averaged over the ranks exactly once, after its "
            "last micro-batch."
        )


@exercise(given_8, ddp_program=programs.as_program, points=3, partial=True)
def exercise_8(ddp_program, variant) -> str:
    """Build DDP: hooks all-reduce buckets as they fill, no communication before the last
    micro-batch; judged on the weights, the all-reduces and the order of events."""
    for (case,), shown, got in checks.each_call(ddp_program, cases_8(variant)["ddp_program"]):
        run = programs.evidence(got, shown, case, ("collectives", "weights"))
        if run["failure"] is not None:
            fail(_ddp_failed(shown, run["failure"]))
        for calls in run["collectives"]:
            _ddp_calls(shown, case, calls)
        _ddp_weights(shown, case, run)
    # (No measured figure here: a check's message is the same on every run, so strict nbval
    # compares it; the cell above the check prints what the run's clock measured.)
    return (
        "Right on your buckets and fresh ones: the replicas' weights equal one worker's on "
        "the whole batch, with one all-reduce per bucket, each issued during the last "
        "micro-batch's backward, before it ended: the communication overlaps the backward."
    )
