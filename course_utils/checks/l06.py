"""Checks for lesson 06's exercises (data parallelism).

The traffic figures are those of the ring all-reduce (Patarasuk & Yuan 2009): every worker
sends 2(N-1)/N of the gradient; the naive all-reduce (gather on rank 0, then broadcast) makes
rank 0 send (N-1) copies. The scaling of 6.6 is lesson 06's two-level model: a ring runs at
its slowest link, NVLink inside a node, the network between nodes (`course_utils.plan`).
"""

from __future__ import annotations

import math

from course_utils import checks
from course_utils.checks import DEFAULT, OTHERWISE, Variant, exercise, fail, judge, numbers, pick

for_student = checks.lesson_checks(__name__)


given_1 = numbers(
    pick("1e", (1024, 16), [(512, 8), (2048, 32), (768, 12)], "batch", "workers"),
    pick("1o", (100, 8), [(90, 8), (75, 6), (130, 12)], "odd_batch", "odd_workers"),
)


@exercise(given_1, per_worker="number", shards="list")
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
    judge(per_worker, batch // workers, "per_worker", hints)
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
            f"Your shards add up to {sum(sizes):g} samples, but the mini-batch has {odd_batch}. "
            "Shards are disjoint and together cover every sample exactly once (none dropped)."
        )
    if max(sizes) - min(sizes) > 1:
        fail(
            f"Your shards add up to {odd_batch}, but they are uneven: the slowest (largest) "
            "shard sets the pace of the step. Spread the samples so sizes differ by at most one."
        )
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


def _chunks(length: int, n: int) -> list[tuple[int, int]]:
    from course_utils.threads.collectives import chunk_bounds

    return chunk_bounds(length, n)


def ring_messages(data: list[list[float]]) -> list[list[list[float]]]:
    """What each rank sends in the ring the exercise describes, in order: per rank, its
    2(N-1) messages (reduce-scatter: chunk (r-k) mod N, all-gather: chunk (r+1-k) mod N)."""
    n = len(data)
    bufs = [list(row) for row in data]
    bounds = _chunks(len(bufs[0]), n)
    sent: list[list[list[float]]] = [[] for _ in range(n)]
    for k in range(2 * (n - 1)):
        gather = k >= n - 1  # the all-gather copies finished sums; the reduce-scatter adds
        step = k - (n - 1) if gather else k
        msgs = [bufs[r][slice(*bounds[(r + gather - step) % n])] for r in range(n)]
        for r in range(n):
            sent[r].append(list(msgs[r]))
        for r in range(n):
            a, b = bounds[(r + gather - step - 1) % n]
            incoming = msgs[(r - 1) % n]
            bufs[r][a:b] = (
                incoming if gather else [x + y for x, y in zip(bufs[r][a:b], incoming, strict=True)]
            )
    return sent


def cases_4(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    rng = variant.cases("4")
    shapes = [
        (4, 8),
        (rng.randint(2, 3), rng.randint(5, 13)),
        (rng.randint(5, 7), rng.randint(8, 30)),
    ]
    shapes += [(rng.randint(3, 6), rng.randint(1, 2)), (1, rng.randint(1, 5))]
    cases = []
    for n, length in shapes:
        data = [[round(rng.uniform(-10, 10), 3) for _ in range(length)] for _ in range(n)]
        cases.append((data,))
    return {"ring_allreduce": cases}


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def _message(item, what: str, n: int) -> tuple[int, int, list[float]]:
    parts = checks.as_sequence(item, what, length=3)
    src, dst = (
        checks.as_int(parts[0], f"{what}'s source rank"),
        checks.as_int(parts[1], f"{what}'s destination"),
    )
    if not (0 <= src < n and 0 <= dst < n):
        fail(f"{what} goes from rank {src} to rank {dst}: ranks are whole numbers 0..{n - 1}.")
    values = checks.as_sequence(parts[2], f"{what}'s values", item=checks.as_number)
    return src, dst, values


def _check_sums(shown: str, data: list[list[float]], result) -> None:
    n, length = len(data), len(data[0])
    want = [sum(col) for col in zip(*data, strict=True)]
    rows = checks.as_sequence(result, f"the result list of {shown}")
    if len(rows) != n:
        fail(f"{shown} returned {len(rows)} rows; it should return one list per rank ({n}).")
    for r, row in enumerate(rows):
        got = checks.as_sequence(row, f"rank {r}'s result", item=checks.as_number)
        if len(got) != length:
            fail(f"{shown}: rank {r}'s result has {len(got)} numbers instead of {length}.")
        if all(_same(g, w) for g, w in zip(got, want, strict=True)):
            continue
        if all(_same(g, w / n) for g, w in zip(got, want, strict=True)):
            fail(f"{shown}: rank {r} holds the mean; this exercise asks for the sum.")
        bad = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if not _same(g, w))
        fail(
            f"{shown}: rank {r}'s element {bad} is {got[bad]:.4g}, not the sum over the "
            "ranks. Hint: try N = 3 ranks of 3 numbers and print every rank's list after "
            "each step: after the reduce-scatter, which chunk is complete on each rank? "
            "That is the chunk it must pass on first in the all-gather."
        )


