"""Expert parallelism on threads: experts spread over workers, tokens sent by all-to-all.

GShard (Lepikhin et al. 2020, arXiv 2006.16668); DeepSpeed-MoE; Megatron-LM's token
dispatcher. N workers each hold E/N experts (worker w holds experts w x E/N ...
(w+1) x E/N - 1) and a copy of the router and norm. One step on worker w:

    route its tokens -> dispatch all-to-all (each token to its expert's worker)
    -> the local experts run -> combine all-to-all (results back to the token's worker)
    -> weighted sum and residual
    backward: the same two all-to-alls in reverse order carry the gradients back, then
    an all-reduce sums the router and norm gradients (they are replicated).

The backward is written out: every worker runs autograd only on its own graph pieces and
gradients cross between workers only as messages (`Communicator.all_to_all`, mailbox
style). `ExpertParallel.step` records a measured `Timeline`, one event per phase; the
expert bars carry the expert id where a pipeline's carry the micro-batch, so draw them
with `gantt.draw(timeline, colour="expert")`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from course_utils import validation
from course_utils.actions import Action
from course_utils.errors import CourseInputError, WorkerError
from course_utils.parallel.moe.block import MoE, MoEStep, checked_grad_output, column_sums
from course_utils.parallel.moe.limits import (
    MAX_WORKERS,
    check_tokens,
)
from course_utils.parallel.moe.routing import experts_of_worker, route
from course_utils.threads.collectives import chunk_bounds
from course_utils.threads.devices import Aborted, ThreadRunner
from course_utils.threads.links import Links
from course_utils.threads.trace import Recorder, Stream, on


@dataclass
class _Shard:
    """What one worker holds: copies of the norm and router, and its own E/N experts."""

    norm: nn.LayerNorm
    router: nn.Linear
    experts: nn.ModuleList
    expert_ids: list[int]


class ExpertParallel(ThreadRunner):
    """The experts of `moe` spread over `workers` threads (E/N each); see the module docstring.

    `moe` is copied, not modified. `step(x, grad_output, aux_weight)` splits the tokens
    into N consecutive groups (worker w routes group w) and returns a `MoEStep` equal to
    `reference_step(moe, x, grad_output, aux_weight, groups=workers)`. Use as a context
    manager, or call `close()`, to stop the threads.
    """

    def __init__(
        self,
        moe: MoE,
        workers: int,
        timeout: float = 60.0,
        clock: str = "virtual",
        links: Links | None = None,
    ) -> None:
        self._keep_workers_and_clock(workers, MAX_WORKERS, clock, links)
        if moe.num_experts % workers:
            raise CourseInputError(
                f"workers must divide the number of experts ({moe.num_experts}), got {workers}"
            )
        validation.number(timeout, "timeout", 1e-3, 3600.0)
        self.num_experts = moe.num_experts
        self.d_model, self.top_k = moe.d_model, moe.top_k
        self.capacity_factor = moe.capacity_factor
        self.shards = []
        for w in range(workers):
            ids = experts_of_worker(w, moe.num_experts, workers)
            self.shards.append(
                _Shard(
                    norm=copy.deepcopy(moe.norm),
                    router=copy.deepcopy(moe.router),
                    experts=nn.ModuleList(copy.deepcopy(moe.experts[e]) for e in ids),
                    expert_ids=ids,
                )
            )
        self._start_threads("ep worker", timeout, one_core=self.clock == "virtual")

    def step(
        self, x: torch.Tensor, grad_output: torch.Tensor | None = None, aux_weight: float = 0.0
    ) -> MoEStep:
        """Forward and explicit backward on all workers.

        The gradients land in the shards' .grad (replacing the previous step's), ready for
        one optimizer per worker over `parameters(worker)`.
        """
        tokens = check_tokens(x, self.d_model, self.workers, "workers")
        validation.number(aux_weight, "aux_weight", 0.0, 1e6)
        flat = x.detach().reshape(tokens, self.d_model)
        dy = checked_grad_output(grad_output, x).reshape(tokens, self.d_model)
        bounds = chunk_bounds(tokens, self.workers)
        for shard in self.shards:
            for p in _shard_params(shard):
                p.grad = None
        self.group.reset_counters()
        trace = Recorder()
        jobs = [
            _WorkerStep(self, w, flat[lo:hi], dy[lo:hi], aux_weight / self.workers, trace.stream(w))
            for w, (lo, hi) in enumerate(bounds)
        ]
        results = self.run_jobs([on(job.stream, job.run) for job in jobs], trace)
        return self._gather(results, x.shape, trace)

    def _gather(self, results: list[dict], shape: torch.Size, trace: Recorder) -> MoEStep:
        routed = [r["routed"] for r in results]
        timeline = self._timeline(
            trace,
            name=f"expert parallel: E={self.num_experts} experts on p={self.workers} workers",
            meta={"received_per_expert": column_sums(routed), "routed": routed},
        )
        phases = results[0]["bytes"].keys()
        return MoEStep(
            output=torch.cat([r["output"] for r in results]).reshape(shape),
            input_grad=torch.cat([r["input_grad"] for r in results]).reshape(shape),
            grads=self.gathered_grads(),
            aux_loss=sum(r["aux"] for r in results) / self.workers,
            tokens_per_expert=column_sums([r["counts"] for r in results]),
            kept_per_expert=column_sums(routed),
            dropped=sum(r["dropped"] for r in results),
            capacity=[r["capacity"] for r in results],
            routed=routed,
            bytes_sent={p: [r["bytes"][p] for r in results] for p in phases},
            timeline=timeline,
            trace=trace,
        )

    def gathered_grads(self) -> dict[str, torch.Tensor]:
        """The workers' gradients under the reference module's parameter names.

        Norm and router gradients were all-reduced, so worker 0's copy is the total.
        """
        first = self.shards[0]
        grads = {f"norm.{n}": _grad(p) for n, p in first.norm.named_parameters()}
        grads.update({f"router.{n}": _grad(p) for n, p in first.router.named_parameters()})
        for shard in self.shards:
            for e, expert in zip(shard.expert_ids, shard.experts, strict=True):
                for n, p in expert.named_parameters():
                    grads[f"experts.{e}.{n}"] = _grad(p)
        return grads

    def parameters(self, worker: int) -> list[nn.Parameter]:
        """What worker `worker` trains: its norm and router copies and its own experts.

        Give each worker its own optimizer over these; the replicated gradients were
        all-reduced, so the copies receive the same update and stay identical.
        """
        validation.integer(worker, "worker", 0, self.workers - 1)
        return _shard_params(self.shards[worker])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The parameters put back together, loadable with `MoE.load_state_dict`."""
        first = self.shards[0]
        state = {f"norm.{n}": p.detach() for n, p in first.norm.named_parameters()}
        state.update({f"router.{n}": p.detach() for n, p in first.router.named_parameters()})
        for shard in self.shards:
            for e, expert in zip(shard.expert_ids, shard.experts, strict=True):
                state.update({f"experts.{e}.{n}": p.detach() for n, p in expert.named_parameters()})
        return state

    def max_replica_diff(self) -> float:
        """Largest difference between worker 0's router/norm gradients and any other's."""
        worst = 0.0
        for shard in self.shards[1:]:
            for a, b in zip(_replicated(self.shards[0]), _replicated(shard), strict=True):
                worst = max(worst, (_grad(a) - _grad(b)).abs().max().item())
        return worst


