"""Sentences about measurements, computed from the measurements.

A lesson's markdown states the theory and what to look for; it never says what the
learner's own timing will show, because that depends on their machine. What the
measurement did show is printed by these functions, from the numbers measured and from the
capacity probe (how much faster 2 threads ran than 1 just before). Each returns plain
sentences; tests/test_conclusions.py checks them on a machine with two free cores, on one
core, and in between, so no sentence can contradict the numbers it prints.
"""

from __future__ import annotations

from collections.abc import Sequence

from course_utils.measure.capacity import Capacity

NOISE = 0.1  # differences below 10% are within what a shared machine varies by


def speedup(
    what: str, measured: float, ideal: float, capacity: Capacity, where: str = "this machine"
) -> str:
    """How a measured parallel speed-up compares with the ideal and with the machine.

    `measured` = time of the one-device (or unsplit) run / time of the parallel run;
    `ideal` = what the schedule or method allows with free communication and equal work;
    `where` names the machine, e.g. "the reference machine" for a recording.
    """
    cap = capacity.speedup
    bound = min(ideal, max(cap, 1.0))
    text = f"{what} ran {measured:.2f}x as fast as the baseline (ideal {ideal:.2f}x). "
    text += f"Just before, 2 threads ran {cap:.2f}x as fast as 1 on {where}"
    if capacity.regime == "one core":
        text += ", so the threads took turns and no speed-up could show: "
        if measured < 1 - NOISE:
            return (
                text + "the parallel version even lost time to its extra work (threads, messages)."
            )
        return text + f"{measured:.2f}x is what turns on one core give."
    text += f", so {bound:.2f}x was the most this run could reach here. "
    reached = measured / bound if bound > 0 else 0.0
    if reached >= 1 - NOISE:
        return text + f"It reached {reached:.0%} of that: as good as this machine allows."
    if measured < 1 - NOISE:
        return text + (
            f"It was slower than the baseline: the extra work (threads, messages) cost more "
            f"than the {cap:.2f}x of parallel compute gave back."
        )
    return text + (
        f"It reached {reached:.0%} of that: the rest went to overheads (messages, waiting, "
        "uneven work) or to other programs on the machine."
    )


def ratio(a_name: str, a: float, b_name: str, b: float, unit: str = "s") -> str:
    """Which of two times was shorter, and by how much, or that they are within noise."""
    if a <= 0 or b <= 0:
        return f"{a_name} took {a:.3g} {unit} and {b_name} {b:.3g} {unit}."
    faster, slower = (a_name, b_name) if a < b else (b_name, a_name)
    factor = max(a, b) / min(a, b)
    if factor - 1 < NOISE:
        return (
            f"{a_name} ({a:.3g} {unit}) and {b_name} ({b:.3g} {unit}) took the same time "
            f"within noise ({factor - 1:.0%} apart)."
        )
    quick, slow = min(a, b), max(a, b)  # the times in the order the sentence names them
    return f"{faster} was {factor:.2f}x as fast as {slower} ({quick:.3g} vs {slow:.3g} {unit})."


def trend(
    xs: Sequence[float], ys: Sequence[float], x_name: str, y_name: str, where: str = "this machine"
) -> str:
    """The shape of a measured curve in words: rises, falls, rises then falls, or flat.

    Steps smaller than NOISE (relative to the largest value) do not count as a change of
    direction, so a wobble on a busy machine is not called a peak.
    """
    if len(xs) != len(ys) or len(ys) < 2:
        return f"Too few points to say how {y_name} changes with {x_name}."
    on = f"On {where}"
    top = max(abs(y) for y in ys) or 1.0
    best = max(range(len(ys)), key=lambda i: ys[i])
    rise = ys[best] - ys[0] > NOISE * top
    fall = ys[best] - ys[-1] > NOISE * top
    peak = f"{y_name} was highest at {x_name} = {xs[best]:g}"
    if rise and fall:
        return f"{on} {y_name} rose, then fell: {peak}."
    if rise:
        return f"{on} {y_name} only rose over the range measured: {peak}."
    if ys[0] - ys[-1] > NOISE * top:
        where = "the first point" if best == 0 else "within noise of the first point"
        return f"{on} {y_name} only fell as {x_name} grew: {peak}, {where}."
    return f"{on} {y_name} stayed flat within noise over the range measured."


