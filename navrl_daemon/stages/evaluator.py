"""Evaluator: NavRL's evaluation of the newest published weights, off the training path.

It has its own env (same map as training) and its own policy copy; its work runs on the
compute thread it is given (on CPU the one training uses, so evaluation costs training
exactly its own compute); its input channel coalesces, so a slow evaluation skips versions instead
of slowing the trainer. Results go to `eval/results.jsonl` (one fsynced line each, all or
nothing), the log, and an optional output channel (the checkpoint writer's keep-best);
with a `BestPolicy`, the weights of the best evaluation so far go to `export/best.pt`. A
result that cannot be written (disk full) is logged, counted and written with the next
one: evaluation, like training, goes on.

A stop ends an evaluation in flight at its next progress check (every `CHECK_EVERY` env
steps): its result is dropped, and the compute thread (on CPU the trainer's) is free for
the last update and the final checkpoint. A long evaluation (thousands of steps, NavRL's
2,200) would otherwise hold the stop past `run.shutdown_timeout_s`.

With `log.video_interval` (`EvaluationVideos`), the first evaluation and every N-th after
it are flown recorded (the same numbers) and drawn as a GIF in a worker thread, handed to
telemetry (TensorBoard, W&B); the next evaluation waits for it (the newest weights then),
and a stop skips a video not yet drawn.

With a curriculum (rl/curriculum.py) the evaluator owns the curriculum's decisions: it
evaluates at its curriculum's current stage (`StageEvaluation` rebuilds the eval env when
the stage changes; `eval.layout` still chooses the spawn rule), counts every result
against the stage's rule, and sends the producer its progress (`CurriculumProgress`),
which the producer applies between rollouts.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio
import structlog

from navrl_daemon.pipeline.messages import CurriculumProgress, PolicyWeights
from navrl_daemon.rl.curriculum import Curriculum
from navrl_daemon.rl.evaluate import Progress, Trajectories, eval_rank
from navrl_daemon.rl.policy import NavRLPolicy
from navrl_daemon.runtime.channels import Receiver, Sender
from navrl_daemon.runtime.compute import ComputeThread
from navrl_daemon.runtime.supervisor import Shutdown
from navrl_daemon.storage.atomic import write_atomic
from navrl_daemon.storage.history import JsonLinesFile
from navrl_daemon.storage.policy_file import save_policy_state

log = structlog.get_logger("evaluator")
curriculum_log = structlog.get_logger("curriculum")

# Frames of a logged evaluation video (4 s at ops/video.py's 15 frames/s): drawing one
# costs 0.1-0.3 s of a CPU core (`eval --video` draws up to twice as many).
VIDEO_FRAMES = 60


class Evaluate(Protocol):
    """An evaluation of `policy`; `progress` is told (steps, envs done) as it goes."""

    def __call__(
        self, policy: NavRLPolicy, *, progress: Progress | None = None
    ) -> dict[str, Any]: ...


class RecordedEvaluate(Protocol):
    """An evaluation that also records the drones' paths, for a video, where its env can
    (`recordable`: a `RecordableEnv`)."""

    @property
    def recordable(self) -> bool: ...

    def recorded(
        self, policy: NavRLPolicy, *, progress: Progress | None = None
    ) -> tuple[dict[str, Any], Trajectories]: ...


@dataclass
class EvaluationVideos:
    """`log.video_interval`: the 1st evaluation of a daemon and every `every`-th after it
    are flown recorded (`record`, the same numbers) and drawn as a GIF (ops/video.py) for
    `on_video` (the record, the GIF's bytes), drawn off the compute thread."""

    record: RecordedEvaluate
    every: int
    on_video: Callable[[dict[str, Any], bytes], None]
    evaluations: int = 0  # evaluations started by this daemon

    def due(self) -> bool:
        """Whether the next evaluation is one to record (counted here)."""
        due = self.evaluations % self.every == 0
        self.evaluations += 1
        return due


class EvaluationStopped(Exception):
    """Raised from the progress check of an evaluation in flight when the daemon stops."""


@dataclass(frozen=True)
class EvaluatorEvents:
    """What the evaluator reports as it goes (telemetry, keep-best)."""

    on_result: Callable[[dict[str, Any]], None] = lambda _: None
    on_write_failed: Callable[[], None] = lambda: None


@dataclass(frozen=True)
class CurriculumDecisions:
    """With a curriculum: the evaluator's own, which its evaluation is at and every result
    counts against, and where its progress goes after each result (the producer)."""

    curriculum: Curriculum
    to_producer: Sender[CurriculumProgress]

    def observe(self, record: dict[str, Any]) -> None:
        """Count `record`; send the producer the progress (a promotion is logged)."""
        curriculum = self.curriculum
        promotion = curriculum.observe(record)
        if promotion is not None:
            rule = curriculum.stages[promotion.from_stage].promote
            curriculum_log.info(
                "curriculum promotion",
                from_stage=promotion.from_stage,
                to_stage=promotion.to_stage,
                name=curriculum.name(promotion.to_stage),
                rule=rule.model_dump() if rule else None,
                **promotion.result,
            )
        self.to_producer.send_nowait(CurriculumProgress(curriculum.progress))


@dataclass(frozen=True)
class EvaluatorContext:
    """What the evaluator runs with besides its inputs and outputs."""

    results_path: Path  # eval/results.jsonl
    shutdown: Shutdown
    compute: ComputeThread
    curriculum: CurriculumDecisions | None = None  # with a curriculum: its decisions


class Evaluator:
    name = "evaluator"

    def __init__(
        self,
        policy: NavRLPolicy,
        evaluate: Evaluate,
        weights: Receiver[PolicyWeights],
        *,
        context: EvaluatorContext,
        results: Sender[dict[str, Any]] | None = None,
        best: BestPolicy | None = None,
        videos: EvaluationVideos | None = None,
        events: EvaluatorEvents | None = None,
    ) -> None:
        events = events or EvaluatorEvents()
        self.curriculum = context.curriculum
        self.policy = policy
        self.videos = videos
        self.best = best
        self.evaluate = evaluate
        self.weights = weights
        self.results_path = context.results_path
        self.results_file = JsonLinesFile(context.results_path)
        self.on_write_failed = events.on_write_failed
        self.results = results
        self.on_result = events.on_result
        self.shutdown = context.shutdown
        self.compute = context.compute

    async def run(self) -> None:
        try:
            async for weights in self.weights:
                if self.shutdown.stopping:
                    continue  # drain without evaluating: shutting down
                structlog.contextvars.bind_contextvars(
                    iteration=weights.version, policy_version=weights.version
                )
                log.debug("evaluating")
                recorded = self.videos is not None and self.videos.due()
                try:
                    record, traj = await self.compute.run(self._evaluate, weights, recorded)
                except EvaluationStopped as stopped:
                    log.info("evaluation stopped: shutting down", after_steps=stopped.args[0])
                    continue
                await self._write(record)
                log.info("evaluation", **record)
                if self.curriculum is not None:
                    self.curriculum.observe(record)
                self.on_result(record)
                if self.best is not None:
                    await anyio.to_thread.run_sync(self.best.offer, record, weights.state)
                if self.results is not None:
                    await self.results.send(record)
                if traj is not None and not self.shutdown.stopping:
                    await self._video(record, traj)
        finally:
            if self.results is not None:
                self.results.close()
            if self.curriculum is not None:
                self.curriculum.to_producer.close()

    async def _write(self, record: dict[str, Any] | None) -> None:
        """Append `record` (None: only what is waiting); a failure is logged and counted,
        and the rows wait for the next try."""
        file = self.results_file
        write = file.flush if record is None else functools.partial(file.append, record)
        error = await anyio.to_thread.run_sync(write)
        if error is not None:
            self.on_write_failed()
            log.error(
                "evaluation result not written: kept, retried with the next one",
                path=str(self.results_path),
                error=f"{type(error).__name__}: {error}",
                waiting=len(file.waiting),
                dropped=file.dropped,
            )

    def _evaluate(
        self, weights: PolicyWeights, recorded: bool
    ) -> tuple[dict[str, Any], Trajectories | None]:
        """The evaluation's record, and with `recorded` the paths flown (for a video)."""
        self.policy.load_state_dict(weights.state)
        t0 = time.perf_counter()
        traj = None
        if recorded:
            assert self.videos is not None
            results, traj = self.videos.record.recorded(self.policy, progress=self._check_stop)
        else:
            results = self.evaluate(self.policy, progress=self._check_stop)
        record = {
            "iteration": weights.version,
            "frames": weights.frames,
            "policy_version": weights.version,
            "time": time.time(),
            "seconds": round(time.perf_counter() - t0, 3),
            **results,
        }
        return record, traj

    async def _video(self, record: dict[str, Any], traj: Trajectories) -> None:
        """The evaluation drawn as a GIF in a worker thread (the compute thread trains on
        the CPU); a video that cannot be drawn is logged, and evaluation goes on."""
        from navrl_daemon.ops.video import gif_bytes  # matplotlib: only with videos on

        assert self.videos is not None
        title = f"iteration {record['iteration']}"
        t0 = time.perf_counter()
        try:
            gif = await anyio.to_thread.run_sync(gif_bytes, traj, title, VIDEO_FRAMES)
        except Exception as err:
            log.warning("evaluation video not drawn", error=f"{type(err).__name__}: {err}")
            return
        log.info("evaluation video", seconds=round(time.perf_counter() - t0, 3), bytes=len(gif))
        self.videos.on_video(record, gif)

    def _check_stop(self, steps: int, _done: int) -> None:
        """In the compute thread: `shutdown.stopping` reads a flag the loop sets."""
        if self.shutdown.stopping:
            raise EvaluationStopped(steps)

    async def flush(self, deadline: float) -> None:
        """Results are appended and fsynced as they are made; retry any still waiting."""
        if self.results_file.waiting:
            await self._write(None)


class BestPolicy:
    """`export/best.pt`: the policy of the best evaluation so far (`eval_rank`), in NavRL's
    layout like `export/policy.pt`, and `best.json` beside it: that evaluation's record.
    The best so far starts from `best.json` of an earlier run on the state dir."""

    def __init__(self, path: Path, on_failed: Callable[[], None] = lambda: None) -> None:
        self.path = path
        self.on_failed = on_failed  # a failed write, counted like the export's
        self.record_path = path.with_suffix(".json")
        self.rank: tuple[float, ...] | None = None
        try:
            earlier = json.loads(self.record_path.read_text())
        except (OSError, ValueError):
            earlier = None
        if isinstance(earlier, dict) and path.exists():
            self.rank = eval_rank(earlier)

    def offer(self, record: dict[str, Any], state: dict[str, Any]) -> bool:
        """Write `state` if `record` is the best so far; whether it was. A failed write is
        logged: evaluation and training go on."""
        rank = eval_rank(record)
        if self.rank is not None and rank < self.rank:
            return False
        try:
            save_policy_state(self.path, state)
            write_atomic(self.record_path, (json.dumps(record, indent=1) + "\n").encode())
        except OSError as err:
            self.on_failed()
            log.warning("best policy not exported", path=str(self.path), error=str(err))
            return False
        self.rank = rank
        log.info(
            "best policy so far exported",
            path=str(self.path),
            iteration=record.get("iteration"),
            reach_goal=record.get("reach_goal"),
            collision=record.get("collision"),
        )
        return True
