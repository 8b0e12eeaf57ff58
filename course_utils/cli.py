"""The command line: `python -m course_utils COMMAND ...`.

Each command is a module in `course_utils.commands` with `HELP`, `add_arguments(parser)`
and `run(args) -> int`; only the chosen one is imported, and commands import torch only
after their arguments are checked, so `--help` and bad input answer at once.

Bad input is a `CourseInputError` (or an argparse error): one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

from course_utils.errors import CourseInputError

# name -> module in course_utils.commands
COMMANDS: dict[str, str] = {
    "schedule": "schedule",
    "gantt": "gantt",
    "run": "run",
    "data-parallel": "data_parallel",
    "tensor-parallel": "tensor_parallel",
    "grade": "grade",
    "plan": "plan",
    "distributed": "distributed",
    "fsdp": "fsdp",
    "context-parallel": "context_parallel",
    "moe": "moe",
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is a single line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _command(name: str):
    return importlib.import_module(f"course_utils.commands.{COMMANDS[name]}")


def _usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = [
        "usage: python -m course_utils COMMAND [options]",
        "",
        "Helpers for the course on training neural networks in parallel.",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {_command(name).HELP}" for name in COMMANDS]
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
    command = _command(name)
    parser = OneLineParser(prog=f"python -m course_utils {name}", description=command.HELP)
    command.add_arguments(parser)
    try:
        args = parser.parse_args(rest)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return int(exc.code or 0)
    try:
        return int(command.run(args) or 0)
    except CourseInputError as exc:
        print(f"python -m course_utils {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
