"""Zero bubble's split backward: I (input gradient) now, W (weight gradient) later.

Qi et al. 2024 (arXiv 2401.10241) split a stage's backward in two: I computes the gradient
of the stage input, which the previous stage is waiting for, and W the weight gradients,
which nobody waits for, so a schedule can run W in what would otherwise be a bubble. The
executor runs F with `forward_recording` when a schedule has I and W actions, so that I can
keep the output gradient of every module that owns parameters and W can turn each into
that module's weight gradients (as torch.distributed.pipelining's stage_backward_weight).
"""

from __future__ import annotations

import torch
from torch import nn

from course_utils.threads.mailboxes import Message


def backward_input(st: dict, s: int, mb: int, grad_out: torch.Tensor) -> Message | None:
    """I: one backward pass through stage `s` for micro-batch `mb` that stops short of the
    weights (`st`: what its forward saved).

    It yields the gradient of the stage input (sent to the previous stage at once) and of
    every parameterised module's output, which is all W needs later.
    """
    x, records = st["x"], st["records"]
    wanted = ([x] if x.requires_grad else []) + [o for _, o in records]
    grads = torch.autograd.grad(st["out"], wanted, grad_out, retain_graph=True, allow_unused=True)
    message = None
    if x.requires_grad:
        gx, grads = grads[0], grads[1:]
        message = ("grad", s - 1, mb), gx if gx is not None else x * 0
    st["grad_out"], st["record_grads"] = grad_out, list(grads)
    return message


def backward_weight(st: dict, stage: nn.Module) -> None:
    """W: each module's weight gradients from the output gradient I left for it in `st`.

    Backward from a module's output with `inputs=` its own parameters runs only that
    module's weight-gradient ops (for a Linear, one matmul), not the whole chain again.
    """
    covered = {id(p) for mod, _ in st["records"] for p in mod.parameters(recurse=False)}
    rest = [p for p in stage.parameters() if p.requires_grad and id(p) not in covered]
    if rest:  # parameters used outside a recorded module: the plain (slower) way
        torch.autograd.backward(st["out"], st["grad_out"], inputs=rest, retain_graph=True)
    for (mod, out), g in zip(st["records"], st["record_grads"], strict=True):
        params = [p for p in mod.parameters(recurse=False) if p.requires_grad]
        if params and g is not None:
            torch.autograd.backward(out, g, inputs=params)


def forward_recording(stage: nn.Module, x: torch.Tensor):
    """Run `stage(x)` and record (module, output) for every module that owns parameters.

    The zero-bubble split needs those outputs: I computes their gradients, W turns each
    into that module's weight gradients.
    """
    records: list[tuple[nn.Module, torch.Tensor]] = []

    def hook(module, _inputs, output) -> None:
        if isinstance(output, torch.Tensor) and output.requires_grad:
            records.append((module, output))

    owners = [m for m in stage.modules() if any(True for _ in m.parameters(recurse=False))]
    handles = [m.register_forward_hook(hook) for m in owners]
    try:
        out = stage(x)
    finally:
        for h in handles:
            h.remove()
    return out, records
