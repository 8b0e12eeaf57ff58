"""Checks for the exercises of lesson 06 (data parallelism).

Each `exercise_K` is called by the check cell of Exercise 6.K in
`exercises/06_data_parallelism.ipynb`. The traffic figures are those of the ring
all-reduce (Patarasuk & Yuan 2009): every worker sends 2(N-1)/N of the gradient; the
naive all-reduce (gather on rank 0, then broadcast) makes rank 0 send (N-1) copies.
"""

from __future__ import annotations

import math
import operator
import random

from course_utils.checks import (
    as_choice,
    as_number,
    as_sequence,
    check_function,
    close,
    fail,
    passed,
    require,
)

# -- 6.1 samples per worker ----------------------------------------------------------------

EVEN_BATCH, EVEN_WORKERS = 1024, 16
ODD_BATCH, ODD_WORKERS = 100, 8


def exercise_1(per_worker, shards) -> None:
    """B=1024 over N=16 workers; then the shard sizes of B=100 over N=8 workers."""
    value = as_number(per_worker, "per_worker")
    sizes = as_sequence(shards, "shards")
    want = EVEN_BATCH // EVEN_WORKERS
    if not close(value, want):
        if close(value, EVEN_BATCH * EVEN_WORKERS):
            fail(
                "`per_worker` multiplies batch and workers. The mini-batch of 1024 is *shared* "
                "by the 16 workers: each gets a part of it."
            )
        if close(value, EVEN_BATCH):
            fail(
                "`per_worker` is the whole mini-batch. Every worker holds the whole *model*, "
                "but only its own shard of the samples."
            )
        fail("`per_worker` is not right yet. Hint: the 16 shards are disjoint and cover the batch.")
    if len(sizes) != ODD_WORKERS:
        fail(f"`shards` should list one shard size per worker: 8 numbers, not {len(sizes)}.")
    sizes = [as_number(s, f"shards[{i}]") for i, s in enumerate(sizes)]
    for i, s in enumerate(sizes):
        if not s.is_integer():
            fail(
                f"`shards[{i}]` is {s:g}: a worker gets whole samples, so every shard size "
                "is a whole number. Some workers will get one sample more than others."
            )
        if s < 1:
            fail(f"`shards[{i}]` is {s:g}: every worker should get at least one sample.")
    total = sum(sizes)
    if total != ODD_BATCH:
        fail(
            f"Your shards add up to {total:g} samples, but the mini-batch has {ODD_BATCH}. "
            "Shards are disjoint and together cover every sample exactly once (none dropped)."
        )
    if max(sizes) - min(sizes) > 1:
        fail(
            "Your shards add up to 100, but they are uneven: the slowest (largest) shard sets "
            "the pace of the step. Spread the samples so sizes differ by at most one."
        )
    passed(
        f"Right: {want} samples per worker; 100 = 4 x 13 + 4 x 12. With uneven shards each "
        "worker's loss must be weighted by its share n_r / B (the lesson's section 3)."
    )


# -- 6.2 what happens after the local backward passes --------------------------------------

AFTER_BACKWARD = ("a", "b", "c", "d")


def exercise_2(after_backward) -> None:
    """What must happen after every worker has finished its local backward pass?"""
    choice = as_choice(after_backward, AFTER_BACKWARD, "after_backward")
    hints = {
        "a": (
            "If every worker steps with its own gradient, the replicas get different updates "
            "and stop being copies of one model after the first step. What keeps them equal?"
        ),
        "c": (
            "Moving the samples around would make every worker redo the whole batch: no "
            "work would be saved. What is small enough to exchange, and enough to agree on?"
        ),
        "d": (
            "Worker 0's gradient only saw worker 0's shard: the other shards' samples would "
            "be wasted. The update should use every sample of the mini-batch."
        ),
    }
    if choice != "b":
        fail(f"`after_backward` = {choice!r} is not it. {hints[choice]}")
    passed(
        "Right: an all-reduce combines the gradients, so every replica applies the same update "
        "and the replicas stay identical."
    )


# -- 6.3 the order of events in one step ---------------------------------------------------

