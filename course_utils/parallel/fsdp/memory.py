"""Memory a worker really holds: bytes of the distinct tensor storages, by category, with the peak.

Freeing a gathered layer keeps the tensor (and the views autograd saved) and resizes its
storage to zero bytes, the trick FSDP itself uses; `allocate_storage` gives it back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

# -- memory: bytes of tensors actually held ---------------------------------------------------


def _storage_bytes(tensors, seen: set[int]) -> int:
    """Bytes of the distinct storages behind `tensors` (views of one buffer count once)."""
    total = 0
    for t in tensors:
        storage = t.untyped_storage()
        if storage.nbytes() and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


class MemoryMeter:
    """Samples the bytes a worker holds, by category, and remembers the peak.

    `categories` maps a name to a function listing that category's tensors right now.
    Transient tensors (a layer's full gradient waiting for its reduce-scatter) are
    registered with `hold` and dropped with `release`, from either of the worker's threads.
    """

    def __init__(self, categories: dict[str, Callable[[], list[torch.Tensor]]]) -> None:
        self.categories = categories
        self.transient: dict[tuple, torch.Tensor] = {}
        self.lock = threading.Lock()
        self.peak_total = 0
        self.peak: dict[str, int] = {}

    def now(self) -> dict[str, int]:
        seen: set[int] = set()
        held = {
            name: _storage_bytes(list_now(), seen) for name, list_now in self.categories.items()
        }
        held["layer gradients"] = _storage_bytes(list(self.transient.values()), seen)
        return held

    def sample(self) -> None:
        with self.lock:
            held = self.now()
            total = sum(held.values())
            if total > self.peak_total:
                self.peak_total, self.peak = total, held

    def hold(self, key: tuple, tensor: torch.Tensor) -> None:
        with self.lock:
            self.transient[key] = tensor
        self.sample()

    def release(self, key: tuple) -> None:
        with self.lock:
            self.transient.pop(key, None)

    def reset_peak(self) -> None:
        with self.lock:
            self.peak_total, self.peak = 0, {}


@dataclass
class MemoryReport:
    """One worker's model-state bytes: after the step (`persistent`) and at its peak.

    Categories: "parameters", "gradients", "optimizer" (the three ZeRO shards or copies),
    "gathered" (stage 3: all-gathered layers alive at that moment) and "layer gradients"
    (a layer's full gradient between its backward and its reduce-scatter).
    """

    persistent: dict[str, int]
    peak: dict[str, int]

    @property
    def persistent_total(self) -> int:
        return sum(self.persistent.values())

    @property
    def peak_total(self) -> int:
        return sum(self.peak.values())


# -- one worker's state ----------------------------------------------------------------------


def free_storage(t: torch.Tensor) -> None:
    """Resize `t`'s storage to zero bytes: the tensor and its views stay, its memory goes."""
    if t.untyped_storage().nbytes():
        t.untyped_storage().resize_(0)


def allocate_storage(t: torch.Tensor) -> None:
    """Give a freed `t` its storage back (contents undefined until written), if it lacks it."""
    nbytes = t.numel() * t.element_size()
    if t.untyped_storage().nbytes() != nbytes:
        t.untyped_storage().resize_(nbytes)
