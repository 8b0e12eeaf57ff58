"""The command line: `python -m course_utils COMMAND ...`.

Each sub-command lives in the module that does its work and exposes two functions:
`add_arguments(parser)` and `run(args) -> int`. Only the chosen command's module is
imported, so `--help` and the schedule commands never import torch.

Bad input is a `CourseInputError` (or an argparse error): one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from course_utils.errors import CourseInputError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "schedule": ("course_utils.schedules", "print a pipeline schedule and its simulated timeline"),
    "gantt": ("course_utils.gantt", "draw a schedule's simulated timeline as a Gantt chart"),
    "run": ("course_utils.executor", "run one pipelined training step for real on CPU threads"),
    "data-parallel": ("course_utils.data_parallel", "data-parallel step on threads vs one worker"),
    "tensor-parallel": (
        "course_utils.tensor_parallel",
        "tensor-parallel MLP on threads vs unsplit",
    ),
    "grade": ("course_utils.grading", "grade exercise notebooks with nbval"),
    "plan": ("course_utils.plan", "memory and throughput planner for a training run"),
    "distributed": ("course_utils.distributed", "DDP on torch.distributed processes vs threads"),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is a single line on stderr and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = [
        "usage: python -m course_utils COMMAND [options]",
        "",
        "Helpers for the course on training neural networks in parallel.",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run 'python -m course_utils COMMAND --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(
            f"python -m course_utils: error: unknown command {name!r} "
            f"(choose from {', '.join(COMMANDS)})",
            file=sys.stderr,
        )
        return 2
    module_name, help_ = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        print(f"python -m course_utils {name}: not available yet", file=sys.stderr)
        return 2
    parser = OneLineParser(prog=f"python -m course_utils {name}", description=help_)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except CourseInputError as exc:
        print(f"python -m course_utils {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
