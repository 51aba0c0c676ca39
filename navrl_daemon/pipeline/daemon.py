"""`navrl-daemon run`: wires the stages of docs/design.md §2 and hands them to the supervisor.

```
  RolloutProducer ──rollouts (block)──► Trainer ──snapshots (drop oldest)──► CheckpointWriter
     ▲     │                               ├──weights (coalesce)──► Evaluator
     │     └──every archive.interval-th rollout (block|drop)──► RolloutArchiver
     └──────────────── weights (coalesce) ─┘
```
Before anything runs, the newest valid checkpoint in `STATE_DIR/checkpoints` (if any) is
loaded into the learner and the collector (pipeline/resume.py); with `checkpoint.mirror`,
the mirror's resume point is put there first when the state dir is empty or behind it, and
a MirrorWriter after the CheckpointWriter keeps the mirror up to date.

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
from navrl_daemon.config import Config, ExecutionPlan, resolve_device
from navrl_daemon.env.backends import resolve
from navrl_daemon.env.contract import DensityLevels
from navrl_daemon.errors import ConfigError, StageFailed
from navrl_daemon.ops.logging import bind_process_fields
from navrl_daemon.pipeline import resume
from navrl_daemon.pipeline.cadence import Cadence, Position
from navrl_daemon.pipeline.context import OfflineObjectives, RunContext
from navrl_daemon.pipeline.coordinator import Coordinator, Found, SingleProcess, collector_for_rank
from navrl_daemon.pipeline.messages import (
    CurriculumProgress,
    FinalCollectorState,
    PolicyWeights,
    Rollout,
    Snapshot,
)
from navrl_daemon.pipeline.ranks import Ranks
from navrl_daemon.pipeline.telemetry import Telemetry
from navrl_daemon.rl import ppo
from navrl_daemon.rl.collector import Collector, rollout_memory
from navrl_daemon.rl.curriculum import Curriculum, StageEvaluation
from navrl_daemon.rl.evaluations import Evaluations
from navrl_daemon.rl.learner import Learner
from navrl_daemon.rl.policy import NavRLPolicy, acting_copy, make_policy
from navrl_daemon.rl.run_state import COLLECTOR, RunState, training_state
from navrl_daemon.runtime import heap, memory
from navrl_daemon.runtime.channels import Channel, Overflow, Receiver, Sender
from navrl_daemon.runtime.compute import ComputeThreads
from navrl_daemon.runtime.distributed import World
from navrl_daemon.runtime.leases import Lease, LeasePool
from navrl_daemon.runtime.lock import StateDirLock
from navrl_daemon.runtime.signals import StopSignals
from navrl_daemon.runtime.streams import TrainerStream
from navrl_daemon.runtime.supervisor import Shutdown, Stage, State, Supervisor
from navrl_daemon.stages.archiver import ArchiverEvents, RolloutArchiver, archive_channel
from navrl_daemon.stages.checkpoint_writer import CheckpointWriter
from navrl_daemon.stages.evaluator import (
    BestPolicy,
    CurriculumDecisions,
    EvaluationVideos,
    Evaluator,
    EvaluatorContext,
    EvaluatorEvents,
    RecordedEvaluate,
)
from navrl_daemon.stages.mirror_writer import MirrorEvents, MirrorRequests, MirrorWriter
from navrl_daemon.stages.producer import (
    CurriculumFollower,
    NoCurriculum,
    ProducerContext,
    ProducerEvents,
    RolloutProducer,
)
from navrl_daemon.stages.trainer import (
    Checkpointing,
    IterationRecord,
    Trainer,
    TrainerContext,
    TrainerEvents,
)
from navrl_daemon.storage.checkpoint import CheckpointDir
from navrl_daemon.storage.compressed_rollout import CompressedMinibatches
from navrl_daemon.storage.history import RESULTS_FILE, eval_scores
from navrl_daemon.storage.run_mirror import RunMirror, open_location
from navrl_daemon.storage.staging import SnapshotStaging
from navrl_daemon.storage.state_dir import check_writable

log = structlog.get_logger("daemon")


def configure_heap(cfg: Config) -> None:
    """The process's memory settings of `run`: glibc's mmap threshold."""
    threshold = cfg.run.mmap_threshold_bytes  # large buffers unmapped when freed (heap.py)
    if threshold and not heap.pin_mmap_threshold(threshold):
        log.info(  # the user's own threshold, or no glibc: nothing to warn about
            "run.mmap_threshold_bytes not applied: the environment sets glibc's threshold "
            "(MALLOC_MMAP_THRESHOLD_, GLIBC_TUNABLES) or this C library has no mallopt",
            mmap_threshold_bytes=threshold,
        )


def run(
    cfg: Config,
    state_dir: Path,
    signals: StopSignals,
    offline: OfflineObjectives | None = None,
) -> int:
    """Train until `run.total_frames` or a stop signal. Raises NavrlError subclasses.
    `offline`: the offline objectives, for a config that asks for one."""
    configure_heap(cfg)
    world = World.from_environ()
    serving = functools.partial(
        serve, cfg, state_dir, world=world, signals=signals, offline=offline
    )
    if world.distributed:
        bind_process_fields(rank=world.rank)
    if not world.leader:  # rank 0 owns the state dir; this rank only trains
        with signals.queued():
            anyio.run(serving)
        return 0
    with StateDirLock(state_dir), signals.queued():  # the lock checks the state dir itself
        check_writable(state_dir, written_dirs(cfg))  # ConfigError (78) naming the path
        anyio.run(serving)
    return 0


def written_dirs(cfg: Config) -> list[str]:
    """The directories of the state dir that a run of `cfg` writes files into."""
    names = ["checkpoints", "export"]
    if cfg.eval.interval:
        names.append("eval")
    if cfg.archive.interval:
        names.append("archive")
    return names


async def serve(
    cfg: Config,
    state_dir: Path,
    observe: Callable[[IterationRecord], None] | None = None,
    world: World | None = None,
    signals: StopSignals | None = None,
    offline: OfflineObjectives | None = None,
) -> None:
    """The daemon's event loop. `observe` sees every iteration's record (benchmarks, tests);
    `signals` stop it (without them, only total_frames or a failure does); `offline`: the
    offline objectives (navrl_daemon/offline/), for a config that asks for one."""
    world = world or World()
    device = world.device(resolve_device(cfg))
    if cfg.run.torch_threads:
        torch.set_num_threads(cfg.run.torch_threads)
    cadence = Cadence.of(cfg, world.world_size)
    log.info(
        "starting",
        version=__version__,
        torch=torch.__version__,
        device=str(device),
        state_dir=str(state_dir),
        num_envs=cfg.env.num_envs,
        frames_per_iteration=cadence.frames_per_iteration,
        total_frames=cfg.run.total_frames,
        max_policy_lag=cfg.pipeline.max_policy_lag,
        **({"rank": world.rank, "world_size": world.world_size} if world.distributed else {}),
    )
    telemetry = Telemetry(cfg, device, observe, world, cadence)
    startup = telemetry.startup.start()  # from here to the first iteration's end
    shutdown = Shutdown()
    threads = ComputeThreads(device.type)
    coordinator: Coordinator = SingleProcess()
    failure: StageFailed | None = None
    try:
        if world.distributed:
            with startup.phase("ranks"):
                coordinator = await anyio.to_thread.run_sync(
                    Ranks, world, device, cfg.distributed.timeout_s
                )
        telemetry.start()
        ctx = RunContext(
            cfg, state_dir, device, shutdown, threads, telemetry, coordinator, cadence, offline
        )
        with startup.phase("build stages"):
            stages = await threads.producer.run(build_stages, ctx)
        startup.enter("first iteration")

        def on_state(state: State) -> None:
            telemetry.state(state, shutdown.reason)

        supervisor = Supervisor(
            stages,
            shutdown_timeout_s=cfg.run.shutdown_timeout_s,
            shutdown=shutdown,
            on_state=on_state,
            signals=signals,
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(telemetry.watchdog.run)
            tg.start_soon(telemetry.redraw_progress)
            tg.start_soon(telemetry.extend_stop_timeout, shutdown)
            try:
                await supervisor.run()
            except StageFailed as err:
                failure = err  # raised below, not wrapped in the task group's ExceptionGroup
            finally:
                tg.cancel_scope.cancel()
        if failure is None:  # a clean end, reached or stopped: say which to Prometheus
            state = "finished" if shutdown.reason is None else "stopped"
            await telemetry.last_scrape(state, cfg.metrics.final_scrape_s)
    finally:
        telemetry.close()
        threads.close()
        coordinator.close()
    if failure is not None:
        raise failure
    last = resume.newest_header(state_dir)  # the iteration the run summary says too
    where = {} if last is None else {"iteration": last.iteration, "frames": last.frames}
    log.info("stopped", reason=shutdown.reason or "total_frames reached", **where)


def _offline_objectives(ctx: RunContext) -> OfflineObjectives | None:
    """The offline objectives when the config asks for one; ConfigError (78) where the
    caller provides none or the objective cannot run here."""
    objective = ctx.cfg.offline.objective
    if objective == "none":
        return None
    if ctx.offline is None:
        raise ConfigError(
            f'offline.objective: "{objective}" needs the offline objectives, which this '
            'caller did not provide (`navrl-daemon run` does); allowed here: "none"'
        )
    ctx.offline.refuse_distributed(ctx.cfg, ctx.world.distributed)
    return ctx.offline


def build_stages(ctx: RunContext) -> list[Stage]:
    """Everything heavy (env, policy, buffers) is built here, off the event loop."""
    cfg, world, telemetry = ctx.cfg, ctx.world, ctx.telemetry
    phase = telemetry.startup.phase
    offline = _offline_objectives(ctx)
    if offline is not None and cfg.offline.objective == "bc":  # no env (offline/wiring.py)
        return offline.bc_stages(ctx)
    memory.require(*rollout_memory(cfg), ctx.device, fix="lower env.num_envs or ppo.rollout_length")
    checkpoints = CheckpointDir(ctx.state_dir / "checkpoints", accept=resume.CheckpointFit(cfg))
    mirror = RunMirror(open_location(cfg.checkpoint.mirror)) if cfg.checkpoint.mirror else None
    if mirror is not None and world.leader:
        with phase("mirror"):
            resume.take_mirror(mirror, ctx.state_dir, checkpoints)
    with phase("newest checkpoint"):
        found = ctx.coordinator.newest_checkpoint(checkpoints)
    if found is not None and not ctx.cadence.frames_left(found[1].frames):
        # Nothing to train: build nothing, so nothing is written (config, export, logs).
        log.info(
            "run already finished: nothing trained, nothing written",
            checkpoint=str(found[0]),
            iteration=found[1].iteration,
            frames=found[1].frames,
            total_frames=ctx.cadence.total_frames,
        )
        return []
    if found is not None:
        resume.check_settings(cfg, found[0], found[2])  # before anything is built
    # Every mode this run executes in, and why: ConfigError (78) where one cannot run here.
    captured = resolve(cfg.env.backend).captured
    plan = ExecutionPlan.of(cfg, ctx.device, captured=captured, ranks=world.world_size)
    log.info("execution plan", **plan.fields())
    torch.manual_seed(cfg.run.seed)  # the same initial weights on every rank
    with phase("policy and update"):
        policy = make_policy(cfg, ctx.device, lidar_conv=plan.lidar_conv.value)
        bc = offline.ppo_plus_bc(ctx) if offline is not None else None  # "ppo+bc"
        learner = _learner(ctx, policy, bc.term if bc is not None else None)
    if world.distributed:
        torch.manual_seed(cfg.run.seed + world.rank)  # each rank samples its own actions
    # The producer's curriculum (the checkpointed one); the evaluator owns a copy.
    curriculum = Curriculum(cfg.env) if cfg.env.curriculum else None
    with phase("training envs"):
        collector = _collector(ctx, policy, curriculum)
    first = collector.new_buffer()
    state = training_state(learner, collector, curriculum)
    with phase("resume"):
        start = _resume(ctx, found, state, learner, collector, curriculum)
    ctx.coordinator.share_weights(policy)  # rank 0's weights, whatever happened above
    collector.policy.load_state_dict(policy.state_dict())
    pool = LeasePool([first, *(first.clone() for _ in range(cfg.pipeline.lease_pool - 1))])
    if curriculum is not None:
        telemetry.curriculum_stage(curriculum.applied)

    owned = None
    if world.leader:
        with phase("evaluation and state dir"):
            owned = _state_dir_stages(
                ctx, checkpoints, policy, curriculum, mirror, resumed_from=start.iteration
            )
    stream = TrainerStream.for_device(ctx.device, own=plan.trainer_stream.value)
    core = _Core(learner, collector, state, start, curriculum, checkpoints, owned, stream)
    rollouts: Channel[Rollout] = Channel("rollouts", cfg.pipeline.lease_pool, Overflow.BLOCK)
    weights: Channel[PolicyWeights] = Channel("weights", 1, Overflow.COALESCE)
    producer = _producer(ctx, core, pool, rollouts, weights)
    trainer = _trainer(ctx, core, rollouts, weights)
    stages: list[Stage] = [
        producer,
        bc.trainer(trainer) if bc is not None else trainer,
        *(owned.stages if owned else []),
        *([bc.prefetcher(learner.version)] if bc is not None else []),  # after resume
        *([owned.writer] if owned else []),
        *([owned.mirror] if owned and owned.mirror else []),  # flushed after the writer
    ]
    for channel in [rollouts, weights, *(owned.channels if owned else [])]:
        telemetry.metrics.watch_channel(channel)
    telemetry.metrics.watch_pool(pool)
    return stages


def _learner(ctx: RunContext, policy: NavRLPolicy, aux_loss: ppo.AuxLoss | None) -> Learner:
    """PPO's learner on `policy`; ConfigError (78) if ppo.update_path cannot run."""
    cfg = ctx.cfg
    return Learner.build(
        cfg,
        policy,
        ctx.device,
        reducer=ctx.coordinator.reducer,
        minibatches=(
            CompressedMinibatches(cfg.pipeline.compress_workers)
            if cfg.pipeline.compress_rollouts
            else ppo.frame_minibatches
        ),
        aux_loss=aux_loss,
    )


