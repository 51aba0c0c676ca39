"""Channels: backpressure, overflow policies, close/drain order, stats."""

from __future__ import annotations

import anyio
import pytest

from navrl_daemon.runtime.channels import Channel, Overflow


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def drain(channel: Channel[int]) -> list[int]:
    """Everything a fresh receiver gets, after the senders have closed."""
    async with channel.receiver() as receiver:
        return [item async for item in receiver]


@pytest.mark.anyio
async def test_block_sender_waits_until_a_receiver_takes_an_item() -> None:
    channel: Channel[int] = Channel("rollouts", capacity=1)
    sender, receiver = channel.sender(), channel.receiver()
    events: list[str] = []

    async def produce() -> None:
        await sender.send(1)
        events.append("sent 1")
        await sender.send(2)  # buffer full: waits for the receiver
        events.append("sent 2")

    async with anyio.create_task_group() as tg:
        tg.start_soon(produce)
        await anyio.sleep(0.05)
        assert events == ["sent 1"]
        assert channel.stats.depth == 1
        assert await receiver.receive() == 1
        await anyio.sleep(0.01)
        assert events == ["sent 1", "sent 2"]

    assert channel.stats.blocked_seconds >= 0.04
    assert await receiver.receive() == 2
    await sender.aclose()
    await receiver.aclose()


@pytest.mark.anyio
async def test_block_send_nowait_raises_would_block_when_full() -> None:
    channel: Channel[int] = Channel("c", capacity=2, overflow="block")
    async with channel.sender() as sender, channel.receiver() as receiver:
        assert sender.send_nowait(1) and sender.send_nowait(2)
        with pytest.raises(anyio.WouldBlock):
            sender.send_nowait(3)
        assert channel.stats.dropped == 0
        assert receiver.receive_nowait() == 1
        assert sender.send_nowait(3)
        assert [receiver.receive_nowait(), receiver.receive_nowait()] == [2, 3]
        with pytest.raises(anyio.WouldBlock):
            receiver.receive_nowait()


@pytest.mark.anyio
async def test_drop_newest_keeps_the_first_items() -> None:
    dropped: list[int] = []
    channel = Channel[int]("c", capacity=2, overflow=Overflow.DROP_NEWEST, on_drop=dropped.append)
    async with channel.sender() as sender:
        results = [await sender.send(i) for i in range(5)]
    assert results == [True, True, False, False, False]
    assert dropped == [2, 3, 4]
    assert channel.stats.dropped == 3 and channel.stats.sent == 2
    assert await drain(channel) == [0, 1]


@pytest.mark.anyio
async def test_drop_oldest_keeps_the_last_items() -> None:
    dropped: list[int] = []
    channel = Channel[int]("c", capacity=2, overflow=Overflow.DROP_OLDEST, on_drop=dropped.append)
    async with channel.sender() as sender:
        results = [await sender.send(i) for i in range(5)]
        assert sender.send_nowait(5)
    assert results == [True] * 5
    assert dropped == [0, 1, 2, 3]
    assert channel.stats.dropped == 4 and channel.stats.sent == 6
    assert channel.stats.depth == 2
    assert await drain(channel) == [4, 5]


@pytest.mark.anyio
async def test_coalesce_keeps_only_the_newest_pending_item() -> None:
    dropped: list[int] = []
    channel = Channel[int]("weights", capacity=1, overflow="coalesce", on_drop=dropped.append)
    sender, receiver = channel.sender(), channel.receiver()
    for version in range(3):
        assert await sender.send(version)
    assert await receiver.receive() == 2
    assert await sender.send(3)
    assert await receiver.receive() == 3
    assert dropped == [0, 1]
    stats = channel.stats
    assert (stats.sent, stats.received, stats.dropped, stats.depth) == (4, 2, 2, 0)
    sender.close()
    receiver.close()


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Channel("c", capacity=0)
    with pytest.raises(ValueError, match="capacity must be 1"):
        Channel("c", capacity=2, overflow="coalesce")
    with pytest.raises(ValueError):
        Channel("c", capacity=1, overflow="sometimes")