def follows(
    xs: Sequence[float],
    measured: Sequence[float],
    model: Sequence[float],
    x_name: str,
    what: str,
    tolerance: float,
) -> str:
    """Where a measured curve stays within `tolerance` of a model's, and where it leaves it."""
    gaps = [m - f for m, f in zip(measured, model, strict=True)]
    close = [abs(g) <= tolerance for g in gaps]
    if all(close):
        return f"The measured {what} stayed within {tolerance:g} of the formula at every {x_name}."
    first = close.index(False)
    worst = max(range(len(gaps)), key=lambda i: abs(gaps[i]))
    side = "above" if gaps[worst] > 0 else "below"
    if first == 0:
        within = "left the formula from the first point and"
    elif first == 1:
        within = f"stayed within {tolerance:g} of the formula only at {x_name} = {xs[0]:g}, then"
    else:
        within = (
            f"stayed within {tolerance:g} of the formula up to {x_name} = {xs[first - 1]:g}, then"
        )

    return (
        f"The measured {what} {within} was {abs(gaps[worst]):.2f} {side} it at "
        f"{x_name} = {xs[worst]:g}."
    )


def overlap(what: str, overlap_s: float, makespan_s: float, capacity: Capacity) -> str:
    """How long measured bars overlapped in a schedule where, in theory, none can.

    In the naive schedule a device starts only once the one before has handed it its
    tensor, so one device computes at a time. A measured chart can still show two bars at
    the same moment: the thread that handed over records the end of its bar after the
    hand-over, and on a busy or single core it may wait for the core before it can.
    `overlap_s` = time during which two or more devices had a bar; `makespan_s` = the step.
    """
    if overlap_s <= 0:
        return f"{what}: no two bars overlapped; one device computed at a time, as in theory."
    share = overlap_s / makespan_s if makespan_s > 0 else 1.0
    text = (
        f"{what}: two or more devices had a bar at the same moment for {1e3 * overlap_s:.2f} ms "
        f"in total, {share:.1%} of the {1e3 * makespan_s:.1f} ms step"
    )
    after = (
        "A device starts only once the one before has handed it its tensor, and the thread "
        "that handed over records the end of its bar just after"
    )
    if share < NOISE:
        return f"{text}: the hand-overs. {after}; the work still went one device at a time."
    cap = capacity.speedup
    text += f", more than a hand-over takes. Just before, 2 threads ran {cap:.2f}x as fast as 1"
    if capacity.regime == "one core":
        why = (
            ": the threads took turns on one core, so a thread that had handed its tensor on "
            "could wait for the core, while the next device computed, before it recorded the "
            "end of its bar."
        )
    else:
        why = (
            ", yet a thread can still be held up between the hand-over and recording the end "
            "of its bar: by another program on a core, or by Python's lock that lets one "
            "thread at a time run Python code."
        )
    return (
        f"{text}{why} Those overlaps are waiting drawn as work: {after[0].lower()}{after[1:]}, "
        "so the work itself still went one device at a time."
    )


def gain(
    what: str,
    baseline: str,
    measured: float,
    predicted: float,
    capacity: Capacity,
    where: str = "this machine",
) -> str:
    """How much faster one schedule ran than another, against the simulator's prediction.

    `measured` = the baseline's time / `what`'s time, both measured on this machine just now;
    `predicted` = the same ratio from the simulator given this run's measured costs, i.e.
    for devices that really run at the same time. On one core the device threads take turns,
    so the time one device spends waiting is used by another thread: a schedule that waits
    less cannot show its gain there. A predicted difference within NOISE is never called
    confirmed or refuted. `where` names the machine, e.g. "the reference machine".
    """
    cap = capacity.speedup
    text = (
        f"{what} ran {measured:.2f}x as fast as {baseline}; the simulator, given this run's "
        f"measured costs, predicted {predicted:.2f}x. Just before, 2 threads ran {cap:.2f}x "
        f"as fast as 1 on {where}"
    )
    if capacity.regime == "one core":
        return text + (
            ", so the threads took turns: while one device waited, another computed, and a "
            "schedule that waits less could not gain here. The prediction is for devices "
            "that really run at the same time."
        )
    text += ". "
    if abs(predicted - 1) < NOISE:
        return text + (
            f"A predicted difference of {abs(predicted - 1):.0%} is within what a shared "
            f"machine varies by ({NOISE:.0%}), so this run can neither confirm nor refute it."
        )
    if abs(measured / predicted - 1) <= NOISE:
        return text + "The measured ratio matched the prediction within noise."
    if predicted < 1:
        lost = "lost less" if measured > predicted else "lost more"
        return text + (
            f"It was predicted to be slower, and it {lost} than predicted: costs the "
            "simulator leaves out (hand-overs between threads) or other programs made the "
            "difference."
        )
    shared = (
        " (another program was using a core, so it also filled some of the waiting)"
        if capacity.regime == "shared cores"
        else ""
    )
    if predicted > 1 and measured > predicted:
        return text + (
            f"It gained more than predicted{shared}: the baseline's best run was probably "
            "disturbed by other programs."
        )
    if measured > 1 + NOISE:
        return text + (
            f"It gained, but less than predicted{shared}: the rest went to costs the simulator "
            "leaves out (hand-overs between threads, waking them up) or to other programs."
        )
    if measured >= 1 - NOISE:
        return text + (
            f"No difference showed beyond noise{shared}: the costs the simulator leaves out "
            "(hand-overs between threads, waking them up) or other programs ate the gain."
        )
    return text + (
        f"It was slower than {baseline}{shared}: its extra costs (more hand-overs, smaller "
        "pieces of work) outweighed the waiting it saves."
    )


