"""The verdict of Exercise 9.7: Ulysses attention written as the program every rank runs.

Each case (`UlyssesCase`) runs the learner's program with
`parallel.context_parallel.ulysses_program`: rank r holds its t tokens of q, k, v with all
H heads. The evidence is every rank's output, its collectives (the bytes each sent to each
rank) and its calls of ctx.attend (heads, query and key lengths, mask). The verdict is
computed here: the outputs against full attention on one device (causal or not, as the case
says), rank r's rows r t ... (r+1) t - 1; the collectives against two all-to-alls (q, k, v to
the head split, the output back), each sending (N-1)/N of what the rank holds, 4 (N-1)/N x t
H d values in all (Jacobs et al. 2023, arXiv 2309.14509); the attention against H/N heads of
all L tokens, with the causal mask over the whole sequence when the case is causal. Heads the
ranks do not divide are refused by the case itself: each rank takes whole heads, an equal
share. The known wrong programs each get their hint: the sequence split again instead of the
heads, the second all-to-all missing, its parts joined along the wrong dimension or in the
wrong order, the causal mask forgotten, built over the local shard or added to a case that is
not causal.
"""

from __future__ import annotations

from course_utils.checks import each_call, fail, programs
from course_utils.checks.rank_cases import close
from course_utils.checks.recorded_cases import UlyssesCase

STOPPED = {
    "deadlock": "A collective waits for every rank: each rank calls ctx.comm.all_to_all the "
    "same number of times, in the same order (one to the head split, one back).",
    "": "ctx.comm.all_to_all takes a list of N tensors, the one at index j for rank j, and "
    "returns N, the one at index s from rank s.",
}
LOCAL_MASK = (
    "That mask is over the positions of the rank's own shard, t tokens. After the first "
    "all-to-all the rank holds all L tokens in order, so the causal mask is over global "
    "positions, (L, L): query i sees keys 0 to i of the whole sequence."
)


def _readable(calls) -> bool:
    return isinstance(calls, list) and all(
        isinstance(c, list) and len(c) == 4 and all(isinstance(x, int) for x in c[:3])
        for c in calls
    )


def _attention(shown: str, case: UlyssesCase, rank: int, calls: list) -> None:
    n, h, length = case.devices, case.heads, case.devices * case.tokens
    if not calls:
        fail(f"{shown}: rank {rank} never called ctx.attend: attention runs between the two "
             "all-to-alls, on the heads the rank then holds.")  # fmt: skip
    if any(q_len != length or k_len != length for _, q_len, k_len, _ in calls):
        heads, q_len = calls[0][0], calls[0][1]
        fail(
            f"{shown}: rank {rank} attended with {heads} head(s) of {q_len} queries, not of all "
            f"{length} tokens: it split the sequence again. Ulysses' first all-to-all splits "
            "the HEADS: head group j of the rank's tokens goes to rank j, and what arrives "
            "from rank s (its tokens) is joined along the sequence, so every rank holds "
            "H/N heads of the whole sequence."
        )
    if sum(c[0] for c in calls) != h // n:
        fail(
            f"{shown}: rank {rank} attended over {sum(c[0] for c in calls)} heads; after the "
            f"first all-to-all each rank holds H/N = {h // n} heads of the whole sequence, "
            "and attends over each of them once."
        )
    masks = {str(c[3]) for c in calls}
    if case.causal and "local" in masks:
        fail(f"{shown}: rank {rank} masked with a lower-triangular mask over fewer tokens "
             f"than the sequence. {LOCAL_MASK}")  # fmt: skip
    if case.causal and masks != {"causal"}:
        fail(
            f"{shown}: the case is causal, and rank {rank} attended without the causal mask "
            "(ctx.causal is True): a query sees itself and the tokens before it."
        )
    if not case.causal and masks != {"none"}:
        fail(
            f"{shown}: the case is not causal (ctx.causal is False), and rank {rank} masked "
            "its attention: every query sees every key."
        )


def _collectives(shown: str, run: dict, case: UlyssesCase) -> list[list[int]]:
    """Each rank's bytes per all-to-all, after the program used nothing else."""
    sent = []
    for rank, watch in enumerate(run["watched"]):
        kinds = [str(c[0]) for c in watch["collectives"]]
        if watch["messages"] or any(k != "all_to_all" for k in kinds):
            fail(
                f"{shown}: rank {rank} used {', '.join(sorted(set(kinds))) or 'ctx.send'}: "
                "Ulysses changes the split with all-to-alls only, ctx.comm.all_to_all."
            )
        sent.append([sum(int(b) for b in c[1]) for c in watch["collectives"]])
    return sent


