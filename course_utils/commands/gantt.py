"""`python -m course_utils gantt NAME -p P -m M -o chart.png`: a schedule's simulated
timeline drawn as a Gantt chart (PNG, SVG or PDF). Never imports torch or pyplot."""

from __future__ import annotations

import argparse

from course_utils.commands.common import (
    add_max_actions,
    add_schedule_arguments,
    check_size,
    costs_from_args,
    schedule_from_args,
)
from course_utils.errors import CourseInputError
from course_utils.validation import MAX_GANTT_ACTIONS as MAX_ACTIONS
from course_utils.validation import matplotlib_ready, output_file

HELP = "draw a schedule's simulated timeline as a Gantt chart"
FORMATS = (".png", ".svg", ".pdf")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_schedule_arguments(parser, short=True)
    parser.add_argument("-o", "--output", required=True, help="chart file (.png, .svg or .pdf)")
    parser.add_argument("--no-labels", action="store_true", help="no text inside the bars")
    add_max_actions(parser, MAX_ACTIONS)


def run(args: argparse.Namespace) -> int:
    check_size(args, "gantt", MAX_ACTIONS)
    costs = costs_from_args(args)
    output_file(args.output, "--output", FORMATS)
    matplotlib_ready()
    schedule = schedule_from_args(args)

    from course_utils.charts import gantt  # matplotlib: only once the arguments are right
    from course_utils.pipeline.simulate import simulate

    timeline = simulate(schedule, costs)
    fig = gantt.draw(timeline, labels=not args.no_labels, pyplot=False)
    try:
        path = gantt.save(fig, args.output)
    except OSError as exc:  # a file where a folder should be, a folder in the way, no rights
        raise CourseInputError(f"cannot write {args.output!r}: {exc.strerror or exc}") from None
    print(f"{gantt.title_for(timeline)}\nwrote {path}")
    return 0
