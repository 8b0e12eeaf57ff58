"""The Megatron MLP split on threads equals the unsplit MLP: outputs, input and weight grads."""

import json

import pytest
import torch
from conftest import run_module
from torch import nn

from course_utils.errors import CourseInputError, WorkerError
from course_utils.parallel.tensor_parallel import (
    TensorParallelMLP,
    max_diff,
    shard_mlp,
    tp_mlp_comm_bytes,
    unsplit_forward_backward,
)

TOL = 1e-5


def make_mlp(d_model=16, hidden=24, bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(d_model, hidden, bias=bias), nn.Linear(hidden, d_model, bias=bias)


def inputs(shape, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen)


def assert_matches_unsplit(tp, linear1, linear2, x, dy):
    y_ref, dx_ref, grads_ref = unsplit_forward_backward(linear1, linear2, x, dy)
    result = tp.forward_backward(x, dy)
    for y in result.outputs:  # every device ends with the full output
        assert max_diff(y, y_ref) <= TOL
    for dx in result.input_grads:  # ...and the full input gradient
        assert max_diff(dx, dx_ref) <= TOL
    assert set(result.grads) == set(grads_ref)
    for name, g in grads_ref.items():
        assert result.grads[name].shape == g.shape, name
        assert max_diff(result.grads[name], g) <= TOL, name
    return result


@pytest.mark.parametrize("algorithm", ["ring", "naive"])
@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_same_output_and_gradients_as_unsplit(workers, algorithm):
    linear1, linear2 = make_mlp()
    x, dy = inputs((3, 5, 16))
    with TensorParallelMLP(linear1, linear2, workers, algorithm=algorithm) as tp:
        result = assert_matches_unsplit(tp, linear1, linear2, x, dy)
        # a second step gives fresh gradients, not accumulated ones
        assert_matches_unsplit(tp, linear1, linear2, x, dy)
        # forward alone (no autograd) agrees too
        y_ref, _, _ = unsplit_forward_backward(linear1, linear2, x, dy)
        assert max_diff(tp(x), y_ref) <= TOL
    expected = tp_mlp_comm_bytes(3 * 5, 16, workers, algorithm)
    assert result.bytes_forward == expected["forward"]
    assert result.bytes_backward == expected["backward"]


def test_uneven_hidden_split_no_bias_and_relu():
    linear1, linear2 = make_mlp(d_model=6, hidden=10, bias=False)  # 10 hidden over 4: 3,3,2,2
    x, dy = inputs((7, 6))
    relu = torch.relu
    y_ref, dx_ref, grads_ref = unsplit_forward_backward(linear1, linear2, x, dy, activation=relu)
    with TensorParallelMLP(linear1, linear2, 4, activation=relu) as tp:
        assert [c.weight.shape[0] for c, _ in tp.shards] == [3, 3, 2, 2]
        result = tp.forward_backward(x, dy)
    assert max_diff(result.output, y_ref) <= TOL
    assert max_diff(result.input_grad, dx_ref) <= TOL
    assert set(result.grads) == {"linear1.weight", "linear2.weight"}
    for name, g in grads_ref.items():
        assert max_diff(result.grads[name], g) <= TOL


def test_shards_put_back_together_are_the_original_layers():
    linear1, linear2 = make_mlp(hidden=9)
    shards = shard_mlp(linear1, linear2, 3)
    assert torch.equal(torch.cat([c.weight for c, _ in shards], 0), linear1.weight)
    assert torch.equal(torch.cat([c.bias for c, _ in shards], 0), linear1.bias)
    assert torch.equal(torch.cat([r.weight for _, r in shards], 1), linear2.weight)
    assert all(torch.equal(r.bias, linear2.bias) for _, r in shards)
    # copies: training the shards leaves the original alone
    with torch.no_grad():
        shards[0][0].weight.zero_()
    assert linear1.weight.abs().sum() > 0


def test_communication_is_one_output_sized_all_reduce_each_way():
    # ring, 4 devices, 32 tokens x d_model 16 floats: 2 x 3/4 x 2048 bytes = 3072 each way
    sent = tp_mlp_comm_bytes(32, 16, 4)
    assert sent == {"forward": [3072] * 4, "backward": [3072] * 4}
    assert tp_mlp_comm_bytes(32, 16, 1)["forward"] == [0]


def test_bad_input():
    linear1, linear2 = make_mlp(hidden=4)
    with pytest.raises(CourseInputError, match="workers must be an integer from 1 to 8"):
        TensorParallelMLP(linear1, linear2, 0)
    with pytest.raises(CourseInputError, match="workers must be <= the hidden size 4"):
        TensorParallelMLP(linear1, linear2, 5)
    with pytest.raises(CourseInputError, match="algorithm must be one of ring, naive"):
        shard_mlp(linear1, linear2, 2, algorithm="tree")
    with pytest.raises(CourseInputError, match="linear2.in_features"):
        shard_mlp(linear1, nn.Linear(5, 3), 2)


@pytest.fixture
def _cli(run_cli):
    """`python -m course_utils tensor-parallel ARGS...` here: (returncode, stdout, stderr)."""
    return lambda *args: run_cli("tensor-parallel", *args)


def test_cli_json(_cli):
    proc = _cli("--workers", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["workers"] == 3
    assert 0 <= out["max_output_diff"] <= TOL and 0 <= out["max_grad_diff"] <= TOL


@pytest.mark.parametrize(
    "args", [["--workers", "0"], ["--workers", "1000"], ["--allreduce", "tree"], ["--workers", "x"]]
)
def test_cli_bad_input_is_one_line_exit_2(_cli, args):
    proc = _cli(*args)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_cli_smoke_in_a_subprocess():
    ok = run_module("tensor-parallel", "--workers", "2")
    assert ok.returncode == 0, ok.stderr
    assert "tensor-parallel MLP 64 -> 256 -> 64 on 2 threads" in ok.stdout
    assert "max |gradient diff| vs unsplit" in ok.stdout and "bytes sent per worker" in ok.stdout
    bad = run_module("tensor-parallel", "--allreduce", "tree")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "--allreduce" in bad.stderr


def test_splits_the_mlp_of_a_tiny_gpt_block():
    from course_utils import models

    torch.manual_seed(0)
    cfg = models.GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, d_model=32)
    mlp = models.TinyGPT(cfg).blocks[0].mlp
    linear1, linear2 = mlp[0], mlp[2]
    x, dy = inputs((2, 8, 32))
    with TensorParallelMLP(linear1, linear2, 4) as tp:
        assert_matches_unsplit(tp, linear1, linear2, x, dy)


def test_measured_timeline_shows_one_all_reduce_each_way():
    linear1, linear2 = make_mlp()
    x, dy = inputs((4, 16))
    with TensorParallelMLP(linear1, linear2, 2) as tp:
        tl = tp.forward_backward(x, dy).timeline
    assert tl.source == "measured" and tl.unit == "s" and tl.num_devices == 2
    for d in range(2):
        events = tl.device_events(d)
        comms = [e.label for e in events if not e.action.is_compute]
        assert comms == ["all-reduce (g)", "all-reduce (f)"]  # forward's g, then backward's f
        kinds = [e.action.kind for e in events]
        assert kinds[0] == "F" and kinds[-1] in ("B", "ALL_REDUCE") and "B" in kinds
        # activations and their gradients are all-reduced, not parameter gradients
        assert {e.action.kind for e in events if not e.action.is_compute} == {"ALL_REDUCE"}
        for prev, nxt in zip(events, events[1:], strict=False):
            assert prev.end <= nxt.start


def test_a_failed_call_leaves_no_message_for_the_next(monkeypatch):
    # Rank 1 fails before it sends; rank 0 has already sent its part of the all-reduce.
    # `run_jobs` drops that message, or the next call would add it to its own sums.
    linear1, linear2 = make_mlp()
    with TensorParallelMLP(linear1, linear2, 2) as tp:
        real = tp._forward_on

        def rank_1_fails(rank, x):
            if rank == 1:
                raise RuntimeError("rank 1 fails before it sends")
            return real(rank, x)

        monkeypatch.setattr(tp, "_forward_on", rank_1_fails)
        with pytest.raises(WorkerError, match="rank 1 fails before it sends"):
            tp(inputs((3, 5, 16), seed=1)[0])
        monkeypatch.setattr(tp, "_forward_on", real)
        x, dy = inputs((3, 5, 16), seed=2)
        assert_matches_unsplit(tp, linear1, linear2, x, dy)
