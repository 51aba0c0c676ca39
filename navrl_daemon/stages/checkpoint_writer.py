"""CheckpointWriter: turns staged snapshots into `.nrc` files, off the training path.

The trainer only stages a snapshot (a host copy) and drops it into a coalescing queue;
here it is serialised, compressed by `checkpoint.workers` threads, written durably
(storage/checkpoint.py) and old files pruned (files that are not valid checkpoints are moved
aside, never counted). Low on disk space, older checkpoints are deleted to make room before
a write, never the newest valid one. A failed write (disk full, I/O error, permissions, a
non-finite tensor) is logged and counted and training goes on: the next interval tries
again and every file already written stays. On shutdown the trainer sends
its final snapshot and closes the queue; `run` writes whatever is pending, then ends.
With `checkpoint.mirror`, each file written is offered to the MirrorWriter
(stages/mirror_writer.py), which copies the due ones in its own thread.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import structlog

from navrl_daemon.config import CheckpointConfig
from navrl_daemon.pipeline.messages import Snapshot
from navrl_daemon.runtime.channels import Receiver
from navrl_daemon.stages.mirror_writer import MirrorRequests
from navrl_daemon.storage.checkpoint import (
    REJECTED,
    CheckpointDir,
    encode_checkpoint,
    parse_header,
)

log = structlog.get_logger("checkpoint_writer")


class CheckpointWriter:
    name = "checkpoint_writer"

    def __init__(
        self,
        snapshots: Receiver[Snapshot],
        directory: CheckpointDir,
        cfg: CheckpointConfig,
        *,
        meta: dict[str, Any],
        # seconds, raw bytes, stored bytes, iteration
        on_written: Callable[[float, int, int, int], None] = lambda *_: None,
        on_failed: Callable[[], None] = lambda: None,
        scores: dict[int, float] | None = None,
        mirror: MirrorRequests | None = None,
    ) -> None:
        self.snapshots = snapshots
        self.directory = directory
        self.cfg = cfg
        self.meta = meta
        self.on_written = on_written
        self.on_failed = on_failed
        # Eval reach_goal by iteration, for `keep_best` (see `record_eval`); only those of
        # files on disk and of iterations not written yet are kept (`_prune`).
        self.scores: dict[int, float] = dict(scores or {})
        self.mirror = mirror  # offered each checkpoint written (checkpoint.mirror)
        self.failures = 0
        self._pool = ThreadPoolExecutor(cfg.workers, thread_name_prefix="checkpoint")

    def record_eval(self, iteration: int, reach_goal: float) -> None:
        self.scores[iteration] = reach_goal

    async def run(self) -> None:
        try:
            async for snapshot in self.snapshots:
                await self._write(snapshot)
        finally:
            self.snapshots.close()
            if self.mirror is not None:
                self.mirror.close()

    async def flush(self, deadline: float) -> None:
        """If `run` was cut short (deadline, failure), write what is still queued."""
        while True:
            try:
                snapshot = self.snapshots.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
            await self._write(snapshot)
        self._pool.shutdown(wait=False)

    async def _write(self, snapshot: Snapshot) -> None:
        try:
            path = await anyio.to_thread.run_sync(self._write_sync, snapshot)
        finally:
            snapshot.staged.release()
        if path is not None and self.mirror is not None:
            self.mirror.offer(path, snapshot.iteration, snapshot.final)

    def _write_sync(self, snapshot: Snapshot) -> Path | None:
        t0 = time.perf_counter()
        try:
            snapshot.staged.ready()
            data = encode_checkpoint(
                snapshot.staged.state,
                iteration=snapshot.iteration,
                frames=snapshot.frames,
                policy_version=snapshot.iteration,
                level=self.cfg.compression_level,
                meta={**self.meta, "final": snapshot.final},
                executor=self._pool,
            )
            path = self.directory.write(data, snapshot.iteration)
            if self.directory.made_room:
                log.warning(
                    "low disk space: older checkpoints removed to make room",
                    files=[p.name for p in self.directory.made_room],
                )
        except (OSError, ValueError, TypeError) as err:
            self.failures += 1
            self.on_failed()
            log.error(
                "checkpoint write failed: training goes on, next interval retries",
                iteration=snapshot.iteration,
                error=_describe(err),
                failures=self.failures,
            )
            return None
        seconds = time.perf_counter() - t0
        header = parse_header(data)
        self.on_written(seconds, header.raw_bytes, header.stored_bytes, snapshot.iteration)
        removed = self._prune(path, snapshot.iteration)
        if self.directory.manifest_error is not None:
            log.warning(
                "MANIFEST.json not written (removed if it no longer matched the files); "
                "the next checkpoint writes it",
                error=_describe(self.directory.manifest_error),
            )
        log.info(  # one line per checkpoint, with the old files it replaced
            "checkpoint written",
            path=str(path),
            iteration=snapshot.iteration,
            frames=snapshot.frames,
            final=snapshot.final,
            raw_bytes=header.raw_bytes,
            stored_bytes=header.stored_bytes,
            seconds=round(seconds, 4),
            **({"removed": [p.name for p in removed]} if removed else {}),
        )
        return path

    def _prune(self, newest: Path, iteration: int) -> list[Path]:
        """Delete old files (keep_last, keep_best, keep_every); forget the scores no file
        can use."""
        scores = {self.directory.path / f"ckpt-{it:09d}.nrc": s for it, s in self.scores.items()}
        try:
            removed = self.directory.prune(
                self.cfg.keep_last,
                self.cfg.keep_best,
                scores,
                newest_valid=newest,
                keep_every=self.cfg.keep_every,
            )
        except OSError as err:
            log.warning("pruning old checkpoints failed", error=_describe(err))
            return []
        for path, why in self.directory.rejected:
            log.warning(
                "not a valid checkpoint: moved aside, it never counts",
                file=str(path),
                to=str(self.directory.path / REJECTED),
                reason=why,
            )
        gone = {int(p.stem.removeprefix("ckpt-")) for p in removed}
        # Files are written in iteration order: an older iteration with no file now never
        # gets one, so its score can go (the dict stays as small as the kept files).
        on_disk = {int(p.stem.removeprefix("ckpt-")) for p in scores if p.exists()} - gone
        self.scores = {it: s for it, s in self.scores.items() if it > iteration or it in on_disk}
        return removed


def _describe(err: BaseException) -> str:
    if isinstance(err, OSError) and err.errno is not None:
        name = errno.errorcode.get(err.errno, str(err.errno))
        return f"{name}: {err.strerror or err}" + (f" ({err.filename})" if err.filename else "")
    return f"{type(err).__name__}: {err}"
