"""Run a pipeline schedule for real: one CPU thread per device, real torch work, real clocks.

`PipelineExecutor(stages, num_devices)` runs `step(schedule, inputs, targets)`: every
device runs its action list exactly in the order the schedule gives it, and a stage lives
on the device whose list runs it (`Schedule.device_of_stage()`: s % num_devices for the
looping schedules, a V for ZB-V and DualPipeV, where device d holds stages d and 2p-1-d):

    F  forward one micro-batch through the stage; keep the input and output for backward;
       post the output in the next stage's mailbox
    B  backward: gradient of the loss (last stage) or of the output received from the next
       stage; accumulates parameter gradients and posts the input gradient backwards
    I  zero-bubble input gradient only (Qi et al. 2024, arXiv 2401.10241): posts the input
       gradient backwards early and keeps the graph for W
    W  zero-bubble weight gradient: each module's parameter gradients, from the output
       gradients I kept (like torch.distributed.pipelining's stage_backward_weight)

A device blocks when it needs a message that has not arrived yet; that waiting is the
pipeline bubble, and it shows in the measured `Timeline` exactly as in the simulated one.
A schedule with `send_groups` (DualPipeV, as DeepSeek's dualpipev.py) holds the outputs of
a group of consecutive actions for another device until the group's last action ends; an
output for the device itself (the turn of a V) is handed over at once.
(Explicit communication actions such as SEND_F or RECV_B are skipped: on threads sharing
memory a message is just a tensor handed over in a mailbox by F, B and I themselves.)
Each micro-batch's loss is scaled by 1/m so the accumulated gradients equal those of the
full-batch mean loss; the tests check them against the unsplit model.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from course_utils import validation
from course_utils.actions import ACTIVATIONS, INPUT_GRAD, KIND_NAMES, KINDS, Action, Schedule
from course_utils.errors import CourseInputError, ScheduleError, WorkerError
from course_utils.pipeline.simulate import structure_problems
from course_utils.pipeline.zero_bubble import backward_input, backward_weight, forward_recording
from course_utils.threads.devices import Aborted, DeviceThreads, ThreadRunner
from course_utils.threads.links import Links
from course_utils.threads.mailboxes import Mailboxes, Message
from course_utils.threads.trace import Recorder, Stream, check_clock
from course_utils.timeline import Event, Timeline
from course_utils.validation import MAX_PIPELINE_DEVICES, MAX_PIPELINE_STAGES

# A message between stages is keyed ("act" | "grad", receiving stage, micro-batch): what
# the receiver needs from the stage at `offset` from its own (KINDS[kind].needs).
_MESSAGE_OF = {(-1, ACTIVATIONS): "act", (1, INPUT_GRAD): "grad"}
_MESSAGES = {name: key for key, name in _MESSAGE_OF.items()}


@dataclass
class StageCosts:
    """Measured mean seconds per micro-batch of each stage (what the simulator needs)."""

    forward: list[float]
    backward: list[float]  # B, or I + W for zero-bubble schedules
    weight_fraction: float | None = None  # W / (I + W) when the schedule splits backward


@dataclass
class StepResult:
    """One step: the full-batch mean loss, what each device did when, and stage costs.

    `timeline` is on the executor's clock; `trace` is the recording it came from, so the
    same step can be drawn on the other clock too. Run on the wall clock to see both: there
    the devices compute at once and `trace.timeline("virtual", links)` is the same run on the
    virtual clock, while a virtual-clock run's devices take turns on one core, so its
    `trace.timeline("wall")` shows them one after another. `message_bytes` is the mean size
    of a message between stages, per micro-batch.
    """

    loss: float
    timeline: Timeline
    stage_costs: StageCosts
    microbatch_losses: list[float] = field(default_factory=list)
    wall_time_s: float = 0.0
    trace: Recorder | None = None
    links: Links | None = None
    message_bytes: float = 0.0
    schedule: Schedule | None = None  # the schedule this step ran

    @property
    def step_s(self) -> float:
        """The step's time on the timeline's clock (its makespan)."""
        return self.timeline.makespan

    def retimed(self, trace: Recorder) -> StepResult:
        """This step on the virtual clock from another recording of it (`measure.timing`
        puts several runs together), its stage costs read again from the new timeline."""
        timeline = trace.timeline("virtual")
        costs = self.stage_costs
        if self.schedule is not None:
            costs = _stage_costs(timeline.events, self.schedule)
        links = trace.links if trace.links is not None else self.links
        return replace(self, timeline=timeline, trace=trace, stage_costs=costs, links=links)


# --------------------------------------------------------------------------- the executor


def _module_list(stages) -> list[nn.Module]:
    """`stages` as a non-empty list of modules (a list, tuple or ModuleList of them), else one
    line: one module is not a list of stages."""
    if isinstance(stages, nn.Module) and not isinstance(stages, nn.ModuleList | nn.Sequential):
        raise CourseInputError(
            f"stages must be a list of modules, one per stage (partition(model, n)), got one "
            f"{type(stages).__name__}"
        )
    try:
        found = list(stages)
    except TypeError:
        found = None
    if not found or not all(isinstance(stage, nn.Module) for stage in found):
        raise CourseInputError(f"stages must be a non-empty list of modules, got {stages!r:.80}")
    return found


class PipelineExecutor(ThreadRunner):
    """Runs pipeline schedules on `num_devices` persistent threads (placement: the schedule's)."""

    def __init__(
        self,
        stages: Sequence[nn.Module],
        num_devices: int,
        loss_fn=None,
        step_timeout: float | None = 300.0,
        clock: str = "virtual",
        links: Links | None = None,
    ) -> None:
        check_clock(clock)
        if links is not None and not isinstance(links, Links):
            raise CourseInputError(
                f"links must be a Links (course_utils.threads.links), got {links!r}"
            )
        stages = _module_list(stages)
        validation.integer(num_devices, "num_devices", 1, MAX_PIPELINE_DEVICES)
        if len(stages) > MAX_PIPELINE_STAGES:  # the `run` command's limits
            raise CourseInputError(
                f"stages must hold at most {MAX_PIPELINE_STAGES} modules, got {len(stages)}"
            )
        if len(stages) % num_devices:
            raise CourseInputError(
                f"the number of stages ({len(stages)}) must be a multiple of num_devices "
                f"({num_devices}) so each device holds the same number of chunks"
            )
        if step_timeout is not None and not (
            isinstance(step_timeout, int | float) and 0 < step_timeout < float("inf")
        ):
            raise CourseInputError(
                f"step_timeout must be a finite number of seconds > 0 or None, got {step_timeout!r}"
            )
        if loss_fn is None:
            from course_utils.models import loss_fn
        self.stages = list(stages)
        self.num_devices = num_devices
        self.loss_fn = loss_fn
        self.step_timeout = step_timeout
        self.clock = clock
        if links is None and clock == "virtual":
            from course_utils.threads.clock import default_links

            links = default_links()
        self.links = links
        self.threads = DeviceThreads(num_devices, name="device", one_core=clock == "virtual")

    def parameters(self):
        for stage in self.stages:
            yield from stage.parameters()

    # -- one training step ---------------------------------------------------------------

    def step(
        self,
        schedule: Schedule,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        optimizer: torch.optim.Optimizer | None = None,
        fail_at: str | Action | None = None,
    ) -> StepResult:
        """One training step: run `schedule` on the batch, then `optimizer.step()` if given.

        Gradients are reset at the start (so after the step they are this batch's).
        """
        n_mb = self._check(schedule)
        fail = self._check_fail_at(schedule, fail_at)
        if len(inputs) != len(targets):
            raise CourseInputError("inputs and targets must have the same batch size")
        if len(inputs) % n_mb:
            raise CourseInputError(
                f"batch size {len(inputs)} must be divisible by the {n_mb} micro-batches"
            )
        size = len(inputs) // n_mb
        xs, ys = inputs.split(size), targets.split(size)
        for p in self.parameters():
            p.grad = None
        run = _Run(self, schedule, xs, ys, fail)
        fns = [lambda d=d: run.device(d) for d in range(self.num_devices)]
        t0 = time.perf_counter()
        try:
            with run.trace:
                self.threads.run(fns, timeout=self.step_timeout)
        except WorkerError as err:
            if isinstance(err.__cause__, ScheduleError):
                raise ScheduleError(str(err.__cause__)) from err.__cause__
            if err.__cause__ is None and "timed out" in str(err):
                raise WorkerError(
                    f"the step ran past its limit of {self.step_timeout:g} s (step_timeout), "
                    f"stopped while {run.progress()}"
                ) from err
            raise
        wall = time.perf_counter() - t0
        if optimizer is not None:
            optimizer.step()
        return run.result(wall)

    def _check(self, schedule: Schedule) -> int:
        """Structural problems fail fast; returns the number of micro-batch chunks."""
        if not isinstance(schedule, Schedule):
            raise CourseInputError(
                "schedule must be a Schedule (see course_utils.pipeline.schedules)"
            )
        if schedule.num_devices != self.num_devices or schedule.stages != len(self.stages):
            raise CourseInputError(
                f"schedule is for {schedule.num_devices} devices and {schedule.stages} stages, "
                f"but this executor has {self.num_devices} devices and {len(self.stages)} stages"
            )
        n_mb = schedule.numbered  # naive: one whole batch
        devices = [list(actions) for actions in schedule.devices]
        # The simulator's checks: each action once, nothing missing, and each stage on one
        # device. The placement itself is the schedule's (looping, V, ...): the executor's
        # threads share the stage modules, so any placement the lists define can run.
        problems = structure_problems(devices, schedule.stages, n_mb)
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise ScheduleError(f"{schedule.name}: " + "; ".join(problems[:5]) + more)
        return n_mb

    @staticmethod
    def _check_fail_at(schedule: Schedule, fail_at) -> Action | None:
        if fail_at is None:
            return None
        action = Action.parse(fail_at)
        if not any(action in actions for actions in schedule.devices):
            raise CourseInputError(f"fail_at must be an action of the schedule, got {action}")
        return action


class _Run:
    """The state of one step: messages, saved activations, measured events."""

    def __init__(self, ex: PipelineExecutor, schedule: Schedule, xs, ys, fail: Action | None):
        self.ex, self.schedule, self.xs, self.ys, self.fail = ex, schedule, xs, ys, fail
        self.last = len(ex.stages) - 1
        self.scale = 1.0 / len(xs)  # mean over micro-batches = full-batch mean loss
        self.mail = Mailboxes(ex.num_devices, ex.threads.abort)
        self.trace = Recorder()
        self.streams = [self.trace.stream(d) for d in range(ex.num_devices)]
        self.owner = schedule.device_of_stage()
        self.sent_bytes: list[int] = []  # every message between devices (any thread appends)
        self.held: list[list[Message]] = [[] for _ in range(ex.num_devices)]  # send groups
        self.peaks = [0] * ex.num_devices
        self.current: list[Action | None] = [None] * ex.num_devices  # what each device runs
        self.losses: dict[int, float] = {}
        # record module outputs during F only when the schedule splits backward into I and W
        self.split = any(a.kind == "I" for acts in schedule.devices for a in acts)
        # The kind that makes each product in this schedule (the input gradient: B, or I).
        self.maker = {
            KINDS[a.kind].produces: a.kind
            for acts in schedule.devices
            for a in acts
            if KINDS[a.kind].produces
        }

    # Each device thread runs this over its own action list.
    def device(self, d: int) -> None:
        saved: dict[tuple[int, int], dict] = {}  # (stage, mb) -> what backward needs
        held = 0
        ends_group = _group_ends(self.schedule, d)
        try:
            for i, action in enumerate(self.schedule.devices[d]):
                if self.ex.threads.abort.is_set():
                    raise Aborted(f"device {d} stopped before {action}")
                if not action.is_compute:
                    continue  # communication is implicit: F/B post and take their messages
                self.current[d] = action
                self._do(d, action, saved)
                if ends_group[i]:  # outputs held for the end of the group leave now
                    for message in self.held[d]:
                        self._post(self.streams[d], message)
                    self.held[d].clear()
                held += KINDS[action.kind].holds  # +1 at F, -1 when its memory is freed
                self.peaks[d] = max(self.peaks[d], held)
        except BaseException:
            # Tell peers before this device counts as finished, so they give up (Aborted)
            # instead of mistaking the failure for a deadlock.
            self.ex.threads.abort.set()
            raise
        finally:
            self.mail.finished(d)

    def progress(self) -> str:
        """'device 0 ran 0F3, device 1 ran 1B2': the action each device was on."""
        return ", ".join(
            f"device {d} was at {a}" if a else f"device {d} had not started"
            for d, a in enumerate(self.current)
        )

    def _do(self, d: int, a: Action, saved: dict) -> None:
        s, mb = a.stage, a.microbatch
        assert mb is not None  # only compute actions (F, B, I, W) are done here
        stream = self.streams[d]
        try:
            inputs = self._receive(d, a, saved)  # waiting is idle time, not part of the action
            # The bar ends when the work does, before the hand-over: once the message is
            # posted the receiver may take the core (and the GIL) before this thread could
            # read the clock, and the bar would run on into the receiver's work.
            with stream.compute(a):
                if a == self.fail:
                    raise RuntimeError(f"deliberate failure injected at {a} (fail_at)")
                if a.kind == "F":
                    message = self._forward(s, mb, inputs, saved)
                elif a.kind == "B":
                    message = self._backward(s, mb, inputs, saved)
                elif a.kind == "I":
                    message = backward_input(saved[(s, mb)], s, mb, inputs)
                else:
                    backward_weight(saved.pop((s, mb)), self.ex.stages[s])  # W sends nothing
                    message = None
            if message is not None:
                if self.owner[message[0][1]] != d and self.schedule.send_groups is not None:
                    self.held[d].append(message)  # sent when its send group ends
                else:
                    self._post(stream, message)
        except (Aborted, ScheduleError):
            raise
        except Exception as exc:
            what = f"stage {s}, micro-batch {mb}, {KIND_NAMES[a.kind]}"
            first_line = (str(exc).splitlines() or [""])[0]
            raise WorkerError(
                f"device {d} failed in {a} ({what}): {type(exc).__name__}: {first_line}"
            ) from exc

    def _post(self, stream: Stream, message: Message) -> None:
        """Hand a message to the stage it is for; on another device it crosses a link."""
        key, tensor = message
        kind, stage, mb = key
        to_device = self.owner[stage]
        nbytes = tensor.numel() * tensor.element_size()
        if to_device != stream.device:
            self.sent_bytes.append(nbytes)
            offset, product = _MESSAGES[kind]  # the sender is the stage the receiver needs
            sends = KINDS[self.maker[product]].sends
            assert sends is not None  # F sends activations, B and I input gradients
            send = Action(stage + offset, sends, mb)
            stream.send(key, to_device, nbytes, send)
        else:
            stream.send(key, to_device, nbytes)
        self.mail.put(key, tensor)

    def _receive(self, d: int, a: Action, saved: dict):
        """The message this action needs from another stage (None if it needs none).

        What it needs is KINDS[a.kind].needs: from its own stage, what an earlier action
        on this device left in `saved`; from a neighbouring stage, a message."""
        s, mb = a.stage, a.microbatch
        message = None
        for offset, product in KINDS[a.kind].needs:
            if offset == 0:  # made on this device, by this stage
                here = saved.get((s, mb), {})
                made = bool(here) if product == ACTIVATIONS else "record_grads" in here
                if not made:
                    need = Action(s, self.maker[product], mb)
                    raise ScheduleError(f"device {d} runs {a} before {need}, which it needs")
            elif 0 <= s + offset <= self.last:
                key = (_MESSAGE_OF[offset, product], s, mb)
                what = f"the {product} of stage {s + offset} micro-batch {mb}"
                message = self.mail.get(key, d, f"{what} for {a}")
                self.streams[d].recv(key)
        return message

    def _forward(self, s: int, mb: int, received, saved: dict) -> Message | None:
        x = self.xs[mb] if s == 0 else received
        if s > 0 and x.is_floating_point():
            # a leaf of this stage's own graph, so backward stops here and yields x.grad
            x = x.detach().requires_grad_(True)
        stage = self.ex.stages[s]
        with torch.enable_grad():
            if self.split:
                out, records = forward_recording(stage, x)
            else:
                out, records = stage(x), []
            if s == self.last:
                loss = self.ex.loss_fn(out, self.ys[mb])
                self.losses[mb] = loss.item()
                out = loss * self.scale
        saved[(s, mb)] = {"x": x, "out": out, "records": records}
        return (("act", s + 1, mb), out.detach()) if s < self.last else None

    def _backward(self, s: int, mb: int, grad_out, saved: dict) -> Message | None:
        st = saved.pop((s, mb))
        torch.autograd.backward(st["out"], grad_out)  # accumulates into .grad
        x = st["x"]
        if s == 0:
            return None
        return ("grad", s - 1, mb), x.grad if x.grad is not None else x * 0

    # -- the result ----------------------------------------------------------------------

    def result(self, wall: float) -> StepResult:
        sched = self.schedule
        timeline = self.trace.timeline(
            self.ex.clock,
            self.ex.links,
            num_devices=self.ex.num_devices,
            name=sched.name,
            peak_activations=[p * sched.batch_scale for p in self.peaks],
            stages=sched.stages,
            microbatches=sched.microbatches,
            chunks=sched.chunks,
        )
        loss = sum(self.losses[mb] for mb in sorted(self.losses)) * self.scale
        sent = self.sent_bytes
        return StepResult(
            loss=loss,
            timeline=timeline,
            stage_costs=_stage_costs(timeline.events, sched),
            microbatch_losses=[self.losses[mb] for mb in sorted(self.losses)],
            wall_time_s=wall,
            trace=self.trace,
            links=self.ex.links,
            message_bytes=sum(sent) / len(sent) / sched.batch_scale if sent else 0.0,
            schedule=sched,
        )


def _group_ends(schedule: Schedule, d: int) -> list[bool]:
    """Per action of device d: whether its send group ends with it (`Schedule.send_groups`;
    without groups every action sends its output as it ends, as if it were a group alone)."""
    actions = schedule.devices[d]
    if schedule.send_groups is None:
        return [True] * len(actions)
    ends = [False] * len(actions)
    at = -1
    for size in schedule.send_groups[d]:
        at += size
        ends[at] = True
    return ends


def _stage_costs(events: list[Event], schedule: Schedule) -> StageCosts:
    total: dict[tuple[int, str], list[float]] = defaultdict(list)
    for e in events:
        if e.action.is_compute:
            total[(e.action.stage, e.action.kind)].append(e.duration / schedule.batch_scale)

    def mean(stage: int, kind: str) -> float:
        values = total.get((stage, kind), [])
        return sum(values) / len(values) if values else 0.0

    split = any(kind == "W" for _, kind in total)
    forward, backward, weight, split_backward = [], [], [], []
    for s in range(schedule.stages):
        forward.append(mean(s, "F"))
        # One backward per micro-batch: a whole B, or an I whose W comes later. DualPipeV
        # mixes both on one stage, so average over the passes, not over each kind apart.
        b, i, w = (total.get((s, kind), []) for kind in ("B", "I", "W"))
        passes = len(b) + len(i)
        backward.append((sum(b) + sum(i) + sum(w)) / passes if passes else 0.0)
        weight.append(mean(s, "W"))
        split_backward.append(mean(s, "I") + mean(s, "W"))
    split_total = sum(split_backward)
    fraction = min(1.0, sum(weight) / split_total) if split and split_total > 0 else None
    return StageCosts(forward, backward, fraction)


def simulated_from_measured(result: StepResult, schedule: Schedule | None = None) -> Timeline:
    """The simulator's prediction for `schedule` (default: the one the step ran) from the
    step's measured per-stage costs (s) and, on the virtual clock, the time its links take
    for one message between stages."""
    from course_utils.pipeline.simulate import CostModel, simulate

    schedule = schedule if schedule is not None else result.schedule
    if schedule is None:
        raise CourseInputError("schedule is needed: this result does not say which one ran")

    costs = result.stage_costs
    p2p = 0.0
    if result.timeline.meta.get("clock") == "virtual" and result.links is not None:
        p2p = result.links.transfer_time(0, 1, round(result.message_bytes))
    model = CostModel(
        weight_fraction=0.5 if costs.weight_fraction is None else costs.weight_fraction,
        stage_forward=costs.forward,
        stage_backward=costs.backward,
        p2p=p2p,
    )
    timeline = simulate(schedule, model)
    timeline.unit = "s"
    return timeline


def unsplit_step_time(
    model: nn.Module, loss_fn, x, y, repeats: int = 3, clock: str = "virtual"
) -> float:
    """Best-of-`repeats` seconds of forward+backward of the whole batch on this thread:
    its CPU time on the virtual clock (what one device computes), wall time on the wall clock."""
    check_clock(clock)
    now = time.thread_time if clock == "virtual" else time.perf_counter
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = float("inf")
        for i in range(repeats + 1):  # the first run is a warm-up
            t0 = now()
            loss_fn(model(x), y).backward()
            if i:
                best = min(best, now() - t0)
        model.zero_grad(set_to_none=True)
        return best
    finally:
        torch.set_num_threads(before)


def ideal_speedup(schedule: Schedule) -> float:
    """Speed-up with equal stages and free communication: p*m*(F+B) / simulated makespan."""
    from course_utils.pipeline.simulate import CostModel, simulate

    costs = CostModel()
    timeline = simulate(schedule, costs)
    unsplit = schedule.num_devices * schedule.microbatches * (costs.forward + costs.backward)
    return unsplit / timeline.makespan