def _collector(ctx: RunContext, policy: NavRLPolicy, curriculum: Curriculum | None) -> Collector:
    """This rank's training envs (at the curriculum's first stage) and an acting copy of
    `policy`."""
    cfg = ctx.cfg
    train_cfg = cfg.model_copy(update={"env": curriculum.env_config(0)}) if curriculum else cfg
    return Collector.build(_rank_config(train_cfg, ctx.world), acting_copy(policy), ctx.device)


@dataclass(frozen=True)
class _Core:
    """What the producer and the trainer are built around."""

    learner: Learner
    collector: Collector
    state: RunState  # their stateful parts, and the curriculum's
    start: Position
    curriculum: Curriculum | None
    checkpoints: CheckpointDir
    owned: StateDirStages | None  # rank 0's: evaluation, checkpoints, archive
    stream: TrainerStream  # the trainer's own CUDA stream, if pipeline.trainer_stream


def _producer(
    ctx: RunContext,
    core: _Core,
    pool: LeasePool,
    rollouts: Channel[Rollout],
    weights: Channel[PolicyWeights],
) -> RolloutProducer:
    cfg, telemetry, owned, collector = ctx.cfg, ctx.telemetry, core.owned, core.collector
    curriculum = core.curriculum
    return RolloutProducer(
        collector,
        pool,
        rollouts.sender(),
        weights.receiver(),
        context=ProducerContext(
            cadence=ctx.cadence,
            start=core.start,
            coordinator=ctx.coordinator,
            state=core.state,
            curriculum=(
                CurriculumFollower(
                    curriculum,
                    collector,
                    ctx.threads.producer,
                    decisions=owned.curriculum if owned else None,
                    on_stage=telemetry.curriculum_stage,
                )
                if curriculum is not None
                else NoCurriculum()
            ),
            shutdown=ctx.shutdown,
            compute=ctx.threads.producer,
            trainer_stream=core.stream,
        ),
        archive=owned.archive if owned else None,
        final_state=owned.final_state if owned else None,
        events=ProducerEvents(
            # rank 0's envs, where the backend keeps density levels (DensityLevels)
            on_levels=(
                telemetry.levels
                if cfg.env.navigation.map_levels
                and owned
                and isinstance(collector.env, DensityLevels)
                else None
            ),
            on_phase=telemetry.progress.phase,
        ),
    )


