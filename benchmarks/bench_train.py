"""Benchmark of the torchrun entry point (run by `make bench`; exits 1 if a run fails or
leaves one process's parameters).

Each mode of `python -m course_utils.distributed.train` runs as a real 2-node torchrun job
on this machine (two agents meeting on 127.0.0.1): ddp, fsdp and pipeline (1F1B) with one
process per node, and fsdp+pipeline with two per node (4 processes on 2 cores: they share
them). The course's TinyGPT (4 layers, d_model 64, 8 sequences of 32 tokens) trains
STEPS steps without checkpoints; the figure is the median step time over the steps after the
first (which holds PyTorch's one-time set-up), each step from the first rank starting it to
the last one finishing it. Beside it: one process training the same batches on one thread,
and the whole job's wall time (starting agents and processes dominates it).

The model is tiny on purpose: a step is milliseconds of compute, so these figures measure
what distribution costs (messages, collectives, hooks), not what it gains. Numbers move with
other programs on the machine; rerun on a quiet one.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import torch

from course_utils.distributed.launch import launch
from course_utils.distributed.parallelize import optimizer
from course_utils.distributed.setup import Setup, build_model, loss_fn, make_batch

STEPS = 20
TOL = 1e-5
MODES: list[tuple[str, dict[str, Any]]] = [  # (label, launch options)
    ("ddp", {"parallel": "ddp"}),
    ("fsdp", {"parallel": "fsdp"}),
    ("pipeline 1f1b", {"parallel": "pipeline", "schedule": "1f1b"}),
    ("fsdp+pipeline 2x2", {"parallel": "fsdp+pipeline", "procs_per_node": 2}),
]


def one_process_step_s(steps: int = STEPS) -> float:
    """Median step of the same training on this process, one intra-op thread."""
    setup = Setup()
    torch.set_num_threads(1)
    model = build_model(setup)
    opt = optimizer(model.parameters(), 0.1)
    times = []
    for step in range(steps):
        x, y = make_batch(setup, step)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(setup)(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def main() -> int:
    alone = one_process_step_s()
    print(f"one process, one thread: {1e3 * alone:.1f} ms per step\n")
    print(f"{'mode':<19} {'processes':>9} {'step (ms)':>10} {'vs one':>7} {'job (s)':>8}  max diff")
    failed = False
    for label, options in MODES:
        try:
            job = launch(steps=STEPS, **options)  # no --checkpoint-dir: no checkpoints
        except Exception as exc:  # report it and go on with the other modes
            print(f"{label:<19} FAILED: {exc}")
            failed = True
            continue
        r = job.report
        step = statistics.median(r["step_times_s"][1:])
        ok = r["max_param_diff"] <= TOL
        failed |= not ok
        print(
            f"{label:<19} {r['world_size']:>9} {1e3 * step:>10.1f} {step / alone:>6.1f}x "
            f"{job.seconds:>8.1f}  {r['max_param_diff']:.1e}{'' if ok else '  MISS'}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
