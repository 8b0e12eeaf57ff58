"""The verdicts of the Builds whose answer is a per-rank program: lessons 08 to 10.

Exercise 8.6 (an FSDP step), 9.2 (causal ring attention) and 10.8 (an MoE layer's dispatch
and combine) are programs every rank runs on the course's devices; each case's run comes back
as evidence (`checks.programs`: a `ShardCase`, `AttentionCase` or `DispatchCase` run, watched by
`threads.watched`). The verdict is computed here, in the grader, from that evidence alone:
against what one device computes for the same case (an SGD step, full causal attention, the
MoE layer) and against the lessons' formulas (ZeRO-3's bytes, the ring's order of blocks,
the byte matrix of the dispatch), with the memory a rank held read from its snapshots. Each
mistake a learner makes has its hint, worked out from what the run did. The lessons' check
modules declare the exercises (their numbers and cases) and call these.
"""

from __future__ import annotations

from course_utils import checks
from course_utils.checks import fail, programs
from course_utils.checks.programs import DispatchCase, ShardCase

# --------------------------------------------------------------------------- 8.6: FSDP


STOPPED_6 = {
    "deadlock": "A collective completes only when every rank calls it: every rank gathers every "
    "layer, twice, and reduce-scatters every layer's gradient, all in the same order.",
    "": "Compare it with the steps of one layer listed above the answer.",
}


def _targets_6(case: ShardCase) -> dict:
    """What one device computes for `case`, and what the lesson's formulas give."""
    from course_utils.parallel.fsdp import fsdp_traffic_bytes, gathered_bytes_bound
    from course_utils.parallel.fsdp.rank_program import cut_in_shards, one_device_shards

    model, x, y = case.build()
    numels = [sum(p.numel() for p in layer.parameters()) for layer in model.layers()]
    before = cut_in_shards(model, case.devices)
    shard_bytes = [s.numel() * 4 for s in before[0]]
    return {
        "before": before,
        "after": one_device_shards(model, case.devices, x, y),
        "bytes": fsdp_traffic_bytes(numels, case.devices, stage=3),
        "memory": sum(shard_bytes)
        + gathered_bytes_bound(numels, case.devices, 0)
        + max(shard_bytes),
    }


def _step_off(got: list, before: list, after: list, n: int) -> str | None:
    """How a rank's shards after its step differ from one device's: None if they do not;
    "unchanged"; "1/N" or "N" (times one device's step); or "wrong"."""
    import torch

    def close(a, b) -> bool:
        return torch.allclose(a, b, rtol=1e-4, atol=1e-6)

    ok = len(got) == len(after) and all(
        isinstance(g, torch.Tensor) and g.shape == a.shape for g, a in zip(got, after, strict=False)
    )
    if not ok:
        return "wrong"
    got = [g.float() for g in got]
    if all(close(g, a) for g, a in zip(got, after, strict=True)):
        return None
    if all(close(g, b) for g, b in zip(got, before, strict=True)):
        return "unchanged"
    steps = list(zip(got, before, after, strict=True))
    for name, factor in (("1/N", 1 / n), ("N", n)):
        if all(close(g - b, factor * (a - b)) for g, b, a in steps):
            return name
    return "wrong"


