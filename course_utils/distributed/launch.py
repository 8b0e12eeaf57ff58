"""A multi-node `torchrun` job on this machine: every "node" is one torchrun agent, and the
agents meet at a c10d rendezvous on 127.0.0.1, as the nodes of a cluster meet at
`--rdzv-endpoint=HOST:PORT`.

    job = launch(parallel="pipeline", schedule="1f1b", nodes=2, procs_per_node=1)
    job.report["max_param_diff"], job.timeline      # what rank 0 wrote, as a Timeline

Each agent runs the real `torchrun` (`torch.distributed.run`, the script next to this
Python), which starts `python -m course_utils.distributed.train` processes. The course sets
what a cluster leaves to its operators: the rendezvous timeouts (`--rdzv-conf`), a fresh job
id, which agent hosts the rendezvous store (`is_host`), gloo on the loopback interface.
Nothing outlives the launch: agents die with the process that started them (Linux's
PR_SET_PDEATHSIG, kept across exec), the train processes die with their agent, and every
agent is terminated, killed if need be, and reaped before `launch` returns or raises.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil  # type: ignore[import-untyped]  # a dependency (requirements.txt)

from course_utils.distributed.ports import HOST, free_port
from course_utils.distributed.scratch import scratch_folder
from course_utils.errors import CourseInputError, WorkerError
from course_utils.timeline import Event, Timeline

# On one machine: every agent and every rank imports torch (about 160 MB each); 2 nodes of 2
# processes (lesson 13's largest) fit 1.5 GB with the launcher (tests/test_limits.py).
MAX_NODES, MAX_PROCS_PER_NODE = 2, 2
ERROR = re.compile(r"course_utils\.distributed\.train: error: (.*)")
FAILED = re.compile(r"course_utils\.distributed\.train: (rank \d+ \(node \d+\) failed.*)")
ROOT_CAUSE = re.compile(r"^\s*(rank|exitcode)\s*: (-?\d+)", re.M)
EXCEPTION = re.compile(
    r"^(?:\[rank\d+\]:\s*)?((?:\w+\.)*\w*(?:Error|Exception|Interrupt): .+)$", re.M
)
STORY = re.compile(
    r"course_utils\.distributed\.train: |Worker group FAILED|Detected \d+ new nodes|"
    r"failed \(exitcode|Rendezvous complete|restart_count=|successfully finished"
)
# What a rank that crashed below Python leaves: C++'s terminate message and its what(), glibc's
# abort message, or the faulthandler's (PYTHONFAULTHANDLER) fatal error and innermost frame.
NATIVE = re.compile(
    r"^(?:\[rank\d+\]:\s*)?(terminate called .+|\s*what\(\): .+|Fatal Python error: .+|"
    r"(?:free\(\)|malloc\(\)|double free|corrupted size|munmap_chunk\(\)).+)$",
    re.M,
)
CRASHED_IN = re.compile(
    r"Current thread 0x[0-9a-f]+ \(most recent call first\):\n(?:\[rank\d+\]:)?\s*"
    r"File \"(.+)\", line (\d+) in (\S+)"
)
GLOG_PREFIX = re.compile(r"^[IWE]\d{4} [\d:.]+ +\d+ \S+\] (\[default\] )?")


def torchrun() -> list[str]:
    """The torchrun next to this Python (a venv's), else `python -m torch.distributed.run`."""
    script = Path(sys.executable).with_name("torchrun")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "torch.distributed.run"]


