"""A long-lived worker thread for heavy compute, awaited from the event loop.

Why not `anyio.to_thread.run_sync`: it may run each call on a different pool thread, and
every OS thread that runs torch CPU kernels gets its own OpenMP team, and once a second
team exists the teams wait on each other: the same PPO update ran ~1.9x slower and a
rollout ~1.6x (docs/design.md, docs/checkpoints.md). So on CPU all torch work of the
pipeline goes through one `ComputeThread`; on CUDA each stage may have its own, since its
work there is mostly kernel launches.

Calls run in submission order. Awaiting a call is not cancellable once it has started:
cancellation waits for the call to return (compute polls `Shutdown.abort` to return
early), so no stage ever sees its state changed by an abandoned call.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel

T = TypeVar("T")


class ComputeThread:
    def __init__(self, name: str = "compute") -> None:
        self.name = name
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on this thread; the event loop stays free meanwhile."""
        done = anyio.Event()
        token = anyio.lowlevel.current_token()
        loop_thread = threading.get_ident()

        def wake(_: Future[T]) -> None:
            if threading.get_ident() == loop_thread:  # finished before the callback was added
                done.set()
                return
            # RuntimeError: the event loop has already closed, nobody is waiting.
            with contextlib.suppress(RuntimeError):
                anyio.from_thread.run_sync(done.set, token=token)

        future = self._executor.submit(fn, *args)
        future.add_done_callback(wake)
        with anyio.CancelScope(shield=True):
            await done.wait()
        return future.result()

    def close(self) -> None:
        self._executor.shutdown(wait=True)


class ComputeThreads:
    """Where each stage's torch work runs: on CPU one shared thread, so there is a single
    OpenMP team (see above); on CUDA one thread per stage, whose work is mostly launches."""

    def __init__(self, device_type: str) -> None:
        if device_type == "cpu":
            shared = ComputeThread("compute")
            self.producer = self.trainer = self.evaluator = shared
        else:
            self.producer = ComputeThread("producer")
            self.trainer = ComputeThread("trainer")
            self.evaluator = ComputeThread("evaluator")

    def close(self) -> None:
        for thread in {self.producer, self.trainer, self.evaluator}:
            thread.close()
