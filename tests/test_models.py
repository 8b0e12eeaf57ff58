"""Tiny models: data, tokenizer, partitioning that matches the unsplit model, training."""

import copy
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_utils.errors import CourseInputError
from course_utils.models import (
    MLP,
    CharDataset,
    CharTokenizer,
    GPTConfig,
    TinyGPT,
    balanced_split,
    generate,
    get_batch,
    load_text,
    loss_fn,
    num_params,
    partition,
    single_thread,
    train,
)


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():  # tiny models: one intra-op thread is much faster on 2 busy cores
        yield


def small_gpt(n_layer=4, **kw) -> TinyGPT:
    torch.manual_seed(0)
    vocab = CharTokenizer(load_text()).vocab_size
    return TinyGPT(GPTConfig(vocab_size=vocab, block_size=16, n_layer=n_layer, d_model=32, **kw))


def test_text_is_shipped_and_small():
    text = load_text()
    assert 10_000 < len(text) < 1_000_000
    assert text.startswith("First Citizen:")
    assert load_text(100) == text[:100]


def test_tokenizer_round_trip_and_unknown_characters():
    tok = CharTokenizer("hello world")
    assert tok.vocab_size == len(set("hello world"))
    assert tok.decode(tok.encode("low hole")) == "low hole"
    with pytest.raises(CourseInputError, match="outside the vocabulary"):
        tok.encode("xyz")


def test_get_batch_targets_are_inputs_shifted_by_one():
    data = torch.arange(100)
    x, y = get_batch(data, 5, 8, torch.Generator().manual_seed(1))
    assert x.shape == y.shape == (5, 8)
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(y[:, -1], x[:, -1] + 1)


def test_char_dataset_splits_and_batches():
    ds = CharDataset(block_size=16)
    assert len(ds.train_data) > 8 * len(ds.val_data)
    x, y = ds.batch(4, torch.Generator().manual_seed(0), split="val")
    assert x.shape == (4, 16) and x.dtype == torch.long
    with pytest.raises(CourseInputError, match="split"):
        ds.batch(4, split="test")


def test_models_forward_shapes_and_loss():
    mlp = MLP(8, 16, 3, depth=2)
    x, y = mlp.example_batch(5)
    assert mlp(x).shape == (5, 3) and len(mlp.layers()) == 3
    gpt = small_gpt()
    x, y = gpt.example_batch(2)
    logits = gpt(x)
    assert logits.shape == (2, 16, gpt.config.vocab_size)
    assert len(gpt.layers()) == 4 + 2
    # an untrained model is close to uniform over the vocabulary
    assert abs(loss_fn(logits, y).item() - torch.log(torch.tensor(65.0)).item()) < 0.5


def test_gpt_config_rejects_bad_sizes():
    with pytest.raises(CourseInputError, match="divisible by n_head"):
        GPTConfig(d_model=30, n_head=4)
    with pytest.raises(CourseInputError, match="n_layer"):
        GPTConfig(n_layer=0)


@pytest.mark.parametrize("balance", ["params", "cost"])
@pytest.mark.parametrize("num_stages", [1, 2, 3, 6])
def test_partition_in_sequence_equals_unsplit_model(balance, num_stages):
    gpt = small_gpt()
    stages = partition(gpt, num_stages, balance=balance)
    assert len(stages) == num_stages
    ranges = [s.layer_range for s in stages]
    assert ranges[0][0] == 0 and ranges[-1][1] == len(gpt.layers())
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(ranges, ranges[1:], strict=False))
    x, _ = gpt.example_batch(3)
    h = x
    for stage in stages:
        h = stage(h)
    assert torch.equal(h, gpt(x))
    assert all(p.grad is None for p in gpt.parameters())  # timing left no gradients


def test_partition_shares_modules_and_supports_looping_placement():
    gpt = small_gpt(n_layer=6)
    stages = partition(gpt, 8)  # 8 stages for 4 devices: stage s on device s % 4
    assert sum(num_params(s) for s in stages) == num_params(gpt)
    assert stages[0][0] is gpt.embed  # shared, not copied: training the stages trains gpt


def test_partition_balances_parameters():
    mlp = MLP(4, 64, 4, depth=6)  # layers: small, 6 equal, small
    stages = partition(mlp, 3)
    sizes = [num_params(s) for s in stages]
    assert max(sizes) - min(sizes) <= num_params(mlp.layers()[1]) + 300


def test_partition_bad_input():
    with pytest.raises(CourseInputError, match="num_stages must be between 1 and 6"):
        partition(small_gpt(), 7)
    with pytest.raises(CourseInputError, match="balance"):
        partition(small_gpt(), 2, balance="magic")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=9), st.data())
def test_balanced_split_is_optimal(weights, data):
    k = data.draw(st.integers(1, len(weights)))
    ranges = balanced_split([float(w) for w in weights], k)
    assert len(ranges) == k and ranges[0][0] == 0 and ranges[-1][1] == len(weights)
    worst = max(sum(weights[a:b]) for a, b in ranges)

    # brute force over every way to cut
    import itertools

    best = min(
        max(sum(weights[a:b]) for a, b in zip((0, *cuts), (*cuts, len(weights)), strict=True))
        for cuts in itertools.combinations(range(1, len(weights)), k - 1)
    )
    assert worst == best


def test_train_lowers_the_loss_and_generate_samples():
    gpt = small_gpt(n_layer=2)
    losses = train(gpt, 60, batch_size=16, lr=3e-3, progress=False)
    assert len(losses) == 60
    assert sum(losses[-10:]) / 10 < losses[0] - 0.8
    text = generate(gpt, "First", 20, seed=0)
    assert text.startswith("First") and len(text) == 25


def test_train_runs_the_same_on_a_copy():
    a = small_gpt(n_layer=1)
    b = copy.deepcopy(a)
    assert train(a, 3, progress=False) == train(b, 3, progress=False)  # deterministic


def test_importing_course_utils_does_not_import_torch():
    code = "import course_utils, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
