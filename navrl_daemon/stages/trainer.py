"""Trainer: PPO-updates on each leased rollout, then publishes versioned weights.

The update runs on a compute thread (the event loop only moves leases); the lease is
released the moment the update is done (with `pipeline.compress_rollouts`, as soon as the
batch is compressed, before the epochs), so the producer can refill that buffer. When the
rollout channel ends (the producer stopped) the trainer has trained on every rollout it
was handed; it then stages a final snapshot for the checkpoint writer, with the
collector state the producer sent when it stopped (`FinalCollectorState`), and its flush
exports the final policy in NavRL's layout (a failed export is logged, never fatal:
pipeline/export.py).

Checkpoints: every `checkpoint.interval` updates (pipeline/cadence.py) the trainer stages its
learner state (host copies into reusable buffers, made off the training thread;
storage/staging.py) together with the collector state the producer captured right after
that rollout (pipeline/messages.py's `Rollout`), and
hands the snapshot to the writer's coalescing queue; it never waits for serialisation or
disk, and waits for the copies only if its next update starts before they are done. Too
many non-finite updates in a row roll the learner back to the newest valid checkpoint on
disk.

With `pipeline.trainer_stream` (CUDA) everything the trainer runs on the GPU (update,
weights' copies, snapshot staging) goes on a stream of its own. Its update waits for the
rollout's `ready` event only, not for what the producer queued after it, so with lag 1
the next rollout runs on the GPU beside the update. Whatever leaves the trainer is
finished on its stream first: the lease is released, and weights are published, after a
synchronize of that stream (the update has already waited for its statistics).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import structlog
import torch

from navrl_daemon.ops.logging import FirstError
from navrl_daemon.ops.progress import IterationRecord
from navrl_daemon.pipeline.cadence import Cadence
from navrl_daemon.pipeline.export import export_policy
from navrl_daemon.pipeline.messages import FinalCollectorState, PolicyWeights, Rollout, Snapshot
from navrl_daemon.rl.learner import Learner, NonFiniteTraining
from navrl_daemon.rl.run_state import COLLECTOR, LEARNER, RunState
from navrl_daemon.runtime.channels import Receiver, Sender
from navrl_daemon.runtime.compute import ComputeThread
from navrl_daemon.runtime.streams import TrainerStream
from navrl_daemon.runtime.supervisor import Shutdown
from navrl_daemon.storage.staging import SnapshotStaging

log = structlog.get_logger("trainer")


@dataclass
class Checkpointing:
    """What the trainer needs to hand snapshots to the CheckpointWriter."""

    snapshots: Sender[Snapshot]
    staging: SnapshotStaging
    # Constant entries of every snapshot: resolved config, library versions.
    static: dict[str, Any]
    # The collector's final state, sent by the producer when it stops (the final
    # snapshot's); None: the final snapshot holds no collector state.
    final_state: Receiver[FinalCollectorState] | None = None
    on_stall: Callable[[float], None] = lambda _: None
    # The valid checkpoint file of an iteration, if one is on disk (CheckpointDir.holding).
    holding: Callable[[int], Path | None] = lambda iteration: None
    # Snapshots before this one was sent would repeat it: the version last snapshotted.
    last_version: int = -1


@dataclass(frozen=True)
class TrainerContext:
    """What the trainer runs with besides its inputs and outputs."""

    cadence: Cadence
    shutdown: Shutdown
    compute: ComputeThread
    # The run's stateful parts: the trainer captures the learner's half of them.
    state: RunState
    # None: export nothing (a rank other than 0, whose policy is rank 0's).
    export_path: Path | None
    start_frames: int = 0
    # Loads the newest valid checkpoint's learner state into the learner after too
    # many non-finite updates; returns its path (pipeline/coordinator.py).
    rollback: Callable[[Learner], Path] | None = None
    # `pipeline.trainer_stream` on a CUDA device: the trainer's own stream.
    stream: TrainerStream = field(default_factory=TrainerStream)


@dataclass(frozen=True)
class TrainerEvents:
    """What the trainer reports as it goes (telemetry)."""

    on_iteration: Callable[[IterationRecord], None] = lambda _: None
    on_export_failed: Callable[[], None] = lambda: None
    # ("update", True) when an update starts, ("update", False) when it ends.
    on_phase: Callable[[str, bool], None] = lambda _name, _running: None
    # ("update", done, total) as the update's minibatch steps are done (compute thread).
    on_phase_progress: Callable[[str, int, int], None] = lambda _name, _done, _total: None


class Trainer:
    name = "trainer"

    def __init__(
        self,
        learner: Learner,
        rollouts: Receiver[Rollout],
        weights: Sequence[Sender[PolicyWeights]],
        *,
        context: TrainerContext,
        evaluations: Sender[PolicyWeights] | None = None,
        checkpoints: Checkpointing | None = None,
        events: TrainerEvents | None = None,
    ) -> None:
        events = events or TrainerEvents()
        self.learner = learner
        self.stream = context.stream
        self.on_export_failed = events.on_export_failed
        self.on_phase = events.on_phase
        self.on_phase_progress = events.on_phase_progress
        self.rollouts = rollouts
        self.weights = list(weights)
        self.cadence = context.cadence
        self.frames = context.start_frames
        self.evaluations = evaluations
        self.checkpoints = checkpoints
        if checkpoints is not None:  # a resumed run's start is on disk: never rewritten
            checkpoints.last_version = learner.version
        self.export_path = context.export_path
        self.rollback = context.rollback
        self.on_iteration = events.on_iteration
        self.shutdown = context.shutdown
        self.compute = context.compute
        self.state = context.state
        self._rollbacks: dict[Path, int] = {}
        # Held while the weights change, so a flush never reads a half-stepped policy.
        self._weights_lock = threading.Lock()
        self._capture_failure = FirstError(
            log,
            "CUDA graph capture failed: the PPO update goes on as ppo.update_path = "
            "'fused' (the same maths, launched step by step)",
        )

    async def run(self) -> None:
        ckpt = self.checkpoints
        try:
            async for rollout in self.rollouts:
                with rollout.lease:
                    t0, lag = time.perf_counter(), self._starting(rollout)
                    losses = await self.compute.run(
                        self._update, rollout.lease.buffer, self._releaser(rollout), rollout.ready
                    )
                record = self._record(rollout, lag, time.perf_counter() - t0, losses)
                await self._publish()
                if ckpt and self.cadence.checkpoints(record.iteration):
                    await self._snapshot(rollout.collector_state, final=False)
                self.on_iteration(record)
            if ckpt and ckpt.last_version != self.learner.version and self.learner.version:
                await self._snapshot(await self._final_state(), final=True)
        finally:
            outputs = [*self.weights, self.evaluations, ckpt and ckpt.snapshots]
            for out in outputs:
                if out is not None:
                    out.close()
            if ckpt is not None:  # the last snapshot's copies finish on their own
                ckpt.staging.close(wait=False)

    async def _final_state(self) -> dict[str, Any] | None:
        """The collector state the producer sent when it stopped (None if it sent none)."""
        assert self.checkpoints is not None
        final = self.checkpoints.final_state
        if final is None:
            return None
        try:
            return (await final.receive()).state
        except anyio.EndOfStream:  # the producer stopped without one (it failed)
            return None

    async def _snapshot(self, collected: dict[str, Any] | None, *, final: bool) -> None:
        """Start staging the learner (the trainer's only stall) and queue the snapshot."""
        ckpt = self.checkpoints
        assert ckpt is not None

        def stage() -> Any:  # on the trainer's stream: ordered before its next update
            with self._weights_lock, self.stream.on():
                return ckpt.staging.stage({LEARNER: self.state.capture(LEARNER)})

        t0 = time.perf_counter()
        staged = await self.compute.run(stage)
        ckpt.on_stall(time.perf_counter() - t0)
        staged.state.update(ckpt.static, frames=self.frames)
        if collected is not None:
            staged.state[COLLECTOR] = collected
        ckpt.last_version = self.learner.version
        await ckpt.snapshots.send(Snapshot(self.learner.version, self.frames, staged, final))

    def _starting(self, rollout: Rollout) -> int:
        """The update on `rollout` starts: its policy lag, logged with the iteration."""
        lag = self.learner.version - rollout.policy_version
        structlog.contextvars.bind_contextvars(  # iteration N makes policy version N
            iteration=rollout.iteration + 1, policy_version=self.learner.version
        )
        log.debug("updating", policy_lag=lag)
        return lag

    def _releaser(self, rollout: Rollout) -> Callable[[], None]:
        """Releases the rollout's lease from the compute thread, once the update stops
        reading it (finished on the GPU too)."""
        token = anyio.lowlevel.current_token()

        def release() -> None:
            self.stream.finish()
            anyio.from_thread.run_sync(rollout.lease.release, token=token)

        return release

    def _record(
        self, rollout: Rollout, lag: int, update_s: float, losses: dict[str, float]
    ) -> IterationRecord:
        self.frames += self.cadence.frames_per_iteration
        return IterationRecord(
            iteration=self.learner.version,
            frames=self.frames,
            policy_lag=lag,
            collect_s=rollout.collect_s,
            update_s=update_s,
            losses=losses,
            episodes=rollout.episodes,
            rolled_back=bool(losses.get("rolled_back")),
        )

    def _update(
        self,
        buffer: object,
        release: Callable[[], None] | None = None,
        ready: torch.cuda.Event | None = None,
    ) -> dict[str, float]:
        with self._weights_lock, self.stream.on():
            self.stream.wait_for(ready)  # the rollout's kernels, and nothing queued after
            if self.checkpoints is not None:
                self.checkpoints.staging.fence()  # a snapshot still reading the weights
            self.on_phase("update", True)
            try:
                losses = self.learner.update(
                    buffer,  # type: ignore[arg-type]
                    abort=self.shutdown.abort,
                    release=release,
                    progress=lambda done, total: self.on_phase_progress("update", done, total),
                )
                self._capture_failure.check(self.learner.capture_error)
                return losses
            except NonFiniteTraining as err:
                rollback = self.rollback
                if not rollback:
                    raise
                return self._roll_back(rollback, err)
            finally:
                self.on_phase("update", False)

    def _roll_back(
        self, rollback: Callable[[Learner], Path], err: NonFiniteTraining
    ) -> dict[str, float]:
        """Replace the learner state by the newest valid checkpoint's, and count this as
        the iteration's update (versions only move forward). Gives up after 3 rollbacks
        to the same file: the same state keeps diverging."""
        try:
            path = rollback(self.learner)
        except Exception as load_err:
            raise NonFiniteTraining(f"{err}; no checkpoint to roll back to: {load_err}") from err
        self._rollbacks[path] = self._rollbacks.get(path, 0) + 1
        if self._rollbacks[path] > 3:
            raise NonFiniteTraining(f"{err}; rolled back to {path.name} 3 times already") from err
        self.learner.version += 1
        log.error(
            "non-finite training: ROLLED BACK to the last valid checkpoint",
            checkpoint=str(path),
            reason=str(err),
            rollbacks_to_this_file=self._rollbacks[path],
        )
        return {"rolled_back": 1.0}

    def _weights(self) -> dict[str, torch.Tensor]:
        """The learner's weights copied, the copies finished (others read them on their
        own streams)."""
        with self.stream.on():
            weights = self.learner.weights()
        self.stream.finish()
        return weights

    async def _publish(self) -> None:
        version = self.learner.version
        weights = PolicyWeights(version, self.frames, await self._run_locked(self._weights))
        for out in self.weights:
            await out.send(weights)
        if self.evaluations is not None and self.cadence.evaluates(version):
            await self.evaluations.send(weights)

    async def _run_locked(self, fn: Callable[[], object]) -> object:
        def locked() -> object:
            with self._weights_lock:
                return fn()

        return await self.compute.run(locked)

    async def flush(self, deadline: float) -> None:
        if self.export_path is None:
            return
        if self.learner.version == 0:
            log.info("nothing trained: policy not exported", path=str(self.export_path))
            return  # never replace an earlier run's export with untrained weights
        state = await self._run_locked(self.learner.policy.state_dict)
        holding = self.checkpoints.holding if self.checkpoints else lambda iteration: None
        await export_policy(
            self.export_path,
            state,  # type: ignore[arg-type]
            on_failed=self.on_export_failed,
            checkpoint=lambda: holding(self.learner.version),
            iteration=self.learner.version,
            frames=self.frames,
        )