def _listed(names: list[str]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def fsdp_step(program, cases: list[tuple]) -> str:
    """Exercise 8.6: an FSDP (ZeRO-3) step, judged on what each case's run did."""
    for (case,), shown, got in checks.each_call(program, cases):
        run = programs.watched(got, shown, case, "shards")
        if run["failure"] is not None:
            fail(programs.stopped(shown, run["failure"], STOPPED_6))
        want, n = _targets_6(case), case.devices
        for rank in range(n):
            off = _step_off(run["shards"][rank], want["before"][rank], want["after"][rank], n)
            if off == "unchanged":
                fail(
                    f"{shown}: rank {rank}'s shards are as they were before the step. Each "
                    "rank updates its own shards with SGD, shard -= ctx.lr x (its slice of the "
                    "gradient summed over the ranks), in place in ctx.shards."
                )
            if off == "1/N":
                fail(
                    f"{shown}: every shard moved 1/{n} of one device's step. ctx.loss(out, "
                    f"ctx.rank) already divides each rank's loss by the {n} ranks, so their "
                    "gradients add up to the whole batch's: sum them, do not average."
                )
            if off == "N":
                fail(
                    f"{shown}: every shard moved {n} times one device's step. Each rank's "
                    "loss is its share of the batch's mean, ctx.loss(out, ctx.rank), and the "
                    "ranks' gradients are summed once."
                )
            if off:
                fail(
                    f"{shown}: rank {rank}'s shards after the step are not one device's. Each "
                    "layer's backward starts from the gradient the next layer handed back "
                    "(the grad of its input), and each rank keeps the sum over the ranks of "
                    "its own slice of the layer's gradient."
                )
        for rank, watch in enumerate(run["watched"]):
            peak, held = programs.held_at_peak(watch)
            if peak > want["memory"]:
                fail(
                    f"{shown}: rank {rank} held {peak:,} bytes at once, over the "
                    f"{want['memory']:,} of its shards, one gathered layer and one gradient "
                    f"shard. At that moment it still held {_listed(held)}. Free a layer's "
                    "gathered parameters once it is computed: keep no reference to them, not "
                    "even through autograd, which keeps what a forward saved until its "
                    "backward. Run the forward under torch.no_grad() and gather each layer "
                    "again for its backward."
                )
            kinds = [str(c[0]) for c in watch["collectives"]]
            if "all_reduce" in kinds:
                fail(
                    f"{shown}: rank {rank} all-reduces. An all-reduce sends twice the bytes of "
                    "a reduce-scatter and leaves every rank the whole summed gradient, when "
                    "its SGD needs only its own slice of it: which collective leaves each "
                    "rank just its slice of the sum?"
                )
            sent = {
                k: sum(sum(c[1]) for c in watch["collectives"] if c[0] == k)
                for k in ("all_gather", "reduce_scatter")
            }
            if sent != {k: want["bytes"][k] for k in sent}:
                fail(
                    f"{shown}: rank {rank} sent {sent['all_gather']:,} bytes in all-gathers "
                    f"and {sent['reduce_scatter']:,} in reduce-scatters; the lesson's formula "
                    f"gives {want['bytes']['all_gather']:,} and "
                    f"{want['bytes']['reduce_scatter']:,}: every layer gathered twice "
                    "(forward, backward) and its gradient reduce-scattered once."
                )
    mine = _targets_6(cases[0][0])
    return (
        f"Right: on your model and two others every rank's shards after the step equal one "
        f"device's SGD step; on yours each rank sent {mine['bytes']['total']:,} bytes, the "
        "formula's (each layer gathered twice, its gradient reduce-scattered once: 1.5 times "
        "plain data parallelism), and held at most its shards, one gathered layer and one "
        f"gradient shard ({mine['memory']:,} bytes). That is FSDP's whole trade."
    )


# --------------------------------------------------------------------------- 9.2: the ring


def _close(got, want) -> bool:
    import torch

    return got.shape == want.shape and bool(torch.isclose(got, want, rtol=1e-4, atol=1e-5).all())


MERGES = ("right", "average", "swapped", "unnormalised", "larger", "sum")  # see `_merge`
MERGE_HINTS = {
    "average": "the running output and a block's are averaged, as if each block held the same "
    "share of the softmax. Weigh each by its share: exp(lse_x - lse), lse the log-sum-exp over "
    "both.",
    "swapped": "the two weights of the merge are swapped: the running output goes with "
    "exp(lse_running - lse), the block's with exp(lse_block - lse).",
    "unnormalised": "the merge's weights exp(lse_a) and exp(lse_b) do not add up to 1: divide "
    "them by exp(lse), that is, exp(lse_a - lse) and exp(lse_b - lse).",
    "larger": "the merged lse is the larger of the two. The log-sum-exp over both blocks is "
    "log(exp(lse_a) + exp(lse_b)), above either one (torch.logaddexp).",
    "sum": "the merged lse = lse_a + lse_b multiplies the two sums of exponentials; the keys of "
    "both blocks together need their sum, log(exp(lse_a) + exp(lse_b)).",
}


def _merge(rule: str, out, lse, out_b, lse_b):
    """The running (out, lse) merged with a block's by `rule`: "right" (the log-sum-exp
    merge), or one of the mistakes of `MERGE_HINTS`."""
    import torch

    new = torch.logaddexp(lse, lse_b)
    if rule == "larger":
        new = torch.maximum(lse, lse_b)
    elif rule == "sum":
        new = lse + lse_b
    if rule == "average":
        return (out + out_b) / 2, new
    norm = torch.zeros_like(new) if rule == "unnormalised" else new
    w_a, w_b = (torch.exp(x - norm).unsqueeze(-1) for x in (lse, lse_b))
    if rule == "swapped":
        w_a, w_b = w_b, w_a
    return w_a * out + w_b * out_b, new


def _ring_merged(q, blocks: list, rule: str, masked_owner: int | None):
    """Rank's output when it merges the blocks [(owner, k, v)] in that order with `rule`,
    masking the block of `masked_owner` inside (causal)."""
    import torch

    from course_utils.parallel.context_parallel import block_attention

    out = lse = None
    for owner, k, v in blocks:
        mask = None
        if owner == masked_owner:
            mask = torch.ones(len(q), len(k), dtype=torch.bool).tril()
        out_b, lse_b = block_attention(q, k, v, mask)
        if out is None:
            out, lse = out_b, lse_b
        else:
            out, lse = _merge(rule, out, lse, out_b, lse_b)
    return out


def _attended(q, ks, vs, rank: int, got):
    """(the owners, masked own block or not) of the blocks whose exact attention `got` is
    rank's output, merged in the ring's order; None if none is."""
    from itertools import combinations

    n = len(ks)
    ring = [(rank - s) % n for s in range(n)]
    for size in range(1, n + 1):
        for chosen in combinations(range(n), size):
            order = [o for o in ring if o in chosen]
            for mask in (True, False):
                blocks = [(o, ks[o], vs[o]) for o in order]
                if _close(got, _ring_merged(q, blocks, "right", rank if mask else None)):
                    return sorted(chosen), mask
    return None


STOPPED_2 = {
    "deadlock": "Sends never wait, receives do: every rank sends the block in hand to its right "
    "neighbour before it waits for the next one from its left.",
    "unreceived": "The block in hand at the last step goes nowhere: N - 1 sends and N - 1 "
    "receives per rank.",
}


def _sent_owners(messages: list, rank: int, n: int) -> tuple[list[int], str | None]:
    """The owners of the K/V blocks rank sent, in order, and a hint if a send is off."""
    owners: list[int] = []
    for to, what, _ in messages:
        if to != (rank + 1) % n:
            return owners, (
                f"rank {rank} sent a message to rank {to}. Round the ring each block goes to "
                f"the right neighbour, rank (r + 1) mod N = {(rank + 1) % n}, and the next "
                "comes from the left."
            )
        digits = str(what).lstrip("kv")
        if not digits.isdigit():
            return owners, (
                f"rank {rank} sent a message that is not a K/V block: send the keys and "
                "values in hand, as they came."
            )
        if str(what).startswith("v") and owners and owners[-1] == int(digits):
            continue  # v sent after k: the same block in two messages
        owners.append(int(digits))
    return owners, None


def ring_sends(shown: str, run: dict, n: int, sent: int, what: str) -> None:
    """Every rank passed on the `what` ("block") in hand to its right, in the ring's order,
    N - 1 times, `sent` bytes in all (Exercises 9.2 and 9.4)."""
    for rank, watch in enumerate(run["watched"]):
        owners, off = _sent_owners(watch["messages"], rank, n)
        if off:
            fail(f"{shown}: {off}")
        want = [(rank - s) % n for s in range(n - 1)]
        if owners != want or run["bytes_sent"][rank] != sent:
            fail(
                f"{shown}: rank {rank} sent the {what}s of ranks {owners}, "
                f"{run['bytes_sent'][rank]:,} bytes. Round the ring it passes on the {what} "
                "in hand, the one it has just received: at steps 0 to N - 2 those of "
                f"ranks {want}, {sent:,} bytes."
            )


def ring_attention(program, cases: list[tuple]) -> str:
    """Exercise 9.2: causal ring attention, judged on what each case's run did."""
    import torch

    from course_utils.parallel.context_parallel import attention, ring_bytes_per_worker
    from course_utils.parallel.context_parallel.layout import split_sequence

    for (case,), shown, got in checks.each_call(program, cases):
        run = programs.watched(got, shown, case, "outputs")
        if run["failure"] is not None:
            fail(programs.stopped(shown, run["failure"], STOPPED_2))
        n, t, d = case.devices, case.tokens, case.dim
        q, k, v = case.build()
        qs, ks, vs = (split_sequence(x, n) for x in (q, k, v))
        ring_sends(shown, run, n, ring_bytes_per_worker(n * t, n, 1, d, 4)["forward"], "block")
        full = attention(q, k, v, causal=True)
        for rank, out in enumerate(run["outputs"]):
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != (t, d):
                what = out if isinstance(out, str) else f"shape {tuple(out.shape)}"
                fail(
                    f"{shown}: rank {rank} returned {what}; the program returns its queries' "
                    f"attention output, ({t}, {d})."
                )
            out = out.float()
            if _close(out, full[rank * t : (rank + 1) * t]):
                continue
            if not torch.isfinite(out).all():
                fail(
                    f"{shown}: rank {rank}'s output has inf or NaN. Exp of a log-sum-exp above "
                    "88 overflows float32: write each weight of the merge as exp(lse_x - lse), "
                    "with lse the merged log-sum-exp; it never exceeds 1."
                )
            blocks = [((rank - s) % n, ks[(rank - s) % n], vs[(rank - s) % n]) for s in range(n)]
            seen = [b for b in blocks if b[0] <= rank]
            for rule, hint in MERGE_HINTS.items():
                if _close(out, _ring_merged(qs[rank], seen, rule, rank)):
                    fail(f"{shown}: on rank {rank} {hint}")
            found = _attended(qs[rank], ks, vs, rank, out)
            if found == (list(range(rank + 1)), False):
                fail(
                    f"{shown}: rank {rank} attends to the right blocks, but its own without "
                    "the mask: inside its own block query i may see keys 0 to i only (a "
                    "lower-triangular mask)."
                )
            if found == (list(range(n)), True) or found == (list(range(n)), False):
                fail(
                    f"{shown}: rank {rank} attends to every block. Under the causal mask the "
                    "blocks of later ranks hold only later tokens, which its queries may not "
                    "see: skip them."
                )
            if found is not None:
                fail(
                    f"{shown}: rank {rank} attends to the blocks of ranks {found[0]}; its "
                    f"queries may see those of ranks 0 to {rank} only. Whose block is in hand "
                    "at step s? It has come s hops from the left."
                )
            fail(
                f"{shown}: rank {rank}'s output is not causal attention over the keys of ranks "
                f"0 to {rank}. Merge each block's (out, lse) into the running ones with the "
                "log-sum-exp rule of section 3."
            )
    first = cases[0][0]
    sent = ring_bytes_per_worker(first.devices * first.tokens, first.devices, 1, first.dim, 4)
    return (
        f"Right on {len(cases)} rings, sharp attention included: every rank's output equals "
        f"full causal attention, each rank passed on the blocks in the ring's order and sent "
        f"N - 1 of them ({sent['forward']:,} bytes on your ring). Nothing of size L x L was "
        "built anywhere, and the later ranks did the most work: the plain split's straggler."
    )


# --------------------------------------------------------------------------- 10.8: the MoE layer


def byte_matrix(routed, d_model: int, size: int, owner=None, home: int = 0) -> list[list[int]]:
    """Bytes worker s sends worker d for the experts d holds (contiguous blocks unless
    `owner(e, workers)` says otherwise); a worker sends itself `home` times its tokens."""
    workers, experts = len(routed), len(routed[0])
    owner = owner or (lambda e, n: e // (experts // n))

    def sent(s: int, d: int) -> int:
        tokens = sum(routed[s][e] for e in range(experts) if owner(e, workers) == d)
        return (home if s == d else 1) * tokens * d_model * size

    return [[sent(s, d) for d in range(workers)] for s in range(workers)]


STOPPED_8 = {
    "deadlock": "An all-to-all completes only when every rank calls it: every rank makes the "
    "same all-to-alls in the same order, with a chunk (maybe empty) for every rank.",
}


def _targets_8(case: DispatchCase) -> dict:
    """What one device computes for `case`: each rank's tokens' output of the MoE layer (and
    of the layer with one mistake in it), and the dispatch's byte matrix (the lesson's,
    and those of two mistakes)."""
    import torch

    from course_utils.parallel.moe import route
    from course_utils.threads.collectives import chunk_bounds

    moe, x = case.build()
    per, n = case.experts // case.devices, case.devices
    names = ("x", "right", "ungated", "no residual", "one")
    found: dict[str, list] = {name: [] for name in names}
    routed, first = [], []
    with torch.no_grad():
        for lo, hi in chunk_bounds(len(x), n):
            xr, h = x[lo:hi], moe.norm(x[lo:hi])
            routing = route(moe.router(h), case.top_k, None)
            routed.append(routing.counts())
            first.append(torch.bincount(routing.expert[:, 0], minlength=case.experts).tolist())
            every = torch.stack([expert(h) for expert in moe.experts])  # (E, T, d)
            rows = torch.arange(len(xr))
            parts = [  # (gate, the chosen expert's output, its rank's first expert's output)
                (routing.gate[:, j, None], every[e, rows], every[e // per * per, rows])
                for j, e in enumerate(routing.expert.T)
            ]
            found["x"].append(xr)
            found["right"].append(xr + sum(g * o for g, o, _ in parts))
            found["ungated"].append(xr + sum(o for _, o, _ in parts))
            found["no residual"].append(sum(g * o for g, o, _ in parts))
            found["one"].append(xr + sum(g * f for g, _, f in parts))  # one expert per rank
    each = case.tokens * case.d_model * 4
    found["dispatch"] = byte_matrix(routed, case.d_model, 4)
    found["first"] = byte_matrix(first, case.d_model, 4)
    found["everything"] = [[0 if s == d else each for d in range(n)] for s in range(n)]
    return found


def carrying_tokens(watch: dict, d_model: int) -> list[list[int]]:
    """The bytes each of a rank's all-to-alls of tokens (float, d_model wide) sent per rank."""
    return [
        list(c[1])
        for c in watch["collectives"]
        if c[0] == "all_to_all" and "float" in str(c[2]) and list(c[3]) == [d_model]
    ]


def rows_elsewhere(got, want) -> bool:
    """Every row of `got` is some row of `want` (not all in their places, or it would be right)."""
    import torch

    return all(any(torch.allclose(row, w, rtol=1e-4, atol=1e-5) for w in want) for row in got)


def _all_to_alls_8(shown: str, run: dict, case: DispatchCase, want: dict) -> None:
    """Fail unless every rank dispatched and combined its tokens by all-to-all, with the
    byte matrices of the lesson (a failed run: as far as its all-to-alls went)."""
    sent = [carrying_tokens(w, case.d_model) for w in run["watched"]]
    failed = run["failure"] is not None
    if any(len(calls) < 2 for calls in sent) and not (failed and not any(sent)):
        fail(
            f"{shown}: a rank made {min(len(c) for c in sent)} all-to-all(s) of tokens "
            f"({case.d_model} numbers wide). The tokens go to their experts' ranks in one "
            "all-to-all (the dispatch) and the experts' outputs come back in another (the "
            "combine): ctx.comm.all_to_all."
        )
    if any(len(calls) < 2 for calls in sent):
        return  # failed before any: the failure says why
    matrix = [calls[0] for calls in sent]
    if matrix == want["everything"] and matrix != want["dispatch"]:
        fail(
            f"{shown}: every rank sends all its tokens to every other rank. Send each rank "
            "only the tokens routed to the experts it holds: row s of the dispatch's byte "
            "matrix is what rank s sends each rank."
        )
    if matrix == want["first"] and matrix != want["dispatch"]:
        fail(
            f"{shown}: every token went to its first expert only. With top-{case.top_k} "
            f"routing each token goes to each of its {case.top_k} experts (ctx.experts_of "
            "has a column per choice), and its output is the gated sum of theirs."
        )
    matrices(shown, sent, want["dispatch"], "the lesson's is", "routes")


def matrices(shown: str, sent: list, want: list, named: str, does: str) -> None:
    """Fail unless each rank's first all-to-all of tokens (`sent[rank]`, their bytes to every
    rank) makes the byte matrix `want` (`named` says whose it is; rank s `does` the tokens)
    and its second, the combine, the transpose."""
    matrix = [calls[0] for calls in sent]
    if matrix != want:
        fail(
            f"{shown}: the dispatch sent the byte matrix {matrix} (row s: what rank s sent "
            f"each rank); {named} {want}: the tokens rank s {does} to the experts rank d "
            "holds, times d_model x 4 bytes, 0 on the diagonal."
        )
    back = [calls[1] for calls in sent]
    transposed = [list(col) for col in zip(*want, strict=True)]
    if back != transposed:
        fail(
            f"{shown}: the combine sent the byte matrix {back}, not the dispatch's "
            f"transposed, {transposed}: the expert outputs went back to the wrong ranks. "
            "Each rank returns to rank s exactly the tokens rank s sent it, in that order."
        )


def moe_layer(program, cases: list[tuple]) -> str:
    """Exercise 10.8: the MoE layer's dispatch and combine, judged on each case's run."""
    import torch

    for (case,), shown, got in checks.each_call(program, cases):
        run = programs.watched(got, shown, case, "outputs")
        want = _targets_8(case)
        if run["failure"] is None or run["failure"].get("kind") == "raised":
            _all_to_alls_8(shown, run, case, want)
        if run["failure"] is not None:
            fail(programs.stopped(shown, run["failure"], STOPPED_8))
        for rank, out in enumerate(run["outputs"]):
            right = want["right"][rank]
            if not isinstance(out, torch.Tensor) or out.shape != right.shape:
                what = out if isinstance(out, str) else f"shape {tuple(out.shape)}"
                fail(
                    f"{shown}: rank {rank} returned {what}; the program returns its tokens' "
                    f"output, {tuple(right.shape)}."
                )
            out = out.float()
            if torch.allclose(out, right, rtol=1e-4, atol=1e-5):
                continue
            hints = {
                "ungated": "adds the experts' outputs unweighted: weigh each by its gate, "
                "ctx.gates (the router's say in the output, and its gradient).",
                "no residual": "leaves out the residual: the layer's output is "
                "x + sum_j gate_j expert_j(h).",
                "one": "sends every token to the right rank, but that rank runs "
                "each through the same expert. It must know which of its experts each token "
                "chose: send the expert numbers (or the tokens per expert) along.",
            }
            for name, hint in hints.items():
                if torch.allclose(out, want[name][rank], rtol=1e-4, atol=1e-5):
                    fail(f"{shown}: rank {rank} {hint}")
            if rows_elsewhere(out - want["x"][rank], right - want["x"][rank]):
                fail(
                    f"{shown}: rank {rank}'s expert outputs are there, but added at other tokens' "
                    "rows. The combine's chunk from rank d lines up with what you sent to d: "
                    "add each output at the row of the token it belongs to."
                )
            fail(
                f"{shown}: rank {rank}'s output is not the MoE layer's, "
                "x + sum_j gate_j expert_j(h), for its tokens."
            )
    matrix = _targets_8(cases[0][0])["dispatch"]
    return (
        f"Right on {len(cases)} layers: every rank's output equals the MoE layer on one device, "
        f"and the dispatch's byte matrix read from the run, {matrix} on yours, is the "
        "lesson's; the combine sent it back transposed. Two all-to-alls per forward, two more "
        "in the backward: the traffic expert parallelism pays for holding 1/N of the experts."
    )