EVENTS = ("a", "b", "c", "d", "e", "f")
# a all-reduce, b forward, c split, d optimizer step, e backward, f broadcast the weights
SETUP = {"c", "f"}


def exercise_3(order) -> None:
    """Order the events of one data-parallel step (split and broadcast may come in any order)."""
    items = as_sequence(order, "order", item=lambda x, name: as_choice(x, EVENTS, name))
    if sorted(items) != sorted(EVENTS):
        missing = sorted(set(EVENTS) - set(items))
        fail(
            "`order` should use each of the letters 'a' to 'f' exactly once"
            + (f" (missing: {', '.join(missing)})." if missing else ".")
        )
    pos = {letter: i for i, letter in enumerate(items)}
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
    passed(
        "Right: split the batch and make the replicas identical, then forward, backward, "
        "all-reduce, and the same optimizer step everywhere."
    )


# -- 6.4 build a ring all-reduce -----------------------------------------------------------


def _ring_case(rng: random.Random, n: int, length: int) -> list[list[float]]:
    return [[round(rng.uniform(-10, 10), 3) for _ in range(length)] for _ in range(n)]


def exercise_4(ring_allreduce) -> None:
    """Build ring_allreduce(data, send): every rank ends with the element-wise sum, and data
    moves only by `send` to the right neighbour, about 2(N-1)/N of the data per rank."""
    call = check_function(ring_allreduce, "ring_allreduce")
    rng = random.Random()
    cases = [
        (4, 8),
        (rng.randint(2, 3), rng.randint(5, 13)),
        (rng.randint(5, 7), rng.randint(8, 30)),
    ]
    cases += [(rng.randint(3, 6), rng.randint(1, 2)), (1, rng.randint(1, 5))]
    for n, length in cases:
        data = _ring_case(rng, n, length)
        want = [sum(col) for col in zip(*data, strict=True)]
        sent = [0] * n
        messages = [0]

        def send(src, dst, values, n=n, sent=sent, messages=messages):
            try:  # ints, numpy integers and 0-d integer tensors are all fine
                src, dst = operator.index(src), operator.index(dst)
            except TypeError:
                fail(f"send({src!r}, {dst!r}, ...): ranks are whole numbers 0..{n - 1}.")
            if not (0 <= src < n and 0 <= dst < n):
                fail(f"send({src!r}, {dst!r}, ...): ranks are whole numbers 0..{n - 1}.")
            if dst != (src + 1) % n:
                fail(
                    f"Rank {src} sent to rank {dst} (with N = {n}). In a ring, a rank only "
                    f"sends to its right neighbour, rank (src + 1) % N = {(src + 1) % n}."
                )
            items = as_sequence(values, "the values passed to send", item=as_number)
            sent[src] += len(items)
            messages[0] += 1
            return list(items)

        shown = f"ring_allreduce(<{n} ranks x {length} numbers>, send)"
        result = call([list(row) for row in data], send)
        rows = as_sequence(result, f"the result of {shown}")
        if len(rows) != n:
            fail(f"{shown} returned {len(rows)} rows; it should return one list per rank ({n}).")
        for r, row in enumerate(rows):
            got = as_sequence(row, f"rank {r}'s result", item=as_number)
            if len(got) != length:
                fail(f"{shown}: rank {r}'s result has {len(got)} numbers instead of {length}.")
            if all(close(g, w, rel=1e-9, abs=1e-9) for g, w in zip(got, want, strict=True)):
                continue
            if all(close(g, w / n, rel=1e-9, abs=1e-9) for g, w in zip(got, want, strict=True)):
                fail(f"{shown}: rank {r} holds the mean; this exercise asks for the sum.")
            bad = next(
                i for i, (g, w) in enumerate(zip(got, want, strict=True)) if not close(g, w, 1e-9)
            )
            fail(
                f"{shown}: rank {r}'s element {bad} is {got[bad]:.4g}, not the sum over the "
                "ranks. Hint: try N = 3 ranks of 3 numbers and print every rank's list after "
                "each step: after the reduce-scatter, which chunk is complete on each rank? "
                "That is the chunk it must pass on first in the all-gather."
            )
        if n > 1 and messages[0] == 0:
            fail(
                f"{shown} gives the right sums but sent no message: in a real cluster a rank "
                "cannot read another rank's memory. Move the chunks with `send`."
            )
        limit = 2 * (n - 1) * math.ceil(length / n)
        if max(sent) > limit:
            worst = sent.index(max(sent))
            fail(
                f"{shown} is right, but rank {worst} sent {sent[worst]} numbers, more than a "
                f"ring needs (2(N-1) chunks of about {length}/{n}). Send one chunk per step, "
                "not the whole vector."
            )
    passed(
        f"Right on fresh random cases (ranks x length) {cases}: every rank holds the sum, and "
        "each sent only 2(N-1) chunks to its right neighbour."
    )


