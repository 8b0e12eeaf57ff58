"""Sharded checkpoints with `torch.distributed.checkpoint` (DCP), and finding the last one.

Every rank writes only what it holds (its FSDP shards, its pipeline stages' parameters, its
optimizer state) into one folder per step, `DIR/step-N/`, in parallel; rank 0 writes the
folder's `.metadata` last, once every rank has finished. A folder without `.metadata` is a
save that was cut short (a crash while writing) and is never loaded. Keys are the whole
model's parameter names (`blocks.1.attn.qkv.weight`), whatever the layout: DDP's `module.`
prefix and FSDP's sharding are undone by `get_model_state_dict`, and a pipeline rank's
parts keep the names the layers have in the whole model.

On a cluster `DIR` must be storage every node mounts (NFS, Lustre, a bucket through
fsspec): a rank restarted on another node reads what the others wrote.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful

STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir(folder: str | Path, step: int) -> Path:
    """Where the checkpoint taken after `step` training steps lives."""
    return Path(folder) / f"step-{step}"


def complete_steps(folder: str | Path) -> list[int]:
    """Steps with a complete checkpoint in `folder` (its `.metadata` written), ascending."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    steps = []
    for child in folder.iterdir():
        match = STEP_DIR.match(child.name)
        if match and (child / ".metadata").is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)


def latest_step(folder: str | Path, at_most: int | None = None) -> int | None:
    """The last complete checkpoint's step (not past `at_most`), or None."""
    steps = [s for s in complete_steps(folder) if at_most is None or s <= at_most]
    return steps[-1] if steps else None


class TrainState(Stateful):
    """What a rank saves and restores: its model parts' parameters and optimizer states.

    A rank may hold several parts (a looped pipeline's stages), each with its own optimizer,
    as in torchtitan; their state dicts are merged into one flat dict whose keys never
    collide, since each part holds different layers of the model.
    """

    def __init__(self, parts: list[nn.Module], optimizers: list[torch.optim.Optimizer]):
        self.parts, self.optimizers = parts, optimizers

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        merged: dict[str, Any] = {}
        options = StateDictOptions(flatten_optimizer_state_dict=True)
        for part, opt in zip(self.parts, self.optimizers, strict=True):
            model_sd, optim_sd = get_state_dict(part, opt, options=options)
            merged.update({f"model.{k}": v for k, v in model_sd.items()})
            merged.update({f"optim.{k}": v for k, v in optim_sd.items()})
        return merged

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_state_dict,
            set_state_dict,
        )

        options = StateDictOptions(flatten_optimizer_state_dict=True)
        for part, opt in zip(self.parts, self.optimizers, strict=True):
            # This part's own keys (as state_dict() wrote them) pick its entries.
            model_keys, optim_keys = (set(d) for d in get_state_dict(part, opt, options=options))
            set_state_dict(
                part,
                opt,
                model_state_dict={k: state_dict[f"model.{k}"] for k in model_keys},
                optim_state_dict={k: state_dict[f"optim.{k}"] for k in optim_keys},
                options=options,
            )


def save(folder: str | Path, step: int, state: TrainState) -> Path:
    """Every rank writes its shards of `state` to `folder/step-N` (a collective call)."""
    import torch.distributed.checkpoint as dcp

    where = step_dir(folder, step)
    dcp.save({"train": state}, checkpoint_id=str(where))
    return where


def load(folder: str | Path, step: int, state: TrainState) -> None:
    """Every rank reads its shards from `folder/step-N` into `state`, in place (collective)."""
    import torch.distributed.checkpoint as dcp

    dcp.load({"train": state}, checkpoint_id=str(step_dir(folder, step)))


def load_full(path: str | Path) -> dict[str, torch.Tensor]:
    """A checkpoint's whole model on one process, without any process group: parameter name
    -> full tensor (the shards put together). For comparing runs, or using a model later."""
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "full.pt"
        dcp_to_torch_save(str(path), str(out))
        data = torch.load(out, weights_only=False)
    flat = data["train"] if "train" in data else data
    return {k[6:]: v for k, v in flat.items() if k.startswith("model.")}