@pytest.mark.anyio
async def test_receivers_drain_everything_sent_before_close_then_end() -> None:
    channel: Channel[int] = Channel("c", capacity=8)
    first, second = channel.sender(), channel.sender()
    receiver = channel.receiver()
    for i in range(3):
        await first.send(i)
    await first.aclose()
    await first.aclose()  # idempotent
    await second.send(3)
    # One sender is still open: the stream has not ended.
    assert [receiver.receive_nowait() for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(anyio.WouldBlock):
        receiver.receive_nowait()
    await second.send(4)
    second.close()
    assert await receiver.receive() == 4
    with pytest.raises(anyio.EndOfStream):
        await receiver.receive()
    with pytest.raises(anyio.ClosedResourceError):
        channel.sender()
    receiver.close()


@pytest.mark.anyio
async def test_closing_senders_wakes_a_waiting_receiver_with_end_of_stream() -> None:
    channel: Channel[str] = Channel("c", capacity=1)
    sender = channel.sender()
    received: list[str] = []

    async def consume() -> None:
        async with channel.receiver() as receiver:
            async for item in receiver:
                received.append(item)
            received.append("<end>")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await sender.send("a")
            await sender.send("b")
            await anyio.sleep(0.01)
            assert received == ["a", "b"]
            await sender.aclose()
    assert received == ["a", "b", "<end>"]


@pytest.mark.anyio
async def test_several_receivers_share_the_items() -> None:
    channel: Channel[int] = Channel("c", capacity=4)
    got: dict[str, list[int]] = {"a": [], "b": []}

    async def consume(key: str) -> None:
        async with channel.receiver() as receiver:
            async for item in receiver:
                got[key].append(item)
                await anyio.sleep(0)

    async with anyio.create_task_group() as tg:
        for key in got:
            tg.start_soon(consume, key)
        async with channel.sender() as sender:
            for i in range(20):
                await sender.send(i)
    assert sorted(got["a"] + got["b"]) == list(range(20))
    assert got["a"] and got["b"]


@pytest.mark.anyio
async def test_closing_all_receivers_breaks_senders() -> None:
    channel: Channel[int] = Channel("c", capacity=1)
    sender = channel.sender()
    first, second = channel.receiver(), channel.receiver()
    await sender.send(0)
    first.close()
    with pytest.raises(anyio.WouldBlock):
        sender.send_nowait(1)  # one receiver left: still only full, not broken

    async def blocked_send() -> None:
        with pytest.raises(anyio.BrokenResourceError):
            await sender.send(1)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(blocked_send)
            await anyio.sleep(0.01)
            await second.aclose()
    with pytest.raises(anyio.BrokenResourceError):
        sender.send_nowait(2)
    with pytest.raises(anyio.ClosedResourceError):
        channel.receiver()
    sender.close()


@pytest.mark.anyio
async def test_closed_handles_refuse_use() -> None:
    channel: Channel[int] = Channel("c", capacity=1)
    keep_open = channel.sender()
    sender, receiver = channel.sender(), channel.receiver()
    sender.close()
    receiver.close()
    with pytest.raises(anyio.ClosedResourceError):
        await sender.send(1)
    with pytest.raises(anyio.ClosedResourceError):
        await receiver.receive()
    keep_open.close()


@pytest.mark.anyio
async def test_stats_track_depth_capacity_sent_received() -> None:
    channel: Channel[int] = Channel("rollouts", capacity=3)
    stats = channel.stats
    assert (stats.name, stats.capacity, stats.depth, stats.sent, stats.received) == (
        "rollouts",
        3,
        0,
        0,
        0,
    )
    async with channel.sender() as sender, channel.receiver() as receiver:
        for i in range(3):
            await sender.send(i)
        assert (channel.stats.depth, channel.stats.sent) == (3, 3)
        await receiver.receive()
        receiver.receive_nowait()
        stats = channel.stats
        assert (stats.depth, stats.sent, stats.received, stats.dropped) == (1, 3, 2, 0)
        assert stats.blocked_seconds == 0.0
