"""What several commands share: the schedule and cost flags, and checks that name the flag."""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
from collections.abc import Callable
from typing import TypeVar

from course_utils import validation
from course_utils.errors import CourseInputError, Terminated
from course_utils.parallel.costs import ALGORITHMS

T = TypeVar("T")


def flag_value(args: argparse.Namespace, flag: str):
    """What argparse stored for `--flag` (its dest: no leading dashes, "-" read as "_")."""
    return getattr(args, flag.lstrip("-").replace("-", "_"))


def int_flag(args: argparse.Namespace, flag: str, low: int = 1, high: int | None = None) -> int:
    """The value of `--flag` as an int in [low, high], or a one-line error naming the flag."""
    return validation.integer(flag_value(args, flag), flag, low, high)


def number_flag(
    args: argparse.Namespace,
    flag: str,
    low: float = 0.0,
    high: float = math.inf,
    strict: bool = False,
) -> float:
    """The value of `--flag` as a finite float >= low (> low if strict) and <= high."""
    return validation.number(flag_value(args, flag), flag, low, high, strict)


def _terminated(signum, frame) -> None:
    raise Terminated(128 + signum)


def exit_on_sigterm() -> None:
    """SIGTERM unwinds the command like Ctrl-C (exit 143), so its `finally` blocks stop the
    processes it started (grade's workers, distributed's ranks) instead of leaving them."""
    try:
        signal.signal(signal.SIGTERM, _terminated)
    except ValueError:  # not the main thread (main() called from a thread): no handler
        pass


def add_max_actions(parser: argparse.ArgumentParser, default: int) -> None:
    parser.add_argument(
        "--max-actions",
        type=int,
        default=default,
        help=f"limit: refuse schedules of more compute actions (default {default:,}); raising "
        f"it works while the run is predicted to need under {validation.MEMORY_BUDGET / 1e9:g} "
        "GB and under half of the memory available now",
    )


def check_size(args: argparse.Namespace, use: str, default: int) -> None:
    """Refuse a schedule bigger than --max-actions before building it; a --max-actions
    raised above `default` holds only while the predicted memory fits (`use`: table, json
    or gantt; see `validation.check_actions`)."""
    from course_utils.pipeline.schedules import count_actions

    p, m, v = (int_flag(args, flag) for flag in ("--devices", "--microbatches", "--chunks"))
    actions = count_actions(args.name, p, m, v)
    validation.check_actions(
        actions,
        args.max_actions,
        "--max-actions",
        use=use,
        default=default,
        what=f"{args.name} on {p} devices x {m} micro-batches",
    )


def add_devices_argument(parser: argparse.ArgumentParser, short: bool, help: str, **kw) -> None:
    """--devices P (-p where `short`); --stages, its name before V schedules put several stages
    on a device, still works."""
    flags = ("-p", "--devices", "--stages") if short else ("--devices", "--stages")
    parser.add_argument(*flags, dest="devices", type=int, help=f"{help} (--stages: the same)", **kw)


def add_schedule_arguments(parser: argparse.ArgumentParser, short: bool = False) -> None:
    """The schedule name, p, m, v and the cost flags (the `schedule` and `gantt` commands)."""
    from course_utils.pipeline.schedules import SCHEDULES

    parser.add_argument("name", help=f"the schedule: {', '.join(SCHEDULES)}")
    names = (lambda s, long: (s, long)) if short else (lambda s, long: (long,))
    add_devices_argument(parser, short, required=True, help="devices P")
    parser.add_argument(
        *names("-m", "--microbatches"), type=int, required=True, help="micro-batches M"
    )
    with_chunks = ", ".join(n for n, info in SCHEDULES.items() if info.uses_chunks)
    parser.add_argument(
        *names("-v", "--chunks"), type=int, default=1, help=f"stages per device V ({with_chunks})"
    )
    add_cost_arguments(parser)


