"""Our schedules against PyTorch's own (`torch.distributed.pipelining`), without processes.

PyTorch describes its schedules in two ways: an order table (`pipeline_order`, which
`_schedule_visualizer.get_schedule_ops` returns) and, for the single-stage schedules
(GPipe, 1F1B), the code that really runs (`_step_microbatches`). We compare with both:
the runtime order by running `_step_microbatches` on a stand-in stage that only records
which micro-batch it is asked to forward or backward.

Where they differ (see docs/schedules.md):
- the table of torch 2.10 to 2.13 for Schedule1F1B is off by one on the last rank (it starts with F1
  and names a micro-batch M that does not exist); its runtime order is right and equals ours.
- Our interleaved schedule requires M to be a multiple of P (Megatron-LM's rule); PyTorch
  relaxes that. For the M we accept, the orders are identical.
- ZB-H1 has no PyTorch counterpart (ScheduleInterleavedZeroBubble needs 2+ stages per rank).
"""

from __future__ import annotations

import functools
from unittest import mock

import pytest

from course_utils.pipeline.schedules import make_schedule


@functools.cache
def pytorch(name: str):
    """A schedule class of torch.distributed.pipelining (or `get_schedule_ops`, or
    `PipelineStage`), imported at first use: the package imports torch._dynamo (about 2 s),
    which every pytest worker would otherwise pay while collecting."""
    from torch.distributed.pipelining import _schedule_visualizer, schedules, stage

    for module in (schedules, _schedule_visualizer, stage):
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"torch.distributed.pipelining has no {name}")


# Compute actions by their enum names: the values changed between releases (2.10: 1, 10, ...;
# 2.13: "F", "B", ...), the names did not.
COMPUTE = {"FORWARD", "FULL_BACKWARD", "BACKWARD_INPUT", "BACKWARD_WEIGHT"}


def table_order(schedule_class: str, p: int, m: int, v: int | None = None) -> list[list[str]]:
    """PyTorch's order table, as our action strings, without idle slots and communication."""
    ops = pytorch("get_schedule_ops")(pytorch(schedule_class), p, m, num_stages_per_rank=v)
    return [
        [str(a) for a in rank if a is not None and a.computation_type.name in COMPUTE]
        for rank in ops
    ]


def runtime_order(schedule_class: str, p: int, m: int, rank: int) -> list[str]:
    """The order PyTorch's runtime really uses on `rank`: run its loop on a recording stage."""
    stage = mock.create_autospec(pytorch("PipelineStage"), instance=True)
    stage.group_rank, stage.group_size, stage.submod = rank, p, None
    stage.num_stages, stage.stage_index = p, rank
    stage.is_first, stage.is_last = rank == 0, rank == p - 1
    for ops in ("get_fwd_recv_ops", "get_fwd_send_ops", "get_bwd_recv_ops", "get_bwd_send_ops"):
        getattr(stage, ops).return_value = []  # no peers: nothing to send or receive
    order: list[str] = []
    stage.forward_one_chunk.side_effect = lambda mb, *a, **k: order.append(f"{rank}F{mb}")
    stage.backward_one_chunk.side_effect = lambda mb, *a, **k: order.append(f"{rank}B{mb}")
    schedule = pytorch(schedule_class)(stage, m)
    schedule._initialize_stage = lambda *a, **k: None  # would run a real forward
    schedule._maybe_compute_loss = lambda *a, **k: None
    schedule._step_microbatches([()] * m, [{}] * m)
    return order


SHAPES = [(2, 2), (2, 4), (3, 6), (4, 4), (4, 8), (4, 12)]


@pytest.mark.parametrize("p, m", SHAPES)
def test_gpipe_matches_pytorch_table_and_runtime(p, m):
    ours = make_schedule("gpipe", p, m).as_strings()
    assert ours == table_order("ScheduleGPipe", p, m)
    assert ours == [runtime_order("ScheduleGPipe", p, m, r) for r in range(p)]


@pytest.mark.parametrize("p, m", SHAPES)
def test_1f1b_matches_pytorch_runtime(p, m):
    ours = make_schedule("1f1b", p, m).as_strings()
    assert ours == [runtime_order("Schedule1F1B", p, m, r) for r in range(p)]


@pytest.mark.parametrize("p, m", SHAPES)
def test_pytorch_1f1b_table_is_off_by_one_on_the_last_rank(p, m):
    # Documented discrepancy (torch 2.10 to 2.13): `Schedule1F1B._get_pipeline_order` starts the
    # last rank's steady state at F1 (its forward counter starts at 0 and is bumped before
    # use when there is no warm-up), so the table skips F0 and names F{m}, which does not
    # exist. All other ranks agree with the runtime order and with ours.
    ours = make_schedule("1f1b", p, m).as_strings()
    table = table_order("Schedule1F1B", p, m)
    assert table[:-1] == ours[:-1]
    last = p - 1
    shifted = [
        f"{last}F{int(a[len(str(last)) + 1 :]) + 1}" if a[len(str(last))] == "F" else a
        for a in ours[-1]
    ]
    assert table[-1] == shifted
    assert f"{last}F0" not in table[-1] and f"{last}F{m}" in table[-1]


@pytest.mark.parametrize("p, m", SHAPES)
@pytest.mark.parametrize("v", [2, 3])
def test_interleaved_matches_pytorch(p, m, v):
    assert make_schedule("interleaved", p, m, v).as_strings() == table_order(
        "ScheduleInterleaved1F1B", p, m, v
    )


@pytest.mark.parametrize("p, m", SHAPES + [(3, 2), (4, 5)])
@pytest.mark.parametrize("v", [2, 3])
def test_breadth_first_matches_pytorch_looped_bfs(p, m, v):
    assert make_schedule("breadth-first", p, m, v).as_strings() == table_order(
        "ScheduleLoopedBFS", p, m, v
    )


def test_pytorch_interleaved_accepts_m_we_reject():
    # PyTorch relaxes Megatron's "M multiple of P" (rounds of M // P micro-batches); we keep
    # the paper's rule so the bubble formula (p-1)/(v m) holds. Just document it here.
    assert table_order("ScheduleInterleaved1F1B", 4, 10, 2)  # torch builds it
    with pytest.raises(ValueError, match="multiple of devices"):
        make_schedule("interleaved", 4, 10, 2)
