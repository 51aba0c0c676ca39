"""`navrl-daemon run`: wires the stages of DESIGN.md §2 and hands them to the supervisor.

```
  RolloutProducer ──rollouts: leases (block)──► Trainer ──weights (coalesce)──► Evaluator
        ▲                                          │
        └──────────── weights (coalesce) ──────────┘
```
The checkpoint writer, archiver, prefetcher and metrics plug in here as they arrive.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import structlog
import torch

from navrl_daemon import __version__
from navrl_daemon.config import Config, resolve_device, to_toml
from navrl_daemon.errors import StageFailed
from navrl_daemon.rl.evaluate import evaluate
from navrl_daemon.rl.training import (
    Collector,
    Learner,
    acting_copy,
    eval_steps,
    make_eval_env,
    make_policy,
)
from navrl_daemon.runtime.channels import Channel, Overflow
from navrl_daemon.runtime.compute import ComputeThread
from navrl_daemon.runtime.leases import LeasePool
from navrl_daemon.runtime.lock import StateDirLock
from navrl_daemon.runtime.sd_notify import ProgressWatchdog, SystemdNotifier
from navrl_daemon.runtime.supervisor import Shutdown, State, Supervisor
from navrl_daemon.stages.evaluator import Evaluator
from navrl_daemon.stages.messages import PolicyWeights
from navrl_daemon.stages.producer import RolloutProducer
from navrl_daemon.stages.progress import ProgressLog
from navrl_daemon.stages.trainer import IterationRecord, Trainer
from navrl_daemon.storage.atomic import write_atomic

log = structlog.get_logger("daemon")


def run(cfg: Config, state_dir: Path) -> int:
    """Train until `run.total_frames` or a signal. Raises NavrlError subclasses."""
    with StateDirLock(state_dir):
        write_atomic(state_dir / "config.toml", to_toml(cfg).encode())
        anyio.run(serve, cfg, state_dir)
    return 0


async def serve(
    cfg: Config, state_dir: Path, observe: Callable[[IterationRecord], None] | None = None
) -> None:
    """The daemon's event loop. `observe` sees every iteration's record (benchmarks, tests)."""
    device = torch.device(resolve_device(cfg))
    if cfg.run.torch_threads:
        torch.set_num_threads(cfg.run.torch_threads)
    notifier = SystemdNotifier()
    watchdog = ProgressWatchdog(notifier)
    log.info(
        "starting",
        version=__version__,
        torch=torch.__version__,
        device=str(device),
        state_dir=str(state_dir),
        num_envs=cfg.env.num_envs,
        frames_per_iteration=cfg.frames_per_iteration,
        total_frames=cfg.run.total_frames,
        max_policy_lag=cfg.pipeline.max_policy_lag,
    )
    shutdown = Shutdown()
    threads = ComputeThreads(device)
    stages, progress = await threads.producer.run(
        build_stages, cfg, state_dir, device, shutdown, notifier, watchdog, threads, observe
    )

    def on_state(state: State) -> None:
        if state is State.DRAINING:
            notifier.stopping(f"draining: {shutdown.reason or 'finished'}")
            notifier.extend_timeout(cfg.run.shutdown_timeout_s)

    supervisor = Supervisor(
        stages, shutdown_timeout_s=cfg.run.shutdown_timeout_s, shutdown=shutdown, on_state=on_state
    )
    failure: StageFailed | None = None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watchdog.run)
            try:
                await supervisor.run()
            except StageFailed as err:
                failure = err  # raised below, not wrapped in the task group's ExceptionGroup
            finally:
                tg.cancel_scope.cancel()
    finally:
        progress.summarise()
        progress.close()
        notifier.close()
        threads.close()
    if failure is not None:
        raise failure
    log.info("stopped", reason=shutdown.reason or "total_frames reached")


class ComputeThreads:
    """Where each stage's torch work runs (see runtime/compute.py for why): on CPU one
    shared thread, so there is a single OpenMP team; on CUDA one thread per stage."""

    def __init__(self, device: torch.device) -> None:
        if device.type == "cpu":
            shared = ComputeThread("compute")
            self.producer = self.trainer = self.evaluator = shared
        else:
            self.producer = ComputeThread("producer")
            self.trainer = ComputeThread("trainer")
            self.evaluator = ComputeThread("evaluator")

    def close(self) -> None:
        for thread in {self.producer, self.trainer, self.evaluator}:
            thread.close()


def build_stages(
    cfg: Config,
    state_dir: Path,
    device: torch.device,
    shutdown: Shutdown,
    notifier: SystemdNotifier,
    watchdog: ProgressWatchdog,
    threads: ComputeThreads,
    observe: Callable[[IterationRecord], None] | None = None,
) -> tuple[list[Any], ProgressLog]:
    """Everything heavy (env, policy, buffers) is built here, off the event loop."""
    torch.manual_seed(cfg.run.seed)
    policy = make_policy(cfg, device)
    learner = Learner.build(cfg, policy, device)
    collector = Collector.build(cfg, acting_copy(policy), device)
    first = collector.new_buffer()
    pool = LeasePool([first, *(first.clone() for _ in range(cfg.pipeline.lease_pool - 1))])

    rollouts: Channel[Any] = Channel("rollouts", cfg.pipeline.lease_pool, Overflow.BLOCK)
    weights: Channel[PolicyWeights] = Channel("weights", 1, Overflow.COALESCE)
    producer = RolloutProducer(
        collector,
        pool,
        [rollouts.sender()],
        weights.receiver(),
        max_policy_lag=cfg.pipeline.max_policy_lag,
        frames_per_rollout=cfg.frames_per_iteration,
        total_frames=cfg.run.total_frames,
        shutdown=shutdown,
        compute=threads.producer,
    )
    stages: list[Any] = [producer]

    eval_sender = None
    if cfg.eval.interval:
        to_eval: Channel[PolicyWeights] = Channel("evaluations", 1, Overflow.COALESCE)
        eval_sender = to_eval.sender()
        eval_env = make_eval_env(cfg, device)
        stages.append(
            Evaluator(
                acting_copy(policy),
                functools.partial(
                    evaluate, eval_env, seed=cfg.eval.seed, max_steps=eval_steps(cfg)
                ),
                to_eval.receiver(),
                results_path=state_dir / "eval" / "results.jsonl",
                shutdown=shutdown,
                compute=threads.evaluator,
            )
        )

    progress = ProgressLog(
        summary_interval=cfg.log.summary_interval,
        total_frames=cfg.run.total_frames,
        device=device,
        on_summary=lambda s: notifier.status(
            f"iteration {s['iteration']}, {s['frames_per_second']:.0f} frames/s"
        ),
    )

    def on_iteration(record: IterationRecord) -> None:
        if record.iteration == 1:
            notifier.ready(f"training: iteration {record.iteration}")
        watchdog.progress()
        progress(record)
        if observe is not None:
            observe(record)

    trainer = Trainer(
        learner,
        rollouts.receiver(),
        [weights.sender()],
        frames_per_iteration=cfg.frames_per_iteration,
        shutdown=shutdown,
        compute=threads.trainer,
        export_path=state_dir / "export" / "policy.pt",
        on_iteration=on_iteration,
        evaluations=eval_sender,
        eval_interval=cfg.eval.interval,
    )
    stages.insert(1, trainer)
    return stages, progress
