"""Ports on this machine's loopback, where the course's processes meet: a free one, whether
one is taken, and the one a job uses (`--port`, $MASTER_PORT or a free one). Importing this
module does not import torch (the torchrun launcher uses it before any rank starts)."""

from __future__ import annotations

import socket

from course_utils import validation
from course_utils.errors import CourseInputError

HOST = "127.0.0.1"


def port_is_free(port: int) -> bool:
    """True if nothing on this machine holds `port` on 127.0.0.1 (we try to bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port the operating system says is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def resolve_port(port: int | None = None) -> int:
    """The rendezvous port: `port`, else $MASTER_PORT, else a free one. Busy -> clear error.

    We check before spawning: otherwise rank 0's TCP store fails inside a child process
    and the learner sees a long traceback about a socket instead of one line. (Checking is
    not holding: `Cluster.start` then binds the port and keeps it, see `_hold_port`.)
    """
    where = "port"
    if port is None and (port := validation.env_port("MASTER_PORT")) is not None:
        where = "MASTER_PORT"
    if port is None:
        return free_port()
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise CourseInputError(f"{where} must be an integer from 1 to 65535, got {port!r}")
    if not port_is_free(port):
        raise CourseInputError(
            f"{where} {port} is already in use on {HOST}: choose another port, "
            "or leave it out and a free one is picked"
        )
    return port
