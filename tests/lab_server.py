"""Start and stop a JupyterLab server for tests: loopback only, free port, token, no browser."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

from conftest import ROOT, free_port


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


@contextmanager
def jupyter_lab(command: list[str] | None = None, startup_timeout: float = 90.0):
    """Yield (base_url, token) of a running JupyterLab; stop it (whole process group) after.

    `command` defaults to `make lab` with the port and token passed through LAB_PORT/LAB_FLAGS,
    so the test starts exactly what the README tells a learner to run.
    """
    port, token = free_port(), secrets.token_hex(16)
    flags = f"--no-browser --IdentityProvider.token={token} --ServerApp.open_browser=False"
    if command is None:
        command = ["make", "--no-print-directory", "lab", f"LAB_PORT={port}", f"LAB_FLAGS={flags}"]
    else:
        command = [*command, f"--ServerApp.port={port}", *flags.split()]
    log = tempfile.NamedTemporaryFile(prefix="jupyterlab-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {proc.returncode}; see {log.name}")
            try:
                status, _ = _get(f"{base}/api/status?token={token}", timeout=2)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"JupyterLab did not answer on {base} in {startup_timeout} s")
            time.sleep(0.5)
        yield base, token
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        log.close()
        if sys.exc_info()[0] is None:
            os.unlink(log.name)


def get_json(url: str) -> dict:
    status, body = _get(url, timeout=30)
    assert status == 200, f"GET {url.split('?')[0]} -> {status}"
    return json.loads(body)


def get_status(url: str) -> int:
    return _get(url, timeout=30)[0]