def add_cost_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--forward-cost",
        type=float,
        default=1.0,
        help="F: one micro-batch through a device's share",
    )
    parser.add_argument("--backward-cost", type=float, default=2.0, help="B: its backward")
    parser.add_argument(
        "--weight-cost",
        type=float,
        default=None,
        help="W: the weight-gradient part of B (zero-bubble schedules; default B/2)",
    )
    parser.add_argument("--p2p-cost", type=float, default=0.0, help="transfer between devices")


def costs_from_args(args: argparse.Namespace):
    """The CostModel the cost flags describe (one-line errors naming the flag)."""
    from course_utils.pipeline.simulate import CostModel

    flags = {k: f"--{k.replace('_', '-')}-cost" for k in ("forward", "backward", "weight", "p2p")}
    return CostModel.from_times(
        args.forward_cost, args.backward_cost, args.weight_cost, args.p2p_cost, names=flags
    )


def schedule_from_args(args: argparse.Namespace):
    """The schedule the name, --devices, --microbatches and --chunks flags describe (its size
    checked first where the command has --max-actions)."""
    from course_utils.pipeline.schedules import check_shape, make_schedule, schedule_info

    schedule_info(args.name)  # an unknown name is the first thing to say
    p, m, v = (int_flag(args, flag) for flag in ("--devices", "--microbatches", "--chunks"))
    limit = getattr(args, "max_actions", validation.MAX_ACTIONS)
    try:
        check_shape(args.name, p, m, v, limit)
    except CourseInputError as exc:  # the library names its arguments, not the flags
        raise CourseInputError(
            f"--devices {p}, --microbatches {m}, --chunks {v} do not fit {args.name}: {exc}"
        ) from None
    return make_schedule(args.name, p, m, v, limit)


# -- the clock and the emulated cluster (run, data-parallel, tensor-parallel, fsdp, ...) ------


def add_network_arguments(group) -> None:
    """The cluster's network flags, shared by the planner and the commands that run threads."""
    from course_utils.plan.inputs import DEFAULT_GPU, HARDWARE_PRESETS

    group.add_argument(
        "--gpu",
        choices=list(HARDWARE_PRESETS),
        default=DEFAULT_GPU,
        help="GPU preset: memory, peak FLOP/s, NVLink and network per GPU",
    )
    group.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (NVSwitch)")
    group.add_argument(
        "--intra-node-gbs", type=float, default=None, help="GB/s per GPU per direction in a node"
    )
    group.add_argument(
        "--inter-node-gbs",
        type=float,
        default=None,
        help="GB/s per GPU per direction between nodes",
    )
    group.add_argument("--latency-us", type=float, default=None, help="microseconds per message")


def hardware_flag(args: argparse.Namespace, flag: str, key: str) -> float:
    """The value of a flag that sets the hardware's number `key`, in the range the planner's
    `Hardware` allows it (`plan.inputs.HARDWARE_RANGES`: every figure derived stays finite)."""
    from course_utils.plan.inputs import HARDWARE_RANGES

    low, high = HARDWARE_RANGES[key]
    if key == "gpus_per_node":
        return int_flag(args, flag, int(low), int(high))
    return number_flag(args, flag, low, high)


def network_changes(args: argparse.Namespace) -> dict:
    """The preset's numbers the network flags change (each checked, naming its flag)."""
    changes: dict = {}
    for flag in ("--gpus-per-node", "--intra-node-gbs", "--inter-node-gbs", "--latency-us"):
        key = flag[2:].replace("-", "_")
        if getattr(args, key) is not None:
            changes[key] = hardware_flag(args, flag, key)
    return changes


def add_clock_arguments(parser: argparse.ArgumentParser) -> None:
    """--clock and the emulated cluster it runs on (the planner's hardware presets)."""
    from course_utils.threads.trace import CLOCKS

    group = parser.add_argument_group(
        "the clock and the emulated cluster",
        "virtual (default): each device computes for its own measured CPU time and messages "
        "cross emulated links of the GPU preset below, scaled to this machine (so ratios are "
        "the cluster's on any computer); wall: real timestamps on this machine's cores",
    )
    group.add_argument(
        "--clock", choices=CLOCKS, default="virtual", help="which clock times the run"
    )
    add_network_arguments(group)


