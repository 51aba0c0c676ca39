"""The offline objectives of `navrl-daemon run` (docs/datasets.md): `OBJECTIVES`, which the
`run` command hands to pipeline/daemon.py (pipeline/context.py: OfflineObjectives).

`offline.objective = "bc"`, a purely offline run (no env, no producer):

```
  HDF5Prefetcher ──batches (block)──► OfflineTrainer ──snapshots (drop oldest)──► CheckpointWriter
                                            └──evaluations (coalesce)──► Evaluator
```
The files of `prefetch.paths` are checked and loaded here, before any stage runs: bad
data stops the daemon with exit 65 naming file, key, expected and found, and no worker
process has been started. Rollout archives (`prefetch.layout = "archive"`) train the
NavRL policy (Beta NLL; evaluated like an online run, exported in NavRL's layout);
multimodal layouts A/B train the image+joint encoder (MSE on normalised actions; no env
to evaluate it in; exported to `export/image_joint_policy.pt`). The run ends after
`offline.steps` gradient steps (0: at a signal). Checkpoints every `checkpoint.interval`
steps hold the policy, Adam, the step count (which is the prefetch position: one batch a
step) and `kind = "offline"`; a restart resumes from the newest and goes on with the
batches it had not seen.

`"ppo+bc"`: the online pipeline, plus a prefetcher over rollout archives whose batches
the PPO update's BC term takes (offline/trainer.py: BCTerm, TrainerWithBCTerm).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import structlog
import torch

from navrl_daemon.config import Config
from navrl_daemon.errors import ConfigError, DataError
from navrl_daemon.offline.bc import BCLearner, ImageJointPolicy
from navrl_daemon.offline.datasets import MultimodalDataset
from navrl_daemon.offline.prefetcher import HDF5Prefetcher, load_offline_data
from navrl_daemon.offline.trainer import (
    BCTerm,
    OfflineTrainer,
    OfflineTrainerContext,
    OfflineTrainerEvents,
    StepRecord,
    TrainerWithBCTerm,
)
from navrl_daemon.pipeline import resume
from navrl_daemon.pipeline.context import RunContext
from navrl_daemon.pipeline.messages import PolicyWeights, Snapshot
from navrl_daemon.pipeline.telemetry import Telemetry
from navrl_daemon.rl.eval_config import eval_steps
from navrl_daemon.rl.evaluate import evaluate
from navrl_daemon.rl.evaluations import make_eval_env
from navrl_daemon.rl.policy import acting_copy, make_policy
from navrl_daemon.runtime.channels import Channel, Overflow
from navrl_daemon.runtime.leases import Lease
from navrl_daemon.runtime.supervisor import Stage
from navrl_daemon.stages.checkpoint_writer import CheckpointWriter
from navrl_daemon.stages.evaluator import Evaluator, EvaluatorContext, EvaluatorEvents
from navrl_daemon.stages.trainer import Checkpointing, Trainer
from navrl_daemon.storage.checkpoint import CheckpointDir
from navrl_daemon.storage.episode_store import ArchiveReader
from navrl_daemon.storage.history import RESULTS_FILE, eval_scores
from navrl_daemon.storage.staging import SnapshotStaging

log = structlog.get_logger("daemon")

OFFLINE = resume.OFFLINE  # the `kind` of an offline run's checkpoints
EXPORT_NAMES = {"navigation": "policy.pt", "image_joint": "image_joint_policy.pt"}


def refuse_distributed(cfg: Config, distributed: bool) -> None:
    """Offline objectives run in one process for now (every rank would read the data)."""
    if distributed and cfg.offline.objective != "none":
        raise ConfigError(
            f'offline.objective: "{cfg.offline.objective}" runs in a single process, not '
            'under torchrun; allowed with several ranks: "none"'
        )


def bc_stages(ctx: RunContext) -> list[Stage]:
    """The stages of a purely offline run (see the module docstring). Runs off the loop."""
    t0 = time.perf_counter()
    cfg = ctx.cfg
    data = load_offline_data(cfg.prefetch, cfg.offline)  # DataError: exit 65, nothing started
    try:
        stages = _bc_stages(ctx, data, t0)
    except BaseException:
        if isinstance(data, ArchiveReader):
            data.close()
        raise
    if not stages and isinstance(data, ArchiveReader):  # a finished run: no stage owns it
        data.close()
    return stages


def _bc_stages(ctx: RunContext, data: MultimodalDataset | ArchiveReader, t0: float) -> list[Stage]:
    cfg, state_dir, device, shutdown = ctx.cfg, ctx.state_dir, ctx.device, ctx.shutdown
    threads, telemetry = ctx.threads, ctx.telemetry
    _log_data(data, time.perf_counter() - t0)
    learner = _bc_learner(cfg, data, device)
    checkpoints = CheckpointDir(state_dir / "checkpoints", accept=resume.CheckpointFit(cfg))
    frames = _resume(learner, checkpoints)
    if 0 < cfg.offline.steps <= learner.steps:
        # Nothing to train: build nothing, so nothing is written (config, export, logs).
        log.info(
            "run already finished: nothing trained, nothing written",
            iteration=learner.steps,
            steps=cfg.offline.steps,
        )
        return []
    telemetry.run_starts(state_dir, learner.steps, frames)

    metrics = telemetry.metrics
    batches: Channel[Lease[int]] = Channel("batches", cfg.prefetch.depth, Overflow.BLOCK)
    snapshots: Channel[Snapshot] = Channel(
        "snapshots",
        cfg.checkpoint.queue_size,
        Overflow.DROP_OLDEST,
        on_drop=lambda snapshot: snapshot.staged.release(),
    )
    channels: list[Channel[Any]] = [batches, snapshots]
    prefetcher = HDF5Prefetcher(
        cfg.prefetch,
        cfg.offline,
        batches.sender(),
        shutdown=shutdown,
        on_batch=lambda _: metrics.prefetch_batch(),
        first_batch=learner.steps,  # one batch a step: where the last run stopped reading
        data=data,
    )
    writer = CheckpointWriter(
        snapshots.receiver(),
        checkpoints,
        cfg.checkpoint,
        meta={"seed": cfg.run.seed, "device": str(device), "threads": torch.get_num_threads()},
        on_written=telemetry.checkpoint_written,
        on_failed=metrics.checkpoint_failed,
        scores=eval_scores(state_dir / RESULTS_FILE),
    )
    stages: list[Stage] = [prefetcher]
    eval_sender = None
    if cfg.eval.interval and learner.kind == "navigation":
        to_eval: Channel[PolicyWeights] = Channel("evaluations", 1, Overflow.COALESCE)
        eval_sender = to_eval.sender()
        channels.append(to_eval)
        stages.append(_evaluator(ctx, learner, to_eval, writer))
    progress = OfflineProgress(telemetry, cfg.log.summary_interval, cfg.prefetch.batch_size)
    trainer = OfflineTrainer(
        learner,
        batches.receiver(),
        context=OfflineTrainerContext(
            cadence=ctx.cadence,
            shutdown=shutdown,
            compute=threads.trainer,
            export_path=state_dir / "export" / EXPORT_NAMES[learner.kind],
            steps=cfg.offline.steps,
            batch_size=cfg.prefetch.batch_size,
        ),
        evaluations=eval_sender,
        checkpoints=Checkpointing(
            snapshots.sender(),
            SnapshotStaging(cfg.checkpoint.queue_size + 2),
            static={**resume.static_state(cfg), "kind": OFFLINE},
            on_stall=metrics.checkpoint_stall,
            holding=checkpoints.holding,
        ),
        events=OfflineTrainerEvents(
            on_step=progress,
            on_end=progress.summarise,
            on_export_failed=functools.partial(metrics.write_failed, "export"),
        ),
    )
    stages.insert(1, trainer)
    stages.append(writer)
    for channel in channels:
        metrics.watch_channel(channel)
    return stages


def _resume(learner: BCLearner, checkpoints: CheckpointDir) -> int:
    """Load the newest valid offline checkpoint (if any) into `learner`; its frames.
    DataError (65) for a checkpoint of another kind or one that does not fit."""
    found = resume.newest_checkpoint(checkpoints)
    if found is None:
        log.info("no checkpoint: starting a new run", checkpoints=str(checkpoints.path))
        return 0
    path, header, state = found
    if state.get("kind") != OFFLINE:
        raise DataError(
            f"checkpoint {path}: holds a run of kind {state.get('kind')!r}, not an offline "
            "one; give the offline run its own state dir (or move the checkpoints away)"
        )
    try:
        learner.load(state)
    except (KeyError, ValueError, RuntimeError, TypeError) as err:
        raise DataError(f"checkpoint {path}: does not fit this offline run: {err}") from None
    log.info(
        "resumed from checkpoint",
        path=str(path),
        iteration=learner.steps,
        frames=header.frames,
        kind=OFFLINE,
        env_restored=False,
    )
    return header.frames


def _evaluator(
    ctx: RunContext,
    learner: BCLearner,
    to_eval: Channel[PolicyWeights],
    writer: CheckpointWriter,
) -> Evaluator:
    """Evaluations of the NavRL policy trained from rollout archives, on the eval env."""
    cfg, telemetry = ctx.cfg, ctx.telemetry

    def on_eval(record: dict[str, Any]) -> None:
        telemetry.evaluation(record)
        writer.record_eval(record["iteration"], record["reach_goal"])

    eval_env = make_eval_env(cfg, ctx.device)
    return Evaluator(
        acting_copy(learner.policy),  # type: ignore[arg-type]
        functools.partial(evaluate, eval_env, seed=cfg.eval.seed, max_steps=eval_steps(cfg)),
        to_eval.receiver(),
        context=EvaluatorContext(ctx.state_dir / RESULTS_FILE, ctx.shutdown, ctx.threads.evaluator),
        events=EvaluatorEvents(
            on_result=on_eval,
            on_write_failed=functools.partial(telemetry.metrics.write_failed, "eval_results"),
        ),
    )


def _bc_learner(
    cfg: Config, data: MultimodalDataset | ArchiveReader, device: torch.device
) -> BCLearner:
    torch.manual_seed(cfg.run.seed)
    policy: torch.nn.Module
    if isinstance(data, ArchiveReader):
        kind, policy = "navigation", make_policy(cfg, device)
    else:
        first = data.files[0]
        mean, std = torch.from_numpy(data.action_mean), torch.from_numpy(data.action_std)
        kind = "image_joint"
        policy = ImageJointPolicy(first.joint_dim, first.action_dim, mean, std).to(device)
    return BCLearner.build(
        kind,  # type: ignore[arg-type]
        policy,
        lr=cfg.offline.lr,
        max_grad_norm=cfg.ppo.max_grad_norm,
        max_nonfinite=cfg.ppo.max_nonfinite_updates,
        device=device,
    )


def _log_data(data: MultimodalDataset | ArchiveReader, seconds: float) -> None:
    if isinstance(data, ArchiveReader):
        log.info(
            "offline data checked",
            layout="archive",
            files=len(data.files),
            frames=data.frames,
            seconds=round(seconds, 3),
        )
    else:
        log.info(
            "offline data checked",
            layouts=sorted({f.layout for f in data.files}),
            files=len(data.files),
            transitions=len(data),
            image_bytes=data.image_bytes,
            seconds=round(seconds, 3),
        )


class OfflineProgress:
    """What each offline step reports: Prometheus (`navrl_loss{term="bc"}`,
    `navrl_prefetch_wait_seconds`, iterations/frames counted as steps/samples), /healthz,
    the systemd watchdog; every `summary_interval` steps a `progress` log line and a
    history row (bc loss, grad norm, data wait and its share of the step time)."""

    def __init__(self, telemetry: Telemetry, summary_interval: int, batch_size: int) -> None:
        self.telemetry = telemetry
        self.summary_interval = summary_interval
        self.batch_size = batch_size
        self.window: list[StepRecord] = []
        self.window_start = time.perf_counter()
        self.window_samples: int | None = None  # samples before the window's first step

    def __call__(self, record: StepRecord) -> None:
        t = self.telemetry
        if self.window_samples is None:  # the first step of this process
            t.startup.started()
            t.notifier.ready(f"training offline: step {record.step}")
            self.window_samples = record.samples - self.batch_size
        t.watchdog.progress()
        t.health.iteration_done()
        t.metrics.iteration(
            frames_delta=self.batch_size,
            policy_version=record.step,
            policy_lag=0,
            losses={
                "bc_loss": record.stats["bc_loss"],
                "nonfinite_updates": record.stats["skipped"],
            },
        )
        t.metrics.stage_time("trainer", "update", record.step_s)
        t.metrics.prefetch_wait(record.wait_s)
        self.window.append(record)
        if record.step % self.summary_interval == 0:
            self.summarise()

    def summarise(self) -> None:
        if not self.window:
            return
        now = time.perf_counter()
        wall = max(now - self.window_start, 1e-9)
        last = self.window[-1]
        step_s = sum(r.step_s for r in self.window)
        wait_s = sum(r.wait_s for r in self.window)
        finite = [r.stats for r in self.window if not r.stats["skipped"]]
        summary: dict[str, Any] = {
            "iteration": last.step,
            "frames": last.samples,
            "frames_per_second": round((last.samples - (self.window_samples or 0)) / wall, 1),
            "steps_per_second": round(len(self.window) / wall, 2),
            "busy": {"trainer": round(step_s / wall, 3)},
            "bc_loss": _mean([s["bc_loss"] for s in finite]),
            "grad_norm": _mean([s["grad_norm"] for s in finite]),
            "skipped_steps": sum(int(r.stats["skipped"]) for r in self.window),
            "data_wait_s": round(wait_s / len(self.window), 6),
            "data_wait_ratio": round(wait_s / max(wait_s + step_s, 1e-9), 4),
        }
        log.info("progress", **summary)
        self.telemetry.summary(summary)
        self.window, self.window_start, self.window_samples = [], now, last.samples


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 6) if values else float("nan")


# ---------------------------------------------------------------------------- ppo+bc


class PPOPlusBC:
    """For "ppo+bc": the learner's PPO updates get `offline.bc_coef` x the Beta NLL of
    prefetched rollout-archive batches, one per minibatch. Made before the learner (the
    term is part of it); the prefetcher after resume, where the batch sequence restarts
    where that many updates would have left it."""

    def __init__(self, ctx: RunContext) -> None:
        cfg = self.cfg = ctx.cfg
        self.shutdown = ctx.shutdown
        self.metrics = ctx.telemetry.metrics
        self.batches: Channel[Lease[int]] = Channel("batches", cfg.prefetch.depth, Overflow.BLOCK)
        self.metrics.watch_channel(self.batches)
        self.term = BCTerm(
            self.batches.receiver(),
            coef=cfg.offline.bc_coef,
            device=ctx.device,
            on_wait=self.metrics.prefetch_wait,
        )

    def prefetcher(self, updates_done: int) -> HDF5Prefetcher:
        """The archives are checked here (exit 65)."""
        cfg = self.cfg
        reader = load_offline_data(cfg.prefetch, cfg.offline)
        assert isinstance(reader, ArchiveReader)  # the config insists on layout "archive"
        _log_data(reader, 0.0)
        per_update = cfg.ppo.epochs * cfg.ppo.minibatches
        return HDF5Prefetcher(
            cfg.prefetch,
            cfg.offline,
            self.batches.sender(),
            shutdown=self.shutdown,
            on_batch=lambda _: self.metrics.prefetch_batch(),
            first_batch=updates_done * per_update,
            data=reader,
        )

    def trainer(self, trainer: Trainer) -> TrainerWithBCTerm:
        return TrainerWithBCTerm(trainer, self.term)


class Objectives:
    """pipeline/context.py's OfflineObjectives: what the daemon builds for "bc" and
    "ppo+bc"."""

    def refuse_distributed(self, cfg: Config, distributed: bool) -> None:
        refuse_distributed(cfg, distributed)

    def bc_stages(self, ctx: RunContext) -> list[Stage]:
        return bc_stages(ctx)

    def ppo_plus_bc(self, ctx: RunContext) -> PPOPlusBC:
        return PPOPlusBC(ctx)


OBJECTIVES = Objectives()
