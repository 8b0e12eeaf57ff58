"""The command-line tools, one module per command: `python -m course_utils COMMAND ...`.

Each module has `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`. The
teaching modules stay free of argument parsing; a command checks its arguments (cheaply,
before torch is imported or a model built), calls the library, and prints. `common` holds
what several commands share: the schedule and cost flags, and their checks.
"""
