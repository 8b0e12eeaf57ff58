"""Activation memory, measured: the bytes autograd keeps for the backward pass, per device.

A pipeline schedule decides how many micro-batches' activations a device holds at once
(GPipe: all of them; 1F1B: at most p). `ActivationMeter` makes that visible in bytes: it
wraps each stage so that every tensor autograd saves for backward is counted on the stage's
device until autograd lets go of it (`torch.autograd.graph.saved_tensors_hooks`). A block
of memory viewed by several saved tensors counts once; parameters and the batch, which exist
anyway, can be left out.

    meter = ActivationMeter(num_devices=4, skip=[*model.parameters(), inputs])
    stages = meter.wrap(partition(model, 4))     # stage s is counted on device s % 4
    executor.step(schedule, inputs, targets)     # then read meter.peak (bytes per device)
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import torch
from torch import nn


class ActivationMeter:
    """Bytes of activations saved for backward, per device: `now` and `peak` (since reset)."""

    now: list[int]  # both set by reset()
    peak: list[int]

    def __init__(self, num_devices: int, skip: Iterable[torch.Tensor] = ()) -> None:
        self.lock = threading.Lock()  # device threads save and free tensors concurrently
        self.skip = {t.untyped_storage().data_ptr() for t in skip}
        self.reset(num_devices)

    def reset(self, num_devices: int | None = None) -> None:
        n = len(self.now) if num_devices is None else num_devices
        self.live: list[dict[int, list[int]]] = [{} for _ in range(n)]  # storage -> [bytes, refs]
        self.now = [0] * n
        self.peak = [0] * n

    def wrap(self, stages: list[nn.Module]) -> list[nn.Module]:
        """The stages, each counting what it saves on its device (stage s on s % devices)."""
        return [MeteredStage(stage, s % len(self.now), self) for s, stage in enumerate(stages)]

    def _add(self, device: int, storage) -> int:
        key = storage.data_ptr()
        with self.lock:
            entry = self.live[device].setdefault(key, [storage.nbytes(), 0])
            if entry[1] == 0:
                self.now[device] += entry[0]
                self.peak[device] = max(self.peak[device], self.now[device])
            entry[1] += 1
        return key

    def _drop(self, device: int, key: int) -> None:
        with self.lock:
            entry = self.live[device][key]
            entry[1] -= 1
            if entry[1] == 0:
                self.now[device] -= entry[0]
                del self.live[device][key]


class SavedTensor:
    """One tensor kept for backward; its bytes count until autograd drops this wrapper."""

    def __init__(self, meter: ActivationMeter, device: int, tensor: torch.Tensor) -> None:
        self.meter, self.device, self.tensor = meter, device, tensor
        self.key = meter._add(device, tensor.untyped_storage())

    def __del__(self) -> None:
        self.meter._drop(self.device, self.key)


class MeteredStage(nn.Module):
    """A stage whose forward reports the activations it saves to the meter."""

    def __init__(self, stage: nn.Module, device: int, meter: ActivationMeter) -> None:
        super().__init__()
        self.stage, self.device, self.meter = stage, device, meter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def pack(t: torch.Tensor):
            if t.untyped_storage().data_ptr() in self.meter.skip:
                return t
            return SavedTensor(self.meter, self.device, t)

        def unpack(saved):
            return saved.tensor if isinstance(saved, SavedTensor) else saved

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            return self.stage(x)
