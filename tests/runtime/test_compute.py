"""ComputeThread: one OS thread for every call, results and errors come back, cancel waits."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from navrl_daemon.runtime.compute import ComputeThread


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_every_call_runs_on_the_same_thread_in_order() -> None:
    compute = ComputeThread("t")
    seen: list[tuple[int, int]] = []

    def job(i: int) -> int:
        seen.append((i, threading.get_ident()))
        return i * i

    try:
        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(compute.run, job, i)
        assert await compute.run(job, 9) == 81
    finally:
        compute.close()
    assert len({ident for _, ident in seen}) == 1
    assert seen[0][1] != threading.get_ident()
    assert sorted(i for i, _ in seen) == [0, 1, 2, 3, 4, 9]


@pytest.mark.anyio
async def test_errors_propagate() -> None:
    compute = ComputeThread()

    def boom() -> None:
        raise ValueError("from the compute thread")

    try:
        with pytest.raises(ValueError, match="from the compute thread"):
            await compute.run(boom)
        assert await compute.run(lambda: 3) == 3  # still usable
    finally:
        compute.close()


@pytest.mark.anyio
async def test_cancellation_waits_for_the_call_to_return() -> None:
    compute = ComputeThread()
    finished = threading.Event()

    def slow() -> None:
        time.sleep(0.3)
        finished.set()

    try:
        with anyio.move_on_after(0.05):
            await compute.run(slow)
        assert finished.is_set()  # never abandoned half-way
    finally:
        compute.close()


@pytest.mark.anyio
async def test_loop_stays_responsive_during_a_call() -> None:
    compute = ComputeThread()
    worst = 0.0

    async def probe() -> None:
        nonlocal worst
        for _ in range(20):
            t0 = time.perf_counter()
            await anyio.sleep(0.01)
            worst = max(worst, time.perf_counter() - t0 - 0.01)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(compute.run, time.sleep, 0.5)
            tg.start_soon(probe)
    finally:
        compute.close()
    assert worst < 0.1