# -- 6.5 traffic per worker ----------------------------------------------------------------

GRAD_MB, TRAFFIC_WORKERS = 1000.0, 8


def exercise_5(ring_mb_per_worker, naive_mb_rank0) -> None:
    """1000 MB of gradients, 8 workers: MB sent per worker by the ring, and by rank 0 naively."""
    ring = as_number(ring_mb_per_worker, "ring_mb_per_worker")
    naive = as_number(naive_mb_rank0, "naive_mb_rank0")
    n, s = TRAFFIC_WORKERS, GRAD_MB
    if not close(ring, 2 * (n - 1) / n * s):
        if close(ring, (n - 1) / n * s):
            fail(
                "`ring_mb_per_worker` counts only one phase. The ring all-reduce has two: "
                "reduce-scatter, then all-gather. Both send chunks."
            )
        if close(ring, 2 * s):
            fail(
                "`ring_mb_per_worker` is the limit for very many workers. With 8 workers, "
                "how many chunks of size S/8 does each worker send in each phase?"
            )
        if close(ring, s / n) or close(ring, 2 * s / n):
            fail("Each ring step sends one chunk, but there are N - 1 steps per phase.")
        fail(
            "`ring_mb_per_worker` is not right yet. Count chunks: N chunks of S/N; how many "
            "steps per phase, and how many phases?"
        )
    if not close(naive, (n - 1) * s):
        if close(naive, n * s):
            fail(
                "`naive_mb_rank0`: rank 0 does not send the result to itself. How many "
                "*other* ranks need it?"
            )
        if close(naive, s):
            fail(
                "`naive_mb_rank0`: S is what each of the *other* ranks sends. Rank 0 sends "
                "the sum back to every other rank."
            )
        if close(naive, 2 * (n - 1) * s):
            fail(
                "`naive_mb_rank0` also counts what rank 0 receives. The question asks only "
                "about what it sends."
            )
        fail("`ring_mb_per_worker` is right; `naive_mb_rank0` is not yet. Who does rank 0 send to?")
    passed(
        f"Right: the ring sends {ring:g} MB per worker, evenly; naive makes rank 0 send "
        f"{naive:g} MB, 4x more, and that one link sets the pace."
    )


# -- 6.6 diagnose sub-linear scaling -------------------------------------------------------

SCALING = {
    "compute_1": 4.8,  # seconds for the global batch on one worker
    "grad_bytes": 1.2e9,  # 300 M parameters, fp32 gradients
    "bandwidth": 12.5e9,  # 100 Gbit/s
}
SCALING_WORKERS = (1, 2, 4, 8, 16)


def scaling_table() -> list[tuple[int, float, float]]:
    """(workers, compute seconds per step, all-reduce seconds per step) of Exercise 6.6."""
    from course_utils.parallel.costs import ring_allreduce_time

    c, s, bw = SCALING["compute_1"], SCALING["grad_bytes"], SCALING["bandwidth"]
    return [(n, c / n, ring_allreduce_time(s, n, bw)) for n in SCALING_WORKERS]


SCALING_CAUSES = ("a", "b", "c", "d")
SCALING_FIXES = ("a", "b", "c", "d")


