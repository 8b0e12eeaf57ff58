"""The verdict of Exercise 9.4: causal ring attention on the zig-zag split, written as the
program every rank runs, with the work each rank did counted.

Each case's run (`rank_cases.ZigzagCase`, `parallel.context_parallel.zigzag_program`) comes
back as evidence: every rank's output, the messages it sent (whose chunks each carried) and
every chunk product it computed (query chunk, key chunk, mask). The verdict is computed here,
in the grader: the outputs against full causal attention on one device; the products against
the causal mask: query chunk a may see key chunk b when b <= a, with the lower-triangular
mask when b = a, so that every rank computes 2N + 1 products, the plain split's slowest rank
4N (Dubey et al. 2024, arXiv 2407.21783); the messages against the ring's order (each rank
passes on the chunks in hand, N - 1 times). The known wrong programs each get their hint:
blocks skipped whole as in the plain split, products the mask hides computed anyway, the own
chunk without its mask, the two outputs in the wrong order.
"""

from __future__ import annotations

from course_utils import checks
from course_utils.checks import fail, programs
from course_utils.checks.builds import ring_sends
from course_utils.checks.rank_cases import close

STOPPED = {
    "deadlock": "Sends never wait, receives do: every rank sends the chunks in hand to its "
    "right neighbour before it waits for the next ones from its left.",
    "unreceived": "The chunks in hand at the last step go nowhere: N - 1 sends and N - 1 "
    "receives per rank.",
}


def right_products(n: int, rank: int) -> set[tuple[int, int, str]]:
    """The chunk products rank computes: each of its chunks against every chunk it may see."""
    mine = (rank, 2 * n - 1 - rank)
    return {(a, b, "causal" if a == b else "none") for a in mine for b in range(a + 1)}


def _readable(products) -> bool:
    return isinstance(products, list) and all(
        isinstance(p, list) and len(p) == 3 and all(isinstance(x, int) for x in p[:2])
        for p in products
    )


def _products(shown: str, n: int, rank: int, products: list) -> None:
    got = [(a, b, str(m)) for a, b, m in products]
    want = right_products(n, rank)
    late = 2 * n - 1 - rank
    if -1 in {x for a, b, _ in got for x in (a, b)}:
        fail(
            f"{shown}: rank {rank} called ctx.attend on a tensor that is no chunk: pass one "
            "chunk of queries (ctx.q[i]) and the keys and values of one chunk in hand."
        )
    hidden = sorted((a, b) for a, b, _ in got if b > a)
    if hidden:
        fail(
            f"{shown}: rank {rank} computed {len(got)} chunk products, {len(hidden)} of them "
            f"(query chunk, key chunk) {hidden[:3]}{'...' if len(hidden) > 3 else ''} with a "
            "key chunk after the query chunk, which the mask hides whole. Skip them: "
            f"the zig-zag split's balance ({len(want)} products on every rank) is what is "
            "left when each rank skips what its mask hides."
        )
    if len(set(got)) < len(got):
        fail(f"{shown}: rank {rank} computed a chunk product twice: each once.")
    pairs = {(a, b) for a, b, _ in got}
    missing = sorted((a, b) for a, b, _ in want if (a, b) not in pairs)
    if any(a == late and b < n and b > rank for a, b in missing):
        fail(
            f"{shown}: rank {rank} skipped the early chunks of later ranks, as in the plain "
            f"split. Its late chunk, {late}, comes after every rank's early chunk: it sees "
            "part of every block in the ring."
        )
    if missing:
        fail(
            f"{shown}: rank {rank} never computed (query chunk, key chunk) {missing[0]}, "
            "which its mask lets it see: a query chunk sees every key chunk up to its own."
        )
    for a, b, mask in got:
        if (a, b, mask) not in want:
            needs = "the lower-triangular mask" if a == b else "no mask"
            fail(
                f"{shown}: rank {rank} computed query chunk {a} against key chunk {b} with "
                f"mask {mask!r}: that product needs {needs} (a query sees itself and the "
                "tokens before it)."
            )


def zigzag_ring(program, cases: list[tuple]) -> str:
    """Exercise 9.4: causal ring attention on the zig-zag split, judged on each case's run."""
    import torch

    from course_utils.parallel.context_parallel import attention

    for (case,), shown, got in checks.each_call(program, cases):
        run = programs.watched(got, shown, case, "outputs")
        products = run.get("products")
        if not (
            isinstance(products, list)
            and len(products) == case.devices
            and all(_readable(p) for p in products)
        ):
            fail(f"{shown} did not come back as the record of a run: it cannot be judged.")
        if run["failure"] is not None:
            fail(programs.stopped(shown, run["failure"], STOPPED))
        n, c, d = case.devices, case.chunk, case.dim
        block = 2 * 2 * c * d * 4  # two chunks' keys and values, float32
        ring_sends(shown, run, n, (n - 1) * block, "K/V block")
        for rank in range(n):
            _products(shown, n, rank, products[rank])
        q, k, v = case.build()
        full = attention(q, k, v, causal=True).chunk(2 * n)
        for rank, out in enumerate(run["outputs"]):
            early, late = full[rank], full[2 * n - 1 - rank]
            if close(out, torch.cat([early, late])):
                continue
            if close(out, torch.cat([late, early])):
                fail(
                    f"{shown}: rank {rank} returned its late chunk's output first: return "
                    "the early chunk's (index 0 of ctx.q), then the late one's."
                )
            fail(
                f"{shown}: rank {rank}'s output is not causal attention for its chunks "
                f"({rank} and {2 * n - 1 - rank}) though it computed the right products: "
                "merge each product's (out, lse) into its query chunk's running ones with "
                "ctx.merge, and return both chunks' outputs, (2 x chunk, dim)."
            )
    n = cases[0][0].devices
    return (
        f"Right on your ring and fresh ones: every rank's output equals full causal attention "
        f"and every rank computed {2 * n + 1} chunk products on your ring of {n} ranks, where "
        f"the plain split's last rank computes {n} blocks = {4 * n} chunk products: a "
        f"compute-bound causal pass {4 * n / (2 * n + 1):.2f}x as fast."
    )
