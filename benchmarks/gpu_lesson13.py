"""Lesson 13's worker file on NCCL, on a machine with an NVIDIA GPU (not part of `make bench`:
CI and the course's laptops have no GPU). From the repository root, with a `python3` whose
PyTorch is a CUDA build:

    bash benchmarks/gpu_lesson13.sh

It writes the worker file exactly as the lesson's `%%writefile` cells do (read from
`notebooks/13_beyond_one_machine.ipynb`) and runs it with the course's launcher
(`distributed.workers.run_worker`), three times:

1. one rank: the file picks NCCL and `cuda:0` itself; its all-reduce and its DeviceMesh's
   all-gather run on the GPU (not its ring: at world 1 a rank's neighbour is itself);
2. two ranks on a node with one GPU: the file picks gloo on the CPU, as on a laptop;
3. two ranks forced onto NCCL, both on `cuda:0`: what NCCL says to ranks sharing a GPU.

It prints each run's backend, results and calls, writes them to `$OUT/gpu_lesson13.json`
when OUT is set, and exits 1 if run 1 or 2 is not what the lesson says.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from course_utils.distributed.workers import run_worker

ROOT = Path(__file__).resolve().parents[1]
LESSON = ROOT / "notebooks" / "13_beyond_one_machine.ipynb"
NAME = "lesson13_worker.py"
SOLO = f"""\
import torch.distributed as dist
from {Path(NAME).stem} import BACKEND, DEVICE, hello, mesh


def solo():
    dist.init_process_group(BACKEND)
    out = {{"backend": dist.get_backend(), "device": DEVICE, "hello": hello(), "mesh": mesh()}}
    dist.destroy_process_group()  # no ring: at world 1 its neighbour would be itself
    return out
"""
FORCED = (  # every rank on NCCL and on cuda:0, whatever the node has
    ("ON_GPU = torch.cuda.device_count()", "ON_GPU = True or torch.cuda.device_count()"),
    ('f"cuda:{LOCAL_RANK}"', '"cuda:0"'),
)


def worker_text() -> str:
    """The file the lesson's cells write: the first `%%writefile`, then each `-a` appended."""
    text = ""
    for cell in json.loads(LESSON.read_text())["cells"]:
        source = "".join(cell["source"])
        first, _, body = source.partition("\n")
        if cell["cell_type"] == "code" and first.split() == ["%%writefile", NAME]:
            text = body + "\n"
        elif cell["cell_type"] == "code" and first.split() == ["%%writefile", "-a", NAME]:
            text += body + "\n"
    assert "init_process_group(BACKEND)" in text, "the lesson's worker cells were not found"
    return text


def show(title: str, run) -> dict:
    print(f"\n== {title}: {run.seconds:.1f} s")
    run.show()
    for rank, out in enumerate(run.returned):
        print(f"rank {rank} returned {out}")
    for rank, calls in enumerate(run.calls):
        print(f"rank {rank} called", [(c["op"], c["peer"], c["bytes"]) for c in calls])
    if run.failure:
        print("failure:", run.failure["message"])
    return {
        "returned": run.returned,
        "calls": run.calls,
        "failure": run.failure,
        "seconds": run.seconds,
    }


def main() -> int:
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, python {sys.version.split()[0]}")
    if not torch.cuda.is_available():
        print("no CUDA device: this script needs a GPU machine")
        return 1
    print(f"{torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}")
    version = torch.cuda.nccl.version()  # a tuple (an int in old releases)
    nccl = ".".join(map(str, version if isinstance(version, tuple) else (version,)))
    print("NCCL", nccl)
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")  # the ranks meet on this machine
    os.environ.setdefault("NCCL_DEBUG", "WARN")
    folder = Path(tempfile.mkdtemp(prefix="gpu-lesson13-"))
    os.chdir(folder)  # each rank imports the files from here (its sys.path starts with it)
    text = worker_text()
    (folder / NAME).write_text(text)
    (folder / "solo.py").write_text(SOLO)
    forced = text
    for old, new in FORCED:
        assert old in forced, old
        forced = forced.replace(old, new)
    (folder / "forced.py").write_text(forced)

    one = run_worker("solo.py", "solo", world=1, timeout=120, echo=False, raise_failure=False)
    two = run_worker(NAME, "main", world=2, timeout=120, echo=False, raise_failure=False)
    shared = run_worker("forced.py", "main", world=2, timeout=120, echo=False, raise_failure=False)
    report = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "nccl": nccl,
        "one rank, the file's choice": show("1 rank, the file's choice", one),
        "two ranks, the file's choice": show("2 ranks on 1 GPU, the file's choice", two),
        "two ranks forced onto NCCL": show("2 ranks forced onto NCCL on cuda:0", shared),
    }
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_lesson13.json").write_text(json.dumps(report, indent=1, default=str))

    ok = one.failure is None and one.returned[0]["backend"] == "nccl"
    ok = (
        ok
        and one.returned[0]["hello"] == 1.0
        and one.returned[0]["mesh"]["whole"] == [float(i) for i in range(8)]
    )
    ok = ok and two.failure is None and [r["backend"] for r in two.returned] == ["gloo"] * 2
    ok = ok and [r["hello"] for r in two.returned] == [3.0, 3.0]
    print(
        "\nverdict:",
        "NCCL ran the lesson's worker on the GPU" if ok else "NOT what the lesson says",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
