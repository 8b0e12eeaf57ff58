"""Tiny real PyTorch models to split into pipeline stages, and the data to train them.

Two models, both written as a flat list of layers so that splitting them is easy:

- `MLP`: Linear+GELU blocks, sized by arguments (fast, for the executor and benchmarks);
- `TinyGPT`: a character-level GPT in the style of nanoGPT (Karpathy, 2022), trained on
  the Tiny Shakespeare text shipped in `course_utils/data/`.

`partition(model, num_stages)` cuts `model.layers()` into contiguous stages, balanced by
parameter count or by measured forward+backward time. Running the stages one after the
other computes exactly what the unsplit model computes (they share the same modules).

There is no dropout by default, so a pipelined step and an unsplit step on the same batch
give the same numbers, which is what the course's correctness checks compare.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.errors import CourseInputError

DATA_DIR = Path(__file__).parent / "data"
TEXT_PATH = DATA_DIR / "tinyshakespeare.txt"


@contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one intra-op thread: for models this small, more threads only add
    synchronisation (10-30x slower on a busy 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- data


def load_text(max_chars: int | None = None) -> str:
    """The Tiny Shakespeare excerpt shipped with the course (public domain)."""
    text = TEXT_PATH.read_text(encoding="utf-8")
    return text if max_chars is None else text[:max_chars]


class CharTokenizer:
    """One token per character: the vocabulary is the sorted set of characters in `text`."""

    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - self.stoi.keys())
        if unknown:
            raise CourseInputError(f"text has characters outside the vocabulary: {unknown!r}")
        return [self.stoi[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def get_batch(
    data: torch.Tensor, batch_size: int, block_size: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch_size` random windows of `block_size` tokens, and the same shifted by one."""
    if len(data) <= block_size:
        raise CourseInputError(f"block_size must be < {len(data)} (the data length)")
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    x = torch.stack([data[i : i + block_size] for i in starts.tolist()])
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in starts.tolist()])
    return x, y


class CharDataset:
    """The shipped text as token tensors, split 90/10 into train and validation."""

    def __init__(self, text: str | None = None, block_size: int = 64, train_fraction=0.9) -> None:
        text = load_text() if text is None else text
        self.tokenizer = CharTokenizer(text)
        self.block_size = block_size
        ids = torch.tensor(self.tokenizer.encode(text), dtype=torch.long)
        cut = int(train_fraction * len(ids))
        self.train_data, self.val_data = ids[:cut], ids[cut:]

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def batch(
        self, batch_size: int, generator: torch.Generator | None = None, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if split not in ("train", "val"):
            raise CourseInputError(f"split must be 'train' or 'val', got {split!r}")
        data = self.train_data if split == "train" else self.val_data
        return get_batch(data, batch_size, self.block_size, generator)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every token (or every row, for the MLP's class targets)."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


# --------------------------------------------------------------------------- MLP


class MLP(nn.Module):
    """`depth` Linear+GELU blocks of width `d_hidden`, then a Linear head to `d_out` logits."""

    def __init__(self, d_in: int = 32, d_hidden: int = 64, d_out: int = 10, depth: int = 4):
        super().__init__()
        if min(d_in, d_hidden, d_out, depth) < 1:
            raise CourseInputError("MLP sizes (d_in, d_hidden, d_out, depth) must all be >= 1")
        self.d_in, self.d_out = d_in, d_out
        widths = [d_in] + [d_hidden] * depth
        blocks = [
            nn.Sequential(nn.Linear(a, b), nn.GELU())
            for a, b in zip(widths, widths[1:], strict=False)
        ]
        self.net = nn.Sequential(*blocks, nn.Linear(d_hidden, d_out))

    def layers(self) -> list[nn.Module]:
        return list(self.net)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def example_batch(
        self, batch_size: int, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A random batch: inputs and class targets (a fixed random task, for timing/tests)."""
        x = torch.randn(batch_size, self.d_in, generator=generator)
        y = torch.randint(self.d_out, (batch_size,), generator=generator)
        return x, y


# --------------------------------------------------------------------------- TinyGPT


@dataclass
class GPTConfig:
    vocab_size: int = 65
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    dropout: float = 0.0  # zero by default: pipelined and unsplit runs match exactly

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "d_model"):
            if getattr(self, name) < 1:
                raise CourseInputError(f"GPTConfig.{name} must be >= 1")
        if self.d_model % self.n_head:
            raise CourseInputError(
                f"GPTConfig.d_model ({self.d_model}) must be divisible by n_head ({self.n_head})"
            )


class Embedding(nn.Module):
    """Token plus position embeddings: token ids (B, T) -> vectors (B, T, d_model)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.block_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.size(1), device=idx.device)
        return self.drop(self.tok(idx) + self.pos(positions))


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, heads, T, head_dim)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model),
            nn.GELU(),
            nn.Linear(4 * cfg.d_model, cfg.d_model),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    """Final LayerNorm and the projection to vocabulary logits."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(cfg.d_model)
        # Not tied to the token embedding (unlike GPT-2): a tied weight would live on the
        # first and the last pipeline stage at once.
        self.out = nn.Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


class TinyGPT(nn.Module):
    """A character-level GPT: Embedding, `n_layer` Blocks, Head; token ids in, logits out."""

    def __init__(self, cfg: GPTConfig | None = None) -> None:
        super().__init__()
        self.config = cfg = cfg or GPTConfig()
        self.embed = Embedding(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.head = Head(cfg)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:  # Embedding has no bias
            nn.init.zeros_(module.bias)

    def layers(self) -> list[nn.Module]:
        return [self.embed, *self.blocks, self.head]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.size(1) > self.config.block_size:
            raise CourseInputError(
                f"sequence length {idx.size(1)} exceeds block_size {self.config.block_size}"
            )
        x = idx
        for layer in self.layers():
            x = layer(x)
        return x

    def example_batch(
        self, batch_size: int, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random token ids and targets of shape (batch_size, block_size)."""
        shape = (batch_size, self.config.block_size)
        x = torch.randint(self.config.vocab_size, shape, generator=generator)
        y = torch.randint(self.config.vocab_size, shape, generator=generator)
        return x, y