def _check_messages(shown: str, data: list[list[float]], log) -> None:
    n, length = len(data), len(data[0])
    messages = [
        _message(m, f"message {i}", n) for i, m in enumerate(checks.as_sequence(log, "messages"))
    ]
    if n > 1 and not messages:
        fail(
            f"{shown} gives the right sums but sent no message: in a real cluster a rank "
            "cannot read another rank's memory. Move the chunks with `send`."
        )
    for src, dst, _ in messages:
        if dst != (src + 1) % n:
            fail(
                f"Rank {src} sent to rank {dst} (with N = {n}). In a ring, a rank only "
                f"sends to its right neighbour, rank (src + 1) % N = {(src + 1) % n}."
            )
    expected = ring_messages(data)
    for r in range(n):
        mine = [vals for src, _, vals in messages if src == r and vals]
        ring = [vals for vals in expected[r] if vals]
        if len(mine) > len(ring):
            fail(
                f"{shown} is right, but rank {r} sent {len(mine)} messages, more than a ring "
                f"needs (2(N-1) = {2 * (n - 1)}, one chunk per step). Send one chunk per step, "
                "not the whole vector."
            )
        for k, (got, exp) in enumerate(zip(mine, ring, strict=False)):
            if len(got) > len(exp):
                fail(
                    f"{shown} gives the right sums, but rank {r}'s message {k} holds "
                    f"{len(got)} numbers. A ring sends one chunk per step, about L/N = "
                    f"{length}/{n} numbers: cut the data with chunk_bounds(L, N)."
                )
            if len(got) != len(exp) or not all(_same(a, b) for a, b in zip(got, exp, strict=True)):
                gather = k >= n - 1
                step = k - (n - 1) if gather else k
                fail(
                    f"{shown} gives the right sums, but rank {r}'s message {k} is not what "
                    f"the ring sends: in {'all-gather' if gather else 'reduce-scatter'} step "
                    f"{step}, rank {r} sends its copy of chunk {(r + gather - step) % n} "
                    "(chunk_bounds(L, N)), "
                    + ("a finished sum." if gather else "the partial sum it has built so far.")
                )
        if len(mine) < len(ring):
            fail(
                f"{shown} gives the right sums, but rank {r} sent only {len(mine)} of the "
                f"ring's {len(ring)} messages: every step of both phases sends one chunk."
            )


@exercise(ring_allreduce="function")
def exercise_4(ring_allreduce, variant) -> str:
    """Build ring_allreduce(data) -> (result, messages): every rank ends with the element-wise
    sum, and the messages are the ring's: to the right neighbour, one chunk per step."""
    shapes = []
    for (data,), _, result in checks.each_call(ring_allreduce, cases_4(variant)["ring_allreduce"]):
        n, length = len(data), len(data[0])
        shapes.append(f"{n}x{length}")
        shown = f"ring_allreduce(<{n} ranks x {length} numbers>)"
        answer = checks.as_sequence(result, f"the result of {shown}")
        if len(answer) != 2:
            fail(
                f"{shown} should return two things, (result, messages): the sums on every "
                "rank, and the log `send` kept of the messages."
            )
        _check_sums(shown, data, answer[0])
        _check_messages(shown, data, answer[1])
    return (
        f"Right on fresh random cases (ranks x length) {', '.join(shapes)}: every rank holds "
        "the sum, and each sent its 2(N-1) chunks, the ring's own, to its right neighbour."
    )


given_5 = numbers(params_m=pick("5p", 250, [125, 350, 500, 750]), workers=pick("5n", 8, [4, 6, 16]))


