"""Messages between device threads, and the proof that a set of waiting devices is stuck.

A device posts a message under a key (`put`); another takes it (`get`), waiting until it is
there. Messages under one key queue in the order they were posted (first in, first out), as
messages between two GPUs arrive in the order they were sent. Sends never block (a message
waits in its box), so the only way a run can hang is that every device still running waits
for a message nobody has posted: nobody is left to post it. `Mailboxes` checks exactly that
proof at every wake-up and then raises `Deadlock` naming who waits for what (and, given
`progress`, what each device last finished), instead of hanging. A device that is merely
waiting for a busy one is slow, not stuck; the caller's own time limit bounds that.

The pipeline executor keys its messages ("act" | "grad", receiving stage, micro-batch); the
per-rank harness (`threads.ranks`) keys them by (channel, sender, receiver).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

import torch

from course_utils.errors import ScheduleError
from course_utils.threads.devices import Aborted

_POLL_S = 0.02  # how often a waiting device re-checks abort and deadlock

# What an action hands to another stage: (mailbox key, tensor), e.g. (("act", 2, 0), out).
Message = tuple[tuple, torch.Tensor]


class Deadlock(ScheduleError):
    """Every device still running waits for a message nobody has posted (`who`: for what)."""

    def __init__(self, who: str) -> None:
        super().__init__(f"schedule cannot complete (deadlock): {who}")
        self.who = who


class Mailboxes:
    """Messages between devices, keyed by any hashable, first in first out; detects deadlock.

    A deadlock is certain when every device that has not finished is waiting for a message
    nobody has posted: nobody is left to post it. Only that proof is called a deadlock: a
    device waiting a long time for a busy one is just slow (the step's own time limit,
    `PipelineExecutor(step_timeout=...)`, bounds how long anything may take).

    `unit` names a device in messages ("device", "rank"), or `names(d)` does (a device may be
    a rank's second thread); `progress(d)` may add what device d last did, e.g. " (last
    finished 0F0)". The last `helpers` devices serve the others (a rank's communication
    stream): a deadlock's message leaves them out when they have finished or wait for
    nothing in particular (`what` is "").
    """

    def __init__(
        self,
        num_devices: int,
        abort: threading.Event,
        unit: str = "device",
        progress: Callable[[int], str] | None = None,
        names: Callable[[int], str] | None = None,
        helpers: int = 0,
    ) -> None:
        self.num_devices, self.helpers = num_devices, num_devices - helpers
        self.abort = abort
        self.name = names or (lambda d: f"{unit} {d}")
        self.progress = progress or (lambda d: "")
        self._cond = threading.Condition()
        self._box: dict[Hashable, deque] = {}
        self._waiting: dict[int, tuple[Hashable, str]] = {}
        self._finished: set[int] = set()
        self._stuck: str | None = None  # who waited for whom, when a deadlock was found

    def put(self, key: Hashable, value: Any) -> None:
        with self._cond:
            self._box.setdefault(key, deque()).append(value)
            self._cond.notify_all()

    def finished(self, device: int) -> None:
        with self._cond:
            self._finished.add(device)
            self._cond.notify_all()

    def get(self, key: Hashable, device: int, what: str) -> Any:
        """Take the oldest message under `key`, waiting for it; `what` describes the wait."""
        with self._cond:
            self._waiting[device] = (key, what)
            try:
                while key not in self._box:
                    if self.abort.is_set():
                        raise Aborted(f"{self.name(device)} gave up waiting for {what or 'work'}")
                    if self._stuck is None and self._deadlocked():
                        self._stuck = self._who()  # as first seen: the others report the same
                    if self._stuck is not None:
                        raise Deadlock(self._stuck)
                    self._cond.wait(_POLL_S)
                queue = self._box[key]
                value = queue.popleft()
                if not queue:  # an empty box is no box: `key in self._box` means a message
                    del self._box[key]
                return value
            finally:
                del self._waiting[device]

    def left(self) -> dict[Hashable, list]:
        """The messages nobody took, by key (after a run: what was sent and never received)."""
        with self._cond:
            return {key: list(queue) for key, queue in self._box.items()}

    def _deadlocked(self) -> bool:
        active = set(range(self.num_devices)) - self._finished
        return bool(active) and all(
            d in self._waiting and self._waiting[d][0] not in self._box for d in active
        )

    def _who(self) -> str:
        name, progress = self.name, self.progress
        waits = {d: what for d, (_, what) in self._waiting.items() if what}
        parts = [f"{name(d)}{progress(d)} waits for {waits[d]}" for d in sorted(waits)]
        done = [d for d in sorted(self._finished) if d < self.helpers]
        parts += [f"{name(d)}{progress(d)} has finished" for d in done]
        return "; ".join(parts)