def _outputs(shown: str, case: UlyssesCase, outputs: list, sent: list[list[int]]) -> None:
    import torch

    from course_utils.parallel.context_parallel import attention

    n, t, h, d = case.devices, case.tokens, case.heads, case.dim
    q, k, v = case.build()
    full = attention(q, k, v, causal=bool(case.causal))
    want = list(full.chunk(n, dim=1))
    held = 4 * t * h * d * 4  # q, k, v and the output of its tokens, float32
    for rank, out in enumerate(outputs):
        if close(out, want[rank]):
            continue
        if isinstance(out, torch.Tensor) and tuple(out.shape) == (h // n, n * t, d):
            if sum(sent[rank]) < held * (n - 1) // n:
                fail(
                    f"{shown}: rank {rank} returned H/N = {h // n} heads of all {n * t} "
                    "tokens, the head split, and its all-to-alls sent only q, k and v. A "
                    "second all-to-all takes the output back: slice i of the sequence to "
                    "rank i, joined there along the heads, (H, t, d)."
                )
            fail(
                f"{shown}: rank {rank} returned shape {tuple(out.shape)}: it joined what the "
                "second all-to-all brought along the sequence. Each part holds a head group "
                "of the rank's own tokens: join them along the heads, (H, t, d)."
            )
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (h, t, d):
            what = out if isinstance(out, str) else f"shape {tuple(out.shape)}"
            fail(
                f"{shown}: rank {rank} returned {what}; the program returns all heads of its "
                f"own tokens' output, ({h}, {t}, {d})."
            )
        groups = want[rank].chunk(n, dim=0)
        if any(close(out, torch.cat(groups[i:] + groups[:i])) for i in range(1, n)) or close(
            out, torch.cat(groups[::-1])
        ):
            fail(
                f"{shown}: rank {rank}'s output holds the right heads in the wrong order: the "
                "part the second all-to-all brings from rank j is head group j; join the "
                "parts in rank order."
            )
        if any(close(out, want[other]) for other in range(n) if other != rank):
            fail(
                f"{shown}: rank {rank} got another rank's tokens back: the part of the "
                "sequence it sends to rank i in the second all-to-all is slice i (in the "
                "order the first all-to-all joined them: rank s's tokens at place s)."
            )
        fail(
            f"{shown}: rank {rank}'s output is not attention for its tokens {rank * t} to "
            f"{(rank + 1) * t - 1}. Split the heads into N groups for the first all-to-all, "
            "join what arrives along the sequence in rank order, attend, then split the "
            "sequence into N slices for the second and join along the heads."
        )


def ulysses(program, cases: list[tuple]) -> str:
    """Exercise 9.7: Ulysses attention per rank, judged on what each case's run did."""
    from course_utils.parallel.context_parallel import ring_bytes_per_worker

    measured: list[tuple[UlyssesCase, list[int]]] = []
    for (case,), shown, got in each_call(program, cases):
        run = programs.watched(got, shown, case, "outputs")
        calls = run.get("attended")
        if not (
            isinstance(calls, list) and len(calls) == case.devices and all(map(_readable, calls))
        ):
            fail(f"{shown} did not come back as the record of a run: it cannot be judged.")
        failure = run["failure"]
        if failure is not None and "mask must be" in str(failure["message"]) and case.causal:
            fail(f"{shown}: {failure['message']}. {LOCAL_MASK}")
        if failure is not None:
            fail(programs.stopped(shown, failure, STOPPED))
        sent = _collectives(shown, run, case)
        for rank in range(case.devices):
            _attention(shown, case, rank, calls[rank])
        _outputs(shown, case, run["outputs"], sent)
        n, t, h, d = case.devices, case.tokens, case.heads, case.dim
        want = 4 * (n - 1) * t * h * d * 4 // n  # q, k, v there and the output back
        for rank, per_call in enumerate(sent):
            if sum(per_call) != want:
                fail(
                    f"{shown}: rank {rank}'s all-to-alls sent {sum(per_call):,} bytes; "
                    f"sending each rank only its part, they send {want:,}: (N-1)/N of the "
                    "rank's q, k, v and output, the part for itself staying home."
                )
        measured.append((case, sent[0]))
    case, rank_0 = measured[0]
    n, t, h, d = case.devices, case.tokens, case.heads, case.dim
    ring = ring_bytes_per_worker(n * t, n, h, d, 4)["forward"]
    ulysses_bytes = sum(rank_0)
    return (
        f"Right on your ranks and fresh ones: every rank's output equals full attention for "
        f"its tokens. On {case!r}, rank 0's {len(rank_0)} all-to-alls sent "
        f"{' + '.join(f'{b:,}' for b in rank_0)} = {ulysses_bytes:,} bytes; 9.2's ring on the "
        f"same {h} heads sends {ring:,} bytes per rank (N - 1 K/V blocks): the ring sends "
        f"{ring / ulysses_bytes:.2f}x as much, N/2, so Ulysses sends less from N = 3 on (with "
        "grouped-query attention, fewer K/V heads, the ring's share shrinks). But Ulysses' "
        f"degree stops at the heads ({h} here): beyond it only the ring goes on."
    )
