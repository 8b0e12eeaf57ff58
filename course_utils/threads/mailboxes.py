"""Messages between device threads, and the proof that a set of waiting devices is stuck.

A device posts a tensor under a key (`put`); another takes it (`get`), waiting until it is
there. Sends never block (a message waits in its box), so the only way a run can hang is
that every device still running waits for a message nobody has posted: nobody is left to
post it. `Mailboxes` checks exactly that proof at every wake-up and then raises a
`ScheduleError` naming who waits for what, instead of hanging. A device that is merely
waiting for a busy one is slow, not stuck; the caller's own time limit bounds that.

The pipeline executor keys its messages ("act" | "grad", receiving stage, micro-batch).
"""

from __future__ import annotations

import threading

import torch

from course_utils.errors import ScheduleError
from course_utils.threads.devices import Aborted

_POLL_S = 0.02  # how often a waiting device re-checks abort and deadlock

# What an action hands to another stage: (mailbox key, tensor), e.g. (("act", 2, 0), out).
Message = tuple[tuple, torch.Tensor]


class Mailboxes:
    """Messages between devices, keyed by any hashable; detects deadlock.

    A deadlock is certain when every device that has not finished is waiting for a message
    nobody has posted: nobody is left to post it. Only that proof is called a deadlock: a
    device waiting a long time for a busy one is just slow (the step's own time limit,
    `PipelineExecutor(step_timeout=...)`, bounds how long anything may take).
    """

    def __init__(self, num_devices: int, abort: threading.Event) -> None:
        self.num_devices = num_devices
        self.abort = abort
        self._cond = threading.Condition()
        self._box: dict[tuple, torch.Tensor] = {}
        self._waiting: dict[int, tuple[tuple, str]] = {}
        self._finished: set[int] = set()

    def put(self, key: tuple, value: torch.Tensor) -> None:
        with self._cond:
            self._box[key] = value
            self._cond.notify_all()

    def finished(self, device: int) -> None:
        with self._cond:
            self._finished.add(device)
            self._cond.notify_all()

    def get(self, key: tuple, device: int, what: str) -> torch.Tensor:
        """Take message `key`, waiting for it; `what` describes the wait for error messages."""
        with self._cond:
            self._waiting[device] = (key, what)
            try:
                while key not in self._box:
                    if self.abort.is_set():
                        raise Aborted(f"device {device} gave up waiting for {what}")
                    if self._deadlocked():
                        raise ScheduleError(f"schedule cannot complete (deadlock): {self._who()}")
                    self._cond.wait(_POLL_S)
                return self._box.pop(key)
            finally:
                del self._waiting[device]

    def _deadlocked(self) -> bool:
        active = set(range(self.num_devices)) - self._finished
        return bool(active) and all(
            d in self._waiting and self._waiting[d][0] not in self._box for d in active
        )

    def _who(self) -> str:
        parts = [f"device {d} waits for {self._waiting[d][1]}" for d in sorted(self._waiting)]
        parts += [f"device {d} has finished its actions" for d in sorted(self._finished)]
        return "; ".join(parts)