def num_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# --------------------------------------------------------------------------- partition


class Stage(nn.Sequential):
    """A contiguous run of a model's layers; `layer_range` = (first, last + 1)."""

    def __init__(self, layers: list[nn.Module], index: int, layer_range: tuple[int, int]):
        super().__init__(*layers)
        self.index = index
        self.layer_range = layer_range

    def extra_repr(self) -> str:
        return f"stage {self.index}: layers {self.layer_range[0]}..{self.layer_range[1] - 1}"


def balanced_split(weights: list[float], num_stages: int) -> list[tuple[int, int]]:
    """Cut `weights` into `num_stages` non-empty contiguous ranges minimising the heaviest.

    Dynamic programming over (layers used, stages used); fine for tens of layers.
    """
    n = len(weights)
    if not 1 <= num_stages <= n:
        raise CourseInputError(
            f"num_stages must be between 1 and {n} (the layers), got {num_stages}"
        )
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = math.inf
    # best[k][i]: smallest max-stage weight putting the first i layers into k stages
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for i in range(k, n - (num_stages - k) + 1):
            for j in range(k - 1, i):
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                # `<` keeps the earliest cut on ties, so equal layers split evenly and stably
                if cost < best[k][i] - 1e-12:
                    best[k][i], cut[k][i] = cost, j
    ranges, i = [], n
    for k in range(num_stages, 0, -1):
        ranges.append((cut[k][i], i))
        i = cut[k][i]
    return ranges[::-1]


def layer_costs(
    model: MLP | TinyGPT, batch_size: int = 8, repeats: int = 3, generator=None
) -> list[float]:
    """Measured forward+backward seconds of each layer on an example batch (best of repeats)."""
    x, _ = model.example_batch(batch_size, generator)
    saved = [p.grad for p in model.parameters()]
    costs = []
    with single_thread():
        costs = _time_layers(model.layers(), x, repeats)
    for p, g in zip(model.parameters(), saved, strict=True):
        p.grad = g  # timing must not leave gradients behind
    return costs


def _time_layers(layers: list[nn.Module], x: torch.Tensor, repeats: int) -> list[float]:
    costs = []
    for layer in layers:
        best = math.inf
        for _ in range(repeats):
            inp = x.detach().requires_grad_(x.is_floating_point())
            t0 = time.perf_counter()
            out = layer(inp)
            out.sum().backward()
            best = min(best, time.perf_counter() - t0)
        costs.append(best)
        x = out.detach()
    return costs


