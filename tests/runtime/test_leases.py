"""Leases: pool backpressure, shared release, stale handles, no overwrite while held."""

from __future__ import annotations

import random
import time

import anyio
import pytest
import torch

from navrl_daemon.runtime.channels import Channel
from navrl_daemon.runtime.leases import Lease, LeaseError, LeasePool


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make_pool(size: int) -> LeasePool[torch.Tensor]:
    return LeasePool([torch.zeros(16) for _ in range(size)], name="test")


@pytest.mark.anyio
async def test_exhausted_pool_blocks_acquire_until_a_release() -> None:
    pool = make_pool(2)
    first, second = await pool.acquire(), await pool.acquire()
    assert {first.slot, second.slot} == {0, 1}
    assert pool.free == 0 and pool.size == 2
    with pytest.raises(anyio.WouldBlock):
        pool.acquire_nowait()
    got: list[Lease[torch.Tensor]] = []

    async def wait_for_buffer() -> None:
        got.append(await pool.acquire())

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_for_buffer)
        await anyio.sleep(0.05)
        assert got == []
        first.release()
    assert got[0].slot == first.slot
    assert pool.waiting_seconds >= 0.04
    got[0].release()
    second.release()
    assert pool.free == 2


@pytest.mark.anyio
async def test_waiters_are_served_first_come_first_served() -> None:
    pool = make_pool(1)
    held = pool.acquire_nowait()
    order: list[int] = []

    async def wait(i: int) -> None:
        with await pool.acquire():
            order.append(i)

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(wait, i)
            await anyio.sleep(0.005)
        held.release()
    assert order == [0, 1, 2]


@pytest.mark.anyio
async def test_cancelled_acquire_does_not_lose_a_buffer() -> None:
    pool = make_pool(1)
    held = pool.acquire_nowait()
    with anyio.move_on_after(0.01):
        await pool.acquire()
    held.release()
    assert pool.free == 1
    pool.acquire_nowait().release()


@pytest.mark.anyio
async def test_buffer_returns_only_after_every_shared_holder_releases() -> None:
    pool = make_pool(1)
    lease = pool.acquire_nowait()
    lease.meta["iteration"] = 7
    readers = lease.share(3)
    assert lease.released and len(readers) == 3
    assert all(r.meta["iteration"] == 7 and r.slot == lease.slot for r in readers)
    assert all(r.buffer is readers[0].buffer for r in readers)
    for reader in readers:
        assert pool.free == 0
        reader.release()
    assert pool.free == 1


@pytest.mark.anyio
async def test_share_zero_releases_at_once() -> None:
    pool = make_pool(1)
    assert pool.acquire_nowait().share(0) == []
    assert pool.free == 1
    with pytest.raises(ValueError):
        pool.acquire_nowait().share(-1)


@pytest.mark.anyio
async def test_released_handles_raise() -> None:
    pool = make_pool(1)
    lease = pool.acquire_nowait()
    lease.release()
    assert lease.released
    with pytest.raises(LeaseError):
        _ = lease.buffer
    with pytest.raises(LeaseError):
        lease.release()
    with pytest.raises(LeaseError):
        lease.share(2)
    with pytest.raises(LeaseError):
        lease.share(0)
    assert pool.free == 1  # the double release did not return the slot twice


@pytest.mark.anyio
async def test_shared_writer_handle_is_released() -> None:
    pool = make_pool(1)
    writer = pool.acquire_nowait()
    (reader,) = writer.share(1)
    with pytest.raises(LeaseError):
        _ = writer.buffer
    with pytest.raises(LeaseError):
        writer.share(1)
    with pytest.raises(LeaseError):
        writer.release()
    assert pool.free == 0
    reader.release()
    assert pool.free == 1


@pytest.mark.anyio
async def test_old_generation_handle_cannot_reach_a_relent_buffer() -> None:
    pool = make_pool(1)
    old = pool.acquire_nowait()
    (stale,) = old.share(1)
    stale.release()
    new = pool.acquire_nowait()
    assert new.slot == stale.slot and new.generation == stale.generation + 1
    with pytest.raises(LeaseError):
        _ = stale.buffer
    with pytest.raises(LeaseError):
        stale.release()
    assert not new.released
    assert new.buffer is pool._buffers[new.slot]
    new.release()


@pytest.mark.anyio
async def test_context_manager_releases_once() -> None:
    pool = make_pool(1)
    with pool.acquire_nowait() as lease:
        assert pool.free == 0
    assert lease.released and pool.free == 1
    with pool.acquire_nowait() as lease:
        lease.release()  # released inside: exit must not release again
    assert pool.free == 1
    with pytest.raises(ValueError):
        LeasePool([])


@pytest.mark.anyio
@pytest.mark.parametrize(("seed", "in_thread"), [(0, False), (1, False), (2, True)])
async def test_consumers_never_see_their_buffer_overwritten(seed: int, in_thread: bool) -> None:
    """A producer refills a 2-buffer pool as fast as it can; consumers hold leases for
    random short times (on the loop, or in a worker thread as stages do) and check the
    stamp they were handed is still there."""
    rng = random.Random(seed)
    iterations, consumers = 300, 2
    pool = make_pool(2)
    channels = [Channel[Lease[torch.Tensor]](f"to-{i}", capacity=2) for i in range(consumers)]
    checked = [0] * consumers

    async def produce() -> None:
        senders = [channel.sender() for channel in channels]
        for stamp in range(1, iterations + 1):
            lease = await pool.acquire()
            lease.buffer.fill_(stamp)
            lease.meta["stamp"] = stamp
            for sender, reader in zip(senders, lease.share(consumers), strict=True):
                await sender.send(reader)
        for sender in senders:
            await sender.aclose()

    async def consume(i: int) -> None:
        async with channels[i].receiver() as receiver:
            async for lease in receiver:
                with lease:
                    stamp = lease.meta["stamp"]
                    assert torch.all(lease.buffer == stamp)
                    hold = rng.choice([0, 0, 0.0005, 0.001])
                    if in_thread:
                        await anyio.to_thread.run_sync(time.sleep, hold)
                    else:
                        await anyio.sleep(hold)
                    assert torch.all(lease.buffer == stamp), "buffer overwritten while held"
                checked[i] += 1

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for i in range(consumers):
                tg.start_soon(consume, i)
            tg.start_soon(produce)
    assert checked == [iterations] * consumers
    assert pool.free == pool.size
    assert pool.waiting_seconds > 0  # the pool, not the channels, paced the producer
