"""Checks for lesson 09's exercises (sequence parallelism and context parallelism).

Every expected answer is computed with `course_utils.parallel` (Korthikanti's formula, the
ring's layout, work and memory, the ring simulator); Exercise 9.1's answer is a program every
rank runs (Megatron's sequence parallelism, `checks.sequence_build`); Exercise 9.2's is one every
rank runs (`checks.programs.AttentionCase`), judged from its run against full causal attention
(`attention`) and the ring's order of sends. Conventions shared
with the lesson: an MLP block keeps, per device, Korthikanti's five terms (Korthikanti et al.
2022, arXiv 2205.05198): the LayerNorm input, the first linear's input, the GeLU input, the
second linear's input (e bytes per value each) and the dropout mask (one byte per value);
f = 4h. Ring attention (Liu et al. 2023, arXiv 2310.01889) on N workers passes K/V blocks to
the right: at step k worker w holds worker (w - k) mod N's block. The zig-zag split gives
worker i chunks i and 2N-1-i of 2N (Dubey et al. 2024, arXiv 2407.21783).
"""

from __future__ import annotations

from course_utils import checks
from course_utils.checks import (
    DEFAULT,
    OTHERWISE,
    Variant,
    builds,
    exercise,
    fail,
    judge,
    numbers,
    pick,
    programs,
)
from course_utils.checks.programs import AttentionCase
from course_utils.checks.rank_cases import SequenceCase, ZigzagCase

for_student = checks.lesson_checks(__name__)


given_1 = numbers(tokens=pick("1s", 6, [9, 12]), d_model=pick("1h", 8, [6, 10]))


