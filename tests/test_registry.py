"""The schedule registry: every entry works everywhere, and its closed forms are the simulator's.

Adding a schedule is one builder and one entry in `course_utils.pipeline.schedules.SCHEDULES`;
these tests then walk it through the simulator, the Gantt chart, the explorer, the planner,
the thread executor and the PyTorch export, and hold its formulas to the simulator inside
the condition the entry states. (The torch.distributed bridge walk is in test_distributed.py,
which has a cluster of processes to spare.)
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_utils import plan
from course_utils.charts import gantt
from course_utils.charts.explorer import Settings, explorer_update
from course_utils.models import MLP, loss_fn, partition
from course_utils.pipeline import SCHEDULES, Case, CostModel, make_schedule, simulate, validate
from course_utils.pipeline.executor import PipelineExecutor
from course_utils.pipeline.export import from_pytorch_csv, to_pytorch_csv

NAMES = list(SCHEDULES)
COSTS = st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, 3.0])


def chunks_for(name: str, v: int) -> int:
    return v if SCHEDULES[name].uses_chunks else 1


@st.composite
def cases(draw):
    name = draw(st.sampled_from(NAMES))
    p = draw(st.integers(1, 8))
    m = draw(st.integers(1, 20))
    v = chunks_for(name, draw(st.integers(1, 4)))
    if SCHEDULES[name].shape_rule(p, m, v):
        m = 2 * p * draw(st.integers(1, 3))  # interleaved: rounds of p; dualpipe-v: m >= 2p
    case = Case(
        p,
        m,
        v,
        forward=draw(COSTS),
        backward=draw(COSTS),
        weight_fraction=draw(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])),
        p2p=draw(st.sampled_from([0.0, 0.0, 0.3])),
    )
    return name, case


def simulated(name: str, c: Case):
    costs = CostModel(c.forward, c.backward, c.weight_fraction, c.p2p)
    return simulate(make_schedule(name, c.p, c.m, c.v), costs)


@settings(max_examples=400, deadline=None)
@given(cases())
def test_closed_forms_equal_the_simulator_where_they_say_they_hold(named_case):
    name, case = named_case
    info = SCHEDULES[name]
    timeline = simulated(name, case)
    bubble = info.bubble(case)
    if bubble is not None:
        assert bubble == pytest.approx(timeline.bubble_fraction, abs=1e-9), info.bubble.formula
    peak = info.peak(case)
    if peak is not None:  # whole-stage micro-batches: a chunk holds 1/v of a device's layers
        assert peak == pytest.approx(max(timeline.peak_activations) / info.chunks(case.v))


@pytest.mark.parametrize("name", NAMES)
def test_every_formula_holds_with_the_lessons_costs(name):
    # F = 1, B = 2, W = B/2, free transfers, every device busy (m a multiple of p, m >= p):
    # the setting of the lessons and the planner, where every closed form must apply.
    for p, m, v in [(2, 4, 2), (4, 8, 2), (4, 12, 3), (8, 16, 1)]:
        case = Case(p, m, chunks_for(name, v))
        assert SCHEDULES[name].bubble(case) is not None
        assert SCHEDULES[name].peak(case) is not None


def test_zb_h1_needs_w_below_both_f_and_i():
    # The paper's idle time (p-1)(F+I-W) (Qi et al. 2024) holds only while W <= min(F, I).
    # "W <= I" alone is not enough: with F < W the W's overfill the gaps they are given.
    p, m = 4, 8
    f, i, w = 0.5, 1.5, 1.5  # W <= I but W > F
    case = Case(p, m, 1, forward=f, backward=i + w, weight_fraction=w / (i + w))
    timeline = simulated("zb-h1", case)
    idle = timeline.makespan - m * (f + i + w)
    assert idle == pytest.approx((p - 1) * i)  # not (p-1)(F+I-W) = (p-1) * 0.5
    assert idle != pytest.approx((p - 1) * (f + i - w))
    assert SCHEDULES["zb-h1"].bubble(case) == pytest.approx(timeline.bubble_fraction)
    # and inside the condition the paper's form is exact
    case = Case(p, m, 1, forward=1.0, backward=2.0, weight_fraction=0.25)  # I = 1.5, W = 0.5
    idle = simulated("zb-h1", case).makespan - m * 3.0
    assert idle == pytest.approx((p - 1) * (1.0 + 1.5 - 0.5))


def test_breadth_first_formula_needs_every_device_busy():
    case = Case(4, 2, 2)  # m < p: devices wait for micro-batches that do not exist
    assert SCHEDULES["breadth-first"].bubble(case) is None
    assert simulated("breadth-first", case).bubble_fraction > (4 - 1) / (2 * 2 + 4 - 1)


@pytest.mark.parametrize("name", NAMES)
def test_every_entry_is_simulated_drawn_explored_and_planned(name):
    info = SCHEDULES[name]
    p, m, v = 2, 4, chunks_for(name, 2)
    schedule = make_schedule(name, p, m, v)
    assert schedule.name == name and validate(schedule) == []
    timeline = simulate(schedule)
    fig = gantt.draw(timeline, pyplot=False)
    assert fig.axes[0].get_title(loc="left").startswith(info.label)
    view = explorer_update(Settings(name, p, m, chunks=v))
    assert view.title.startswith(info.label)
    assert view.bubble_fraction == pytest.approx(timeline.bubble_fraction)
    assert view.formula == info.bubble.formula
    if info.microbatched:
        assert name in plan.PLANNED_SCHEDULES
        assert plan.pipeline_bubble(name, p, m, v) == pytest.approx(timeline.bubble_fraction)
        assert plan.inflight_microbatches(name, p, m, v) == pytest.approx(
            max(timeline.peak_activations) / info.chunks(v)
        )
    else:
        assert name not in plan.PLANNED_SCHEDULES


@pytest.mark.parametrize("name", NAMES)
def test_every_entry_runs_on_the_executor_with_the_unsplit_gradients(name):
    p, m, v = 2, 4, chunks_for(name, 2)
    stages = make_schedule(name, p, m, v).stages
    torch.manual_seed(0)
    model = MLP(16, 32, 4, depth=stages)
    x, y = model.example_batch(8, torch.Generator().manual_seed(1))
    reference = copy.deepcopy(model)
    loss_fn(reference(x), y).backward()
    with PipelineExecutor(partition(model, stages), p, loss_fn) as ex:
        ex.step(make_schedule(name, p, m, v), x, y)
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert (a.grad - b.grad).abs().max().item() < 1e-5


@pytest.mark.parametrize("name", NAMES)
def test_every_entry_exports_to_pytorchs_csv_and_back(name, tmp_path):
    schedule = make_schedule(name, 2, 4, chunks_for(name, 2))
    path = tmp_path / f"{name}.csv"
    to_pytorch_csv(schedule, path)
    back = from_pytorch_csv(path)
    computed = [[a for a in acts if a.is_compute] for acts in schedule.devices]
    assert [list(acts) for acts in back.devices] == computed


def test_schedule_names_are_written_only_in_the_registry():
    # Outside the registry a schedule is named through it (SCHEDULES, RECOMMENDED): a name
    # written out elsewhere is a second place to change when a schedule is renamed. Docstring
    # examples and the lessons' checks (which ask about a named schedule, like the notebooks)
    # may name one.
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "course_utils"
    registry = {"pipeline/schedules.py", "pipeline/vshape.py"}
    other_meaning = {("parallel/costs.py", "naive")}  # the naive all-reduce, not the schedule
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package).as_posix()
        if where in registry or where.startswith("checks/"):
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and node.value in SCHEDULES
                and id(node) not in docstrings
                and (where, node.value) not in other_meaning
            ):
                found.append(f"{where}:{node.lineno} {node.value!r}")
    assert found == []
