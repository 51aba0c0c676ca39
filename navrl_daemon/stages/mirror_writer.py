"""MirrorWriter: copies the run's resume point to `checkpoint.mirror`, off the training path.

The checkpoint writer offers each checkpoint it has written (`MirrorRequests`); those due
(every `checkpoint.mirror_every`-th interval checkpoint, and the final one) go through a
coalescing channel, so a slow mirror only ever skips to the newest. The copy runs in a
worker thread (storage/run_mirror.py: a new point, synced, then the pointer switched).
A failed write is logged and counted, and the mirror keeps its last good point; training
never waits for it. At the end, `flush` mirrors the newest checkpoint with the evaluations
and history finished after it was written.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import structlog

from navrl_daemon.runtime.channels import Receiver, Sender
from navrl_daemon.storage.checkpoint import CheckpointDir
from navrl_daemon.storage.run_mirror import RunMirror

log = structlog.get_logger("mirror_writer")


@dataclass
class MirrorRequests:
    """The checkpoint writer's end: it offers every checkpoint it wrote, the due ones go."""

    sender: Sender[Path]
    due: Callable[[int], bool]  # by iteration: Cadence.mirrors

    def offer(self, path: Path, iteration: int, final: bool) -> None:
        if final or self.due(iteration):
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                self.sender.send_nowait(path)

    def close(self) -> None:
        self.sender.close()


@dataclass(frozen=True)
class MirrorEvents:
    # a point written; with a time: the point the mirror held at start (a resume)
    on_written: Callable[..., None] = lambda when=None: None
    on_failed: Callable[[], None] = lambda: None


class MirrorWriter:
    name = "mirror_writer"

    def __init__(
        self,
        requests: Receiver[Path],
        mirror: RunMirror,
        state_dir: Path,
        events: MirrorEvents | None = None,
    ) -> None:
        self.requests = requests
        self.mirror = mirror
        self.state_dir = state_dir
        self.events = events or MirrorEvents()
        self.failures = 0

    async def run(self) -> None:
        try:
            with contextlib.suppress(Exception):  # an unreadable mirror is logged at start-up
                when = await anyio.to_thread.run_sync(self.mirror.written_at)
                if when is not None:  # the resume point already there: its age, not none
                    self.events.on_written(when)
            async for checkpoint in self.requests:
                await anyio.to_thread.run_sync(self._write, checkpoint)
        finally:
            self.requests.close()

    async def flush(self, deadline: float) -> None:
        """The newest checkpoint with everything written after it; past the deadline the
        copy is left behind (a torn write never becomes the current point)."""
        files = CheckpointDir(self.state_dir / "checkpoints").files()
        if files:
            await anyio.to_thread.run_sync(self._write, files[-1], abandon_on_cancel=True)

    def _write(self, checkpoint: Path) -> None:
        t0 = time.perf_counter()
        try:
            point = self.mirror.write(self.state_dir, checkpoint)
        except Exception as err:  # any file system's error: the mirror is a copy, training goes on
            self.failures += 1
            self.events.on_failed()
            log.error(
                "mirror write failed: training goes on, the mirror keeps its last resume point",
                mirror=self.mirror.location.where,
                checkpoint=checkpoint.name,
                error=f"{type(err).__name__}: {err}",
                failures=self.failures,
            )
            return
        if point is None:
            return  # the mirror holds these very files
        try:
            removed = self.mirror.remove_others(point)
        except Exception as err:  # left for the next write to remove
            removed = []
            log.warning("old mirror points not removed", error=f"{type(err).__name__}: {err}")
        self.events.on_written()
        log.info(
            "mirror written",
            mirror=self.mirror.location.where,
            point=point.folder,
            iteration=point.iteration,
            frames=point.frames,
            files=len(point.files),
            bytes=sum(int(e["bytes"]) for e in point.files.values()),
            seconds=round(time.perf_counter() - t0, 4),
            **({"removed": removed} if removed else {}),
        )
