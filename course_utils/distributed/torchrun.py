"""`python -m course_utils.distributed.torchrun`: torchrun, with the course's one-line failures.

    python -m course_utils.distributed.torchrun --nnodes=2 --nproc-per-node=2 \\
        --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT \\
        -m course_utils.distributed.train --parallel fsdp+pipeline --steps 100

It takes torchrun's options and runs PyTorch's own torchrun (`torch.distributed.run.main`) in
this process: the same agent, rendezvous and restarts. Two things differ, both about failing:

- the flags of `course_utils.distributed.train` are checked first, before torch is imported
  and before any process starts: a bad one is one line and exit 2 (under plain torchrun every
  rank says that line, then torchrun adds a 45-line `ChildFailedError` report);
- when a rank fails, torchrun's report becomes one line naming the first rank that failed and
  its exit code, and this command exits with that code. A rank that refused its input (exit
  2) has already said why in its own line: nothing more is added.
"""

from __future__ import annotations

import logging
import sys

from course_utils.errors import CourseInputError

PROG = "python -m course_utils.distributed.torchrun"
TRAIN = "course_utils.distributed.train"
REFUSED = 2  # the exit code of a rank that refused its input, having said why


def train_arguments(argv: list[str]) -> list[str] | None:
    """The arguments after `-m course_utils.distributed.train`, or None for another program."""
    for i, word in enumerate(argv):
        if word in ("-m", "--module") and argv[i + 1 : i + 2] == [TRAIN]:
            return argv[i + 2 :]
        if word == f"-m{TRAIN}":
            return argv[i + 1 :]
    return None


class _Teardown(logging.Filter):
    """Hold torchrun's logs of a failed group's teardown (the first failure, the closing
    signals sent to the other ranks) until the failure is known: a refusal (REFUSED) was said
    by the ranks already; any other failure gets them back, in order."""

    WORDS = ("failed (exitcode", "Sending process", "Unable to shutdown process")

    def __init__(self) -> None:
        super().__init__()
        self.held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(self.WORDS):
            self.held.append(record)
            return False
        return True

    def release(self, logger: logging.Logger) -> None:
        logger.removeFilter(self)
        for record in self.held:
            logger.handle(record)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    train = train_arguments(argv)
    if train is not None and "-h" not in train and "--help" not in train:
        from course_utils.distributed.job import check_arguments
        from course_utils.distributed.train import parser

        try:
            check_arguments(parser().parse_args(train))
        except CourseInputError as exc:
            print(f"{TRAIN}: error: {exc}", file=sys.stderr)
            return REFUSED
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing import api
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    teardown = _Teardown()
    api.logger.addFilter(teardown)
    try:
        run.main(argv)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if failure.exitcode == REFUSED:
            return REFUSED
        teardown.release(api.logger)
        how = (f"signal {failure.signal_name()}" if failure.exitcode < 0
               else f"exit code {failure.exitcode}")  # fmt: skip
        print(
            f"{PROG}: error: rank {rank} (local rank {failure.local_rank}) of {exc.name} failed "
            f"with {how}; its own lines above say why",
            file=sys.stderr,
        )
        return failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode
    except api.SignalException as exc:  # torchrun stops its ranks on SIGINT/SIGTERM, then this
        teardown.release(api.logger)
        print(f"{PROG}: stopped by {exc.sigval.name}", file=sys.stderr)
        return 128 + int(exc.sigval)
    teardown.release(api.logger)  # a failure that a restart mended
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