def _trainer(
    ctx: RunContext, core: _Core, rollouts: Channel[Rollout], weights: Channel[PolicyWeights]
) -> Trainer:
    owned, telemetry = core.owned, ctx.telemetry
    return Trainer(
        core.learner,
        rollouts.receiver(),
        [weights.sender()],
        context=TrainerContext(
            cadence=ctx.cadence,
            shutdown=ctx.shutdown,
            compute=ctx.threads.trainer,
            state=core.state,
            export_path=ctx.state_dir / "export" / "policy.pt" if owned else None,  # rank 0's
            start_frames=core.start.frames,
            rollback=functools.partial(ctx.coordinator.rollback, core.checkpoints),
            stream=core.stream,
        ),
        evaluations=owned.evaluations if owned else None,
        checkpoints=owned.checkpointing if owned else None,
        events=TrainerEvents(
            on_iteration=telemetry.iteration,
            on_export_failed=functools.partial(telemetry.metrics.write_failed, "export"),
            on_phase=telemetry.progress.phase,
            on_phase_progress=telemetry.progress.phase_progress,
        ),
    )


def _resume(
    ctx: RunContext,
    found: Found | None,
    state: RunState,
    learner: Learner,
    collector: Collector,
    curriculum: Curriculum | None,
) -> Position:
    """Put the checkpoint `found` (if any) into learner and collector; where the run
    starts. History rows after that point are about to be redone (Telemetry.run_starts)."""
    if found is None:
        checkpoints = ctx.state_dir / "checkpoints"
        log.info("no checkpoint: starting a new run", checkpoints=str(checkpoints))
        if ctx.world.leader:
            ctx.telemetry.run_starts(ctx.state_dir, 0, 0)
        return Position()
    path, header, saved = found
    saved = {**saved, COLLECTOR: collector_for_rank(saved.get(COLLECTOR), ctx.world)}
    resumed = resume.restore(ctx.cfg, path, header, saved, state, learner, collector, curriculum)
    if curriculum is not None and resumed.curriculum_restored:
        resume.replay_evaluations(curriculum, ctx.state_dir / RESULTS_FILE, resumed)
    collector.policy.load_state_dict(learner.policy.state_dict())
    ctx.telemetry.metrics.resumed_from(header.raw_bytes, header.stored_bytes, header.created)
    log.info(
        "resumed from checkpoint",
        path=str(resumed.path),
        iteration=resumed.iteration,
        frames=resumed.frames,
        kind=resumed.kind,
        env_restored=resumed.env_restored,
    )
    if ctx.world.leader:
        ctx.telemetry.run_starts(ctx.state_dir, resumed.iteration, resumed.frames)
    return Position(learner.version, resumed.frames)