def partition(model: MLP | TinyGPT, num_stages: int, balance: str = "params") -> list[Stage]:
    """Split `model.layers()` into `num_stages` contiguous stages (shared modules, no copy).

    balance="params" balances parameter counts; balance="cost" balances measured
    forward+backward time per layer. More stages than devices is fine: the executor puts
    stage s on device s % devices (looping placement, Narayanan et al., 2021,
    arXiv:2104.04473).
    """
    if not hasattr(model, "layers"):
        raise CourseInputError("model must have a layers() method (MLP, TinyGPT)")
    layers = model.layers()
    if not isinstance(num_stages, int) or not 1 <= num_stages <= len(layers):
        raise CourseInputError(
            f"num_stages must be between 1 and {len(layers)} (this model's layers), "
            f"got {num_stages!r}"
        )
    if balance == "params":
        weights = [float(num_params(layer)) for layer in layers]
    elif balance == "cost":
        weights = layer_costs(model)
    else:
        raise CourseInputError(f"balance must be 'params' or 'cost', got {balance!r}")
    return [
        Stage(layers[a:b], i, (a, b))
        for i, (a, b) in enumerate(balanced_split(weights, num_stages))
    ]


# --------------------------------------------------------------------------- training


def train(
    model: MLP | TinyGPT,
    steps: int,
    batch_fn: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None,
    batch_size: int = 16,
    lr: float = 3e-3,
    seed: int = 0,
    progress: bool = True,
) -> list[float]:
    """Train with AdamW for `steps` steps on one thread; return the loss of every step.

    `batch_fn()` returns (inputs, targets); by default TinyGPT gets Tiny Shakespeare
    windows and the MLP its random example batches.
    """
    from tqdm.auto import tqdm

    if not isinstance(steps, int) or steps < 1:
        raise CourseInputError(f"steps must be an integer >= 1, got {steps!r}")
    generator = torch.Generator().manual_seed(seed)
    if batch_fn is None:
        if isinstance(model, TinyGPT):
            data = CharDataset(block_size=model.config.block_size)
            if data.vocab_size != model.config.vocab_size:
                raise CourseInputError(
                    f"GPTConfig.vocab_size must be {data.vocab_size} for the shipped text"
                )
            batch_fn = lambda: data.batch(batch_size, generator)  # noqa: E731
        else:
            batch_fn = lambda: model.example_batch(batch_size, generator)  # noqa: E731
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses: list[float] = []
    model.train()
    bar = tqdm(range(steps), desc="training", disable=not progress)
    with single_thread():
        for _ in bar:
            _train_step(model, optimizer, batch_fn, losses)
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return losses


def _train_step(model, optimizer, batch_fn, losses: list[float]) -> None:
    x, y = batch_fn()
    loss = loss_fn(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())


@torch.no_grad()
def generate(
    model: TinyGPT,
    prompt: str,
    n: int,
    tokenizer: CharTokenizer | None = None,
    temperature: float = 1.0,
    seed: int | None = None,
) -> str:
    """Continue `prompt` by `n` characters, sampling one character at a time."""
    tokenizer = tokenizer or CharTokenizer(load_text())
    if temperature <= 0:
        raise CourseInputError(f"temperature must be > 0, got {temperature!r}")
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    idx = torch.tensor([tokenizer.encode(prompt or "\n")], dtype=torch.long)
    was_training = model.training
    model.eval()
    with single_thread():
        for _ in range(n):
            logits = model(idx[:, -model.config.block_size :])[:, -1, :] / temperature
            probs = torch.softmax(logits, dim=-1)
            idx = torch.cat([idx, torch.multinomial(probs, 1, generator=generator)], dim=1)
    model.train(was_training)
    return tokenizer.decode(idx[0].tolist())


def build_model(kind: str, num_stages: int, seed: int = 0) -> MLP | TinyGPT:
    """A fresh, seeded "mlp" or "gpt" with enough layers for `num_stages` stages (the
    commands' models)."""
    torch.manual_seed(seed)
    if kind == "mlp":
        return MLP(d_in=256, d_hidden=512, d_out=10, depth=max(4, num_stages))
    vocab = CharTokenizer(load_text()).vocab_size
    cfg = GPTConfig(vocab_size=vocab, block_size=32, n_layer=max(4, num_stages), d_model=64)
    return TinyGPT(cfg)
