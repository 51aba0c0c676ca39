"""`navrl-daemon run`: wires the stages of docs/design.md §2 and hands them to the supervisor.

```
  RolloutProducer ──rollouts: leases (block)──► Trainer ──snapshots (coalesce)──► CheckpointWriter
     ▲     │                                       ├──weights (coalesce)──► Evaluator
     │     └──every archive.interval-th rollout (block|drop)──► RolloutArchiver
     └──────────────── weights (coalesce) ─────────┘
```
Before anything runs, the newest valid checkpoint in `STATE_DIR/checkpoints` (if any) is
loaded into the learner and the collector (stages/resume.py).

Started by torchrun as one of several ranks (pipeline/ranks.py), every rank runs a
producer and a trainer on its own envs, and the trainers average gradients; rank 0 alone
owns the state dir (lock, checkpoints, evaluations, archive, history) and the others only
train. All ranks stop at the same rollout, agreed on in the producer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import structlog
import torch

from navrl_daemon import __version__
from navrl_daemon.config import Config, resolve_device, to_toml
from navrl_daemon.env.curriculum import Curriculum
from navrl_daemon.errors import DataError, StageFailed
from navrl_daemon.ops.logging import bind_process_fields
from navrl_daemon.pipeline import offline
from navrl_daemon.pipeline.ranks import Ranks, collector_for_rank
from navrl_daemon.pipeline.telemetry import Telemetry
from navrl_daemon.rl.captured_rollout import CapturedRollout
from navrl_daemon.rl.evaluate import Evaluation
from navrl_daemon.rl.policy import NavRLPolicy
from navrl_daemon.rl.snapshot import learner_state, restore_learner
from navrl_daemon.rl.training import (
    Collector,
    Learner,
    acting_copy,
    eval_steps,
    make_eval_env,
    make_policy,
)
from navrl_daemon.runtime.channels import Channel, Overflow, Sender
from navrl_daemon.runtime.compute import ComputeThreads
from navrl_daemon.runtime.distributed import World
from navrl_daemon.runtime.leases import LeasePool
from navrl_daemon.runtime.lock import StateDirLock
from navrl_daemon.runtime.supervisor import Shutdown, State, Supervisor
from navrl_daemon.stages import resume
from navrl_daemon.stages.archiver import RolloutArchiver, archive_channel
from navrl_daemon.stages.checkpoint_writer import CheckpointWriter
from navrl_daemon.stages.evaluator import Evaluator, StageEvaluation, eval_scores
from navrl_daemon.stages.messages import PolicyWeights, Snapshot
from navrl_daemon.stages.producer import RolloutProducer
from navrl_daemon.stages.trainer import Checkpointing, IterationRecord, Trainer
from navrl_daemon.storage.atomic import write_atomic
from navrl_daemon.storage.checkpoint import CheckpointDir
from navrl_daemon.storage.compressed_rollout import CompressedMinibatches
from navrl_daemon.storage.staging import SnapshotStaging

log = structlog.get_logger("daemon")


def run(cfg: Config, state_dir: Path) -> int:
    """Train until `run.total_frames` or a signal. Raises NavrlError subclasses."""
    world = World.from_environ()
    serving = functools.partial(serve, cfg, state_dir, world=world)
    if world.distributed:
        bind_process_fields(rank=world.rank)
    if not world.leader:  # rank 0 owns the state dir; this rank only trains
        anyio.run(serving)
        return 0
    with StateDirLock(state_dir):
        write_atomic(state_dir / "config.toml", to_toml(cfg).encode())
        anyio.run(serving)
    return 0


async def serve(
    cfg: Config,
    state_dir: Path,
    observe: Callable[[IterationRecord], None] | None = None,
    world: World | None = None,
) -> None:
    """The daemon's event loop. `observe` sees every iteration's record (benchmarks, tests)."""
    world = world or World()
    device = world.device(resolve_device(cfg))
    if cfg.run.torch_threads:
        torch.set_num_threads(cfg.run.torch_threads)
    log.info(
        "starting",
        version=__version__,
        torch=torch.__version__,
        device=str(device),
        state_dir=str(state_dir),
        num_envs=cfg.env.num_envs,
        frames_per_iteration=cfg.frames_per_iteration * world.world_size,
        total_frames=cfg.run.total_frames,
        max_policy_lag=cfg.pipeline.max_policy_lag,
        **({"rank": world.rank, "world_size": world.world_size} if world.distributed else {}),
    )
    telemetry = Telemetry(cfg, device, observe, world)
    shutdown = Shutdown()
    threads = ComputeThreads(device.type)
    ranks: Ranks | None = None
    failure: StageFailed | None = None
    try:
        if world.distributed:
            ranks = await anyio.to_thread.run_sync(Ranks, world, device, cfg.distributed.timeout_s)
        telemetry.start()
        stages = await threads.producer.run(
            build_stages, cfg, state_dir, device, shutdown, threads, telemetry, ranks
        )

        def on_state(state: State) -> None:
            telemetry.state(state, shutdown.reason)

        supervisor = Supervisor(
            stages,
            shutdown_timeout_s=cfg.run.shutdown_timeout_s,
            shutdown=shutdown,
            on_state=on_state,
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(telemetry.watchdog.run)
            tg.start_soon(telemetry.extend_stop_timeout, shutdown)
            try:
                await supervisor.run()
            except StageFailed as err:
                failure = err  # raised below, not wrapped in the task group's ExceptionGroup
            finally:
                tg.cancel_scope.cancel()
    finally:
        telemetry.close()
        threads.close()
        if ranks is not None:
            ranks.close()
    if failure is not None:
        raise failure
    log.info("stopped", reason=shutdown.reason or "total_frames reached")


def build_stages(
    cfg: Config,
    state_dir: Path,
    device: torch.device,
    shutdown: Shutdown,
    threads: ComputeThreads,
    telemetry: Telemetry,
    ranks: Ranks | None = None,
) -> list[Any]:
    """Everything heavy (env, policy, buffers) is built here, off the event loop."""
    world = ranks.world if ranks is not None else World()
    offline.refuse_distributed(cfg, world.distributed)
    if cfg.offline.objective == "bc":  # no env: prefetcher → offline trainer (offline.py)
        return offline.bc_stages(cfg, state_dir, device, shutdown, threads, telemetry)
    checkpoints = CheckpointDir(state_dir / "checkpoints")
    found = _checkpoint_to_resume(checkpoints, ranks)
    torch.manual_seed(cfg.run.seed)  # the same initial weights on every rank
    policy = make_policy(cfg, device)
    learner = Learner.build(cfg, policy, device)
    if cfg.pipeline.compress_rollouts:
        learner.minibatches = CompressedMinibatches(cfg.pipeline.compress_workers)
    if ranks is not None:
        learner.reducer, learner.check_interval = ranks.reducer, cfg.distributed.check_interval
        torch.manual_seed(cfg.run.seed + world.rank)  # each rank samples its own actions
    learner.update_path()  # ConfigError (78) now if it cannot run (the trainer logs it)
    curriculum = _curriculum(cfg, ranks)
    train_cfg = cfg.model_copy(update={"env": curriculum.env_config(0)}) if curriculum else cfg
    collector = Collector.build(_rank_config(train_cfg, world), acting_copy(policy), device)
    masked = getattr(collector.env, "masked_reset", None)  # the embedded env's choice
    if masked is not None:
        captured = isinstance(collector.rollout, CapturedRollout)
        log.info(
            "env reset mode",
            mode="masked" if masked else "indexed",
            collect_path="cuda_graph" if captured else "eager",
        )
    first = collector.new_buffer()
    start_frames = 0
    if found is not None:
        path, header, state = found
        state = {**state, "collector": collector_for_rank(state.get("collector"), world)}
        resumed = resume.restore(cfg, path, header, state, learner, collector, curriculum)
        if curriculum is not None and resumed.env_restored:
            resume.replay_evaluations(curriculum, state_dir / "eval" / "results.jsonl", resumed)
        collector.policy.load_state_dict(policy.state_dict())
        start_frames = resumed.frames
        log.info(
            "resumed from checkpoint",
            path=str(resumed.path),
            iteration=resumed.iteration,
            frames=resumed.frames,
            kind=resumed.kind,
            env_restored=resumed.env_restored,
        )
        if world.leader:
            telemetry.run_starts(state_dir, resumed.iteration, resumed.frames)
    else:
        log.info("no checkpoint: starting a new run", checkpoints=str(checkpoints.path))
        if world.leader:
            telemetry.run_starts(state_dir, 0, 0)
    if ranks is not None:
        ranks.reducer.broadcast_module(policy)  # rank 0's weights, whatever happened above
        collector.policy.load_state_dict(policy.state_dict())
    frames_per_iteration = cfg.frames_per_iteration * world.world_size
    pool = LeasePool([first, *(first.clone() for _ in range(cfg.pipeline.lease_pool - 1))])

    if curriculum is not None:
        telemetry.curriculum_stage(curriculum.applied)
    rollouts: Channel[Any] = Channel("rollouts", cfg.pipeline.lease_pool, Overflow.BLOCK)
    weights: Channel[PolicyWeights] = Channel("weights", 1, Overflow.COALESCE)
    channels: list[Channel[Any]] = [rollouts, weights]
    producer = RolloutProducer(
        collector,
        pool,
        [rollouts.sender()],
        weights.receiver(),
        max_policy_lag=cfg.pipeline.max_policy_lag,
        frames_per_rollout=frames_per_iteration,
        total_frames=cfg.run.total_frames,
        shutdown=shutdown,
        compute=threads.producer,
        start_iteration=learner.version,
        start_frames=start_frames,
        checkpoint_interval=cfg.checkpoint.interval,
        curriculum=curriculum,
        on_stage=telemetry.curriculum_stage,
        ranks=ranks,
    )
    if ranks is None:
        rollback = functools.partial(resume.load_learner, checkpoints)
    else:  # rank 0 loads it, every rank gets it
        rollback = functools.partial(_shared_rollback, ranks, checkpoints)
    owned = (
        _state_dir_stages(
            cfg,
            state_dir,
            device,
            shutdown,
            threads,
            telemetry,
            channels,
            checkpoints,
            producer,
            policy,
            curriculum,
            rollback,
            distributed=ranks is not None,
        )
        if world.leader
        else None
    )
    trainer = Trainer(
        learner,
        rollouts.receiver(),
        [weights.sender()],
        frames_per_iteration=frames_per_iteration,
        shutdown=shutdown,
        compute=threads.trainer,
        export_path=state_dir / "export" / "policy.pt" if owned else None,  # rank 0 exports
        on_iteration=telemetry.iteration,
        evaluations=owned.evaluations if owned else None,
        eval_interval=cfg.eval.interval,
        start_frames=start_frames,
        checkpoints=owned.checkpointing if owned else None,
        rollback=rollback,
    )
    stages: list[Any] = [producer, trainer, *(owned.stages if owned else [])]
    if cfg.offline.objective == "ppo+bc":  # + a BC term from prefetched archive batches
        stages[1], prefetcher = offline.with_bc_term(cfg, trainer, device, shutdown, telemetry)
        stages.append(prefetcher)
    if owned is not None:
        stages.append(owned.writer)
    for channel in channels:
        telemetry.metrics.watch_channel(channel)
    telemetry.metrics.watch_pool(pool)
    return stages


@dataclass
class StateDirStages:
    """What the process that owns the state dir (rank 0, or the only one) runs besides
    producer and trainer, and the trainer's ends of it."""

    stages: list[Any]  # archiver, evaluator (as configured)
    writer: CheckpointWriter
    evaluations: Sender[PolicyWeights] | None
    checkpointing: Checkpointing


