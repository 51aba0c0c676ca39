"""Supervisor: lifecycle, flushes under their own deadline, a crashing stage, a responsive
loop."""

from __future__ import annotations

import os
import signal
import time

import anyio
import pytest
import torch

from navrl_daemon.errors import DataError, StageFailed
from navrl_daemon.runtime.signals import StopSignals
from navrl_daemon.runtime.supervisor import Shutdown, State, Supervisor


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Looping:
    """Works in 20 ms steps until told to stop; records its flush."""

    def __init__(self, name: str, shutdown: Shutdown, flush_s: float = 0.0) -> None:
        self.name = name
        self.shutdown = shutdown
        self.flush_s = flush_s
        self.steps = 0
        self.flushed_at: float | None = None

    async def run(self) -> None:
        while not self.shutdown.stopping:
            await anyio.to_thread.run_sync(time.sleep, 0.02)
            self.steps += 1

    async def flush(self, deadline: float) -> None:
        await anyio.sleep(self.flush_s)
        self.flushed_at = time.monotonic()


class Stubborn:
    """Ignores the stop: runs for a minute."""

    name = "stubborn"

    async def run(self) -> None:
        await anyio.sleep(60)

    async def flush(self, deadline: float) -> None:
        pass


class Crashing:
    name = "crasher"

    async def run(self) -> None:
        await anyio.sleep(0.1)
        raise ValueError("injected failure")

    async def flush(self, deadline: float) -> None:
        pass


@pytest.mark.anyio
async def test_signal_drains_then_flushes_every_stage() -> None:
    shutdown = Shutdown()
    stages = [Looping("a", shutdown), Looping("b", shutdown)]
    states: list[State] = []
    signals = StopSignals().install()
    sup = Supervisor(
        stages, shutdown_timeout_s=5, shutdown=shutdown, on_state=states.append, signals=signals
    )

    async def send_sigterm() -> None:
        await anyio.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)

    try:
        with signals.queued():
            async with anyio.create_task_group() as tg:
                tg.start_soon(send_sigterm)
                await sup.run()
    finally:
        signals.restore()
    assert shutdown.reason == "SIGTERM"
    assert states == [State.RUNNING, State.DRAINING, State.STOPPED]
    assert all(s.steps > 0 and s.flushed_at is not None for s in stages)


@pytest.mark.anyio
async def test_second_request_sets_abort() -> None:
    shutdown = Shutdown()
    sup = Supervisor([], shutdown_timeout_s=5, shutdown=shutdown)
    sup.request_stop("SIGINT")
    assert shutdown.stopping and not shutdown.abort.is_set()
    sup.request_stop("SIGINT")
    assert shutdown.abort.is_set()


@pytest.mark.anyio
async def test_crashing_stage_stops_everything_and_names_the_stage() -> None:
    shutdown = Shutdown()
    other = Looping("steady", shutdown)
    sup = Supervisor([other, Crashing()], shutdown_timeout_s=5, shutdown=shutdown)
    t0 = time.monotonic()
    with pytest.raises(StageFailed, match="stage crasher failed: ValueError: injected failure"):
        await sup.run()
    assert time.monotonic() - t0 < 5
    assert other.flushed_at is not None  # the healthy stage still flushed


@pytest.mark.anyio
async def test_a_stage_that_finds_bad_data_mid_run_keeps_exit_65() -> None:
    class BadData(Crashing):
        async def run(self) -> None:
            raise DataError("dataset d.h5: key actions: NaN at row 7")

    sup = Supervisor([BadData()], shutdown_timeout_s=5)
    with pytest.raises(StageFailed, match="NaN at row 7") as failed:
        await sup.run()
    assert failed.value.exit_code == 65
    with pytest.raises(StageFailed) as crashed:
        await Supervisor([Crashing()], shutdown_timeout_s=5).run()
    assert crashed.value.exit_code == 1


@pytest.mark.anyio
async def test_stage_ignoring_stop_is_cut_at_the_deadline() -> None:
    shutdown = Shutdown()
    sup = Supervisor([Stubborn()], shutdown_timeout_s=0.3, shutdown=shutdown)
    sup.request_stop("test")
    t0 = time.monotonic()
    with pytest.raises(StageFailed, match="did not stop within"):
        await sup.run()
    assert time.monotonic() - t0 < 3


@pytest.mark.anyio
async def test_a_late_stage_leaves_the_flushes_their_own_time() -> None:
    """A stage past the deadline is cancelled; the flushes after it still get the whole
    timeout (the final checkpoint is never written in zero seconds)."""

    shutdown = Shutdown()
    saver = Looping("saver", shutdown, flush_s=0.6)  # takes most of the 1 s timeout
    sup = Supervisor([Stubborn(), saver], shutdown_timeout_s=1.0, shutdown=shutdown)
    t0 = time.monotonic()  # before the stop: its deadline counts from the request
    sup.request_stop("test")
    with pytest.raises(StageFailed, match="did not stop within"):
        await sup.run()
    assert saver.flushed_at is not None
    assert 1.6 <= saver.flushed_at - t0 < 2.0  # the deadline, then its own 0.6 s
    assert sup.late == ["(pipeline)"]  # the stubborn stage, not the flush


@pytest.mark.anyio
async def test_slow_flush_is_bounded_by_the_deadline() -> None:
    shutdown = Shutdown()
    slow = Looping("slow", shutdown, flush_s=30)
    sup = Supervisor([slow], shutdown_timeout_s=0.5, shutdown=shutdown)
    sup.request_stop("test")
    t0 = time.monotonic()
    with pytest.raises(StageFailed, match="slow"):
        await sup.run()
    assert time.monotonic() - t0 < 3
    assert slow.flushed_at is None


@pytest.mark.anyio
async def test_loop_answers_within_100ms_while_a_1s_update_runs() -> None:
    """Heavy compute runs in a worker thread; the event loop stays free for probes."""
    shutdown = Shutdown()
    a = torch.randn(256, 256)

    def one_second_update() -> int:
        end, n = time.perf_counter() + 1.0, 0
        while time.perf_counter() < end:
            (a @ a).sum()
            n += 1
        return n

    class Busy:
        name = "busy"

        async def run(self) -> None:
            await anyio.to_thread.run_sync(one_second_update)
            shutdown.stop.set()

        async def flush(self, deadline: float) -> None:
            pass

    worst = 0.0

    class Probe:
        name = "probe"

        async def run(self) -> None:
            nonlocal worst
            while not shutdown.stopping:
                t0 = time.perf_counter()
                await anyio.sleep(0.01)
                worst = max(worst, time.perf_counter() - t0 - 0.01)

        async def flush(self, deadline: float) -> None:
            pass

    await Supervisor([Busy(), Probe()], shutdown_timeout_s=5, shutdown=shutdown).run()
    assert worst < 0.1, f"event loop stalled for {worst * 1000:.0f} ms"
