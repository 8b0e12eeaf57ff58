"""Sequence parallelism: the unsplit block's numbers, Korthikanti's activation bytes, and
the same traffic as tensor parallelism's all-reduces."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_utils import plan
from course_utils.errors import CourseInputError, WorkerError
from course_utils.parallel.sequence_parallel import (
    MLPBlock,
    SequenceParallelMLP,
    korthikanti_mlp_block_bytes,
    layernorm_statistics_bytes,
    sp_comm_bytes,
    unsplit_block,
)
from course_utils.parallel.tensor_parallel import tp_mlp_comm_bytes

HIDDEN, FFN = 8, 24  # FFN divisible by 1, 2, 3, 4


def data(s, b, dtype=torch.float64, seed=3, hidden=HIDDEN):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(s, b, hidden, generator=gen, dtype=dtype)
    return x, torch.randn(s, b, hidden, generator=gen, dtype=dtype)


def run(block, workers, x, dy, **kwargs):
    with SequenceParallelMLP(block, workers, **kwargs) as model:
        return model.forward_backward(x, dy)


def max_error(result, reference) -> float:
    y, dx, grads = reference
    errors = [(result.output - y).abs().max(), (result.input_grad - dx).abs().max()]
    errors += [(result.grads[k] - g).abs().max() for k, g in grads.items()]
    return max(e.item() for e in errors)


@settings(max_examples=15, deadline=None)
@given(
    workers=st.integers(1, 4),
    extra=st.integers(0, 5),
    batch=st.integers(1, 2),
    dropout=st.sampled_from([0.0, 0.3]),
    sequence_parallel=st.booleans(),
    save=st.booleans(),
)
def test_output_and_all_gradients_match_the_unsplit_block(
    workers, extra, batch, dropout, sequence_parallel, save
):
    block = MLPBlock.random(HIDDEN, FFN, dropout=dropout, dtype=torch.float64)
    x, dy = data(workers + extra, batch)  # uneven sequence shards included
    result = run(
        block, workers, x, dy, sequence_parallel=sequence_parallel, save_gathered_input=save
    )
    assert max_error(result, unsplit_block(block, x, dy)) < 1e-5


def test_float32_matches_too():
    block = MLPBlock.random(HIDDEN, FFN, dropout=0.1)
    x, dy = data(7, 2, torch.float32)
    result = run(block, 3, x, dy)
    assert max_error(result, unsplit_block(block, x, dy)) < 1e-5


def test_dropout_really_drops():
    block = MLPBlock.random(HIDDEN, FFN, dropout=0.5, dtype=torch.float64)
    x, dy = data(4, 2)
    y0, _, _ = unsplit_block(block, x, dy, seed=0)
    y1, _, _ = unsplit_block(block, x, dy, seed=1)
    assert not torch.allclose(y0, y1)  # a different seed, a different mask
    assert torch.allclose(run(block, 2, x, dy).output, y0, atol=1e-12)


# -- activation memory ---------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2, 4])
@pytest.mark.parametrize("sequence_parallel, save", [(False, False), (True, False), (True, True)])
def test_saved_activations_are_korthikantis_terms_plus_layernorm_statistics(
    workers, sequence_parallel, save
):
    s, b = 8, 2
    block = MLPBlock.random(HIDDEN, FFN, dropout=0.1, dtype=torch.float64)
    result = run(
        block, workers, *data(s, b), sequence_parallel=sequence_parallel, save_gathered_input=save
    )
    terms = korthikanti_mlp_block_bytes(
        s, b, HIDDEN, FFN, workers, sequence_parallel, 8, True, save
    )
    stats = layernorm_statistics_bytes(s, b, workers, sequence_parallel, 8)
    assert result.activation_bytes == [sum(terms.values()) + stats] * workers


@settings(max_examples=10, deadline=None)
@given(workers=st.integers(2, 4), s=st.integers(4, 9), ffn=st.integers(4, 13), sp=st.booleans())
def test_uneven_splits_add_up_to_the_formula_over_all_devices(workers, s, ffn, sp):
    block = MLPBlock.random(HIDDEN, ffn, dtype=torch.float64)
    result = run(block, workers, *data(s, 1), sequence_parallel=sp)
    terms = korthikanti_mlp_block_bytes(s, 1, HIDDEN, ffn, workers, sp, 8, dropout=False)
    per_device = sum(terms.values()) + layernorm_statistics_bytes(s, 1, workers, sp, 8)
    assert sum(result.activation_bytes) == pytest.approx(workers * per_device)


def test_sequence_parallelism_divides_every_activation_by_t():
    block = MLPBlock.random(HIDDEN, FFN, dropout=0.1, dtype=torch.float64)
    x, dy = data(12, 1)
    one = run(block, 1, x, dy).activation_bytes[0]
    for t in (2, 3, 4):
        tp = run(block, t, x, dy, sequence_parallel=False).activation_bytes[0]
        sp = run(block, t, x, dy, sequence_parallel=True).activation_bytes[0]
        assert sp * t == one  # Korthikanti: s b h (34 + 5 a s / h) / t
        assert sp < tp < one  # tensor parallelism alone keeps LayerNorm and dropout whole


def test_the_formula_is_the_mlp_half_of_the_planners():
    s, b, h, a, t = 2048, 1, 4096, 32, 8
    sbh = s * b * h
    terms = korthikanti_mlp_block_bytes(s, b, h, 4 * h, bytes_per_value=2)
    assert sum(terms.values()) == 21 * sbh  # LayerNorm 2 sbh + MLP 19 sbh (Section 4.1)
    # what sequence parallelism saves on top of tensor parallelism: 5 sbh (1 - 1/t) here,
    # the same again in the attention half (its LayerNorm, QKV input, dropout mask)
    ours = sum(korthikanti_mlp_block_bytes(s, b, h, 4 * h, t, False, 2).values()) - sum(
        korthikanti_mlp_block_bytes(s, b, h, 4 * h, t, True, 2).values()
    )
    planner = plan.activation_bytes_per_layer(s, b, h, a, t) - plan.activation_bytes_per_layer(
        s, b, h, a, t, sequence_parallel=True
    )
    assert ours == pytest.approx(5 * sbh * (1 - 1 / t))
    assert 2 * ours == pytest.approx(planner)


# -- bytes on the wire ---------------------------------------------------------------------------


@pytest.mark.parametrize("workers, s", [(2, 8), (4, 8), (3, 7)])
def test_reduce_scatter_plus_all_gather_moves_what_the_all_reduce_moved(workers, s):
    b = 2
    block = MLPBlock.random(HIDDEN, FFN, dtype=torch.float64)
    x, dy = data(s, b)
    tp = run(block, workers, x, dy, sequence_parallel=False)
    kept = run(block, workers, x, dy, save_gathered_input=True)
    regathered = run(block, workers, x, dy)
    ring = tp_mlp_comm_bytes(s * b, HIDDEN, workers, element_size=8)
    assert tp.bytes_forward == ring["forward"] and tp.bytes_backward == ring["backward"]
    for result, save in ((kept, True), (regathered, False)):
        formula = sp_comm_bytes(s, b, HIDDEN, workers, 8, save)
        assert result.bytes_forward == formula["forward"]
        assert result.bytes_backward == formula["backward"]
        assert result.bytes_param_grads == formula["param_grads"]
    # same total traffic as the all-reduce, per device too when t divides s
    assert sum(kept.bytes_forward) == sum(tp.bytes_forward)
    assert sum(kept.bytes_backward) == sum(tp.bytes_backward)
    if s % workers == 0:
        assert kept.bytes_forward == tp.bytes_forward
    # not keeping the gathered input costs one more all-gather in the backward
    extra = sum(regathered.bytes_backward) - sum(kept.bytes_backward)
    assert extra == sum(tp.bytes_backward) // 2


def test_timelines_show_the_collectives_of_each_mode():
    block = MLPBlock.random(HIDDEN, FFN, dtype=torch.float64)
    x, dy = data(6, 1)
    sp = run(block, 2, x, dy).timeline
    tp = run(block, 2, x, dy, sequence_parallel=False).timeline
    for worker in range(2):
        kinds = [e.action.kind for e in sp.device_events(worker) if not e.action.is_compute]
        assert sorted(kinds) == sorted(
            ["ALL_GATHER"] * 3 + ["REDUCE_SCATTER"] * 2 + ["REDUCE_GRAD"]
        )
        labels = [e.label for e in tp.device_events(worker) if not e.action.is_compute]
        assert labels == ["all-reduce (g)", "all-reduce (f)"]
        assert {e.action.kind for e in sp.device_events(worker) if e.action.is_compute} == {
            "F",
            "B",
        }


# -- bad input and faults ------------------------------------------------------------------------


def test_bad_input_is_refused():
    block = MLPBlock.random(HIDDEN, FFN)
    with pytest.raises(CourseInputError, match="workers"):
        SequenceParallelMLP(block, 0)
    with pytest.raises(CourseInputError, match="dropout"):
        SequenceParallelMLP(MLPBlock.random(HIDDEN, FFN, dropout=1.0), 2)
    with SequenceParallelMLP(block, 3) as model:
        x, dy = data(4, 1, torch.float32)
        with pytest.raises(CourseInputError, match="sequence, batch, hidden"):
            model.forward_backward(x[0], dy[0])
        with pytest.raises(CourseInputError, match="hidden size"):
            model.forward_backward(x[..., :4], dy[..., :4])
        with pytest.raises(CourseInputError, match=">= workers"):
            model.forward_backward(x[:2], dy[:2])
        with pytest.raises(CourseInputError, match="finite"):
            model.forward_backward(x * float("inf"), dy)
        with pytest.raises(CourseInputError, match="grad_output"):
            model.forward_backward(x, dy[:3])


def test_a_failing_device_is_named_and_nobody_hangs():
    block = MLPBlock.random(HIDDEN, FFN)
    with SequenceParallelMLP(block, 2, timeout=5) as model:

        def broken(x):
            raise RuntimeError("norm on fire")

        model.norms[1].forward = broken
        with pytest.raises(WorkerError, match="device 1.*norm on fire"):
            model.forward_backward(*data(4, 1, torch.float32))
