"""The lessons' diagrams (charts.placement, tensor_split, grid, collectives, attention, moe):
each draws the state it is given, read back from the figure's patches, images and texts.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # no display, in this process and before pyplot is imported

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from course_utils.charts import attention, collectives, grid, moe, placement, tensor_split  # noqa: E402
from course_utils.errors import CourseInputError  # noqa: E402
from course_utils.parallel.context_parallel import causal_work, sequence_chunks  # noqa: E402
from course_utils.threads.collectives import ring_allreduce_steps  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts if t.get_text()]  # arrows are empty annotations


def _filled(ax) -> list[Rectangle]:
    return [p for p in ax.patches if isinstance(p, Rectangle) and p.get_fill()]


# --------------------------------------------------------------------------- placement


def test_layer_cuts_gives_whole_layers_to_a_device_or_a_block_of_every_layer():
    fig = placement.layer_cuts(layers=8, devices=4)
    pipeline, tensor = fig.axes
    assert len(_filled(pipeline)) == 8 and len(_filled(tensor)) == 8 * 4
    colours = [to_rgb(p.get_facecolor()) for p in _filled(pipeline)]
    assert colours[0] == colours[1] != colours[2]  # layers 0 and 1 on device 0, 2 on device 1
    assert _texts(pipeline) == [f"layer {k}" for k in range(8)]
    with pytest.raises(CourseInputError, match="devices"):
        placement.layer_cuts(layers=6, devices=4)


def test_looping_placement_puts_stage_s_on_device_s_mod_p():
    fig = placement.looping_placement(p=3, v=2)
    top, bottom = fig.axes
    cycle = [to_rgb(c) for c in plt.rcParams["axes.prop_cycle"].by_key()["color"]]
    stages = _filled(top)
    assert [to_rgb(p.get_facecolor()) for p in stages] == [cycle[s % 3] for s in range(6)]
    rows = [p.get_y() for p in _filled(bottom)]  # device d drawn at height p - 1 - d
    assert rows == [3 - 1 - s % 3 for s in range(6)]
    assert "6 stages on 3 devices" in top.get_title()


def test_stage_paths_counts_the_hops_that_change_device():
    fig = placement.stage_paths({"Looping": [0, 1, 0, 1], "V": [0, 1, 1, 0]})
    looping, vee = fig.axes
    assert looping.get_title() == "Looping: 3 of 3 hops change device"
    assert vee.get_title() == "V: 2 of 3 hops change device"
    assert list(vee.get_lines()[0].get_ydata()) == [0, 1, 1, 0]
    assert looping.yaxis_inverted()  # device 0 on top


def test_batch_shards_draws_every_sample_once_in_the_batch_and_once_in_its_shard():
    fig = placement.batch_shards([3, 3, 2, 2])
    ax = fig.axes[0]
    assert len(_filled(ax)) == 2 * 10
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "shard 0: 3 samples",
        "shard 1: 3 samples",
        "shard 2: 2 samples",
        "shard 3: 2 samples",
    ]
    assert "B = 10 samples split into 4 disjoint shards" in ax.get_title()


# --------------------------------------------------------------------------- tensor parallelism


def test_tensor_split_pictures_name_the_blocks_of_both_cuts():
    fig = tensor_split.matmul_split()
    by_columns, by_rows = fig.axes
    assert {"A₁", "A₂", "Y₁", "Y₂"} <= set(_texts(by_columns))
    assert {"X₁A₁", "X₂A₂", "+"} <= set(_texts(by_rows))
    mlp = tensor_split.megatron_mlp().axes[0]
    assert {"all-reduce\n(g)", "copy\n(f)", "GeLU\nZ₁", "GeLU\nZ₂"} <= set(_texts(mlp))


def test_rank_grid_draws_every_gpu_in_its_node_and_every_group():
    tp, pp, dp, per_node = 2, 2, 2, 4

    def rank(d, s, t):
        return t + tp * (s + pp * d)

    tensor = [[rank(d, s, t) for t in range(tp)] for d in range(dp) for s in range(pp)]
    pipeline = [[rank(d, s, t) for s in range(pp)] for d in range(dp) for t in range(tp)]
    data = [[rank(d, s, t) for d in range(dp)] for s in range(pp) for t in range(tp)]
    ax = grid.rank_grid(tp, pp, per_node, tensor, pipeline, data).axes[0]
    assert sorted(_texts(ax)) == sorted(f"GPU {r}\nnode {r // per_node}" for r in range(8))
    assert len([p for p in ax.patches if isinstance(p, Rectangle)]) == 8
    assert len(ax.get_lines()) == len(tensor) + len(data)  # a bar per pair, a path per group
    assert "8 GPUs as tp=2 x pp=2 x dp=2 (nodes of 4 GPUs)" in ax.get_title()


# --------------------------------------------------------------------------- collectives


def test_ring_allreduce_states_show_how_many_gradients_each_chunk_holds():
    states = ring_allreduce_steps([[10.0**r] * 3 for r in range(3)])
    fig = collectives.ring_allreduce_states(states)
    panels = fig.axes
    assert len(panels) == len(states) == 1 + 2 * 2  # the start, N-1 reduce-scatter, N-1 gather
    assert _texts(panels[0]) == ["1"] * 9  # at the start every chunk is its own gradient
    assert _texts(panels[-1]) == ["3"] * 9  # at the end every chunk is the full sum
    arrows = [t for t in panels[1].texts if not t.get_text()]
    assert len(arrows) == len(states[1].transfers) == 3  # one message per rank per step
    assert np.array_equal(panels[-1].get_images()[0].get_array(), np.full((3, 3), 3))


def test_kv_ring_and_all_to_all_write_who_holds_each_piece():
    held = np.array([[(w - s) % 3 for s in range(3)] for w in range(3)])
    ax = collectives.kv_ring(held).axes[0]
    assert _texts(ax)[:3] == ["kv0", "kv2", "kv1"]  # worker 0 at steps 0, 1, 2
    before = np.array([[0, 1], [0, 1]])
    after = np.array([[0, 0], [1, 1]])
    left, right = collectives.all_to_all_layout({"before": before, "after": after}).axes
    assert _texts(left) == ["w0", "w1", "w0", "w1"] and _texts(right) == ["w0", "w0", "w1", "w1"]


# --------------------------------------------------------------------------- attention


@pytest.mark.parametrize("zigzag", [False, True])
def test_causal_owners_give_every_unmasked_square_to_the_queries_worker(zigzag):
    chunks = sequence_chunks(4, zigzag)
    owners = attention.owners(chunks)
    n = len(owners)
    assert np.isnan(owners[np.triu_indices(n, 1)]).all()  # masked: above the diagonal
    squares = [int(owners[q, k]) for q in range(n) for k in range(q + 1)]
    per_worker = [squares.count(w) for w in range(4)]
    assert per_worker == causal_work(4, zigzag)  # the same work the library counts


def test_causal_split_and_softmax_blocks_draw_what_they_are_given():
    splits = {n: (sequence_chunks(4, z), causal_work(4, z)) for n, z in [("plain", 0), ("zz", 1)]}
    plain, zz = attention.causal_split(splits).axes
    assert plain.get_title() == "plain split: block products per worker [1, 2, 3, 4]"
    assert zz.get_title() == "zz split: chunk products per worker [9, 9, 9, 9]"
    own = [0.1, 0.2, 0.3, 0.4, 0.4, 0.3, 0.2, 0.1]
    full = [v / 2 for v in own]
    left, right = attention.softmax_blocks(own, full, full, weights=(0.5, 0.5)).axes
    assert [p.get_height() for p in left.patches] == own
    assert list(right.get_lines()[0].get_ydata()) == full
    assert "weights 0.50 and 0.50" in right.get_title()


# --------------------------------------------------------------------------- mixture of experts


def test_router_choices_box_each_tokens_expert_and_count_them():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]])
    choice = probs.argmax(1).tolist()
    heat, counts = moe.router_choices(probs, choice).axes[:2]
    boxes = [p for p in heat.patches if isinstance(p, Rectangle) and not p.get_fill()]
    assert [(round(b.get_x() + 0.5), round(b.get_y() + 0.5)) for b in boxes] == [
        (e, t) for t, e in enumerate(choice)
    ]
    assert [p.get_height() for p in counts.patches] == [2, 1, 1]


def test_dispatch_writes_what_stays_home_and_what_is_sent():
    ax = moe.dispatch(np.array([[5, 3], [2, 6]]), ["w0", "w1"], title="dispatch").axes[0]
    assert _texts(ax) == ["5\nstays home", "3\nsent", "2\nsent", "6\nstays home"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["w0", "w1"]
    assert ax.get_title() == "dispatch"


def test_the_primer_states_say_who_holds_what_after_each_collective():
    from course_utils.charts.primer import collective_states

    before, after = collective_states("all-to-all", 3)
    assert after == [list(col) for col in zip(*before, strict=True)]  # a transpose
    _, scattered = collective_states("reduce-scatter", 3)
    assert [[bool(x) for x in row] for row in scattered] == [
        [r == c for c in range(3)] for r in range(3)
    ]
    mine, gathered = collective_states("all-gather", 3)
    assert sum(bool(x) for row in mine for x in row) == 3 and gathered[0] == gathered[2]
    assert collective_states("all-reduce", 2)[1] == [["Σ0", "Σ1"], ["Σ0", "Σ1"]]
    with pytest.raises(CourseInputError, match="name must be one of"):
        collective_states("broadcast")
