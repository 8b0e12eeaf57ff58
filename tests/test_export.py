"""The CSV export must load in PyTorch's own pipelining loader and give back the same actions."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from course_utils.actions import Action, Schedule
from course_utils.errors import CourseInputError
from course_utils.pipeline.export import from_pytorch_csv, to_pytorch_csv, to_pytorch_rows

ROOT = Path(__file__).resolve().parents[1]


def hand_gpipe(p: int, m: int) -> Schedule:
    """GPipe written out by hand, so these tests do not depend on the schedule builders."""
    devices = []
    for d in range(p):
        fwd = [Action(d, "F", i) for i in range(m)]
        bwd = [Action(d, "B", i) for i in range(m)]
        devices.append(tuple(fwd + bwd))
    return Schedule("gpipe", p, m, tuple(devices))


def hand_looped_bfs(p: int, m: int, v: int) -> Schedule:
    """Breadth-first with looping placement (stage s on device s % p)."""
    devices = []
    for d in range(p):
        stages = list(range(d, p * v, p))
        fwd = [Action(s, "F", i) for s in stages for i in range(m)]
        bwd = [Action(s, "B", i) for s in reversed(stages) for i in range(m)]
        devices.append(tuple(fwd + bwd))
    return Schedule("breadth-first", p * v, m, tuple(devices))


def pytorch_load(path: Path, schedule: Schedule):
    """Load `path` with PyTorch's `_PipelineScheduleRuntime._load_csv` (compute_only).

    The runtime normally needs real `PipelineStage`s and a process group; loading only
    reads `pp_group_size`, `_num_stages` and `_n_microbatches`, so we give it those on a
    bare instance and let PyTorch's real parser, validator and lowering passes run.
    """
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    runtime = object.__new__(_PipelineScheduleRuntime)
    runtime.pipeline_order = {}
    runtime.pp_group_size = schedule.num_devices
    runtime._num_stages = schedule.stages
    runtime._n_microbatches = schedule.microbatches
    runtime._stages = []
    runtime._defer_pp_recv = False
    runtime._load_csv(str(path), format="compute_only")
    return runtime


def as_strings(pytorch_order: dict) -> list[list[str]]:
    return [[str(a) for a in pytorch_order[r] if a is not None] for r in sorted(pytorch_order)]


@pytest.mark.parametrize(
    "schedule", [hand_gpipe(2, 4), hand_gpipe(4, 3), hand_looped_bfs(2, 4, 2)], ids=str
)
def test_pytorch_loader_reads_back_the_same_actions(tmp_path, schedule):
    path = to_pytorch_csv(schedule, tmp_path / "s.csv")
    runtime = pytorch_load(path, schedule)
    assert as_strings(runtime.pipeline_order) == schedule.as_strings()
    # PyTorch inferred the same stage -> rank placement the course uses (s % p).
    assert runtime.stage_index_to_group_rank == schedule.device_of_stage()
    # Its lowering added the communication a 2-device pipeline needs (by enum name: the
    # values changed after 2.10, from integers to letters).
    kinds = {a.computation_type.name for a in runtime.pipeline_order_with_comms[0]}
    assert {"SEND_F", "RECV_B", "REDUCE_GRAD"} <= kinds


def test_zero_bubble_split_backward_exports(tmp_path):
    # ZB-H1-like order on 2 devices, 2 micro-batches: B split into I (input grad) and W.
    rows = [
        "0F0 0F1 0I0 0I1 0W0 0W1".split(),
        "1F0 1I0 1F1 1W0 1I1 1W1".split(),
    ]
    schedule = Schedule("zb", 2, 2, tuple(tuple(map(Action.parse, r)) for r in rows))
    runtime = pytorch_load(to_pytorch_csv(schedule, tmp_path / "zb.csv"), schedule)
    assert as_strings(runtime.pipeline_order) == rows


def test_course_schedules_round_trip(tmp_path):
    from course_utils.pipeline import schedules

    cases = [
        ("gpipe", 2, 4, 1),
        ("1f1b", 2, 4, 1),
        ("1f1b", 4, 8, 1),
        ("interleaved", 2, 4, 2),
        ("breadth-first", 2, 4, 2),
        ("zb-h1", 2, 4, 1),
    ]
    for name, p, m, v in cases:
        schedule = schedules.make_schedule(name, p, m, v)
        path = to_pytorch_csv(schedule, tmp_path / f"{name}.csv")
        runtime = pytorch_load(path, schedule)
        assert as_strings(runtime.pipeline_order) == schedule.as_strings(), name
        back = from_pytorch_csv(path)
        assert back.devices == schedule.devices, name


def test_file_is_one_row_per_rank_of_action_strings(tmp_path):
    schedule = hand_gpipe(2, 2)
    path = to_pytorch_csv(schedule, tmp_path / "g.csv")
    with open(path, newline="") as f:
        assert list(csv.reader(f)) == [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1F1", "1B0", "1B1"]]


def test_compute_only_drops_communication_compute_comms_keeps_it():
    rows = ["0F0 0SEND_F0 0RECV_B0 0B0 0REDUCE_GRAD".split(), "1RECV_F0 1F0 1B0 1SEND_B0".split()]
    schedule = Schedule("with-comms", 2, 1, tuple(tuple(map(Action.parse, r)) for r in rows))
    assert to_pytorch_rows(schedule) == [["0F0", "0B0"], ["1F0", "1B0"]]
    assert to_pytorch_rows(schedule, format="compute_comms") == rows


def test_reads_pytorchs_own_padded_rows(tmp_path):
    # PyTorch's generated orders pad idle steps with None, dumped as empty cells.
    path = tmp_path / "padded.csv"
    path.write_text("0F0,0F1,,0B1,0B0\n,1F0,1F1,1B1,1B0\n")
    schedule = from_pytorch_csv(path, name="padded")
    assert schedule.name == "padded"
    assert (schedule.stages, schedule.microbatches, schedule.num_devices) == (2, 2, 2)
    assert schedule.as_strings()[1] == ["1F0", "1F1", "1B1", "1B0"]


def test_pytorch_looped_bfs_order_matches_course_breadth_first_work(tmp_path):
    """PyTorch's own ScheduleLoopedBFS order, dumped to CSV, reads back as the same work."""
    from torch.distributed.pipelining.schedules import ScheduleLoopedBFS

    p, m, v = 2, 4, 2
    fake = SimpleNamespace(_stages=[None] * v, pp_group_size=p, _n_microbatches=m)
    path = tmp_path / "bfs.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        for rank in range(p):
            order = ScheduleLoopedBFS._calculate_single_rank_operations(fake, rank)
            writer.writerow(["" if a is None else str(a) for a in order])
    theirs = from_pytorch_csv(path)
    ours = hand_looped_bfs(p, m, v)
    assert theirs.device_of_stage() == ours.device_of_stage()
    for d in range(p):
        assert sorted(theirs.devices[d]) == sorted(ours.devices[d])


@pytest.mark.parametrize(
    "call, word",
    [
        (lambda tmp: to_pytorch_csv("0F0", tmp / "x.csv"), "schedule"),
        (lambda tmp: to_pytorch_csv(hand_gpipe(2, 2), tmp / "x.csv", format="grid"), "format"),
        (lambda tmp: from_pytorch_csv(tmp / "missing.csv"), "path"),
    ],
)
def test_bad_input_names_the_parameter(tmp_path, call, word):
    with pytest.raises(CourseInputError, match=word):
        call(tmp_path)


def test_bad_cell_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("0F0,zap\n")
    with pytest.raises(CourseInputError, match="zap"):
        from_pytorch_csv(path)


def test_export_does_not_import_torch():
    code = "import sys, course_utils.pipeline.export; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