def exercise_6(efficiency_16, cause, fix) -> None:
    """Read the scaling chart: efficiency at 16 workers, the main cause and a fix."""
    eff = as_number(efficiency_16, "efficiency_16")
    why = as_choice(cause, SCALING_CAUSES, "cause")
    what = as_choice(fix, SCALING_FIXES, "fix")
    rows = {n: (c, a) for n, c, a in scaling_table()}
    speedup = rows[1][0] / sum(rows[16])
    if eff > 1.5:
        fail(
            "`efficiency_16` looks like a speed-up. Efficiency is speed-up / number of "
            "workers: a fraction, 1 for perfect scaling."
        )
    if not close(eff, speedup / 16, rel=2e-2):
        fail(
            "`efficiency_16` is not right yet. Speed-up = step time on 1 worker / step time on "
            "16 (compute + all-reduce); efficiency = speed-up / 16."
        )
    cause_hints = {
        "b": (
            "The learning rate changes how well the model learns per step, not how long a "
            "step takes; the chart shows time per step."
        ),
        "c": (
            "Check the ring formula: each worker sends 2(N-1)/N of the gradient, which hardly "
            "grows from 8 to 16 workers (1.75 S to 1.875 S)."
        ),
        "d": "Nothing in the chart is about memory; each worker holds the same replica.",
    }
    if why != "a":
        fail(f"`efficiency_16` is right. `cause` = {why!r} is not it: {cause_hints[why]}")
    fix_hints = {
        "b": "The naive all-reduce sends more from rank 0, not less: it would make this worse.",
        "c": (
            "A smaller batch per worker shrinks the compute further while the all-reduce "
            "stays: communication's share would grow."
        ),
        "d": "More synchronization points add waiting; they hide nothing.",
    }
    if what != "a":
        fail(f"`efficiency_16` and `cause` are right. `fix` = {what!r} is not: {fix_hints[what]}")
    passed(
        f"Right: {speedup:.1f}x on 16 workers, {eff:.0%} efficiency. Compute halves with every "
        "doubling, the all-reduce does not; hiding it behind the backward pass wins much of "
        "it back."
    )


# -- 6.7 evaluate training strategies ------------------------------------------------------

STRATEGY_ANSWERS = (True, False, False, True, False)
STRATEGY_HINTS = (
    "Strategy 1: with equal shards, the mean over the 8 shard means is the mean over all "
    "512 samples, and gradients are linear in the loss.",
    "Strategy 2: with shards of 13 and 12 samples, is one sample of a 12-sample shard given "
    "the same weight as one of a 13-sample shard? Write out the weights.",
    "Strategy 3: after one local step the replicas differ, so later gradients are taken at "
    "different weights. Is that the gradient of the whole batch at one set of weights?",
    "Strategy 4: sum over shards of (sum over the shard's samples), divided by 100, is the "
    "mean over all 100 samples.",
    "Strategy 5: the global batch grew from 64 to 512 samples. With the same number of steps "
    "and learning rate, is it the same sequence of updates? (Goyal et al. 2017 scale the "
    "learning rate with the batch.)",
)


def _as_bool(value, what: str) -> bool:
    require(value, what)
    if not isinstance(value, bool):
        fail(f"`{what}` should be True or False, but it is {value!r}.")
    return value


def exercise_7(exact) -> None:
    """For 5 strategies: is it exactly gradient descent on the whole global batch?"""
    items = as_sequence(exact, "exact", length=len(STRATEGY_ANSWERS), item=_as_bool)
    wrong = [i for i, (a, b) in enumerate(zip(items, STRATEGY_ANSWERS, strict=True)) if a != b]
    if wrong:
        first = wrong[0]
        count = "1 answer is" if len(wrong) == 1 else f"{len(wrong)} answers are"
        fail(f"{count} not right yet. Look again at: {STRATEGY_HINTS[first]}")
    passed(
        "Right: only a properly weighted all-reduce of gradients taken at the same weights is "
        "exactly large-batch gradient descent; and a bigger global batch is a different run."
    )


__all__ = [f"exercise_{k}" for k in range(1, 8)] + ["scaling_table"]
