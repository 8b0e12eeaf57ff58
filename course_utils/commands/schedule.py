"""`python -m course_utils schedule NAME --devices P --microbatches M`: a schedule's action
lists and its simulated timeline, as a table or as JSON. Never imports torch."""

from __future__ import annotations

import argparse
import gc
import json
import sys
from contextlib import contextmanager

from course_utils.actions import Schedule
from course_utils.commands.common import (
    add_max_actions,
    add_schedule_arguments,
    check_size,
    costs_from_args,
    schedule_from_args,
)
from course_utils.validation import MAX_ACTIONS  # a few seconds, under 0.5 GB even as JSON

HELP = "print a pipeline schedule and its simulated timeline"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_schedule_arguments(parser)
    add_max_actions(parser, MAX_ACTIONS)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from course_utils.pipeline.simulate import simulate_arrays

    check_size(args, "json" if args.json else "table", MAX_ACTIONS)
    costs = costs_from_args(args)
    with _no_cyclic_gc():
        sched = schedule_from_args(args)
        result = simulate_arrays(sched, costs)
        _print(sched, result, as_json=args.json)
    return 0


@contextmanager
def _no_cyclic_gc():
    # Big schedules allocate 100k+ small objects and no cycles: the cyclic collector would
    # only rescan them again and again (a third of the run time for 131k actions).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _print(sched: Schedule, result: dict, as_json: bool) -> None:
    out = sys.stdout
    if as_json:
        names = [[f"{a.stage}{a.kind}{a.microbatch}" for a in acts] for acts in result["actions"]]
        # 100k+ events: formatting each as text is 3x faster than json.dumps on dicts.
        events = []  # device by device, each in its run order
        for d, (acts, st, en) in enumerate(
            zip(names, result["starts"], result["ends"], strict=True)
        ):
            events += [
                f'{{"device":{d},"action":"{a}","start":{s!r},"end":{e!r}}}'
                for a, s, e in zip(acts, st, en, strict=True)
            ]
        head = {"schedule": sched.name, "devices": names}
        tail = {k: result[k] for k in ("makespan", "bubble_fraction", "peak_activations")}
        text = json.dumps(head, separators=(",", ":"), allow_nan=False)[:-1]
        text += ',"events":[' + ",".join(events) + "],"
        text += json.dumps(tail, separators=(",", ":"), allow_nan=False)[1:]
        out.write(text + "\n")
        return
    p, v = sched.num_devices, sched.chunks
    out.write(
        f"{sched.name}: {p} devices x {v} chunk(s) = {sched.stages} stages, "
        f"{sched.microbatches} micro-batches"
        + (
            f" (unsplit: each action costs {sched.batch_scale} micro-batches)\n"
            if sched.batch_scale > 1
            else "\n"
        )
    )
    width = max(len(str(a)) for acts in result["actions"] for a in acts)
    for d, acts in enumerate(result["actions"]):
        out.write(f"device {d}: " + " ".join(f"{str(a):>{width}}" for a in acts) + "\n")
    makespan = result["makespan"]
    out.write(f"makespan: {makespan:g} units\n")
    out.write(f"bubble: {100 * result['bubble_fraction']:.1f}% of devices x makespan idle\n")
    out.write("device  busy      idle      peak activations\n")
    for d in range(p):
        busy = result["busy"][d]
        peak = result["peak_activations"][d]
        out.write(f"{d:>6}  {busy:<8g}  {makespan - busy:<8g}  {peak}\n")