def train_arguments(**options) -> list[str]:
    """`parallel="fsdp+pipeline", steps=4` -> ["--parallel", "fsdp+pipeline", "--steps", "4"]."""
    out = []
    for name, value in options.items():
        if value is None or value is False:
            continue
        out += [f"--{name.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return out


def torchrun_command(
    node: int,
    nodes: int,
    procs_per_node: int,
    port: int,
    job_id: str,
    arguments: list[str],
    max_restarts: int = 0,
    join_timeout: float = 60,
    log_dir: str | None = None,
) -> list[str]:
    """The command node `node` runs: the one a cluster runs on every node, plus what a
    cluster's network makes unnecessary: the timeouts, `is_host` (node 0 hosts the rendezvous
    store; on a cluster, the endpoint's host) and the node's address (loopback here)."""
    conf = f"join_timeout={join_timeout:g},close_timeout=10,is_host={int(node == 0)}"
    return [
        *torchrun(),
        f"--nnodes={nodes}",
        f"--nproc-per-node={procs_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={HOST}:{port}",
        f"--rdzv-id={job_id}",
        f"--rdzv-conf={conf}",
        f"--local-addr={HOST}",
        f"--max-restarts={max_restarts}",
        *([f"--log-dir={log_dir}"] if log_dir else []),
        "-m",
        "course_utils.distributed.train",
        *arguments,
    ]


# Linux: the agent gets SIGKILL when the process that started it dies (a notebook kernel
# killed, a test runner stopped); exec keeps that setting. Its pid, which exec keeps too,
# goes to its train processes (COURSE_AGENT_PID): each exits as soon as it sees that
# process gone, even if the agent died while the process was still importing torch.
_EXEC_BOUND = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGKILL)\n"
    "os.getppid() == int(sys.argv[1]) or os._exit(1)\n"
    "os.environ['COURSE_AGENT_PID'] = str(os.getpid())\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def start_agent(command: list[str], log: Path, env: dict) -> subprocess.Popen:
    """Start one torchrun agent, bound to this process's life where the system allows it."""
    # torchrun is a Python script: run it with this Python (the venv's, as its shebang says).
    command = command if command[0] == sys.executable else [sys.executable, *command]
    if sys.platform == "linux":
        command = [sys.executable, "-c", _EXEC_BOUND, str(os.getpid()), *command]
    with open(log, "wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)


@dataclass
class Job:
    """A finished launch: what each agent printed and rank 0's report."""

    commands: list[list[str]]
    returncodes: list[int]
    logs: list[str]
    seconds: float
    peak_memory_mb: float  # all agents and their processes together (RSS, sampled)
    stopped: list[int] = field(default_factory=list)  # nodes the launcher had to stop itself
    report: dict = field(default_factory=dict)

    @property
    def timeline(self) -> Timeline:
        """Every rank's recorded actions, on rank 0's clock: one Gantt row per process."""
        return Timeline.from_dict(self.report["timeline"])

    def step_timeline(self, step: int) -> Timeline:
        """The actions of training step `step` alone, from the step's start: one step's Gantt."""
        spans = {span["step"]: span for span in self.report["step_spans"]}
        if step not in spans:
            raise CourseInputError(f"step must be one of the steps this run trained: {list(spans)}")
        span, whole = spans[step], self.timeline
        events = [
            Event(e.device, e.action, e.start - span["start_s"], e.end - span["start_s"], e.label)
            for e in whole.events
            if span["start_s"] <= e.start < span["end_s"]
        ]
        return replace(whole, events=events, name=f"{whole.name}, step {step}")

    def command_line(self, node: int = 0) -> str:
        """Node `node`'s command as one would type it, one option per line."""
        words = self.commands[node]
        if words[0] == sys.executable and words[1:3] == ["-m", "torch.distributed.run"]:
            words = ["torchrun", *words[3:]]
        elif words[0].endswith("torchrun"):
            words = ["torchrun", *words[1:]]
        text = " ".join(words).replace(" -m ", " \\\n    -m ")
        return re.sub(r" (--\S+(?: (?!-)\S+)?)", r" \\\n    \1", text)

    def story(self) -> list[str]:
        """What each node's torchrun agent and processes said about starting, failing and
        restarting: the lines of their logs that tell it, in each node's order."""
        lines = []
        for node, log in enumerate(self.logs):
            for line in log.splitlines():
                if STORY.search(line):
                    text = GLOG_PREFIX.sub("", line).rstrip()
                    lines.append(f"node {node}: {text[:200]}")
        return lines


def _family(procs: list[subprocess.Popen]):
    members = []
    for p in procs:
        try:
            top = psutil.Process(p.pid)
            members += [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return members


def _memory_mb(procs: list[subprocess.Popen]) -> float:
    total = 0
    for member in _family(procs):
        try:
            total += member.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total / 2**20


def stop(procs: list[subprocess.Popen], grace: float = 5.0) -> None:
    """Terminate (torchrun passes it on to its processes), then kill whatever is left, and
    reap: nothing of the job survives this call."""
    family = _family(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for member in family:
        try:
            if member.is_running() and member.status() != psutil.STATUS_ZOMBIE:
                member.kill()
        except psutil.NoSuchProcess:
            pass
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def launch(
    nodes: int = 2,
    procs_per_node: int = 1,
    max_restarts: int = 0,
    timeout: float = 300.0,
    join_timeout: float = 60.0,
    **train_options,
) -> Job:
    """Run `python -m course_utils.distributed.train` on `nodes` torchrun agents of
    `procs_per_node` processes each, on this machine; return the job with rank 0's report.

    `train_options` are the module's flags: `parallel="fsdp", steps=6, checkpoint_dir=...,
    fail_at_step=3` (without `checkpoint_dir`, no checkpoints: a restart starts over).
    A bad launch raises CourseInputError with the module's one line, a failed job
    WorkerError with the failing rank's; after `timeout` seconds the job is stopped. Either
    way every agent and process is gone before `launch` returns or raises.
    """
    _check_count("nodes", nodes, 1, MAX_NODES)
    _check_count("procs_per_node", procs_per_node, 1, MAX_PROCS_PER_NODE)
    _check_count("max_restarts", max_restarts, 0, 10)
    if not timeout > 0 or not join_timeout > 0:
        raise CourseInputError("timeout and join_timeout must be numbers of seconds > 0")
    workdir = scratch_folder("job")  # removed below; a killed launcher's, by the next launch
    report_path = workdir / "report.json"
    train_options.setdefault("timeout", min(timeout, 120.0))  # a rank's wait for a collective
    arguments = train_arguments(report=report_path, **train_options)
    port, job_id = free_port(), uuid.uuid4().hex[:12]
    # torch 2.13's torchrun hands its rendezvous store to the ranks and keeps it across
    # restarts, without a per-attempt namespace: a restarted rank can read the addresses of
    # the last attempt's ranks and fail to connect (pytorch/pytorch#135712, #167288). With
    # this, rank 0 of every attempt starts a fresh store instead.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    env.setdefault("LOGLEVEL", "INFO")  # torchrun's account of rendezvous and restarts
    # A rank that crashes inside C++ (SIGABRT, SIGSEGV) prints where it was in Python, and
    # glibc's own abort messages go to stderr (by default to a terminal CI does not have).
    env.setdefault("PYTHONFAULTHANDLER", "1")
    env.setdefault("LIBC_FATAL_STDERR_", "1")
    if sys.platform == "linux":  # stay on loopback: a hostname with a LAN address can hang gloo
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    commands = [
        torchrun_command(n, nodes, procs_per_node, port, job_id, arguments, max_restarts,
                         join_timeout, str(workdir / f"node{n}"))
        for n in range(nodes)
    ]  # fmt: skip
    logs = [workdir / f"node{n}.log" for n in range(nodes)]
    procs: list[subprocess.Popen] = []
    start = time.monotonic()
    try:
        for command, log in zip(commands, logs, strict=True):
            procs.append(start_agent(command, log, env))
        peak, finished = _wait(procs, timeout)
    finally:
        stopped = [n for n, p in enumerate(procs) if p.poll() is None]
        stop(procs)
        seconds = time.monotonic() - start
        texts = [log.read_text(errors="replace") if log.exists() else "" for log in logs]
        report = report_path.read_text() if report_path.exists() else None
        if not os.environ.get("COURSE_DEBUG"):  # COURSE_DEBUG=1 keeps the agents' logs
            shutil.rmtree(workdir, ignore_errors=True)
    job = Job(commands, [p.returncode for p in procs], texts, seconds, peak, stopped)
    if not finished:
        raise WorkerError(f"the torchrun job did not finish within {timeout:g} s: stopped")
    if any(job.returncodes) or report is None:
        error = _failure(job)
        error.job = job  # type: ignore[attr-defined]  # for a caller who wants the logs
        raise error
    job.report = json.loads(report)
    return job


def _check_count(name: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CourseInputError(f"{name} must be an integer from {low} to {high}, got {value!r}")


def _wait(procs: list[subprocess.Popen], timeout: float) -> tuple[float, bool]:
    """Wait for every agent, at most `timeout` seconds: (the job's peak memory in MB,
    sampled; whether it finished)."""
    start, peak, failed_at = time.monotonic(), 0.0, None
    while any(p.poll() is None for p in procs):
        peak = max(peak, _memory_mb(procs))
        now = time.monotonic()
        if now - start > timeout:
            return peak, False
        if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
            failed_at = now  # an agent gave up: the others follow at once, or are stopped
        if failed_at is not None and now - failed_at > 15:
            break
        time.sleep(0.2)
    return peak, True


def _exit_code(key: str, value: str) -> str:
    """torchrun's exit code, with the signal's name when a signal ended the rank."""
    if key != "exitcode" or int(value) >= 0:
        return value
    try:
        return f"{value} ({signal.Signals(-int(value)).name})"
    except ValueError:
        return value


def _native_crash(text: str) -> str | None:
    """'terminate called ...; what(): ...' or 'Fatal Python error: Aborted, in f (file:line)'
    for a rank that crashed below Python; None when no rank did."""
    said = list(dict.fromkeys(line.strip() for line in NATIVE.findall(text)))
    if not said:
        return None
    where = ""
    if match := CRASHED_IN.search(text):
        where = f", in {match[3]} ({Path(match[1]).name}:{match[2]})"
    return "; ".join(said[:2]) + where


def _failure(job: Job) -> Exception:
    """The one line that says what went wrong, from the agents' output."""
    text = "\n".join(job.logs)
    if match := ERROR.search(text):
        return CourseInputError(match.group(1))
    if match := FAILED.search(text):
        return WorkerError(match.group(1))
    if "RendezvousTimeoutError" in text:
        return WorkerError("rendezvous timed out: not every node joined in time (join_timeout)")
    # A rank that died before train.py could report (killed, or an error at start-up): torchrun's
    # "Root Cause" box names the rank and its exit code, and the rank's traceback ends in the
    # exception's line. (The box's rules of "=" are no message.)
    box = text.partition("Root Cause")[2]  # empty when torchrun printed no box
    cause = ", ".join(f"{key} {_exit_code(key, value)}" for key, value in ROOT_CAUSE.findall(box))
    where = f"; {cause}" if cause else ""
    errors = [e for e in EXCEPTION.findall(text) if "ChildFailedError" not in e]
    said = [line.strip() for line in text.splitlines() if line.strip(" =-")] or ["no output"]
    if crash := _native_crash(text):
        why = crash
    elif errors:
        why = errors[-1]
    elif where:
        why = "no error printed (COURSE_DEBUG=1 keeps the agents' logs)"
    else:
        why = said[-1]
    return WorkerError(
        f"the torchrun job failed (agents' exit codes {job.returncodes}{where}): {why}"
    )