def _state_dir_stages(
    cfg: Config,
    state_dir: Path,
    device: torch.device,
    shutdown: Shutdown,
    threads: ComputeThreads,
    telemetry: Telemetry,
    channels: list[Channel[Any]],
    checkpoints: CheckpointDir,
    producer: RolloutProducer,
    policy: NavRLPolicy,
    curriculum: Curriculum | None,
    rollback: Callable[[Learner], Path],
    *,
    distributed: bool,
) -> StateDirStages:
    """Archiver, checkpoint writer and evaluator, with their channels (added to
    `channels`); the producer gets its archive sender."""
    stages: list[Any] = []
    if cfg.archive.interval:
        archive = archive_channel(cfg.archive, on_dropped=telemetry.metrics.archive_dropped)
        channels.append(archive)
        producer.archive, producer.archive_interval = archive.sender(), cfg.archive.interval
        stages.append(
            RolloutArchiver(
                cfg.archive,
                state_dir / "archive",
                archive.receiver(),
                shutdown=shutdown,
                on_written=telemetry.metrics.archive_written,
                on_failed=telemetry.metrics.archive_dropped,
            )
        )

    snapshots: Channel[Snapshot] = Channel(
        "snapshots",
        cfg.checkpoint.queue_size,
        Overflow.DROP_OLDEST,
        on_drop=lambda snapshot: snapshot.staged.release(),
    )
    channels.append(snapshots)
    writer = CheckpointWriter(
        snapshots.receiver(),
        checkpoints,
        cfg.checkpoint,
        meta={"seed": cfg.run.seed, "device": str(device), "threads": torch.get_num_threads()},
        on_written=telemetry.checkpoint_written,
        on_failed=telemetry.metrics.checkpoint_failed,
        scores=eval_scores(state_dir / "eval" / "results.jsonl"),
    )

    def on_eval(record: dict[str, Any]) -> None:
        telemetry.evaluation(record)
        writer.record_eval(record["iteration"], record["reach_goal"])

    eval_sender = None
    if cfg.eval.interval:
        to_eval: Channel[PolicyWeights] = Channel("evaluations", 1, Overflow.COALESCE)
        eval_sender = to_eval.sender()
        channels.append(to_eval)
        if curriculum is None:
            evaluation: Callable[[Any], dict[str, Any]] = Evaluation.for_env(
                make_eval_env(cfg, device), seed=cfg.eval.seed, max_steps=eval_steps(cfg)
            )
        else:  # at the curriculum's current stage
            evaluation = StageEvaluation(cfg, curriculum, device)
        stages.append(
            Evaluator(
                acting_copy(policy),
                evaluation,
                to_eval.receiver(),
                results_path=state_dir / "eval" / "results.jsonl",
                shutdown=shutdown,
                compute=threads.evaluator,
                on_result=on_eval,
                curriculum=curriculum,
            )
        )

    checkpointing = Checkpointing(
        snapshots.sender(),
        cfg.checkpoint.interval,
        SnapshotStaging(cfg.checkpoint.queue_size + 2),
        # The final snapshot's env state: in a distributed run every rank's, gathered by
        # the producers when they stopped together.
        collector_state=(lambda: producer.final_state) if distributed else producer.collector_state,
        static=resume.static_state(cfg),
        on_stall=telemetry.metrics.checkpoint_stall,
        rollback=rollback,
    )
    return StateDirStages(stages, writer, eval_sender, checkpointing)


