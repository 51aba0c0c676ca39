"""Named, bounded channels between stages, over anyio memory object streams.

A `Channel` hands out `Sender` and `Receiver` handles. Every handle owns a clone of the
underlying stream, so closing one handle only withdraws that handle:

- once every sender handle is closed (and at least one was created) receivers drain what
  is buffered, then get `anyio.EndOfStream` (an `async for` simply ends);
- once every receiver handle is closed (and at least one was created) `send` raises
  `anyio.BrokenResourceError`; items still buffered are lost.

Several receivers compete for items (work-sharing), they do not each get a copy.

Overflow policies, applied when the buffer holds `capacity` items:

- `block`: `send` waits (backpressure); the time waited adds to `blocked_seconds`.
- `drop_newest`: the new item is dropped and `send` returns False.
- `drop_oldest`: the oldest pending item is dropped to make room for the new one.
- `coalesce`: only the newest pending item is kept (capacity must be 1): a newer item
  replaces a pending one, e.g. weights or snapshots where only the latest matters.

Every dropped item counts in `dropped` and goes to `on_drop` (e.g. to release its lease).
`sent` counts items that were enqueued, so `depth == sent - received - dropped` apart from
`drop_newest` drops, which never entered the buffer.

Use from one event-loop thread only: stages hop to worker threads for compute and come
back to the loop to send or receive.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, Self, TypeVar

import anyio
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

T = TypeVar("T")


class Overflow(enum.StrEnum):
    BLOCK = "block"
    DROP_NEWEST = "drop_newest"
    DROP_OLDEST = "drop_oldest"
    COALESCE = "coalesce"


@dataclass(frozen=True)
class ChannelStats:
    name: str
    capacity: int
    depth: int
    sent: int
    received: int
    dropped: int
    blocked_seconds: float


class Channel(Generic[T]):
    def __init__(
        self,
        name: str,
        capacity: int,
        overflow: Overflow | str = Overflow.BLOCK,
        on_drop: Callable[[T], None] | None = None,
    ) -> None:
        self.name = name
        self.capacity = capacity
        self.overflow = Overflow(overflow)
        if capacity < 1:
            raise ValueError(f"channel {name!r}: capacity must be >= 1, got {capacity}")
        if self.overflow is Overflow.COALESCE and capacity != 1:
            raise ValueError(f"channel {name!r}: coalesce keeps one item, capacity must be 1")
        self._on_drop = on_drop
        # The root ends stay open until the last handle of their side closes; the root
        # receive end is also how drop_oldest/coalesce pull out the pending item.
        self._send_root, self._receive_root = anyio.create_memory_object_stream[T](capacity)
        self._open_senders = 0
        self._open_receivers = 0
        self._sent = 0
        self._received = 0
        self._dropped = 0
        self._blocked_seconds = 0.0

    def sender(self) -> Sender[T]:
        """A new sender handle; raises `anyio.ClosedResourceError` once all have closed."""
        handle = Sender(self, self._send_root.clone())
        self._open_senders += 1
        return handle

    def receiver(self) -> Receiver[T]:
        """A new receiver handle; raises `anyio.ClosedResourceError` once all have closed."""
        handle = Receiver(self, self._receive_root.clone())
        self._open_receivers += 1
        return handle

    @property
    def stats(self) -> ChannelStats:
        return ChannelStats(
            name=self.name,
            capacity=self.capacity,
            depth=self._send_root.statistics().current_buffer_used,
            sent=self._sent,
            received=self._received,
            dropped=self._dropped,
            blocked_seconds=self._blocked_seconds,
        )

    def _drop(self, item: T) -> None:
        self._dropped += 1
        if self._on_drop is not None:
            self._on_drop(item)

    def _sender_closed(self) -> None:
        self._open_senders -= 1
        if self._open_senders == 0:
            self._send_root.close()

    def _receiver_closed(self) -> None:
        self._open_receivers -= 1
        if self._open_receivers == 0:
            self._receive_root.close()

    def __repr__(self) -> str:
        return f"<Channel {self.name!r} {self.overflow} {self.stats.depth}/{self.capacity}>"


class _Handle:
    _closed = False

    def _on_close(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._on_close()

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Sender(_Handle, Generic[T]):
    def __init__(self, channel: Channel[T], stream: MemoryObjectSendStream[T]) -> None:
        self._channel = channel
        self._stream = stream

    async def send(self, item: T) -> bool:
        """Enqueue `item` (waiting while full under `block`); False if it was dropped."""
        await anyio.lowlevel.checkpoint()  # a producer that never blocks still lets others run
        try:
            return self.send_nowait(item)
        except anyio.WouldBlock:
            pass
        start = time.perf_counter()
        try:
            await self._stream.send(item)
        finally:
            self._channel._blocked_seconds += time.perf_counter() - start
        self._channel._sent += 1
        return True

    def send_nowait(self, item: T) -> bool:
        """As `send`, but under `block` a full buffer raises `anyio.WouldBlock`."""
        channel = self._channel
        try:
            self._stream.send_nowait(item)
        except anyio.WouldBlock:
            if channel.overflow is Overflow.BLOCK:
                raise
            if channel.overflow is Overflow.DROP_NEWEST:
                channel._drop(item)
                return False
            oldest = channel._receive_root.receive_nowait()
            self._stream.send_nowait(item)
            channel._sent += 1
            channel._drop(oldest)  # last, so a failing on_drop leaves the channel consistent
            return True
        channel._sent += 1
        return True

    def _on_close(self) -> None:
        self._stream.close()
        self._channel._sender_closed()


class Receiver(_Handle, Generic[T]):
    def __init__(self, channel: Channel[T], stream: MemoryObjectReceiveStream[T]) -> None:
        self._channel = channel
        self._stream = stream

    async def receive(self) -> T:
        """The next item; `anyio.EndOfStream` once all senders closed and it is drained."""
        item = await self._stream.receive()
        self._channel._received += 1
        return item

    def receive_nowait(self) -> T:
        item = self._stream.receive_nowait()
        self._channel._received += 1
        return item

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def _on_close(self) -> None:
        self._stream.close()
        self._channel._receiver_closed()