def cases_1(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own block on 3 ranks (3 divides its tokens), then fresh ones: 2 ranks
    on an odd number of tokens, 4 ranks; in the notebook fixed by their name, in the grader
    drawn afresh."""
    g, rng = given_1(variant), variant.cases("1")
    cases = [SequenceCase(3, g.tokens, g.d_model, 4 * g.d_model, seed=1)]
    for devices, tokens in ((2, rng.choice([5, 7, 9])), (4, rng.choice([8, 10, 12]))):
        hidden = devices * rng.randint(2, 5) + rng.randint(0, devices - 1)
        cases.append(
            SequenceCase(devices, tokens, rng.randint(4, 9), hidden, rng.randint(1, 10**6))
        )
    return {"sp_block": [(case,) for case in cases]}


@exercise(given_1, sp_block=programs.as_program, points=3, partial=True)
def exercise_1(sp_block, variant) -> str:
    """Build Megatron's sequence parallelism per rank: LayerNorm on the rank's tokens, g and
    g-bar along the sequence; judged on the run's outputs, gradients, collectives, bytes and
    the tokens its LayerNorm held."""
    from course_utils.checks.sequence_build import sequence_parallel as verdict  # the grader's

    return verdict(sp_block, cases_1(variant)["sp_block"])


given_2 = numbers(
    N=pick("2n", 4, [2, 3, 4]),
    tokens=pick("2t", 4, [3, 4, 5]),
    dim=pick("2d", 8, [4, 8]),
)
SHARP = 400  # queries scaled so: log-sum-exps near 400, far above float32 exp's range (88)


def cases_2(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own ring twice (their numbers; the second with sharp attention), then
    two more: in the notebook fixed by their name, in the grader drawn afresh."""
    g, rng = given_2(variant), variant.cases("2")
    mine = {"devices": g.N, "tokens": g.tokens, "dim": g.dim}
    cases = [AttentionCase(**mine, seed=9), AttentionCase(**mine, seed=10, sharp=SHARP)]
    for sharp in (1, SHARP):
        devices, tokens, dim = rng.choice([2, 3, 4]), rng.choice([2, 3, 5]), rng.choice([4, 6])
        cases.append(AttentionCase(devices, tokens, dim, rng.randint(1, 10**6), sharp))
    return {"ring_attention": [(case,) for case in cases]}


@exercise(given_2, ring_attention=programs.as_program, points=3, partial=True)
def exercise_2(ring_attention, variant) -> str:
    """Build causal ring attention as a per-rank program; judged on what the run did."""
    return builds.ring_attention(ring_attention, cases_2(variant)["ring_attention"])


def given_3(variant: Variant = DEFAULT) -> dict:
    n = variant.pick("3n", 4, [3, 5, 6, 8])
    return {"N": n, "w": variant.pick("3w", 1, range(1, n))}


@exercise(given_3, held="whole numbers", sends="whole number", partial=True)
def exercise_3(g, held, sends) -> str:
    """Ring attention forward: whose K/V block worker w holds at each step; blocks it sends."""
    n, w = g.N, g.w
    want, backwards = [(w - k) % n for k in range(n)], [(w + k) % n for k in range(n)]
    hints = {
        f"`held` needs one owner per step: the forward has N = {n} steps.": len(held) != n,
        f"`held` numbers the workers from 1. Workers are numbered 0 to {n - 1}, like everything "
        f"in the course: at step 0 worker {w} holds its own block, kv{w}.": [x + 1 for x in want],
        "The blocks go round the wrong way: each worker passes its block to the RIGHT (w + 1), "
        f"so the block that reaches worker {w} next comes from its left.": backwards,
        "Off by one step: at step 0 no block has moved yet; every worker starts with its own "
        "K/V block.": [(w - k - 1) % n for k in range(n)],
        f"Over the N = {n} steps worker {w} meets every worker's block exactly once.": sorted(held)
        != list(range(n)),
        "`held` is not the order the blocks arrive in; follow one hop to the right per "
        "step.": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    fields.judge(held, want, "held", hints)
    hints = {
        "`sends`: after the last step nobody needs the block in hand any more; the last block "
        "is not passed on.": n,
        "`sends` counts the backward too; the question asks for the forward only.": 2 * n - 1,
        "`sends` is not right: how many times does a block change hands before step "
        f"{n - 1}?": OTHERWISE,
    }
    fields.judge(sends, n - 1, "sends", hints)
    fields.verdict()
    return (
        f"Right: worker {w} sees the blocks of {want} and sends {n - 1}. In all each worker "
        "sends (N-1)/N of the sequence's K and V, as a ring all-gather would: nearly constant "
        "as N grows, while its compute shrinks, so the blocks must stay big enough to hide it."
    )


given_4 = numbers(N=pick("4n", 4, [3, 5, 6]), chunk=pick("4c", 2, [2, 3]))


def cases_4(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's ring (their numbers), then two more: in the notebook fixed by their name,
    in the grader drawn afresh."""
    g, rng = given_4(variant), variant.cases("4")
    cases = [ZigzagCase(g.N, g.chunk, 4, seed=4)]
    for devices in (rng.choice([2, 3]), rng.choice([4, 5])):
        cases.append(ZigzagCase(devices, rng.choice([2, 3]), 4, rng.randint(1, 10**6)))
    return {"zigzag_ring": [(case,) for case in cases]}


@exercise(given_4, zigzag_ring=programs.as_program, points=3, partial=True)
def exercise_4(zigzag_ring, variant) -> str:
    """Build causal ring attention on the zig-zag split per rank; judged on its outputs, its
    messages and the chunk products each rank computed."""
    from course_utils.checks.zigzag_build import zigzag_ring as verdict  # the grader's

    return verdict(zigzag_ring, cases_4(variant)["zigzag_ring"])


given_5 = numbers(
    N=pick("5n", 4, [5, 6, 8]),
    block_ms=pick("5b", 2.0, [1.5, 3.0]),
    transfer_ms=pick("5t", 0.5, [0.25, 0.75]),
)


# The calls of its material a graded notebook may make (the grader computes their results and
# hands them to the sandbox as data: course_utils.grading.stand_in): name -> other arguments.
MATERIAL = {"their_timeline": [{}, {"zigzag": True}]}


def their_timeline(variant: Variant = DEFAULT, zigzag: bool = False):
    """Exercise 9.5's causal ring forward, simulated (the plain split unless `zigzag`)."""
    from course_utils.parallel.context_parallel import simulate_ring

    g = given_5(variant)
    return simulate_ring(
        g["N"], zigzag, True, g["block_ms"], g["transfer_ms"], overlap=True, unit="ms"
    )


@exercise(
    given_5,
    straggler="whole number",
    idle_share="number",
    fix={
        "a": checks.RIGHT,
        "b": "The direction only changes the order the blocks arrive in: the last worker's "
        "queries still see every block.",
        "c": "With more workers the last one still computes N blocks against worker 0's "
        "one: the imbalance 2N/(N+1) even grows.",
        "d": "The transfers are already hidden; exchanging after computing only adds time.",
    },
    gain="number",
    partial=True,
)
def exercise_5(g, straggler, idle_share, fix, gain, variant) -> str:
    """A causal ring gone uneven: the straggler, worker 0's idle share, the fix and its gain."""
    theirs, fixed = their_timeline(variant), their_timeline(variant, zigzag=True)
    busy = theirs.busy_per_device()
    slowest = max(range(g.N), key=lambda r: busy[r])
    hints = {
        "Worker 0 computes least: its queries are the first tokens and see only their own "
        "block. Whom does everyone wait for?": 0,
        f"Worker {straggler} is not the one computing longest. Read each row's busy "
        "time.": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    with fields.judging():
        judge(straggler, slowest, "straggler", hints)
    want, busy_0 = 1 - busy[0] / theirs.makespan, busy[0] / theirs.makespan
    hints = {
        "`idle_share` is the share worker 0 computed; the question asks how long it idled.": busy_0,
        "`idle_share` is a time in ms; give it as a share of the makespan (0 to "
        "1).": theirs.makespan - busy[0],
        "`idle_share` is not right: (makespan - worker 0's busy time) / makespan.": OTHERWISE,
    }
    with fields.judging():
        judge(idle_share, want, "idle_share", hints, unit="fraction")
    want_gain = theirs.makespan / fixed.makespan
    hint = "`gain` is not right: simulate the same ring with zigzag=True and the same costs "
    hint += "(their_timeline(zigzag=True)), then divide the makespans."
    how = "the plain makespan over the zig-zag one"
    with fields.judging():
        judge(gain, want_gain, "gain", hint, upside_down=how)
    fields.verdict()
    return (
        f"Right: worker {slowest} computes {busy[slowest]:g} ms while worker 0 idles "
        f"{want:.0%} of the {theirs.makespan:g} ms step. The zig-zag split gives every worker "
        f"an early and a late chunk, evens the work and is {want_gain:.2f}x as fast."
    )


given_6 = numbers(
    seq=pick("6s", 65536, [32768, 131072]),
    heads=pick("6h", 8, [8, 16]),
    dim=128,
    e=2,
    budget_gib=pick("6g", 16, [8, 24]),
)


def _fits(g: dict, cp: int) -> float:
    from course_utils.parallel.context_parallel import attention_activation_bytes

    return attention_activation_bytes(g["seq"], cp, g["heads"], g["dim"], g["e"]) / checks.GIB


def _smallest(g: dict, gib) -> int:
    return next(cp for cp in (2**k for k in range(12)) if gib(cp) <= g["budget_gib"])


@exercise(given_6, cp="whole number", gib="number", partial=True)
def exercise_6(g, cp, gib) -> str:
    """The smallest power-of-2 context-parallel degree whose attention fits the budget."""
    want = _smallest(g, lambda n: _fits(g, n))
    fields = checks.Fields()  # every wrong answer named at once
    with fields.judging():
        if cp != want:
            if cp < 1 or cp & (cp - 1):
                fail(
                    "`cp` here is a power of 2 (1, 2, 4, 8, ...), as the sequence is split evenly."
                )

            def linear(n: int) -> float:  # the score term wrongly divided by N only
                t = g.seq / n
                return g.e * g.heads * (6 * t * g.dim + t + 2 * t * g.seq) / checks.GIB

            # Scores taken as t x L instead of t x t need a larger cp: say why before "smaller".
            if cp == _smallest(g, linear):
                fail(
                    "`cp`: the scores of one block product are t x t with t = L/N tokens: they "
                    "shrink with N squared, not N. A smaller cp fits."
                )
            if cp > want:
                fail(
                    f"`cp` = {cp} fits, but so does a smaller one: each halving saves "
                    "communication."
                )
            fail(f"`cp`: at cp = {cp} one worker needs {_fits(g, cp):.1f} GiB, over the budget.")
    want_gib, t = _fits(g, want), g.seq // want
    scores = g.e * g.heads * 2 * t * t / checks.GIB
    bytes_off = checks.any_of(want_gib / g.e, want_gib * 2)
    hints = {
        "`gib` counts only the scores; add q, k, v, the output, the lse and the "
        "buffer.": checks.any_of(scores, scores / 2),
        "`gib` is the unsplit layer's need; give it at the smallest cp that fits.": _fits(g, 1),
        "`gib` has the wrong bytes per value: the layer runs in 16-bit, 2 bytes.": bytes_off,
        "`gib` is not right: e x H x (6 t D + t + 2 t^2) bytes, with t = L / cp.": OTHERWISE,
    }
    with fields.judging():
        judge(gib, want_gib, "gib", hints, unit="GiB")
    fields.verdict()
    return (
        f"Right: cp = {want} needs {want_gib:.2f} GiB of the {g.budget_gib} GiB (cp = "
        f"{want // 2} would need {_fits(g, want // 2):.1f} GiB). Doubling cp divides the score "
        "matrix by four, the rest by two."
    )


given_7 = numbers(
    N=pick("7n", 4, [2, 3, 4]),
    per_rank=pick("7h", 2, [1, 2]),
    per_token=pick("7t", 1, [1, 2]),
    heads=lambda g: g.N * g.per_rank,  # the ranks divide the heads: whole heads each
    tokens=lambda g: g.N * g.per_token,  # tokens per rank, a multiple of the ranks
    dim=pick("7d", 4, [4, 8]),
)


def cases_7(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's ranks twice (causal, then not), then two more: in the notebook fixed by
    their name, in the grader drawn afresh; every case's ranks divide its heads."""
    from course_utils.checks.recorded_cases import UlyssesCase

    g, rng = given_7(variant), variant.cases("7")
    mine = {"devices": g.N, "tokens": g.tokens, "heads": g.heads, "dim": g.dim}
    cases = [UlyssesCase(**mine, causal=1, seed=7), UlyssesCase(**mine, causal=0, seed=8)]
    for causal in (0, 1):
        devices = rng.choice([2, 3, 4])
        heads = devices * rng.choice([1, 2])
        tokens, dim = devices * rng.choice([1, 2]), rng.choice([4, 6])
        cases.append(UlyssesCase(devices, tokens, heads, dim, causal, rng.randint(1, 10**6)))
    return {"ulysses": [(case,) for case in cases]}


@exercise(given_7, ulysses=programs.as_program, points=3, partial=True)
def exercise_7(ulysses, variant) -> str:
    """Build Ulysses attention per rank (two all-to-alls around plain attention); judged on
    its outputs, its all-to-alls' bytes and the attention each rank ran."""
    from course_utils.checks.ulysses_build import ulysses as verdict  # the grader's

    return verdict(ulysses, cases_7(variant)["ulysses"])


given_8 = numbers(
    gpus=pick("8g", 32, [16, 32, 64]),
    heads=pick("8h", 32, [32, 64]),
    kv_heads=pick("8k", 8, [4, 8]),
)


@exercise(given_8, ulysses_degree="whole number", ring_degree="whole number", partial=True)
def exercise_8(g, ulysses_degree, ring_degree) -> str:
    """Both combined: the Ulysses degree inside a group and the ring degree across groups."""
    gpus, kv, u = g.gpus, g.kv_heads, ulysses_degree
    want = max(d for d in range(1, kv + 1) if kv % d == 0 and gpus % d == 0)
    query_heads = g.heads if g.heads != kv else None
    hints = {
        f"`ulysses_degree` = {u} splits the query heads, but the keys and values have only "
        f"{kv} heads: a larger degree would need copies of them.": query_heads,
        f"`ulysses_degree` = {u}: each GPU of an all-to-all group takes whole K/V heads, so the "
        f"degree cannot exceed the {kv} K/V heads, and with the course's even split it must "
        "divide them.": u > want,
        "`ulysses_degree` is too small: the all-to-all sends less as its degree grows. Take the "
        "largest that divides both the K/V heads and the GPUs.": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    with fields.judging():
        judge(u, want, "ulysses_degree", hints)
    hints = {
        "`ring_degree` x your `ulysses_degree` uses every GPU, but `ulysses_degree` is not "
        "right yet: the ring's degree follows from it.": bool(fields.failures)
        and ring_degree * u == gpus,
        f"`ring_degree` x `ulysses_degree` must use the {gpus} GPUs: each of the ring's steps "
        "passes K/V blocks between the Ulysses groups.": OTHERWISE,
    }
    with fields.judging():
        judge(ring_degree, gpus // want, "ring_degree", hints)
    fields.verdict()
    return (
        f"Right: Ulysses over {u} GPUs (one K/V head group each), a ring of {gpus // u} such "
        "groups. The all-to-alls stay inside the groups, where the links are fast (a node), and "
        "the ring's blocks cross between them: the 2D scheme of USP (Fang & Zhao 2024, arXiv "
        "2405.07719)."
    )