@dataclass
class StateDirStages:
    """What the process that owns the state dir (rank 0, or the only one) runs besides
    producer and trainer, the channels between them, and the ends producer and trainer
    hold."""

    stages: list[Stage]  # archiver, evaluator (as configured)
    writer: CheckpointWriter
    channels: list[Channel[Any]]
    archive: Sender[Lease] | None
    evaluations: Sender[PolicyWeights] | None
    checkpointing: Checkpointing
    # The final snapshot's env state: every rank's, gathered by the producers when they
    # stopped together.
    final_state: Sender[FinalCollectorState]
    mirror: MirrorWriter | None  # checkpoint.mirror's copier
    # With a curriculum: the evaluator's decisions, which the producer applies.
    curriculum: Receiver[CurriculumProgress] | None = None


def _state_dir_stages(
    ctx: RunContext,
    checkpoints: CheckpointDir,
    policy: NavRLPolicy,
    curriculum: Curriculum | None,
    mirror: RunMirror | None,
    resumed_from: int,
) -> StateDirStages:
    """Archiver, evaluator, checkpoint writer and its mirror, with their channels."""
    cfg, telemetry = ctx.cfg, ctx.telemetry
    results = ctx.state_dir / RESULTS_FILE
    stages: list[Stage] = []
    channels: list[Channel[Any]] = []
    archive_sender = None
    if cfg.archive.interval:
        archive = archive_channel(cfg.archive, on_dropped=telemetry.metrics.archive_dropped)
        channels.append(archive)
        archive_sender = archive.sender()
        stages.append(_archiver(ctx, archive, resumed_from))

    snapshots: Channel[Snapshot] = Channel(
        "snapshots",
        cfg.checkpoint.queue_size,
        Overflow.DROP_OLDEST,
        on_drop=lambda snapshot: snapshot.staged.release(),
    )
    channels.append(snapshots)
    mirror_writer, requests = None, None
    if mirror is not None:
        to_mirror: Channel[Path] = Channel("mirror", 1, Overflow.COALESCE)
        channels.append(to_mirror)
        requests = MirrorRequests(to_mirror.sender(), ctx.cadence.mirrors)
        mirror_writer = MirrorWriter(
            to_mirror.receiver(),
            mirror,
            ctx.state_dir,
            MirrorEvents(telemetry.metrics.mirror_written, telemetry.metrics.mirror_failed),
        )
    writer = CheckpointWriter(
        snapshots.receiver(),
        checkpoints,
        cfg.checkpoint,
        meta={"seed": cfg.run.seed, "device": str(ctx.device), "threads": torch.get_num_threads()},
        on_written=telemetry.checkpoint_written,
        on_failed=telemetry.metrics.checkpoint_failed,
        scores=eval_scores(results),
        mirror=requests,
    )

    def on_eval(record: dict[str, Any]) -> None:
        telemetry.evaluation(record)
        writer.record_eval(record["iteration"], record["reach_goal"])

    eval_sender, decisions, to_producer = None, None, None
    if cfg.eval.interval:
        to_eval: Channel[PolicyWeights] = Channel("evaluations", 1, Overflow.COALESCE)
        eval_sender = to_eval.sender()
        channels.append(to_eval)
        if curriculum is not None:
            # The newest progress is the whole of it: an older one waiting is replaced.
            progress: Channel[CurriculumProgress] = Channel("curriculum", 1, Overflow.COALESCE)
            channels.append(progress)
            decisions = CurriculumDecisions(curriculum.copy(), progress.sender())
            to_producer = progress.receiver()
        stages.append(_evaluator(ctx, to_eval, policy, decisions, on_eval))

    final_state: Channel[FinalCollectorState] = Channel("final collector state", 1)
    checkpointing = Checkpointing(
        snapshots.sender(),
        SnapshotStaging(cfg.checkpoint.queue_size + 2),
        static=resume.static_state(cfg),
        final_state=final_state.receiver(),
        on_stall=telemetry.metrics.checkpoint_stall,
        holding=checkpoints.holding,
    )
    return StateDirStages(
        stages,
        writer,
        channels,
        archive_sender,
        eval_sender,
        checkpointing,
        final_state.sender(),
        mirror_writer,
        to_producer,
    )


