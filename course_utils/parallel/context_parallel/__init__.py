"""Context parallelism on CPU threads: ring attention, with a plain or a zig-zag split.

A long sequence does not fit on one device, so split it: worker i holds the queries,
keys and values of its own tokens. Every layer except attention is token-wise and
needs nothing from the others. Attention needs every key and value, so the K/V blocks
travel around a ring: in each of N-1 steps every worker passes the block it holds to
its right neighbour and takes the next one from its left, and meanwhile computes its
queries against the block in hand (Liu, Zaharia & Abbeel 2023, "Ring Attention with
Blockwise Transformers", arXiv 2310.01889). Nothing of size seq x seq is ever built.

Why the blocks may arrive one at a time, in any order: softmax over all keys can be
assembled from softmaxes over blocks of keys. For a block, keep its partial output
o_b = softmax(s_b) v_b and its log-sum-exp l_b = log sum_j exp(s_j). Two blocks merge
exactly into

    l = log(exp(l_a) + exp(l_b)),     o = exp(l_a - l) o_a + exp(l_b - l) o_b
                                        = sigmoid(l_a - l_b) o_a + sigmoid(l_b - l_a) o_b,

(the online softmax of Milakov & Gimelshein 2018, arXiv 1805.02867; the same bookkeeping
as FlashAttention, Dao et al. 2022, arXiv 2205.14135). Both weights are <= 1, so nothing
overflows, and a block in which a query may see no key at all has l_b = -inf and weight 0.
(The sigmoid form, which ring-flash-attention also uses, depends only on l_a - l_b and so
keeps full precision when both log-sum-exps are large.)

The backward is a ring too. With the final output O and log-sum-exp L kept from the
forward, each block's probabilities are rebuilt as P = exp(S - L), and (Dao et al. 2022,
appendix B) with D_i = sum_d dO_id O_id:

    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - D),   dQ = dS K / sqrt(d),   dK = dS^T Q / sqrt(d).

dQ stays with the queries. dK and dV belong to the block's owner: they travel around the
ring right behind their K/V block, every worker adding its share, and one last hop brings
them home (the scheme of zhuzilin's ring-flash-attention). No worker ever touches
another worker's autograd graph: everything is sent as plain tensors.

Causal masking makes the plain (contiguous) split unfair: worker i's tokens may only
look at tokens before them, so it computes i+1 block products and skips the rest, and
the last worker is the straggler everyone waits for. The zig-zag split (the load-balanced
split of the Llama 3 report, Dubey et al. 2024, arXiv 2407.21783, section 3.3.2) cuts the
sequence into 2N chunks and gives worker i chunks i and 2N-1-i: an early, cheap chunk and
a late, expensive one, so every worker does 2N+1 chunk products. (Llama 3 itself
all-gathers K/V instead of passing them around a ring; the split is the same idea.)

Each thread is one device (`course_utils.threads.devices.DeviceThreads`); the K/V blocks are real
messages through `course_utils.threads.collectives.ThreadGroup`, whose byte counters give the
traffic. Every run records a measured `Timeline`: compute events `F`/`B` labelled like
"q0·kv3" (worker 0's queries against worker 3's K/V block; colour = whose block) and
transfers on the communication lane: K/V blocks as `SEND_F` (activations) and the
travelling dK/dV as `SEND_B` (gradients). `simulate_ring` predicts the same timeline
from a cost model, with or without overlapping transfers with compute.

The other route to long sequences is Ulysses (Jacobs et al. 2023, arXiv 2309.14509): an
all-to-all turns the sequence split into a head split, each worker runs whole-sequence
attention for H/N heads, and a second all-to-all turns it back. Its traffic per worker
shrinks like 1/N, but N cannot exceed the number of (K/V) heads (`ulysses`).

The package, one idea per module: `attention` (blockwise attention and the exact merge),
`layout` (who holds which tokens: plain and zig-zag), `ring` (the ring on threads:
`RingAttention`), `costs` (work, bytes, memory and the simulator), `ulysses` (the
all-to-all route on threads: `UlyssesAttention`, and its bytes and memory),
`rank_program` (the ring written as the program every rank runs, watched:
`run_ring_program`), `checks` (input errors).
"""

from course_utils.parallel.context_parallel.attention import (
    attention,
    block_attention,
    block_attention_backward,
    causal_mask,
    merge_partials,
)
from course_utils.parallel.context_parallel.checks import MAX_WORKERS, check_ring_inputs
from course_utils.parallel.context_parallel.costs import (
    FLASH_BACKWARD_FACTOR,
    attention_activation_bytes,
    causal_work,
    kv_bytes_per_step,
    measured_costs,
    measured_step_costs,
    ring_bytes_per_worker,
    score_elements,
    simulate_ring,
)
from course_utils.parallel.context_parallel.layout import (
    BlockProduct,
    block_products,
    gather_sequence,
    sequence_chunks,
    split_sequence,
)
from course_utils.parallel.context_parallel.ring import (
    Record,
    RingAttention,
    RingResult,
    ring_attention_backward,
    ring_attention_forward,
)
from course_utils.parallel.context_parallel.ulysses import (
    UlyssesAttention,
    UlyssesResult,
    check_ulysses_degree,
    ulysses_activation_bytes,
    ulysses_attention_backward,
    ulysses_attention_forward,
    ulysses_bytes_per_worker,
    ulysses_max_degree,
)

__all__ = [
    "FLASH_BACKWARD_FACTOR",
    "MAX_WORKERS",
    "BlockProduct",
    "Record",
    "RingAttention",
    "RingResult",
    "attention",
    "attention_activation_bytes",
    "block_attention",
    "block_attention_backward",
    "block_products",
    "causal_mask",
    "causal_work",
    "check_ring_inputs",
    "gather_sequence",
    "kv_bytes_per_step",
    "measured_costs",
    "measured_step_costs",
    "merge_partials",
    "ring_attention_backward",
    "ring_attention_forward",
    "ring_bytes_per_worker",
    "score_elements",
    "sequence_chunks",
    "simulate_ring",
    "split_sequence",
    "UlyssesAttention",
    "UlyssesResult",
    "check_ulysses_degree",
    "ulysses_activation_bytes",
    "ulysses_attention_backward",
    "ulysses_attention_forward",
    "ulysses_bytes_per_worker",
    "ulysses_max_degree",
]
