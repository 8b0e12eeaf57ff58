"""Worker files for the tests: lesson 13's ring and data-parallel workers, and the mistakes
learners make.

Each wrong worker is the right one, `RING` or `DDP`, with one mistake written into it (`edit`),
so that it reads as a learner's whole answer cell; `worker(text, function)` writes it into a
folder of this session and gives the `Worker` a check is handed, `cell(text)` the answer
cell of a graded notebook.

A check's run of a worker on the same case is made once per test process (`Remembered`): the
contract test, its sentences test and the hints test judge each wrong worker's run, and a run
costs seconds. The tests that need the same case each time give a seeded `Variant` (SEEDED).
"""

from __future__ import annotations

import atexit
import hashlib
import io
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import psutil
import torch

from course_utils.checks import Variant
from course_utils.distributed.workers import Worker, WorkerRun

SEEDED = Variant("default", cases_seed=13)  # the default student's numbers, fixed cases

RING = """\
import torch
import torch.distributed as dist


def ring_sum(x):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    total, passing = x.clone(), x.clone()
    for _ in range(world - 1):
        received = torch.empty_like(x)
        request = dist.isend(passing, dst=right)
        dist.recv(received, src=left)
        request.wait()
        total += received
        passing = received
    dist.destroy_process_group()
    return total
"""

DDP = """\
import torch
import torch.distributed as dist
import torch.nn.functional as F


def train(model, inputs, targets, steps, lr):
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(inputs), targets).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
    dist.destroy_process_group()
"""

# DistributedDataParallel does the averaging: it passes too.
WITH_DDP = """\
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel


def train(model, inputs, targets, steps, lr):
    dist.init_process_group("gloo")
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(ddp(inputs), targets).backward()
        optimizer.step()
    dist.destroy_process_group()
"""

SEND = "request = dist.isend(passing, dst=right)"
WAIT = "        request.wait()\n"
AVERAGE = "            dist.all_reduce(p.grad)\n            p.grad /= world\n"
LOOP = "        for p in model.parameters():\n" + AVERAGE


def edit(text: str, *changes: tuple[str, str]) -> str:
    """`text` with each (old, new) replaced (each old must be there)."""
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    return text


# The ring's mistakes
both_send_first = edit(RING, (SEND, "dist.send(passing, dst=right)"), (WAIT, ""))
no_init = edit(RING, ('    dist.init_process_group("gloo")\n', ""))
forgot_own = edit(RING, ("total, passing = x.clone(), x.clone()",
                         "total, passing = torch.zeros_like(x), x.clone()"))  # fmt: skip
with_all_reduce = edit(
    RING, ("    for _ in range(world - 1):", "    dist.all_reduce(total)\n    for _ in range(0):")
)
forgot_return = edit(RING, ("    return total\n", ""))
averaged = edit(RING, ("    return total\n", "    return total / world\n"))
kept_own = edit(RING, ("        total += received\n", ""))

# Data parallelism's mistakes
no_division = edit(DDP, ("            p.grad /= world\n", ""))
parameters_not_gradients = edit(
    DDP, (AVERAGE, "            dist.all_reduce(p.data)\n            p.data /= world\n")
)
no_all_reduce = edit(DDP, (AVERAGE, "            pass\n"))
first_only = edit(
    DDP, ("        for p in model.parameters():", "        for p in list(model.parameters())[:1]:")
)
summed_after_step = edit(
    DDP, (LOOP, ""), ("        optimizer.step()\n",
                      "        optimizer.step()\n        for p in model.parameters():\n"
                      "            dist.all_reduce(p.data)\n"),
)  # fmt: skip
trains_a_copy = edit(DDP, ('    dist.init_process_group("gloo")\n',
                           '    dist.init_process_group("gloo")\n'
                           "    model = __import__('copy').deepcopy(model)\n"))  # fmt: skip
hangs = edit(
    RING,
    (
        "    for _ in range(world - 1):",
        "    while rank == 1:\n        pass\n    for _ in range(world - 1):",
    ),
)
raises = edit(
    DDP,
    (
        "        optimizer.step()\n",
        "        optimizer.step()\n        raise ValueError('step too big')\n",
    ),
)

FOLDER = Path(tempfile.mkdtemp(prefix="course-test-workers-"))
atexit.register(shutil.rmtree, FOLDER, True)


_RUNS: dict[str, WorkerRun] = {}


class Remembered(Worker):
    """A Worker whose check runs (`raise_failure=False`) on the same arguments are made once."""

    def run(self, *args, rank_args=None, **options) -> WorkerRun:
        if options.get("raise_failure", True):
            return super().run(*args, rank_args=rank_args, **options)
        buffer = io.BytesIO()
        torch.save((args, rank_args), buffer)
        key = hashlib.sha256(
            self.path.read_bytes() + self.function.encode() + buffer.getvalue()
            + repr(sorted(options.items())).encode()
        ).hexdigest()  # fmt: skip
        if key not in _RUNS:
            _RUNS[key] = super().run(*args, rank_args=rank_args, **options)
        return _RUNS[key]


def worker(text: str, function: str) -> Worker:
    """`text` written to a file of its own (named by its contents) as a Worker of `function`."""
    path = FOLDER / f"w{hashlib.sha256(text.encode()).hexdigest()[:12]}.py"
    if not path.exists():
        path.write_text(text)
    return Remembered(path, function)


def ring(text: str = RING) -> Worker:
    return worker(text, "ring_sum")


def ddp(text: str = DDP) -> Worker:
    return worker(text, "train")


def cell(text: str, name: str) -> str:
    """The answer cell that writes `text` to the file `name`."""
    return f"%%writefile {name}\n{text}"


def ranks_left(pids: Iterable[int] = ()) -> list[str]:
    """The ranks of worker runs still alive that this test answers for: its own descendants
    (a rank in a grading sandbox too), whatever is left in the process group of one of
    `pids` (a run's ranks: what a rank started), and any rank orphaned anywhere on the
    machine (none may be). Another test's live ranks, beside this one, are not counted."""
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    groups, found = set(pids), []
    for p in psutil.process_iter(["cmdline", "status", "ppid"]):
        try:
            line = " ".join(p.info["cmdline"] or [])
            rank = "workers import rank_main" in line
            ours = rank and (p.pid in mine or p.info["ppid"] == 1)
            if p.info["status"] != psutil.STATUS_ZOMBIE and (ours or os.getpgid(p.pid) in groups):
                found.append(f"{p.pid}: {line[:100]}")
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    return found