def _archiver(ctx: RunContext, archive: Channel[Lease], resumed_from: int) -> RolloutArchiver:
    metrics = ctx.telemetry.metrics
    return RolloutArchiver(
        ctx.cfg.archive,
        ctx.state_dir / "archive",
        archive.receiver(),
        shutdown=ctx.shutdown,
        resumed_from=resumed_from,
        events=ArchiverEvents(
            on_written=metrics.archive_written,
            on_failed=metrics.archive_dropped,
            on_rotated=metrics.archive_rotated,
            on_usage=metrics.archive_usage,
        ),
    )


def _evaluator(
    ctx: RunContext,
    to_eval: Channel[PolicyWeights],
    policy: NavRLPolicy,
    decisions: CurriculumDecisions | None,
    on_result: Callable[[dict[str, Any]], None],
) -> Evaluator:
    """Evaluations of the weights sent to `to_eval`, at the stage of the evaluator's
    curriculum when there is one."""
    cfg, telemetry = ctx.cfg, ctx.telemetry
    evaluation: Evaluations | StageEvaluation
    if decisions is None:
        evaluation = Evaluations(cfg, ctx.device)
    else:
        evaluation = StageEvaluation(cfg, decisions.curriculum, ctx.device)
    return Evaluator(
        acting_copy(policy),
        evaluation,
        to_eval.receiver(),
        context=EvaluatorContext(
            ctx.state_dir / RESULTS_FILE, ctx.shutdown, ctx.threads.evaluator, decisions
        ),
        best=BestPolicy(
            ctx.state_dir / "export" / "best.pt",
            on_failed=functools.partial(telemetry.metrics.write_failed, "export"),
        ),
        videos=evaluation_videos(cfg, evaluation, telemetry),
        events=EvaluatorEvents(
            on_result=on_result,
            on_write_failed=functools.partial(telemetry.metrics.write_failed, "eval_results"),
        ),
    )


def evaluation_videos(
    cfg: Config, evaluation: RecordedEvaluate, telemetry: Telemetry
) -> EvaluationVideos | None:
    """`log.video_interval`'s videos, where they can be drawn (an env that records its
    drones' paths) and shown (TensorBoard or W&B on)."""
    every = cfg.log.video_interval
    if not every:
        return None
    if not evaluation.recordable:
        log.warning(
            "log.video_interval: this backend's env cannot record the drones' paths: no videos",
            backend=cfg.env.backend,
        )
        return None
    if not (cfg.log.tensorboard or cfg.log.wandb):
        log.warning("log.video_interval: no videos without log.tensorboard or log.wandb")
        return None
    return EvaluationVideos(evaluation, every, telemetry.evaluation_video)


def _rank_config(cfg: Config, world: World) -> Config:
    """The config a rank's env is built with: rank r's envs are seeded with seed + r
    (rank 0, and a single process, keep `run.seed`)."""
    if not world.rank:
        return cfg
    run = cfg.run.model_copy(update={"seed": cfg.run.seed + world.rank})
    return cfg.model_copy(update={"run": run})