def slowdown(
    what: str, baseline: str, measured: float, predicted: float, capacity: Capacity
) -> str:
    """A measured slow-down (time of `what` / time of `baseline`) against a simulator's.

    The simulator lets workers compute at the same time, so uneven work makes the others
    wait for the slowest (a straggler). Threads that take turns on one core cannot show
    that wait: a step then costs the work of all workers together, however it is split.
    """
    cap = capacity.speedup
    text = (
        f"{what} took {measured:.2f}x as long as {baseline}; the simulator, whose workers "
        f"compute at the same time, predicts {predicted:.2f}x. Just before, 2 threads ran "
        f"{cap:.2f}x as fast as 1 on this machine"
    )
    if capacity.regime == "one core":
        text += (
            ", so the threads took turns: a step cost about the work of all workers "
            "together however it was split, and no worker sat idle waiting for another"
        )
        if abs(measured - 1) <= NOISE:
            return text + ". Here the two took the same time within noise."
        return text + f". The {measured:.2f}x measured here is not that wait."
    gap = measured / predicted - 1 if predicted > 0 else 0.0
    if abs(gap) <= NOISE:
        return text + ". The measurement agreed with the prediction within 10%."
    if gap < 0:
        hidden = (
            " (with a core shared, the threads partly took turns, which hides waiting)"
            if capacity.regime == "shared cores"
            else ""
        )
        return text + f". The measurement stayed {-gap:.0%} below the prediction{hidden}."
    return text + (
        f". The measurement was {gap:.0%} above the prediction: costs the model leaves out "
        "(messages, waking threads, other programs)."
    )


def clocks_agree(virtual_s: float, wall_s: float, capacity: Capacity) -> str:
    """One run drawn on both clocks: whether they agree, and why (from the capacity probe).

    The virtual clock counts each device's own compute; the wall clock what the machine's
    cores did. They can only agree when every device thread had a core of its own.
    """
    apart = wall_s / virtual_s - 1 if virtual_s > 0 else float("inf")
    text = (
        f"The same step took {1e3 * virtual_s:.1f} ms on the virtual clock and "
        f"{1e3 * wall_s:.1f} ms on the wall clock"
    )
    if abs(apart) <= NOISE:
        text += f": they agree within {abs(apart):.0%}"
        if capacity.regime == "two free cores":
            return text + ", as they should with two free cores for two devices."
        return text + (
            ", although the probe found the cores busy: the other program must have "
            "paused while this step ran."
        )
    text += f" ({wall_s / virtual_s:.2f}x as long on the wall)"
    if capacity.regime == "one core":
        return text + (
            ": the two threads took turns on one core, so the wall clock measured the "
            "machine; the virtual clock still says what two devices would do."
        )
    if capacity.regime == "shared cores":
        return text + (
            ": another program shared a core, so the threads partly took turns; the "
            "virtual clock does not count that time."
        )
    return text + (
        ": with two free cores the rest is what the virtual clock leaves out (waking "
        "threads, Python's lock that lets one thread at a time run Python code)."
    )


def step_table(measured: dict, predicted: dict, timings: dict | None = None) -> str:
    """A table: per variant its measured step and idle time per device, the simulator's, and
    (with `timings`, from `timing.compare`) how many runs were timed and their spread.

    `measured` and `predicted` map a name to a Timeline in seconds.
    """

    def idle_ms(timeline) -> float:
        devices = range(timeline.num_devices)
        return 1e3 * sum(timeline.idle(d) for d in devices) / max(1, timeline.num_devices)

    width = max(len(str(name)) for name in measured)
    lines = [f"{'':>{width}}  step (ms)  idle/device   simulated: step, idle    runs, spread"]
    for name, tl in measured.items():
        sim = predicted[name]
        row = (
            f"{name!s:>{width}}  {1e3 * tl.makespan:9.2f}  {idle_ms(tl):11.2f}"
            f"   {1e3 * sim.makespan:15.2f}, {idle_ms(sim):5.2f}"
        )
        if timings is not None:
            t = timings[name]
            row += f"    {len(t.samples):4d}, {t.spread:.0%}"
        lines.append(row)
    return "\n".join(lines)