def clock_words(args: argparse.Namespace, links) -> str:
    """How the run was timed, in the words every timed command prints."""
    if args.clock == "wall":
        return "wall clock: real timestamps on this machine's cores"
    return f"virtual clock: measured compute, {links.describe()}"


def add_allreduce_argument(parser: argparse.ArgumentParser) -> None:
    """--allreduce: which of the threads' all-reduce algorithms sums the gradients."""
    parser.add_argument(
        "--allreduce", default="ring", help=f"all-reduce algorithm: {', '.join(ALGORITHMS)}"
    )


def allreduce_from_args(args: argparse.Namespace) -> str:
    """--allreduce if it names an algorithm, else a one-line error."""
    if args.allreduce not in ALGORITHMS:
        raise CourseInputError(
            f"--allreduce must be one of {', '.join(ALGORITHMS)}, got {args.allreduce!r}"
        )
    return args.allreduce


def links_from_args(args: argparse.Namespace):
    """The emulated links the flags describe. Call it after the command's other checks:
    the flags are checked first, then this machine's compute rate is measured (torch)."""
    from course_utils.threads.links import cluster_links

    changes = network_changes(args)
    return cluster_links(args.gpu, **changes)


def fastest_run(run: Callable[[], T], repeats: int = 3) -> T:
    """Call `run` once to warm up (first calls allocate and initialise), then `repeats` times;
    the runs put together (`measure.timing.least_disturbed`: on the virtual clock every
    compute burst at its least CPU time, since other work only ever adds time)."""
    from course_utils.measure.timing import least_disturbed

    run()
    return least_disturbed([run() for _ in range(repeats)])


def add_json_and_clock_arguments(parser: argparse.ArgumentParser) -> None:
    """--json, --trace and the clock flags: what `printed_as_json` and `write_trace` read, in
    the commands that use them."""
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_trace_argument(parser)
    add_clock_arguments(parser)


# -- --trace: the measured step as a Chrome trace (course_utils.chrome_trace) ----------------


def add_trace_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace",
        default=None,
        metavar="JSON",
        help="write the measured step's timeline as a Chrome trace (a .json file that "
        "ui.perfetto.dev and chrome://tracing open: a track per device and per communication "
        "stream, the clock named)",
    )


def check_trace(args: argparse.Namespace) -> None:
    """--trace names a .json file that can be written (checked before any work is done)."""
    if args.trace is None:
        return
    if isinstance(args.trace, str) and os.path.isdir(args.trace):
        raise CourseInputError(
            f"--trace {args.trace!r} is a folder: give a file name ending in .json"
        )
    validation.output_file(args.trace, "--trace", (".json",))


def write_trace(args: argparse.Namespace, timeline, title: str) -> None:
    """Write `timeline` to --trace, if given, and say so (not with --json: stdout is JSON)."""
    if args.trace is None:
        return
    try:
        timeline.write_chrome_trace(args.trace, title)
    except OSError as exc:
        raise CourseInputError(
            f"--trace: cannot write {args.trace!r}: {exc.strerror or exc}"
        ) from None
    if not getattr(args, "json", False):
        from course_utils.chrome_trace import clock_of

        print(
            f"wrote {args.trace} (Chrome trace of the measured step, {clock_of(timeline)}: "
            "open it in ui.perfetto.dev or chrome://tracing)"
        )


def printed_as_json(args: argparse.Namespace, links, result: dict) -> bool:
    """Add the keys every timed command reports to `result`; with --json, print it and say
    so (the command is then done)."""
    result.update(clock_figures(args, links, result["measured_step_s"], result["simulated_step_s"]))
    if args.json:
        print(json.dumps(result, indent=2, allow_nan=False))
    return bool(args.json)


def clock_figures(args: argparse.Namespace, links, measured_s: float, simulated_s: float) -> dict:
    """The keys every timed command reports in --json, whatever it runs."""
    return {
        "clock": args.clock,
        "links": links.to_dict() if args.clock == "virtual" else None,
        "measured_step_s": measured_s,
        "simulated_step_s": simulated_s,
    }
