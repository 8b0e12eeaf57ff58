"""Checks for the exercises of lesson 06 (data parallelism).

Each `exercise_K` is called by the check cell of Exercise 6.K in
`exercises/06_data_parallelism.ipynb`, with the learner's variant `v`: `given_K(v)` draws the
exercise's numbers (the default student gets the course's own), and every expected answer
is computed from them; `cases_4(v)` are the inputs the Build exercise's function is tried
on. The traffic figures are those of the ring all-reduce (Patarasuk & Yuan 2009): every
worker sends 2(N-1)/N of the gradient; the naive all-reduce (gather on rank 0, then
broadcast) makes rank 0 send (N-1) copies. The scaling of 6.6 is lesson 06's two-level
model: a ring runs at its slowest link, NVLink inside a node, the network between nodes
(`course_utils.plan.Hardware`).
"""

from __future__ import annotations

import math

from course_utils.checks import (
    DEFAULT,
    Variant,
    as_choice,
    as_int,
    as_number,
    as_sequence,
    check_function,
    expect_number,
    fail,
    is_right,
    passed,
    require,
)
from course_utils.checks import (
    for_student as _for_student,
)


def for_student(student: str = "default"):
    """This lesson's checks with `student`'s numbers (the notebook's first code cell)."""
    import sys

    return _for_student(sys.modules[__name__], student)


# -- 6.1 samples per worker ----------------------------------------------------------------


def given_1(v: Variant = DEFAULT) -> dict:
    even = v.pick("1e", (1024, 16), [(512, 8), (2048, 32), (768, 12)])
    odd = v.pick("1o", (100, 8), [(90, 8), (75, 6), (130, 12)])
    return {"batch": even[0], "workers": even[1], "odd_batch": odd[0], "odd_workers": odd[1]}


