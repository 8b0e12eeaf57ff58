"""V-shaped pipeline schedules: ZB-V and DualPipeV, where each device holds two chunks in a V.

With p devices the model is cut into 2p stages. Device d holds stage d (its chunk on the way
down) and stage 2p-1-d (its chunk on the way back up):

    device 0:  stage 0 ........................ stage 2p-1   (first and last stage)
    device 1:     stage 1 .................. stage 2p-2
    ...
    device p-1:            stage p-1, stage p                (the bottom of the V)

Why a V. A micro-batch's forward crosses 2p-1 stage boundaries and its backward crosses them
again. With looping placement (stage s on device s % p, as in interleaved 1F1B) neighbouring
stages are always on different devices, so each micro-batch makes 2(2p-1) = 4p-2 transfers
between devices. In a V the boundary from stage p-1 to stage p lies inside device p-1, so
only 2p-2 boundaries cross devices: 4(p-1) transfers per micro-batch, two fewer (still twice
plain 1F1B's 2(p-1), since every boundary is crossed once per chunk). The V also balances
memory: a device's down chunk keeps its activations long (its backward comes last) and its
up chunk keeps them briefly, and every device has one of each, so with enough micro-batches
every device peaks at the same 2p chunks, one chunk being half of the device's layers, which
is p micro-batches' worth of its layers: 1F1B's peak on its busiest device (Qi et al. 2024,
arXiv 2401.10241, the ZB-V schedule; their repository's README table gives "activation
memory 1x" and "communication volume 2x" against 1F1B). And the input and the loss are on
the same device, device 0. Where the remaining bubble comes from: the first micro-batch
needs d forward steps to reach device d, so device d starts d steps late (the warm-up), and
at the end the last input gradients travel back through the V to device 0 while the devices
they have left run out of work (the cool-down). ZB-V fills everything in between with the
postponed weight gradients W; at equal costs F = I = W every device is busy without a gap
from its first action to its last, and the timeline is a parallelogram whose slanted ends
are the whole bubble: (p-1) chunk-steps per device. That is what the paper calls zero
bubble (its README: "bubble rate 0"): the slant of one step can overlap the next step when
the optimizer step needs no synchronisation across devices; a single step still has it.

    zb_v(p, m)        ZB-V, order equal to PyTorch's ScheduleZBVZeroBubble (torch 2.13)
    dualpipe_v(p, m)  DualPipeV, order equal to PyTorch's ScheduleDualPipeV and to DeepSeek's
                      dualpipe/dualpipev.py (github.com/deepseek-ai/DualPipe): the V variant
                      of DualPipe (DeepSeek-AI 2024, arXiv 2412.19437) made by Sea AI Lab's
                      "cut-in-half" procedure (Sea AI Lab 2025, blog post
                      hackmd.io/@ufotalent/r1lVXsa9Jg, credited in DeepSeek's README)

Which ZB-V. The course's ZB-V is one fixed order, PyTorch's construction (written for equal
costs: its docstring says the order is zero-bubble only when F = I = W). The paper's own
repository builds ZB-V differently: sail-sg/zero-bubble-pipeline-parallelism's
zerobubble/scheduler/zbv.py places the actions greedily from the measured F, B and W costs
under a memory limit (2p chunks' activations by default), trying a few fill rules and keeping
the smallest bubble, so with unequal costs its order may differ from the one built here.

DualPipeV's "F&B" slot. In its steady state DualPipeV runs the forward of one micro-batch
and the full backward of another as one overlapped slot. The course's simulator and thread
executor run one action at a time per device, so an F&B slot is written as the two actions
back to back, F first: exactly what DeepSeek's code runs when the model has no
`overlapped_forward_backward` (`_forward_compute_chunk` then `_backward_compute_chunk`), and
the order of PyTorch's OVERLAP_F_B sub-actions. `dualpipe_v_slots` keeps the pairs.

When outputs leave. dualpipev.py queues every send and posts the queue when the next chunk
starts, so both results of an F&B slot leave when the slot ends (and in the warm-up a down
chunk's output waits for the up chunk's forward after it). `dualpipe_v` records those send
points in `Schedule.send_groups` and the simulator and the thread executor honour them
(tests/test_vshape.py finds every transfer after its group's end): this is the reference the
course teaches, and DeepSeek's README figure (PP/2-1)(F&B + B - 3W) is its idle time.
What the course does not model: before every computation dualpipev.py posts the queued sends
and receives together and waits for all of them (`_commit_and_wait_comm`: one
`batch_isend_irecv`, then `wait()` on every request), so a sender also waits until its peer
has posted the matching receive. Here a send never blocks its sender (as if buffered): only
a receiver waits, for its message. On a
GPU (DeepSeek-V3 report, Section 3.2.1) the two chunks' kernels of a slot are interleaved so
that one chunk's communication (the MoE all-to-all and the pipeline send/receive) hides
behind the other's computation; the computation itself is not faster, so a slot costs about
F + B. `dualpipe_v(p, m, early_send=True)` is the course's named alternative, "DualPipeV,
early send": every output leaves as its action ends, which saves (p-1) I per device at
F = I.

Closed forms (costs F, I, W are per chunk: one micro-batch through one stage; B = I + W; all
checked against `simulate` in tests/test_vshape.py, with p2p = 0):

    ZB-V        idle per device (p-1) I, on every device,
                when m >= 2p-1, F <= I <= 2W and W <= I (W <= I only for p >= 3);
                this includes the paper's case F = I = W;
                peak chunks held by device d: min(2p, 2m, m+1+d), i.e. 2p when m >= 2p-1
    DualPipeV   idle per device (p-1)(F + 2I - W) = (PP/2-1)(F&B + B - 3W) with F&B = F + B,
                on every device, when m >= 2p (required), F = I and W <= I;
                peak chunks held: 2p+1 on every device (README: PP+1 with PP = 2p stages)
    early send  idle per device (p-1)(F + I - W), when m >= 2p, W <= I, (p-1) I <= p F and
                F <= I + W

The V schedules belong to the family of "Pipeline Parallelism with Controllable Memory"
(Qi, Wan, Amar & Lin 2024, arXiv 2405.15362): a schedule is a building block repeated, and
the block's lifespan sets the peak activation memory. Its V-shaped blocks give V-Min (about
1/3 of 1F1B's activation memory, a larger bubble), V-Half (1/2) and V-ZB (1F1B's memory,
almost no bubble: ZB-V).

Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections import deque
from numbers import Real

from course_utils import validation
from course_utils.actions import Action, Schedule
from course_utils.errors import CourseInputError
from course_utils.pipeline.simulate import CostModel
from course_utils.validation import MAX_ACTIONS  # 6 p m compute actions at most, by default


def _check_int(name: str, value, minimum: int = 1) -> int:
    return validation.integer(value, name, minimum)


def _check_shape(p: int, m: int, max_actions: int = MAX_ACTIONS) -> None:
    _check_int("devices", p)
    _check_int("microbatches", m)
    # F, I and W of 2 chunks per device and micro-batch: the limit every schedule shares
    validation.check_actions(6 * p * m, max_actions, what=f"a V schedule of {p} x {m}")


def _check_costs(**costs: float) -> None:
    for name, value in costs.items():
        if isinstance(value, bool) or not isinstance(value, Real) or not 0 <= value < math.inf:
            raise CourseInputError(f"{name} must be a finite number >= 0, got {value!r}")


def v_stages(p: int, device: int) -> tuple[int, int]:
    """The two stages device `device` holds in a V over 2p stages: (down chunk, up chunk)."""
    _check_int("devices", p)
    if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < p:
        raise CourseInputError(f"device must be an integer in 0..{p - 1}, got {device!r}")
    return device, 2 * p - 1 - device


def chunk_costs(forward: float, input_grad: float, weight_grad: float, p2p: float = 0.0):
    """A `CostModel` for a V schedule from per-chunk costs F, I and W.

    The course's `CostModel` takes costs per device (a chunk costs 1/2 of them with two
    chunks per device), so this passes 2F and 2(I + W) with W's share of the backward.
    """
    _check_costs(forward=forward, input_grad=input_grad, weight_grad=weight_grad, p2p=p2p)
    backward = input_grad + weight_grad
    fraction = weight_grad / backward if backward > 0 else 0.5
    return CostModel(2 * forward, 2 * backward, fraction, p2p)


# --------------------------------------------------------------------------- ZB-V


def _zb_v_order(p: int, d: int, m: int) -> list[Action]:
    """Device d's ZB-V actions: the construction of PyTorch's ScheduleZBVZeroBubble, one
    fixed order whatever the costs (sail-sg's zbv.py builds its order from measured costs)."""
    # Built for at least 2p-1 micro-batches (what the warm-up needs to fill the V), then the
    # micro-batches that do not exist are dropped; dropping the same micro-batches from
    # every device keeps a deadlock-free order deadlock-free. Only the actions of existing
    # micro-batches are made: the rest are counted (a long pipeline with few micro-batches
    # would otherwise build 2p-1 micro-batches' actions on every device, p^2 in all).
    n = max(m, 2 * p - 1)
    down, up = v_stages(p, d)
    order: list[Action] = []
    next_mb = {(s, k): 0 for s in (down, up) for k in "FIW"}

    def run(stage: int, kind: str, times: int = 1) -> None:
        first = next_mb[(stage, kind)]
        order.extend(Action(stage, kind, mb) for mb in range(first, min(first + times, m)))
        next_mb[(stage, kind)] = first + times

    def repeat(steps: list[tuple[int, str]], times: int) -> None:
        """Run `steps` in turn, `times` times over; once none of them has an existing
        micro-batch left, the rest is only counted."""
        for done in range(times):
            if all(next_mb[step] >= m for step in steps):
                for step in steps:
                    next_mb[step] += times - done
                return
            for stage, kind in steps:
                run(stage, kind)

    # Warm-up. Micro-batch 0 reaches device d's up chunk after 2p-1-d forward steps and
    # device d starts after d of them, so it fills the 2(p-d)-1 steps in between with
    # down-chunk forwards, ...
    run(down, "F", 2 * (p - d) - 1)
    # ... then alternates the two chunks' forwards while the first input gradient is on
    # its way, ...
    repeat([(up, "F"), (down, "F")], d)
    # ... and runs the up chunk's backward as soon as it can, W straight after I.
    repeat([(up, "F"), (up, "I"), (up, "W")], p - d)
    # Steady state: one forward, I and W of each chunk, until every forward is done.
    while next_mb[(up, "F")] < next_mb[(down, "F")] or next_mb[(down, "F")] < n:
        if all(count >= m for count in next_mb.values()):
            return order  # every action left is of a micro-batch that does not exist
        if next_mb[(down, "F")] < n:
            run(down, "F")
        run(down, "I")
        run(down, "W")
        run(up, "F")
        run(up, "I")
        run(up, "W")
    # Cool-down: input gradients first (another device waits for them); the W's that are
    # left fill the time this device would otherwise wait.
    repeat([(down, "I"), (up, "I")], d)
    repeat([(down, "I"), (down, "W")], p - d)
    run(up, "W", max(0, next_mb[(up, "I")] - next_mb[(up, "W")]))
    run(down, "W", max(0, next_mb[(down, "I")] - next_mb[(down, "W")]))
    return order


def zb_v(p: int, m: int, *, max_actions: int = MAX_ACTIONS) -> Schedule:
    """ZB-V (Qi et al. 2024, arXiv 2401.10241): zero-bubble I/W split on a V of 2p stages.

    Each device runs F, I and W of its down chunk and of its up chunk. With equal costs and
    m >= 2p-1 no device has a gap between its first and its last action, and every device
    holds at most 2p chunks (p micro-batches' worth of its layers, 1F1B's peak).
    Any m >= 1 works; below 2p-1 the warm-up cannot fill the V and the bubble grows.
    """
    _check_shape(p, m, max_actions)
    devices = tuple(tuple(_zb_v_order(p, d, m)) for d in range(p))
    return Schedule("zb-v", 2 * p, m, devices)


def _at_most(a: float, b: float) -> bool:
    """a <= b, allowing for rounding: on a condition's boundary the formula is still exact,
    and costs computed to sit there (F = (p-1) I / p) may land one rounding step past it."""
    return a <= b + 1e-9 * max(1.0, abs(a), abs(b))


def zb_v_formula_holds(p: int, m: int, F: float, I: float, W: float) -> bool:  # noqa: E741
    """Whether `zb_v_idle` is exact: m >= 2p-1, F <= I <= 2W, and W <= I when p >= 3.

    (And p2p = 0; one device never waits, so p = 1 needs nothing.) Each inequality is
    needed: tests/test_vshape.py shows the formula failing when any one of them is broken
    (W <= I only from p = 3 on; with two devices a longer W still fits). Roughly: with
    F > I the forwards, with I > 2W the chain of input gradients, and with W > I the W's
    themselves become the longest path through the step.
    """
    _check_shape(p, m)
    _check_costs(F=F, I=I, W=W)
    if p == 1:
        return True
    return m >= 2 * p - 1 and _at_most(F, I) and _at_most(I, 2 * W) and (_at_most(W, I) or p == 2)


def zb_v_idle(p: int, F: float, I: float, W: float) -> float:  # noqa: E741
    """Idle time of every device in one ZB-V step: (p-1) I (when `zb_v_formula_holds`).

    At F = I = W this is the slant of the parallelogram: device d waits d F for the first
    micro-batch and stops (p-1-d) I before the end. The paper calls ZB-V zero bubble
    because there is no gap inside that parallelogram; a single step still has the slant.
    """
    _check_int("devices", p)
    _check_costs(F=F, I=I, W=W)
    return (p - 1) * I


def zb_v_peak(p: int, m: int, device: int) -> int:
    """Most chunks device `device` holds at once in ZB-V: min(2p, 2m, m+1+d), any costs.

    A chunk is held from its F until its W. With m >= 2p-1 it is 2p on every device.
    """
    _check_shape(p, m)
    _, _ = v_stages(p, device)
    return min(2 * p, 2 * m, m + 1 + device)


# --------------------------------------------------------------------------- DualPipeV


def dualpipe_v_slots(
    p: int, m: int, *, max_actions: int = MAX_ACTIONS
) -> list[list[tuple[Action, ...]]]:
    """DualPipeV per device as slots: one action, or an overlapped (F, B) pair ("F&B").

    The phases are those of DeepSeek's dualpipev.py (names as in its comments, chunk 0 the
    down chunk, chunk 1 the up chunk); `dualpipe_v` flattens the slots.
    """
    return [slots for slots, _ in _dualpipe_v_all(p, m, max_actions)]


def _dualpipe_v_all(
    p: int, m: int, max_actions: int = MAX_ACTIONS
) -> list[tuple[list[tuple[Action, ...]], tuple[int, ...]]]:
    _check_shape(p, m, max_actions)
    if m < 2 * p:
        raise CourseInputError(
            f"microbatches must be >= 2 x devices = {2 * p} for dualpipe-v "
            f"(its warm-up puts 2p micro-batches in flight), got {m}"
        )
    return [_dualpipe_v_device(p, d, m) for d in range(p)]


def _dualpipe_v_device(p: int, d: int, m: int) -> tuple[list[tuple[Action, ...]], tuple[int, ...]]:
    """Device d's slots, and the sizes of its send groups: the runs of actions whose outputs
    dualpipev.py sends together (it queues every send and posts the queue when the next
    chunk starts, so both results of an F&B slot leave when the slot ends)."""
    down, up = v_stages(p, d)
    slots: list[tuple[Action, ...]] = []
    groups: list[int] = []
    hold = False  # the last group's sends wait for the next slot too
    forwards = {down: 0, up: 0}
    backwards = {down: 0, up: 0}  # B or I: the input gradient
    postponed: deque[Action] = deque()  # W's of split backwards, run oldest first

    def forward(stage: int) -> Action:
        forwards[stage] += 1
        return Action(stage, "F", forwards[stage] - 1)

    def backward(stage: int, split: bool = False) -> Action:
        mb = backwards[stage]
        backwards[stage] += 1
        if split:  # zero-bubble: only the input gradient now, W later
            postponed.append(Action(stage, "W", mb))
            return Action(stage, "I", mb)
        return Action(stage, "B", mb)

    def add(*slot: Action, then_hold: bool = False) -> None:
        nonlocal hold
        slots.append(slot)
        if hold:
            groups[-1] += len(slot)
        else:
            groups.append(len(slot))
        hold = then_hold

    def weight() -> None:
        if postponed:
            add(postponed.popleft())

    bottom = d == p - 1
    for _ in range(2 * (p - d - 1)):  # step 1 "nF0": fill the down chunk
        add(forward(down))
    for i in range(d + 1):  # step 2 "nF0F1"
        # dualpipev.py queues the down chunk's output and sends it after the up chunk's
        # forward; at the bottom of the V the last up-chunk output waits one slot more.
        add(forward(down), then_hold=not bottom)
        add(forward(up), then_hold=bottom and i == d)
    for _ in range(p - d - 1):  # step 3 "nB1W1F1": zero-bubble backwards of the up chunk
        add(backward(up, split=True))
        weight()
        add(forward(up))
    for k in range(m - 2 * p + d + 1):  # step 4 "nF0B1F1B0": the overlapped steady state
        if k == 0 and bottom:
            # DeepSeek runs this first pair at the bottom of the V as two separate actions
            # ("to further reduce bubble size", its comment); written as F then B it is the
            # same order either way, only the slot differs.
            add(forward(down))
            add(backward(up))
        else:
            add(forward(down), backward(up))
        add(forward(up), backward(down))
    for _ in range(p - d - 1):  # step 5 "nB1F1B0"
        add(backward(up))
        add(forward(up), backward(down))
    # Step 6 "nB1B0": the last backwards; the second half split into I and W, so the W's
    # can fill the cool-down (the switch point alternates with the device's parity).
    split = False
    for k in range(d + 1):
        if k == (d + 1) // 2 and d % 2 == 1:
            split = True
        add(backward(up, split))
        if k == (d + 1) // 2 and d % 2 == 0:
            split = True
        add(backward(down, split))
    for _ in range(p - d - 1):  # step 7 "nWB0"
        weight()
        add(backward(down, split=True))
    for _ in range(d + 1):  # step 8 "nW"
        weight()
    return slots, tuple(groups)


def dualpipe_v(
    p: int, m: int, early_send: bool = False, *, max_actions: int = MAX_ACTIONS
) -> Schedule:
    """DualPipeV: DualPipe (DeepSeek-AI 2024, arXiv 2412.19437) cut in half onto a V (Sea AI
    Lab 2025, "cut-in-half" blog post), as github.com/deepseek-ai/DualPipe's dualpipev.py runs it.

    Needs m >= 2p. Each overlapped F&B slot is written as F then B; the warm-up and the
    cool-down split some backwards into I and W like ZB-V. The schedule sends outputs when
    dualpipev.py does (`Schedule.send_groups`): both results of an F&B slot when the slot
    ends. `early_send=True` gives the course's variant, "DualPipeV, early send", where
    every output leaves as its action ends.
    """
    both = _dualpipe_v_all(p, m, max_actions)
    devices = tuple(tuple(a for slot in slots for a in slot) for slots, _ in both)
    if early_send:
        return Schedule("dualpipe-v-early-send", 2 * p, m, devices)
    return Schedule("dualpipe-v", 2 * p, m, devices, send_groups=tuple(g for _, g in both))


def dualpipe_v_formula_holds(p: int, m: int, F: float, I: float, W: float) -> bool:  # noqa: E741
    """Whether `dualpipe_v_idle` (DeepSeek's figure) is exact in the simulator: m >= 2p,
    F = I and W <= I (and p2p = 0; p = 1 needs only m >= 2).

    Both are needed: tests/test_vshape.py shows the figure failing when either is broken.
    (With F != I the simulator finds other idle times; the README's figure is then an
    estimate, and the simulator the judge.)
    """
    _check_shape(p, m)
    _check_costs(F=F, I=I, W=W)
    if p == 1:
        return m >= 2
    return m >= 2 * p and _at_most(F, I) and _at_most(I, F) and _at_most(W, I)


def dualpipe_v_idle(
    p: int,
    F: float,
    I: float,  # noqa: E741
    W: float,
    fb: float | None = None,
) -> float:
    """DualPipeV's idle time per device, DeepSeek's figure: (PP/2 - 1)(F&B + B - 3W).

    From the DualPipe repository's README, with PP = 2p stages, B = I + W a full backward
    chunk and `fb` the time of one overlapped F&B slot (default F + B: overlap hides
    communication, it does not make the computation faster). With fb = F + B this is
    (p-1)(F + 2I - W). It counts an F&B slot as one block whose results leave when the
    slot ends, which is how dualpipev.py sends them; the simulator, sending the same way,
    agrees exactly when `dualpipe_v_formula_holds`.
    """
    _check_int("devices", p)
    _check_costs(F=F, I=I, W=W)
    backward = I + W
    fb = F + backward if fb is None else fb
    _check_costs(fb=fb)
    return (p - 1) * (fb + backward - 3 * W)


def dualpipe_v_early_send_formula_holds(
    p: int,
    m: int,
    F: float,
    I: float,  # noqa: E741
    W: float,
) -> bool:
    """Whether `dualpipe_v_early_send_idle` is exact: m >= 2p, W <= I, (p-1) I <= p F and
    F <= I + W (and p2p = 0; p = 1 needs nothing). Each inequality is needed: the tests
    show the formula failing when any one of them is broken."""
    _check_shape(p, m)
    _check_costs(F=F, I=I, W=W)
    if p == 1:
        return m >= 2
    return m >= 2 * p and _at_most(W, I) and _at_most((p - 1) * I, p * F) and _at_most(F, I + W)


def dualpipe_v_early_send_idle(p: int, F: float, I: float, W: float) -> float:  # noqa: E741
    """Idle time per device of the course's variant, "DualPipeV, early send", where an F&B
    slot's forward output leaves as soon as F ends: (p-1)(F + I - W) (when
    `dualpipe_v_early_send_formula_holds`).

    ZB-H1's expression in chunk costs, and (p-1) I less than DeepSeek's figure at F = I:
    each of the p-1 hops of the last input gradients no longer waits for a forward.
    """
    _check_int("devices", p)
    _check_costs(F=F, I=I, W=W)
    return (p - 1) * (F + I - W)


def dualpipe_v_peak(p: int) -> int:
    """Most chunks any device holds at once in DualPipeV (m >= 2p, any costs): 2p + 1.

    One more than ZB-V: in an F&B slot the new micro-batch's forward is counted before the
    old one's backward frees its chunk. On a GPU both chunks are live during the slot, so
    2p + 1 is the honest count (DualPipe's README: PP + 1). Written B first, the count would
    drop to 2p on every device but the last.
    """
    _check_int("devices", p)
    return 2 * p + 1


# --------------------------------------------------------------------------- both


def bubble_fraction(m: int, F: float, I: float, W: float, idle: float) -> float:  # noqa: E741
    """Idle over devices x makespan when every device idles `idle`: idle / (2m(F+I+W) + idle).

    Each device computes 2m chunks of F + I + W, so its makespan is that plus its idle time.
    """
    _check_int("microbatches", m)
    _check_costs(F=F, I=I, W=W, idle=idle)
    total = 2 * m * (F + I + W) + idle
    return idle / total if total > 0 else 0.0


def transfers_per_microbatch(p: int, placement: str) -> int:
    """Cross-device transfers of one micro-batch (forward and backward) over 2p stages.

    "looping" (stage s on device s % p): all 2p-1 boundaries cross devices, 2(2p-1);
    "v": the boundary at the bottom of the V stays on device p-1, 2(2p-2) = 4(p-1).
    """
    _check_int("devices", p)
    if placement == "looping":
        crossing = 2 * p - 1 if p > 1 else 0
    elif placement == "v":
        crossing = 2 * p - 2
    else:
        raise CourseInputError(f"placement must be 'looping' or 'v', got {placement!r}")
    return 2 * crossing
