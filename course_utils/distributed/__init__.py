"""The same model on real `torch.distributed` processes, checked against one process.

- `cluster`     a group of processes joined by gloo on 127.0.0.1, reused for many jobs
- `setup`       the identical model and batch on every rank, and the comparison's result
- `ddp`         `run_ddp`: DistributedDataParallel vs one process and vs the threads
- `fsdp`        `run_fsdp`: FSDP2 `fully_shard` (ZeRO-3) vs one process and vs the threads' ZeRO-3
- `pipelining`  `run_pipeline`: PyTorch's pipeline schedules (or any course schedule through
                PyTorch's CSV format) vs one process and vs the thread executor
- `ring`        ring attention with `isend`/`recv` vs full attention and the threads' ring

The same model for `torchrun`, the way a cluster runs it:

- `train`       `python -m course_utils.distributed.train`: the entry point torchrun starts on
                every node (ddp, fsdp, pipeline, fsdp+pipeline on a 2-D mesh), with a report
- `job`         what every rank runs, from torchrun's environment and the arguments, checked
- `parallelize` the model laid out on a DeviceMesh for each of those modes
- `checkpoint`  sharded checkpoints (torch.distributed.checkpoint) and finding the last one
- `clocks`      each rank's clock offset to rank 0's, for one chart of every node's actions
- `launch`      `launch()`: a multi-node torchrun job on this machine (one agent per "node")
- `torchrun`    `python -m course_utils.distributed.torchrun`: torchrun itself, the training
                flags checked before any process and a failed rank said in one line

Each returns a measured `Timeline` built from every process's own timestamps
(`time.time_ns`, one clock for all processes on one machine), ready for
`course_utils.charts.gantt.draw`. The names below are imported when first used: importing the
package (or `python -m course_utils.distributed.train`) does not import torch, so a bad flag
or variable is refused at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from course_utils.distributed.cluster import (
        HOST,
        MAX_WORKERS,
        Cluster,
        free_port,
        port_is_free,
        resolve_port,
        spawn,
    )
    from course_utils.distributed.ddp import reference_ddp, run_ddp, threads_ddp
    from course_utils.distributed.fsdp import reference_fsdp, run_fsdp, threads_fsdp
    from course_utils.distributed.pipelining import (
        PIPELINES,
        course_schedule,
        executor_pipeline,
        reference_pipeline,
        run_pipeline,
    )
    from course_utils.distributed.setup import (
        MODELS,
        DistributedResult,
        Setup,
        build_model,
        loss_fn,
        make_batch,
        split_stages,
    )

__all__ = [
    "HOST", "MAX_WORKERS", "MODELS", "PIPELINES", "Cluster", "DistributedResult", "Setup",
    "build_model", "course_schedule", "executor_pipeline", "free_port", "loss_fn",
    "make_batch", "port_is_free", "reference_ddp", "reference_pipeline", "resolve_port",
    "reference_fsdp", "run_ddp", "run_fsdp", "run_pipeline", "spawn", "split_stages",
    "threads_ddp", "threads_fsdp",
]  # fmt: skip

# name -> the module that defines it (each imports torch when first asked for)
_HOME = {
    "HOST": "ports", "MAX_WORKERS": "cluster", "Cluster": "cluster", "free_port": "ports",
    "port_is_free": "ports", "resolve_port": "ports", "spawn": "cluster",
    "reference_ddp": "ddp", "run_ddp": "ddp", "threads_ddp": "ddp",
    "reference_fsdp": "fsdp", "run_fsdp": "fsdp", "threads_fsdp": "fsdp",
    "PIPELINES": "pipelining", "course_schedule": "pipelining", "executor_pipeline": "pipelining",
    "reference_pipeline": "pipelining", "run_pipeline": "pipelining",
    "MODELS": "setup", "DistributedResult": "setup", "Setup": "setup", "build_model": "setup",
    "loss_fn": "setup", "make_batch": "setup", "split_stages": "setup",
}  # fmt: skip


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(f"course_utils.distributed.{_HOME[name]}"), name)
    raise AttributeError(f"module 'course_utils.distributed' has no attribute {name!r}")
