"""What the grader reads of a kernel's output, and how it knows it read it all.

A kernel's output comes over one ZeroMQ connection (Jupyter's iopub). The grader's client
reads at most `MESSAGE_BYTES` a message and queues at most `QUEUED_MESSAGES` (ZeroMQ drops a
bigger message before it is read, so it never reaches the grader's memory:
`capped_manager`); it keeps at most `CELL_OUTPUT_BYTES` of a cell's output and
`OUTPUT_BYTES` of a notebook's (`cap_output`); and it watches the connection, so that a
message too big, which breaks it, loses no answer (`Iopub`). Each limit that bites is said
once in the run's notes.
"""

from __future__ import annotations

import json
import time
from typing import Protocol

MESSAGE_BYTES = 16 << 20  # one message from the kernel (an answer is at most 5 MB of text)
QUEUED_MESSAGES = 16  # received and not yet read: at most 256 MiB in the worker
CELL_OUTPUT_BYTES = 4 << 20  # what one cell's output may hold
OUTPUT_BYTES = 32 << 20  # and the whole notebook's


class Notes(Protocol):
    """Where a limit that bit is said: a run's notes (`sandbox.Run`)."""

    notes: list[str]


def capped_manager():
    """AsyncKernelManager whose clients read at most `MESSAGE_BYTES` a message and queue at
    most `QUEUED_MESSAGES` (ZeroMQ's own limits, set on every socket of the client's context:
    a bigger message is dropped before it is read, so it never reaches the worker's memory)."""
    import zmq
    import zmq.asyncio
    from jupyter_client.manager import AsyncKernelManager

    class CappedKernelManager(AsyncKernelManager):
        def client(self, **kwargs):
            context = zmq.asyncio.Context()
            context.setsockopt(zmq.MAXMSGSIZE, MESSAGE_BYTES)
            context.setsockopt(zmq.RCVHWM, QUEUED_MESSAGES)
            kwargs.setdefault("context", context)
            return super().client(**kwargs)

    return CappedKernelManager


class Iopub:
    """The client's output socket, watched. A cell's output can be lost two ways: ZeroMQ
    drops a message over `MESSAGE_BYTES` by closing the connection (and after such an error
    it does not connect again, so the rest of the notebook's output, its answers too, would
    be lost), and for a moment after connecting again the kernel has not yet taken the new
    subscription, so what it publishes then reaches no one (ZeroMQ's "slow joiner"); on a
    busy machine that moment is long enough to lose the next cell's answer. A cell's output
    came whole when the kernel's "idle" for it arrived and the connection held: `complete`
    says so (and connects again if the connection broke); `settle` runs empty cells,
    connecting again after each that did not come back whole, until one does."""

    SETTLE_SECONDS = 30.0  # then the kernel's output is given up on (the row says so)
    given_up = False  # once it is, later cells do not wait for it again

    def __init__(self, client, run: Notes) -> None:
        import zmq

        self.run = run
        self.channel = client.kc.iopub_channel.socket
        self.socket: zmq.Socket = zmq.Socket.shadow(self.channel.underlying)
        self.url = client.kc._make_url("iopub")
        monitor = self.channel.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.monitor: zmq.Socket = zmq.Socket.shadow(monitor.underlying)
        self._keep = monitor
        self.ended: set[int] = set()  # the cells whose "idle" came
        process = client.process_message  # called with each message of the running cell

        def noted(msg: dict, cell, cell_index: int):
            state = msg.get("content", {}).get("execution_state")
            if msg.get("msg_type") == "status" and state == "idle":
                self.ended.add(cell_index)
            return process(msg, cell, cell_index)

        client.process_message = noted

    def recover(self) -> bool:
        """Connect again if the connection broke (noted once); True if it had."""
        from zmq.utils.monitor import recv_monitor_message

        dropped = False
        while self.monitor.poll(0):
            recv_monitor_message(self.monitor)
            dropped = True
        if not dropped:
            return False
        note = (
            f"the kernel sent a message over {MESSAGE_BYTES >> 20} MiB (or its connection "
            "broke): it was dropped unread, and its output was truncated"
        )
        _say_once(self.run, note)
        self._connect()
        return True

    def _connect(self) -> None:
        import zmq

        try:
            self.socket.disconnect(self.url)
        except zmq.ZMQError:
            pass
        self.socket.connect(self.url)

    def complete(self, index: int) -> bool:
        """Whether cell `index`'s output came back whole."""
        broke = self.recover()
        return index in self.ended and not broke

    def settle(self, run_cell) -> bool:
        """Run empty cells (`run_cell(source)` gives the index it ran at) until one's output
        comes back whole, connecting again after each that does not, for at most
        `SETTLE_SECONDS`; False (noted) if none did, then and for every later call."""
        if self.given_up:
            return False
        deadline = time.monotonic() + self.SETTLE_SECONDS
        while time.monotonic() < deadline:
            index = run_cell("pass")
            broke = self.recover()
            if index in self.ended and not broke:
                return True
            if not broke:  # no "idle" and no error seen: the subscription may not have held
                self._connect()
        self.given_up = True
        self.run.notes.append(
            f"the kernel's output stopped coming back (for {self.SETTLE_SECONDS:g} s): "
            "what it printed and answered after that could not be read"
        )
        return False

    def close(self) -> None:
        self.channel.disable_monitor()
        self._keep.close(linger=0)


def _say_once(run: Notes, note: str) -> None:
    if note not in run.notes:
        run.notes.append(note)


def _output_size(msg: dict) -> int:
    content = msg.get("content", {})
    if msg.get("msg_type") == "stream":
        return len(content.get("text", ""))
    return len(json.dumps(content, default=str))


def cap_output(client, learner_cells: int, run: Notes) -> None:
    """Keep at most `CELL_OUTPUT_BYTES` of each cell's output and `OUTPUT_BYTES` of the
    notebook's (the capture's own answer, read by the grader, is exempt); past that a
    message is dropped unread, and the run's notes say so once."""
    process = client.process_message
    spent: dict[int, int] = {}
    kept = ("stream", "display_data", "update_display_data", "execute_result", "error")

    def capped(msg: dict, cell, cell_index: int):
        kind = msg.get("msg_type", "")
        if kind in kept or kind.startswith("comm"):
            answer = kind == "execute_result" and cell_index >= learner_cells
            if not answer:
                size = _output_size(msg)
                spent[cell_index] = spent.get(cell_index, 0) + size
                total = sum(spent.values())
                if spent[cell_index] > CELL_OUTPUT_BYTES or total > OUTPUT_BYTES:
                    note = (
                        f"the notebook printed more than the grader reads (at most "
                        f"{CELL_OUTPUT_BYTES >> 20} MiB a cell, {OUTPUT_BYTES >> 20} MiB in "
                        "all): its output was truncated"
                    )
                    _say_once(run, note)
                    return None
        return process(msg, cell, cell_index)

    client.process_message = capped