def _checkpoint_to_resume(
    checkpoints: CheckpointDir, ranks: Ranks | None
) -> tuple[Path, Any, dict[str, Any]] | None:
    """The newest valid checkpoint (stages/resume.py); in a distributed run rank 0 reads
    it and every rank gets rank 0's choice, or its DataError."""
    if ranks is None:
        return resume.newest_checkpoint(checkpoints)
    found, error = None, None
    if ranks.world.leader:
        try:
            found = resume.newest_checkpoint(checkpoints)
        except DataError as err:
            error = err
    return ranks.share_checkpoint(found, error)


def _curriculum(cfg: Config, ranks: Ranks | None) -> Curriculum | None:
    if not cfg.env.curriculum:
        return None
    return Curriculum(cfg.env)


def _rank_config(cfg: Config, world: World) -> Config:
    """The config a rank's env is built with: rank r's envs are seeded with seed + r
    (rank 0, and a single process, keep `run.seed`)."""
    if not world.rank:
        return cfg
    run = cfg.run.model_copy(update={"seed": cfg.run.seed + world.rank})
    return cfg.model_copy(update={"run": run})


def _shared_rollback(ranks: Ranks, checkpoints: CheckpointDir, learner: Learner) -> Path:
    """Rollback in a distributed run: rank 0 loads its newest checkpoint's learner state
    and every other rank gets the same state (or rank 0's error) from it."""
    if ranks.world.leader:
        try:
            path = resume.load_learner(checkpoints, learner)
        except Exception as err:
            ranks.share_learner_state(None, str(err))
            raise
        ranks.share_learner_state((str(path), learner_state(learner)), None)
        return path
    path_name, state = ranks.share_learner_state(None, None)
    restore_learner(learner, state, counters=False)
    return Path(path_name)
