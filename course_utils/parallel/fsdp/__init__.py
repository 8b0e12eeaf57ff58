"""Sharded data parallelism on CPU threads: ZeRO stages 1, 2 and 3 (= FSDP).

Plain data parallelism keeps a full copy of everything on every worker: parameters,
gradients and optimizer state, 16 bytes per parameter with Adam in fp32. ZeRO
(Rajbhandari et al. 2019, arXiv 1910.02054) notices that the copies are redundant and
cuts each of them into N shards, one per worker:

    stage 1 (P_os)       shard the optimizer state        params Psi + grads Psi + optim K Psi / N
    stage 2 (P_os+g)     ... and the gradients             params Psi + (grads + optim) / N
    stage 3 (P_os+g+p)   ... and the parameters too        everything / N

Stage 3 is what PyTorch calls Fully Sharded Data Parallel (Zhao et al. 2023,
arXiv 2304.11277; `torch.distributed.fsdp.fully_shard`, "FSDP2"). Here the model is a
list of layers and every layer is one FSDP unit. Each layer's parameters are flattened
into one vector, padded with zeros to a multiple of N, and worker w keeps only slice w of
it: FSDP1's `FlatParameter` layout (`FullyShardedDataParallel`). FSDP2 (`fully_shard`)
shards differently: every parameter is a DTensor sharded on its dim 0, so each rank keeps
some rows of every parameter (padded along dim 0 to equal chunks, `torch.chunk`'s split).
A layer's all-gather and reduce-scatter move the same bytes either way, up to the padding.
Then, per micro-batch, worker w:

    before layer l's forward:   all-gather the layer             (kind UNSHARD)
    after it:                   free the gathered copy           (kind RESHARD)
    before layer l's backward:  all-gather it again              (UNSHARD)
    after it:                   reduce-scatter its gradient      (REDUCE_GRAD, "reduce-scatter")
                                and free the gathered copy       (RESHARD)

and at the end of the step applies Adam to its shards only. Adam is element-wise, so N
workers each updating 1/N of the elements compute exactly what one worker updating all
of them would (that is why ZeRO can shard it; we use Adam rather than SGD with momentum
because its two states per parameter are what the memory formulas count). Every worker
runs its own shard of the batch, so it is still data parallelism: the reduce-scatter
sums the workers' gradients and leaves each worker the sum for its own slice.

Stages 1 and 2 keep full parameters. They reduce-scatter the gradients (each worker
only needs the sum for the slice its optimizer state covers), update their slice, and
all-gather the updated parameters after the step. Stage 1 keeps a full gradient buffer
(so with several micro-batches it accumulates locally and reduce-scatters once); stage 2
frees each layer's full gradient as soon as it is reduce-scattered, so it must
reduce-scatter after every micro-batch.

Overlap. Each worker has two threads: a compute thread (forward, backward, optimizer)
and a communication thread that runs the collectives in the order they were issued
(like a CUDA communication stream). With prefetch depth k the compute thread issues the
all-gathers of the next k layers before it computes the current one, so those gathers
run while it computes; the price is memory: up to k + 1 gathered layers at once.
Freeing a gathered layer uses the trick FSDP itself uses: the flat tensor (and the
views of it that autograd saved for the backward) stays, only its storage is resized to
zero bytes; before the backward it gets its storage back and is gathered into again.

What this module measures per worker: a `Timeline` of one step (real `perf_counter_ns`
readings), the bytes each collective sent (the `ThreadGroup` counters), and the bytes of
model-state tensors actually held (storage sizes, sampled whenever something is
allocated or freed). `simulate_fsdp` predicts the timeline from per-layer compute times
and gather times from bytes / bandwidth, running the very same per-worker program.

The package, one idea per module: `shards` (a layer as a flat padded vector; Adam on a
shard), `program` (the per-worker program of a step), `memory` (bytes really held),
`trainer` (the threads: `ShardedDataParallel`), `costs` (bytes and memory on paper, the
simulator), `rank_program` (a step written as the program every rank runs, watched:
`run_fsdp_program`).
"""

from course_utils.parallel.fsdp.costs import (
    FSDPCosts,
    costs_from_timeline,
    dp_traffic_bytes,
    fsdp_traffic_bytes,
    gather_hiding_tokens,
    gathered_bytes_bound,
    hsdp_bytes,
    precision_for,
    reshard_after_forward_costs,
    simulate_fsdp,
    zero_memory_bytes,
)
from course_utils.parallel.fsdp.memory import MemoryMeter, MemoryReport
from course_utils.parallel.fsdp.program import (
    MAX_MICROBATCHES,
    MAX_PREFETCH,
    MAX_WORKERS,
    STAGES,
    CommOp,
    Instr,
    fsdp_program,
)
from course_utils.parallel.fsdp.shards import FlatLayout, adam, adam_update, padded_shard_numels
from course_utils.parallel.fsdp.trainer import (
    DTYPES,
    FSDP,
    FSDPStepResult,
    ShardedDataParallel,
    single_device_steps,
)

__all__ = [
    "DTYPES",
    "FSDP",
    "MAX_MICROBATCHES",
    "MAX_PREFETCH",
    "MAX_WORKERS",
    "STAGES",
    "CommOp",
    "FSDPCosts",
    "FSDPStepResult",
    "FlatLayout",
    "Instr",
    "MemoryMeter",
    "MemoryReport",
    "ShardedDataParallel",
    "adam",
    "adam_update",
    "costs_from_timeline",
    "dp_traffic_bytes",
    "fsdp_program",
    "fsdp_traffic_bytes",
    "gather_hiding_tokens",
    "gathered_bytes_bound",
    "hsdp_bytes",
    "padded_shard_numels",
    "precision_for",
    "reshard_after_forward_costs",
    "simulate_fsdp",
    "single_device_steps",
    "zero_memory_bytes",
]