def exercise_1(per_worker, shards, v: Variant = DEFAULT) -> None:
    """The given batch over its workers; then the shard sizes of the odd batch."""
    batch, workers, odd_batch, odd_workers = given_1(v).values()
    value = as_number(per_worker, "per_worker")
    sizes = as_sequence(shards, "shards")
    want = batch // workers
    if value != want:
        if value == batch * workers:
            fail(
                f"`per_worker` multiplies batch and workers. The mini-batch of {batch} is "
                f"*shared* by the {workers} workers: each gets a part of it."
            )
        if value == batch:
            fail(
                "`per_worker` is the whole mini-batch. Every worker holds the whole *model*, "
                "but only its own shard of the samples."
            )
        fail(
            f"`per_worker` is not right yet. Hint: the {workers} shards are disjoint and "
            "cover the batch."
        )
    if len(sizes) != odd_workers:
        fail(
            f"`shards` should list one shard size per worker: {odd_workers} numbers, not "
            f"{len(sizes)}."
        )
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
    if total != odd_batch:
        fail(
            f"Your shards add up to {total:g} samples, but the mini-batch has {odd_batch}. "
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
    passed(
        f"Right: {want} samples per worker; {odd_batch} = {split}. With uneven shards each "
        "worker's loss must be weighted by its share n_r / B (the lesson's section 3)."
    )


# -- 6.2 what happens after the local backward passes --------------------------------------

AFTER_BACKWARD = ("a", "b", "c", "d")


def exercise_2(after_backward, v: Variant = DEFAULT) -> None:
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


def exercise_3(order, v: Variant = DEFAULT) -> None:
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
    for k in range(n - 1):
        msgs = [bufs[r][slice(*bounds[(r - k) % n])] for r in range(n)]
        for r in range(n):
            sent[r].append(list(msgs[r]))
        for r in range(n):
            a, b = bounds[(r - k - 1) % n]
            bufs[r][a:b] = [x + y for x, y in zip(bufs[r][a:b], msgs[(r - 1) % n], strict=True)]
    for k in range(n - 1):
        msgs = [bufs[r][slice(*bounds[(r + 1 - k) % n])] for r in range(n)]
        for r in range(n):
            sent[r].append(list(msgs[r]))
        for r in range(n):
            a, b = bounds[(r - k) % n]
            bufs[r][a:b] = msgs[(r - 1) % n]
    return sent


def cases_4(v: Variant = DEFAULT) -> dict[str, list[tuple]]:
    rng = v.cases("4")
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
    parts = as_sequence(item, what, length=3)
    src, dst = as_int(parts[0], f"{what}'s source rank"), as_int(parts[1], f"{what}'s destination")
    if not (0 <= src < n and 0 <= dst < n):
        fail(f"{what} goes from rank {src} to rank {dst}: ranks are whole numbers 0..{n - 1}.")
    values = as_sequence(parts[2], f"{what}'s values", item=as_number)
    return src, dst, values


def exercise_4(ring_allreduce, v: Variant = DEFAULT) -> None:
    """Build ring_allreduce(data) -> (result, messages): every rank ends with the element-wise
    sum, and the messages are the ring's: to the right neighbour, one chunk per step."""
    call = check_function(ring_allreduce, "ring_allreduce")
    cases = cases_4(v)["ring_allreduce"]
    shapes = []
    for (data,) in cases:
        n, length = len(data), len(data[0])
        shapes.append((n, length))
        shown = f"ring_allreduce(<{n} ranks x {length} numbers>)"
        answer = as_sequence(call([list(row) for row in data]), f"the result of {shown}")
        if len(answer) != 2:
            fail(
                f"{shown} should return two things, (result, messages): the sums on every "
                "rank, and the log `send` kept of the messages."
            )
        result, log = answer
        want = [sum(col) for col in zip(*data, strict=True)]
        rows = as_sequence(result, f"the result list of {shown}")
        if len(rows) != n:
            fail(f"{shown} returned {len(rows)} rows; it should return one list per rank ({n}).")
        for r, row in enumerate(rows):
            got = as_sequence(row, f"rank {r}'s result", item=as_number)
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
        messages = [
            _message(m, f"message {i}", n) for i, m in enumerate(as_sequence(log, "messages"))
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
                    f"{shown} is right, but rank {r} sent {len(mine)} messages, more than a "
                    f"ring needs (2(N-1) = {2 * (n - 1)}, one chunk per step). Send one chunk "
                    "per step, not the whole vector."
                )
            for k, (got, exp) in enumerate(zip(mine, ring, strict=False)):
                if len(got) > len(exp):
                    fail(
                        f"{shown} gives the right sums, but rank {r}'s message {k} holds "
                        f"{len(got)} numbers. A ring sends one chunk per step, about L/N = "
                        f"{length}/{n} numbers: cut the data with chunk_bounds(L, N)."
                    )
                if len(got) != len(exp) or not all(
                    _same(a, b) for a, b in zip(got, exp, strict=True)
                ):
                    phase = "reduce-scatter" if k < n - 1 else "all-gather"
                    step = k if k < n - 1 else k - (n - 1)
                    chunk = (r - step) % n if k < n - 1 else (r + 1 - step) % n
                    fail(
                        f"{shown} gives the right sums, but rank {r}'s message {k} is not what "
                        f"the ring sends: in {phase} step {step}, rank {r} sends its copy of "
                        f"chunk {chunk} (chunk_bounds(L, N)), "
                        + (
                            "the partial sum it has built so far."
                            if k < n - 1
                            else "a finished sum."
                        )
                    )
            if len(mine) < len(ring):
                fail(
                    f"{shown} gives the right sums, but rank {r} sent only {len(mine)} of the "
                    f"ring's {len(ring)} messages: every step of both phases sends one chunk."
                )
    listed = ", ".join(f"{n}x{length}" for n, length in shapes)
    passed(
        f"Right on fresh random cases (ranks x length) {listed}: every rank holds the sum, and "
        "each sent its 2(N-1) chunks, the ring's own, to its right neighbour."
    )


# -- 6.5 traffic per worker ----------------------------------------------------------------


def given_5(v: Variant = DEFAULT) -> dict:
    return {
        "params_m": v.pick("5p", 250, [125, 350, 500, 750]),
        "workers": v.pick("5n", 8, [4, 6, 16]),
    }


def exercise_5(ring_gb_per_worker, naive_gb_rank0, v: Variant = DEFAULT) -> None:
    """fp32 gradients of the given model, N workers: GB each worker sends in the ring, and
    GB rank 0 sends in the naive all-reduce (1 GB = 10^9 bytes, one direction)."""
    params_m, n = given_5(v).values()
    s = 4 * params_m * 1e6 / 1e9  # GB of fp32 gradients
    want_ring, want_naive = 2 * (n - 1) / n * s, (n - 1) * s
    mb = [(1e3, "looks like megabytes; give GB (1 GB = 1000 MB).")]
    ring = as_number(ring_gb_per_worker, "ring_gb_per_worker")
    if not is_right(ring, want_ring):
        if is_right(ring, (n - 1) / n * s):
            fail(
                "`ring_gb_per_worker` counts only one phase. The ring all-reduce has two: "
                "reduce-scatter, then all-gather. Both send chunks."
            )
        if is_right(ring, 2 * s):
            fail(
                f"`ring_gb_per_worker` is the limit for very many workers. With {n} workers, "
                f"how many chunks of size S/{n} does each worker send in each phase?"
            )
        if is_right(ring, s / n) or is_right(ring, 2 * s / n):
            fail("Each ring step sends one chunk, but there are N - 1 steps per phase.")
        if is_right(ring, params_m * 1e6 * 2 * (n - 1) / n / 1e9):
            fail("`ring_gb_per_worker` counts parameters, not bytes: an fp32 number is 4 bytes.")
        expect_number(
            ring,
            want_ring,
            "ring_gb_per_worker",
            unit="GB",
            slips=[*mb, (2, "counts both directions (sent and received); give the bytes one way.")],
        )
        fail(
            "`ring_gb_per_worker` is not right yet. Count chunks: N chunks of S/N; how many "
            "steps per phase, and how many phases?"
        )
    naive = as_number(naive_gb_rank0, "naive_gb_rank0")
    if not is_right(naive, want_naive):
        if is_right(naive, n * s):
            fail(
                "`naive_gb_rank0`: rank 0 does not send the result to itself. How many "
                "*other* ranks need it?"
            )
        if is_right(naive, s):
            fail(
                "`naive_gb_rank0`: S is what each of the *other* ranks sends. Rank 0 sends "
                "the sum back to every other rank."
            )
        if is_right(naive, 2 * (n - 1) * s):
            fail(
                "`naive_gb_rank0` also counts what rank 0 receives. The question asks only "
                "about what it sends."
            )
        expect_number(naive, want_naive, "naive_gb_rank0", unit="GB", slips=mb)
        fail("`ring_gb_per_worker` is right; `naive_gb_rank0` is not yet. Who does rank 0 send to?")
    passed(
        f"Right: the ring sends {want_ring:.3g} GB per worker, evenly; naive makes rank 0 send "
        f"{want_naive:.3g} GB, {want_naive / want_ring:.3g}x more, and that one link sets the pace."
    )


# -- 6.6 diagnose sub-linear scaling -------------------------------------------------------

SCALING_WORKERS = (1, 2, 4, 8, 16)


# (seconds for the global batch on one GPU, GB of fp32 gradients, GB/s per GPU between nodes):
# every triple gives nearly N inside a node of 8 and about 10x at 16, across two nodes.
SCALING_SETUPS = [(1.8, 1.2, 25.0), (3.0, 1.6, 25.0), (3.6, 1.0, 12.5), (2.0, 2.0, 50.0)]


def given_6(v: Variant = DEFAULT) -> dict:
    compute_1, grad_gb, inter_gbs = v.pick("6", (2.4, 1.2, 25.0), SCALING_SETUPS)
    return {
        "compute_1": compute_1,  # seconds for the global batch on one GPU
        "grad_gb": grad_gb,  # fp32 gradients
        "gpus_per_node": 8,
        "intra_gbs": 300.0,  # NVLink, per GPU
        "inter_gbs": inter_gbs,  # network between nodes, per GPU
    }


def scaling_table(v: Variant = DEFAULT) -> list[tuple[int, float, float]]:
    """(workers, compute seconds per step, all-reduce seconds per step) of Exercise 6.6."""
    from course_utils.parallel.costs import ring_allreduce_time
    from course_utils.plan import Hardware

    g = given_6(v)
    hw = Hardware(
        gpus_per_node=g["gpus_per_node"],
        intra_node_gbs=g["intra_gbs"],
        inter_node_gbs=g["inter_gbs"],
    )
    return [
        (n, g["compute_1"] / n, ring_allreduce_time(g["grad_gb"] * 1e9, n, hw.bandwidth(n)))
        for n in SCALING_WORKERS
    ]


SCALING_CAUSES = ("a", "b", "c", "d")
SCALING_FIXES = ("a", "b", "c", "d")


def exercise_6(efficiency_16, cause, fix, v: Variant = DEFAULT) -> None:
    """Read the scaling table: efficiency at 16 workers, the main cause and a fix."""
    rows = {n: (c, a) for n, c, a in scaling_table(v)}
    speedup = sum(rows[1]) / sum(rows[16])
    want = speedup / 16
    eff = as_number(efficiency_16, "efficiency_16")
    if not is_right(eff, want):
        if is_right(eff, speedup):
            fail(
                "`efficiency_16` looks like a speed-up. Efficiency is speed-up / number of "
                "workers: a fraction, 1 for perfect scaling."
            )
        if is_right(eff, sum(rows[1]) / rows[16][0] / 16):
            fail(
                "`efficiency_16` leaves out the all-reduce: a step on 16 workers is their "
                "compute plus the all-reduce."
            )
        expect_number(eff, want, "efficiency_16", unit="fraction")
        fail(
            "`efficiency_16` is not right yet. Speed-up = step time on 1 worker / step time on "
            "16 (compute + all-reduce); efficiency = speed-up / 16."
        )
    why = as_choice(cause, SCALING_CAUSES, "cause")
    what = as_choice(fix, SCALING_FIXES, "fix")
    cause_hints = {
        "b": (
            "The learning rate changes how well the model learns per step, not how long a "
            "step takes; the table shows time per step."
        ),
        "c": (
            "Check the ring formula: each worker sends 2(N-1)/N of the gradient, which hardly "
            "grows from 8 to 16 workers (1.75 S to 1.875 S). Compare the links instead."
        ),
        "d": "Nothing in the table is about memory; each worker holds the same replica.",
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
    eight = sum(rows[1]) / sum(rows[8])
    passed(
        f"Right: {eight:.1f}x on 8 workers inside a node, {speedup:.1f}x on 16 across two nodes, "
        f"{want:.1%} efficiency. Past one node the ring runs at the slow link's speed; hiding "
        "the all-reduce behind the backward pass wins much of it back."
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
    "Strategy 5: its reference is the single worker on batches of 64. The 8 workers take "
    "each step on 512 samples: with the same number of steps and learning rate, is that the "
    "same sequence of weights as steps on 64? (Goyal et al. 2017 scale the learning rate "
    "with the batch.)",
)


def _as_bool(value, what: str) -> bool:
    require(value, what)
    if not isinstance(value, bool):
        fail(f"`{what}` should be True or False, but it is {value!r}.")
    return value


def exercise_7(exact, v: Variant = DEFAULT) -> None:
    """For 5 strategies: does it compute exactly the weights of the single-worker run named?"""
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


__all__ = [f"exercise_{k}" for k in range(1, 8)] + ["scaling_table", "ring_messages"]