class _WorkerStep:
    """One worker's part of one step, written top to bottom as the phases happen."""

    def __init__(self, ep: ExpertParallel, rank: int, x, dy, aux_weight: float, stream: Stream):
        self.ep, self.rank, self.stream = ep, rank, stream
        self.x, self.dy, self.aux_weight = x, dy, aux_weight
        self.shard = ep.shards[rank]
        self.comm = ep.group.comm(rank)
        self.bytes: dict[str, int] = {}

    @contextmanager
    def phase(self, kind: str, label: str, expert: int | None = None):
        """Record a phase as one bar (compute, or a collective), and name the phase in the
        error if it fails."""
        compute = kind in ("F", "B")
        action = Action(0, kind, expert) if compute else Action(0, kind)
        bar = self.stream.compute(action, label) if compute else self.stream.span(action, label)
        try:
            with bar:
                yield
        except (Aborted, CourseInputError):
            raise  # a peer failed first, or bad input: the message already says what
        except Exception as exc:
            doing = {"F": "forward", "B": "backward"}.get(kind, "communication")
            raise WorkerError(
                f"device {self.rank} failed during {label} ({doing}): {type(exc).__name__}: {exc}"
            ) from exc

    def all_to_all(self, label: str, chunks: list[torch.Tensor]) -> list[torch.Tensor]:
        """`comm.all_to_all`, adding the bytes this worker sent to `self.bytes[label]`."""
        before = self.ep.group.bytes_sent[self.rank]  # only this rank adds to its entry
        received = self.comm.all_to_all(chunks)
        sent = self.ep.group.bytes_sent[self.rank] - before
        self.bytes[label] = self.bytes.get(label, 0) + sent
        return received

    def run(self) -> dict:
        ep, shard, n = self.ep, self.shard, self.ep.workers
        experts_on = [experts_of_worker(d, ep.num_experts, n) for d in range(n)]

        # 1. Route this worker's tokens (its group); line them up by destination worker,
        # each destination's experts one after the other, each expert's queue in slot order.
        with self.phase("F", "router"):
            x = self.x.clone().requires_grad_(True)
            h = shard.norm(x)
            h_in = h.detach().requires_grad_(True)  # the graph is cut here: see step 9
            routing = route(shard.router(h_in), ep.top_k, ep.capacity_factor)
            aux = routing.balancing_loss()
            picks = [routing.assignments(e) for e in range(ep.num_experts)]
            token_to = [torch.cat([picks[e][0] for e in experts_on[d]]) for d in range(n)]
            gate_to = [torch.cat([picks[e][1] for e in experts_on[d]]) for d in range(n)]
            count_to = [torch.tensor([len(picks[e][0]) for e in experts_on[d]]) for d in range(n)]
            send = [h_in.detach()[token_to[d]] for d in range(n)]

        # 2. Dispatch: first how many tokens go to each expert (the receiver must know where
        # one expert's tokens end; Megatron exchanges these counts too), then the tokens.
        with self.phase("ALL_TO_ALL", "dispatch"):
            counts = [c.tolist() for c in self.all_to_all("counts", count_to)]  # [s][i]
            received = self.all_to_all("dispatch", send)
        local = range(len(shard.expert_ids))
        # Where local expert i's tokens from source s sit: in s's message, and in i's batch.
        in_message = [_spans(counts[s]) for s in range(n)]  # [s][i]
        in_batch = [_spans([counts[s][i] for s in range(n)]) for i in local]  # [i][s]

        # 3. The local experts, each on one batch of all the tokens sent to it.
        inputs, outputs = [], []
        for i, e, expert in zip(local, shard.expert_ids, shard.experts, strict=True):
            with self.phase("F", f"expert {e}", expert=e):
                batch = torch.cat([_rows(received[s], in_message[s][i]) for s in range(n)])
                batch.requires_grad_(True)  # a leaf: its gradient goes back as a message
                inputs.append(batch)
                outputs.append(expert(batch))

        # 4. Combine: every token's expert output goes back to the worker that owns the
        # token, laid out as that worker sent it (so it knows which token is which).
        back = [
            torch.cat([_rows(outputs[i].detach(), in_batch[i][s]) for i in local]) for s in range(n)
        ]
        with self.phase("ALL_TO_ALL", "combine"):
            returned = self.all_to_all("combine", back)  # returned[d] lines up with send[d]

        # 5. Weighted sum of the expert outputs, plus the residual.
        with self.phase("F", "weighted sum"):
            expert_out = torch.cat(returned).requires_grad_(True)
            token, gate = torch.cat(token_to), torch.cat(gate_to)
            y = x + torch.zeros_like(x).index_add(0, token, gate[:, None] * expert_out)

        # 6. Backward of this worker's own graph for L = sum(y * dy) + aux_weight * aux:
        # dL/dx (residual), router grads and dL/dh (gates, aux), dL/d(expert outputs).
        with self.phase("B", "weighted sum"):
            weight = torch.tensor(self.aux_weight, dtype=aux.dtype)
            torch.autograd.backward([y, aux], [self.dy, weight])
            grad_out = list(_grad(expert_out).split([len(t) for t in token_to]))

        # 7. The combine in reverse: each output's gradient to the worker of its expert.
        with self.phase("ALL_TO_ALL", "combine grad"):
            # grad_back[s] lines up with received[s]
            grad_back = self.all_to_all("combine grad", grad_out)

        # 8. Expert backward: weight gradients stay here, input gradients go home.
        for i, e, out in zip(local, shard.expert_ids, outputs, strict=True):
            with self.phase("B", f"expert {e}", expert=e):
                out.backward(torch.cat([_rows(grad_back[s], in_message[s][i]) for s in range(n)]))
        grad_in = [
            torch.cat([_rows(_grad(inputs[i]), in_batch[i][s]) for i in local]) for s in range(n)
        ]

        # 9. The dispatch in reverse: dL/dh of every token sent comes back to its owner,
        # is added to the gate path's dL/dh, and goes on through the norm to x.
        with self.phase("ALL_TO_ALL", "dispatch grad"):
            grad_sent = self.all_to_all("dispatch grad", grad_in)  # lines up with send
        with self.phase("B", "router"):
            grad_h = h_in.grad if h_in.grad is not None else torch.zeros_like(h_in)
            h.backward(grad_h.index_add(0, token, torch.cat(grad_sent)))

        # 10. Router and norm are replicated: sum their gradients over the workers.
        with self.phase("REDUCE_GRAD", "all-reduce"):
            before = self.ep.group.bytes_sent[self.rank]
            self.comm.all_reduce([_grad(p) for p in _replicated(shard)], op="sum")
            self.bytes["all-reduce"] = self.ep.group.bytes_sent[self.rank] - before

        return {
            "output": y.detach(),
            "input_grad": x.grad,
            "aux": aux.item(),
            "counts": routing.counts(),
            "routed": [len(p[0]) for p in picks],
            "dropped": routing.dropped,
            "capacity": routing.capacity,
            "bytes": self.bytes,
        }


def _spans(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive (start, end) ranges of the given sizes."""
    spans, start = [], 0
    for size in sizes:
        spans.append((start, start + size))
        start += size
    return spans


def _rows(t: torch.Tensor, span: tuple[int, int]) -> torch.Tensor:
    return t[span[0] : span[1]]


def _replicated(shard: _Shard) -> list[nn.Parameter]:
    return [*shard.norm.parameters(), *shard.router.parameters()]


def _shard_params(shard: _Shard) -> list[nn.Parameter]:
    return [*_replicated(shard), *shard.experts.parameters()]


def _grad(p: torch.Tensor) -> torch.Tensor:
    # Every worker must all-reduce the same buffers, even one whose router saw no token
    # (and an expert no token chose has no gradient until we give it zeros).
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    return p.grad
