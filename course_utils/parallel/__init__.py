"""The parallel dimensions beside the pipeline, each on threads and checked against one device.

- `data_parallel`    replicas, batch shards, gradient all-reduce (imports torch)
- `tensor_parallel`  the Megatron-LM split of a transformer MLP (imports torch)
- `rank_programs`    data- and tensor-parallel programs written per rank (a collective, DDP,
                     a tensor-parallel layer), run on `threads.ranks` (imports torch)
- `moe`              mixture of experts and expert parallelism (all-to-all) (imports torch)
- `timelines`        simulated data-parallel step timelines, alone and beside a pipeline
- `costs`            how long collectives take (the alpha-beta model), for every simulation

`timelines` and `costs` never import torch.
"""
