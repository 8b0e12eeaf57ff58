"""One layer as a flat vector padded to a multiple of N, cut in N equal shards; Adam on a shard.

Worker w of N keeps slice w of every layer's vector (`FlatLayout.shard_slice`). Adam is
element-wise, so updating each slice separately is the same as updating the whole vector.
This is FSDP1's `FlatParameter` layout; FSDP2 (`fully_shard`) instead shards each parameter
on its dim 0 (a DTensor per parameter, padded along dim 0), with the same bytes per layer
up to the padding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

# -- one layer as a flat, padded vector ---------------------------------------------------


@dataclass(frozen=True)
class FlatLayout:
    """Where each parameter of one layer lives in the layer's flat vector.

    `numel` is the layer's real parameter count; the vector is padded to
    `padded = workers x shard` elements so that every worker's shard is the same size.
    """

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    offsets: tuple[int, ...]
    numel: int
    shard: int  # elements per worker: ceil(numel / workers)
    workers: int

    @property
    def padded(self) -> int:
        return self.shard * self.workers

    @classmethod
    def of(cls, layer: nn.Module, workers: int) -> FlatLayout:
        names, shapes, offsets, offset = [], [], [], 0
        for name, p in layer.named_parameters():
            names.append(name)
            shapes.append(p.shape)
            offsets.append(offset)
            offset += p.numel()
        return cls(
            tuple(names), tuple(shapes), tuple(offsets), offset, -(-offset // workers), workers
        )

    def flatten(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """The layer's parameters as one padded vector (a copy)."""
        flat = torch.zeros(self.padded, dtype=dtype)
        for p, offset in zip(layer.parameters(), self.offsets, strict=True):
            flat[offset : offset + p.numel()] = p.detach().reshape(-1)
        return flat

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """name -> view of `flat` in the parameter's shape (autograd flows back to `flat`)."""
        return {
            name: flat[offset : offset + shape.numel()].view(shape)
            for name, shape, offset in zip(self.names, self.shapes, self.offsets, strict=True)
        }

    def shard_slice(self, rank: int) -> slice:
        return slice(rank * self.shard, (rank + 1) * self.shard)


def padded_shard_numels(layer_numels: Sequence[int], workers: int) -> list[int]:
    """Elements per worker of each layer's shard: ceil(numel / workers) (zero padding)."""
    return [-(-n // workers) for n in layer_numels]


# -- Adam, written on the shards ------------------------------------------------------------


def adam_update(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: int,
    lr: float,
    betas: tuple[float, float],
    eps: float,
) -> None:
    """One Adam step in place (Kingma & Ba 2014, arXiv 1412.6980; as `torch.optim.Adam`).

    m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2,
    p = p - lr / (1 - b1^t) x m / (sqrt(v) / sqrt(1 - b2^t) + eps).
    Every line is element-wise, so it can run on any slice of the vectors.
    """
    beta1, beta2 = betas
    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1**step))


def adam(lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
    """The one-device reference optimizer with the same settings (for `single_worker_steps`)."""
    return lambda params: torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, foreach=False)
