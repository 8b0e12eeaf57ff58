"""The activations a device holds: the tensors autograd saved for the backward, while alive.

A forward pass saves what its backward will need (inputs of matrix products, outputs of
activations): that is the memory a pipeline schedule holds per micro-batch in flight.
`SavedActivations.counting(key)` counts, inside its block, the bytes of every tensor autograd
saves (`torch.autograd.graph.saved_tensors_hooks`), a tensor saved twice once, until autograd
lets it go (after its backward, or when the graph is dropped); parameters and buffers (and
views of them) are not activations and are left out. The hooks are thread-local: each device thread
counts its own. `peak_bytes` and `peak_held` (the most keys, e.g. (chunk, micro-batch), that
held something at once) are what a schedule's memory is judged on.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Hashable, Iterable

import torch


class SavedActivations:
    """Bytes autograd saved in `counting` blocks that are still alive, and their peaks."""

    def __init__(self, modules: Iterable[torch.nn.Module] = ()) -> None:
        self.exclude = {
            t.untyped_storage().data_ptr() for m in modules for t in (*m.parameters(), *m.buffers())
        }
        self._lock = threading.Lock()
        self._alive: dict[tuple, list[int]] = {}  # (address, bytes) -> [bytes, references]
        self._by_key: dict[Hashable, int] = defaultdict(int)  # key -> references
        self.bytes = self.peak_bytes = self.peak_held = 0

    def counting(self, key: Hashable):
        """A context manager: what autograd saves inside it counts under `key`."""

        def pack(t: torch.Tensor):
            if t.untyped_storage().data_ptr() in self.exclude:  # a parameter, or a view of one
                return t
            return _Held(self, t, key)

        def unpack(x):
            return x.t if isinstance(x, _Held) else x

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    def _count(self, tensor: tuple, nbytes: int, key: Hashable, step: int) -> None:
        with self._lock:
            entry = self._alive.setdefault(tensor, [nbytes, 0])
            entry[1] += step
            if entry[1] == 1 and step == 1:  # the tensor's first reference
                self.bytes += nbytes
            elif entry[1] == 0:
                self.bytes -= nbytes
                del self._alive[tensor]
            self._by_key[key] += step
            self.peak_bytes = max(self.peak_bytes, self.bytes)
            held = sum(1 for n in self._by_key.values() if n > 0)
            self.peak_held = max(self.peak_held, held)


class _Held:
    """A saved tensor, counted from when autograd saves it until it lets go of it."""

    __slots__ = ("t", "meter", "id", "nbytes", "key")

    def __init__(self, meter: SavedActivations, t: torch.Tensor, key: Hashable) -> None:
        self.t, self.meter, self.key = t, meter, key
        self.nbytes = t.numel() * t.element_size()
        self.id = (t.data_ptr(), self.nbytes)  # the same numbers saved twice count once
        meter._count(self.id, self.nbytes, key, 1)

    def __del__(self) -> None:
        self.meter._count(self.id, self.nbytes, self.key, -1)