@exercise(given_5, ring_gb_per_worker="number", naive_gb_rank0="number")
def exercise_5(g, ring_gb_per_worker, naive_gb_rank0) -> str:
    """fp32 gradients of the given model, N workers: GB each worker sends in the ring, and
    GB rank 0 sends in the naive all-reduce (1 GB = 10^9 bytes, one direction)."""
    n = g.workers
    s = 4 * g.params_m * 1e6 / 1e9  # GB of fp32 gradients
    want_ring, want_naive = 2 * (n - 1) / n * s, (n - 1) * s
    one_step, values = checks.any_of(s / n, 2 * s / n), want_ring / 4  # values: not bytes
    mb = (1e3, "looks like megabytes; give GB (1 GB = 1000 MB).")
    both = (2, "counts both directions (sent and received); give the bytes one way.")
    hints = {
        "`ring_gb_per_worker` counts only one phase. The ring all-reduce has two: "
        "reduce-scatter, then all-gather. Both send chunks.": (n - 1) / n * s,
        f"`ring_gb_per_worker` is the limit for very many workers. With {n} workers, how many "
        f"chunks of size S/{n} does each worker send in each phase?": 2 * s,
        "Each ring step sends one chunk, but there are N - 1 steps per phase.": one_step,
        "`ring_gb_per_worker` counts parameters, not bytes: an fp32 number is 4 bytes.": values,
        "`ring_gb_per_worker` is not right yet. Count chunks: N chunks of S/N; how many steps "
        "per phase, and how many phases?": OTHERWISE,
    }
    judge(ring_gb_per_worker, want_ring, "ring_gb_per_worker", hints, unit="GB", slips=[mb, both])
    hints = {
        "`naive_gb_rank0`: rank 0 does not send the result to itself. How many *other* ranks "
        "need it?": n * s,
        "`naive_gb_rank0`: S is what each of the *other* ranks sends. Rank 0 sends the sum "
        "back to every other rank.": s,
        "`naive_gb_rank0` also counts what rank 0 receives. The question asks only about what "
        "it sends.": 2 * (n - 1) * s,
        "`ring_gb_per_worker` is right; `naive_gb_rank0` is not yet. Who does rank 0 send "
        "to?": OTHERWISE,
    }
    judge(naive_gb_rank0, want_naive, "naive_gb_rank0", hints, unit="GB", slips=[mb])
    return (
        f"Right: the ring sends {want_ring:.3g} GB per worker, evenly; naive makes rank 0 send "
        f"{want_naive:.3g} GB, {want_naive / want_ring:.3g}x more, and that one link sets the "
        "pace."
    )


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


@exercise(
    points=3,
    partial=True,
    efficiency_16="number",
    cause={
        "a": checks.RIGHT,
        "b": "The learning rate changes how well the model learns per step, not how long a "
        "step takes; the table shows time per step.",
        "c": "Check the ring formula: each worker sends 2(N-1)/N of the gradient, which "
        "hardly grows from 8 to 16 workers (1.75 S to 1.875 S). Compare the links instead.",
        "d": "Nothing in the table is about memory; each worker holds the same replica.",
    },
    fix={
        "a": checks.RIGHT,
        "b": "The naive all-reduce sends more from rank 0, not less: it would make this worse.",
        "c": "A smaller batch per worker shrinks the compute further while the all-reduce "
        "stays: communication's share would grow.",
        "d": "More synchronization points add waiting; they hide nothing.",
    },
)
def exercise_6(efficiency_16, cause, fix, variant) -> str:
    """Read the scaling table: efficiency at 16 workers, the main cause and a fix."""
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
    judge(efficiency_16, want, "efficiency_16", hints, unit="fraction")
    return (
        f"Right: {sum(rows[1]) / sum(rows[8]):.1f}x on 8 workers inside a node, {speedup:.1f}x "
        f"on 16 across two nodes, {want:.1%} efficiency. Past one node the ring runs at the "
        "slow link's speed; hiding the all-reduce behind the backward pass wins much of it back."
    )


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
    if wrong:
        count = "1 answer is" if len(wrong) == 1 else f"{len(wrong)} answers are"
        fail(f"{count} not right yet. Look again at: {STRATEGY_HINTS[wrong[0]]}")
    return (
        "Right: only a properly weighted all-reduce of gradients taken at the same weights is "
        "exactly large-batch gradient descent; and a bigger global batch is a different run."
    )
