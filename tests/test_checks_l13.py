"""The lesson 13 checks: right answers pass, wrong ones fail kindly, placeholders say so.

Exercises 13.2 and 13.3 run worker files (tests/workerfiles.py) on two real processes: each
call costs seconds, so the shared contract tests mark this lesson `slow` (SLOW) and try two
students, not seven.
"""

import pytest
import torch
import workerfiles as files

from course_utils.checks import CheckFailed, NotAnswered, Variant
from course_utils.checks import l13 as check
from course_utils.checks.processes import WorkerDDPCase, WorkerRingCase
from course_utils.checks.worker_runs import evidence, failed_run, replicas, trained

SLOW = True  # the contract tests start processes for this lesson
STUDENTS = ["s1", "alice"]

RIGHT = {
    1: (16, 11),
    2: (files.ring(),),
    3: (files.ddp(),),
    4: ("b", "a"),
    5: (97.5,),
}

WRONG = [  # (exercise, arguments, words the hint must contain)
    (1, (8, 11), "LOCAL_WORLD_SIZE"),
    (1, (2, 11), "counts the nodes"),
    (1, (32, 11), "how many processes"),
    (1, (16, 3), "is the LOCAL_RANK"),
    (1, (16, 19), "numbered from 0"),
    (1, (16, 7), "not the other way round"),
    (1, (16, 12), "nodes before this one"),
    (2, (files.ring(files.both_send_first), files.SEEDED), "rank 0 waits in send to rank 1"),
    (2, (files.ring(files.forgot_own), files.SEEDED), "without its own"),
    (2, (files.ring(files.kept_own), files.SEEDED), "returned its own tensor"),
    (2, (files.ring(files.averaged), files.SEEDED), "not the sum of every rank's"),
    (2, (files.ring(files.forgot_return), files.SEEDED), "returned NoneType None"),
    (2, (files.ring(files.with_all_reduce), files.SEEDED), "never sent and received"),
    (2, (files.ring(files.no_init), files.SEEDED), 'dist.init_process_group("gloo")'),
    (3, (files.ddp(files.no_division), files.SEEDED), "Divide by the world size"),
    (3, (files.ddp(files.parameters_not_gradients), files.SEEDED), "averaged their parameters"),
    (3, (files.ddp(files.no_all_reduce), files.SEEDED), "own shard alone"),
    (3, (files.ddp(files.first_only), files.SEEDED), "end with different parameters"),
    (3, (files.ddp(files.summed_after_step), files.SEEDED), "not with one process"),
    (3, (files.ddp(files.trains_a_copy), files.SEEDED), "never changed"),
    (4, ("a", "a"), "may be late"),
    (4, ("c", "a"), "any shape"),
    (4, ("d", "a"), "cannot hang a run"),
    (4, ("b", "b"), "barrier is one more collective"),
    (4, ("b", "c"), "async_op=True"),
    (4, ("b", "d"), "only later"),
    (5, (48.75,), "half of it"),
    (5, (52.0,), "slowest link once"),
    (5, (0.0975,), "looks like seconds"),
    (5, (120.0,), "not it yet"),
]


def right_for(variant: Variant) -> dict:
    g1, g5 = check.given_1(variant), check.given_5(variant)
    n = g5.gpus
    return {
        1: (g1.nodes * g1.per_node, g1.node * g1.per_node + g1.local_rank),
        2: RIGHT[2],
        3: RIGHT[3],
        5: (1e3 * 2 * (n - 1) / n * 2 * g5.billions * 1e9 / (g5.gbs * 1e9),),
    }


@pytest.mark.slow
def test_distributed_data_parallel_passes_too():
    check.exercise_3(files.ddp(files.WITH_DDP))


def test_an_unwritten_or_stub_worker_is_not_answered(tmp_path):
    from course_utils.distributed.workers import Worker

    with pytest.raises(NotAnswered, match="no file .* run the cell that writes it"):
        check.exercise_2(Worker(tmp_path / "ring_worker.py", "ring_sum"))
    stub = tmp_path / "ddp_worker.py"
    stub.write_text(
        "def train(model, inputs, targets, steps, lr):\n    raise NotImplementedError()\n"
    )
    with pytest.raises(NotAnswered, match="still raises NotImplementedError"):
        check.exercise_3(Worker(stub, "train"))


def test_what_a_kernel_claims_is_not_evidence():
    case = WorkerRingCase(2, 3, 1)
    for claim in [{"passed": True}, {"world": 2, "returned": [1, 2]}, "✅ Right", None]:
        with pytest.raises(CheckFailed, match="did not come back as the record of a run"):
            evidence(claim, "ring_worker(...)", case)


def test_a_failed_run_gets_the_hint_of_its_kind():
    said = {
        "deadlock": failed_run("w", {"kind": "deadlock", "message": "deadlock: rank 0 waits"}),
        "no group": failed_run("w", {"kind": "raised", "message": "rank 0 raised ValueError: "
                                     "Default process group has not been initialized, please"}),
        "twice": failed_run("w", {"kind": "raised", "message": "trying to initialize the "
                                  "default process group twice!"}),
        "timeout": failed_run("w", {"kind": "timeout", "message": "the ranks ran past 60 s"}),
    }  # fmt: skip
    assert "`dist.isend`" in said["deadlock"] and "even ranks send first" in said["deadlock"]
    left = failed_run("w", {"kind": "deadlock", "message": "deadlock: rank 0 has finished; ..."})
    assert "returned while another still waited" in left
    assert 'dist.init_process_group("gloo")' in said["no group"]
    assert "Join the group once" in said["twice"]
    assert "never finishes" in said["timeout"]


def test_the_ring_inputs_add_exactly_and_the_reference_is_one_process():
    case = WorkerRingCase(2, 5, 7)
    a, b = case.inputs()
    assert a.dtype == torch.float32 and torch.equal(a, a.round()) and not torch.equal(a, b)
    ddp = WorkerDDPCase(2, 8, 8, 3, 7)
    mean, summed = replicas(ddp, "mean"), replicas(ddp, "sum")
    want = trained(ddp)
    assert all(torch.allclose(mean[0][k], want[k], atol=1e-6) for k in want)
    assert not all(torch.allclose(summed[0][k], want[k], atol=1e-4) for k in want)
    with pytest.raises(ValueError, match="multiple of world"):
        WorkerDDPCase(2, 7, 8, 3, 1)
