"""DeviceThreads: persistent threads, results in order, errors and timeouts surface cleanly."""

import gc
import threading
import time

import pytest
import torch

from course_utils.errors import CourseInputError, WorkerError
from course_utils.threads.devices import COOPERATE_S, Aborted, DeviceThreads


def test_runs_each_function_on_its_own_persistent_thread():
    with DeviceThreads(3, name="dev") as pool:
        first = pool.run([lambda: threading.current_thread().name for _ in range(3)])
        second = pool.run([lambda: threading.get_ident() for _ in range(3)])
        third = pool.run([lambda: threading.get_ident() for _ in range(3)])
    assert first == ["dev-0", "dev-1", "dev-2"]
    assert len(set(second)) == 3
    assert second == third  # same threads reused, not new ones
    assert threading.get_ident() not in second


def test_results_in_device_order_and_torch_single_threaded():
    with DeviceThreads(2) as pool:
        out = pool.run([lambda d=d: (d, torch.get_num_threads()) for d in range(2)])
    assert out == [(0, 1), (1, 1)]


def test_functions_run_concurrently():
    # Both must be inside at the same time, or the barrier times out and raises.
    barrier = threading.Barrier(2, timeout=5)
    with DeviceThreads(2) as pool:
        assert pool.run([barrier.wait, barrier.wait]) is not None


def test_error_names_device_chains_original_and_aborts_peers():
    def bad():
        raise ValueError("boom")

    def patient(pool):
        # A peer waiting for a message that never comes: gives up once abort is set.
        if not pool.abort.wait(timeout=10):
            return "never aborted"
        raise Aborted("gave up")

    with DeviceThreads(2) as pool:
        t0 = time.monotonic()
        with pytest.raises(WorkerError, match=r"device 1 failed: ValueError: boom") as info:
            pool.run([lambda: patient(pool), bad])
        assert time.monotonic() - t0 < 5
        assert isinstance(info.value.__cause__, ValueError)
        assert pool.run([lambda: 1, lambda: 2]) == [1, 2]  # usable again, abort cleared
        assert not pool.abort.is_set()


def test_timeout_names_devices_still_running():
    with DeviceThreads(2) as pool:
        with pytest.raises(WorkerError, match=r"timed out after 0.2 s with device 1 still"):
            pool.run([lambda: None, lambda: pool.abort.wait(10)], timeout=0.2)
        assert pool.run([lambda: "ok", lambda: "ok"]) == ["ok", "ok"]


def test_bad_input_and_closed_pool():
    with pytest.raises(CourseInputError, match="num_devices"):
        DeviceThreads(0)
    pool = DeviceThreads(1)
    with pytest.raises(CourseInputError, match="fns"):
        pool.run([lambda: 1, lambda: 2])
    pool.close()
    pool.close()  # idempotent
    with pytest.raises(WorkerError, match="closed"):
        pool.run([lambda: 1])


def test_close_joins_threads_and_forgotten_pools_are_cleaned_up():
    pool = DeviceThreads(2, name="closeme")
    threads = list(pool._threads)
    pool.close()
    assert not any(t.is_alive() for t in threads)

    forgotten = DeviceThreads(2, name="forgotten")
    threads = list(forgotten._threads)
    del forgotten
    gc.collect()
    for t in threads:
        t.join(timeout=5)
    assert not any(t.is_alive() for t in threads)


def test_keyboard_interrupt_in_caller_stops_workers(ctrl_c_delivered):
    import _thread

    with DeviceThreads(2) as pool:
        seen = []

        def wait_for_abort():
            seen.append(pool.abort.wait(10))

        timer = threading.Timer(0.2, _thread.interrupt_main)
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            pool.run([wait_for_abort, wait_for_abort])
        assert seen == [True, True]  # both workers saw abort and finished before re-raise
        assert pool.run([lambda: 1, lambda: 2]) == [1, 2]


def spin():
    """Pure Python that never looks at abort (a learner's runaway loop)."""
    n = 0
    while True:
        n += 1


def test_a_thread_that_ignores_abort_is_stopped_and_the_pool_closed():
    pool = DeviceThreads(2, name="spinner")
    threads = list(pool._threads)
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=r"timed out after 0.2 s with spinner 1 still running"):
        pool.run([lambda: None, spin], timeout=0.2)
    assert time.monotonic() - t0 < 0.2 + COOPERATE_S + 2
    assert not any(t.is_alive() for t in threads)  # stopped from outside, then joined
    with pytest.raises(WorkerError, match="closed"):
        pool.run([lambda: 1, lambda: 2])


def test_an_exception_in_the_waiting_caller_stops_runaway_workers(ctrl_c_delivered):
    import _thread

    pool = DeviceThreads(2)
    threads = list(pool._threads)

    def swallowing():  # even `except Exception` does not keep it alive: Stopped is a BaseException
        while True:
            try:
                spin()
            except Exception:
                pass

    threading.Timer(0.2, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        pool.run([spin, swallowing])
    assert not any(t.is_alive() for t in threads)
