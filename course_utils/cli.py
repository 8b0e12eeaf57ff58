"""The command line: `python -m course_utils COMMAND ...`.

Each command is a module in `course_utils.commands` with `HELP`, `add_arguments(parser)`
and `run(args) -> int`; only the chosen one is imported, and commands import torch only
after their arguments are checked, so `--help` and bad input answer at once.

Whatever goes wrong that the user can fix is one line and exit code 2, never a traceback:
bad input (a `CourseInputError` or an argparse error, naming the flag as the user typed it:
`-m`, `--micro` or `--microbatches`), an output that cannot be written (a full disk,
`/dev/full`, a closed standard output) or any other error of the operating system. A pipe
closed early (`| head -1`) ends the command quietly with exit code 141, as it does `cat`.
Ctrl-C prints one line and exits with 130. With standard error closed, errors go to
standard output.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
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
PIPE_CLOSED = 141  # 128 + SIGPIPE: what the shell reports for `cat` when its reader left
INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C


def say(line: str) -> None:
    """One line for the user: on standard error, or standard output when that is closed."""
    for stream in (sys.stderr, sys.stdout):
        if stream is not None:
            try:
                stream.write(line.rstrip("\n") + "\n")
                stream.flush()
                return
            except (OSError, ValueError):
                continue


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is a single line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        say(f"{self.prog}: error: {message}")
        self.exit(2)


class _PipeClosed(BaseException):
    """The reader of standard output went away (`| head -1`): stop quietly."""


class _OutputFailed(BaseException):
    """Standard output cannot be written (a full disk, /dev/full)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


class _GuardedStdout:
    """Standard output whose write errors stop the command cleanly (a BaseException, so no
    `except Exception` on the way swallows it), whichever thread prints."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise _PipeClosed from None
        except OSError as exc:
            raise _OutputFailed(exc) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise _PipeClosed from None
        except OSError as exc:
            raise _OutputFailed(exc) from None

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


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


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def _hold_closed_descriptors() -> None:
    """Put /dev/null on a closed standard descriptor, so that no file the command opens later
    takes its number (and a library's warning on "standard error" lands in the user's chart)."""
    for fd in (0, 1, 2):
        if _closed(fd):
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def _silence_stdout() -> None:
    """After an output error: nothing more reaches the broken stream, not even the
    interpreter's last flush at exit (which would print "Exception ignored ...")."""
    stream = sys.__stdout__
    try:
        if stream is not None and stream.fileno() == 1:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.close(null)
    except (OSError, ValueError):
        pass


def _option_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every option string of the parser and of its sub-commands (plan memory|search)."""
    found = dict(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.update(_option_actions(sub))
    return found


def typed_flags(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, str]:
    """{an option string of the parser: the spelling the user typed for that option}, for
    the options typed as a short flag (`-m`) or an abbreviation (`--micro`)."""
    options = _option_actions(parser)
    typed: dict[str, str] = {}
    for token in argv:
        if token == "--":
            break
        if not token.startswith("-") or token == "-" or re.fullmatch(r"-\.?\d[\d.eE+-]*", token):
            continue
        spelled = token.split("=", 1)[0] if token.startswith("--") else token[:2]
        action = options.get(spelled)
        if action is None and token.startswith("--"):
            matches = {a for o, a in options.items() if o.startswith(spelled)}
            action = matches.pop() if len(matches) == 1 else None
        if action is None:
            continue
        for option in action.option_strings:
            if option != spelled:
                typed[option] = spelled
    return typed


def as_typed(message: str, typed: dict[str, str]) -> str:
    """The message with each flag spelled the way the user typed it."""
    for option in sorted(typed, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){re.escape(option)}(?![\w-])", typed[option], message)
    return message


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if sys.__stdout__ is None or sys.__stderr__ is None or sys.__stdin__ is None:
        _hold_closed_descriptors()
    if sys.stdout is None:
        say("python -m course_utils: error: standard output is closed, so nothing could be "
            "printed: run it without '>&-' (or send the output to /dev/null)")  # fmt: skip
        return 2
    original = sys.stdout
    sys.stdout = _GuardedStdout(original)
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except _PipeClosed:
        _silence_stdout()
        return PIPE_CLOSED
    except _OutputFailed as exc:
        _silence_stdout()
        name = argv[0] if argv and argv[0] in COMMANDS else ""
        why = exc.error.strerror or str(exc.error)
        say(
            f"python -m course_utils {name}: error: cannot write the output: {why}".replace(
                "  ", " "
            )
        )
        return 2
    finally:
        sys.stdout = original


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        say(
            f"python -m course_utils: error: unknown command {name!r} "
            f"(choose from {', '.join(COMMANDS)})"
        )
        return 2
    command = _command(name)
    parser = OneLineParser(prog=f"python -m course_utils {name}", description=command.HELP)
    command.add_arguments(parser)
    try:
        args = parser.parse_args(rest)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return int(exc.code or 0)
    prog = f"python -m course_utils {name}"
    try:
        return int(command.run(args) or 0)
    except CourseInputError as exc:
        say(f"{prog}: error: {as_typed(str(exc), typed_flags(parser, rest))}")
        return 2
    except KeyboardInterrupt:
        say(f"{prog}: interrupted")
        return INTERRUPTED
    except MemoryError:
        say(f"{prog}: error: this machine ran out of memory: use smaller sizes")
        return 1
    except BrokenPipeError:
        _silence_stdout()
        return PIPE_CLOSED
    except OSError as exc:  # the operating system said no: a file, a folder, a full disk
        where = f" ({exc.filename})" if exc.filename else ""
        say(f"{prog}: error: {exc.strerror or exc}{where}")
        return 2
