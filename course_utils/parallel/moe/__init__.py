"""Mixture of experts (MoE) and expert parallelism on CPU threads.

An MoE layer replaces the one MLP of a transformer block by E small MLPs, the experts,
and a router that sends every token to only k of them (Shazeer et al. 2017, arXiv
1701.06538): the parameters grow E-fold, the compute per token only k-fold.

    h = LayerNorm(x)
    p = softmax(router(h))                      one probability per expert and token
    e_1..e_k = the k largest p                  top-1 (Switch) or top-2 (GShard)
    y = x + sum_j gate_j * expert_{e_j}(h)      a dropped assignment adds nothing

One idea per file (each readable top to bottom):

- `routing`          top-k routing, gates, capacity and dropped tokens, the balancing
                     loss, and the counts a lesson grades (tokens per expert, all-to-all
                     bytes, parameters per worker)
- `block`            the MoE block on one device (`MoE`) and the single-device step
                     (`reference_step`) that expert parallelism must reproduce
- `expert_parallel`  the experts spread over worker threads, tokens dispatched and
                     combined with the hand-written all-to-all (`ExpertParallel`)
- `rank_program`     the forward's dispatch and combine written as the program every rank
                     runs, watched (`rank_program.run_moe_program`)
- `simulate`         a cost model and simulator of one expert-parallel step
                     (`simulate_moe`), and costs read off a measured one (`fit_costs`,
                     `measured_expert_seconds`)
- `training`         a skewed router trained with and without the balancing loss
- `balancing`        DeepSeek-V3's bias balancing (no auxiliary loss) and ST-MoE's router
                     z-loss
- `limits`           the sizes accepted and the input checks

Every public name is importable from `course_utils.parallel.moe` (but `rank_program`'s).
"""

from course_utils.parallel.moe.balancing import (
    biased_choice,
    expert_load,
    router_z_loss,
    update_bias,
)
from course_utils.parallel.moe.block import Expert, MoE, MoEOutput, MoEStep, reference_step
from course_utils.parallel.moe.expert_parallel import ExpertParallel
from course_utils.parallel.moe.limits import (
    MAX_CAPACITY_FACTOR,
    MAX_D_MODEL,
    MAX_EXPERTS,
    MAX_HIDDEN,
    MAX_SKEW,
    MAX_TOKENS,
    MAX_WORKERS,
)
from course_utils.parallel.moe.routing import (
    Routing,
    all_to_all_bytes_per_worker,
    capacity,
    dropped_tokens,
    expert_params,
    experts_of_worker,
    load_balancing_loss,
    route,
    tokens_per_expert,
)
from course_utils.parallel.moe.simulate import (
    MoECosts,
    fit_costs,
    measured_expert_seconds,
    simulate_moe,
)
from course_utils.parallel.moe.training import TrainDemo, spread, train_demo

__all__ = [
    "MAX_CAPACITY_FACTOR",
    "MAX_D_MODEL",
    "MAX_EXPERTS",
    "MAX_HIDDEN",
    "MAX_SKEW",
    "MAX_TOKENS",
    "MAX_WORKERS",
    "Expert",
    "ExpertParallel",
    "MoE",
    "MoECosts",
    "MoEOutput",
    "MoEStep",
    "Routing",
    "TrainDemo",
    "all_to_all_bytes_per_worker",
    "biased_choice",
    "capacity",
    "dropped_tokens",
    "expert_params",
    "expert_load",
    "experts_of_worker",
    "fit_costs",
    "load_balancing_loss",
    "reference_step",
    "route",
    "router_z_loss",
    "measured_expert_seconds",
    "simulate_moe",
    "spread",
    "tokens_per_expert",
    "train_demo",
    "update_bias",
]
