"""Telemetry: where what the stages report goes (logs, Prometheus, /healthz, systemd,
`STATE_DIR/history.jsonl`, TensorBoard and W&B). Built by pipeline/daemon.py; the stages
only see its callbacks."""

from __future__ import annotations

import errno
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import structlog
import torch

from navrl_daemon import __version__
from navrl_daemon.config import Config, to_toml
from navrl_daemon.errors import ConfigError
from navrl_daemon.ops.http import Health, MetricsServer
from navrl_daemon.ops.metrics import Metrics
from navrl_daemon.ops.progress import IterationRecord, ProgressLog
from navrl_daemon.ops.tensorboard import TensorBoardLog, open_tensorboard
from navrl_daemon.ops.wandb_log import WandbLog, open_wandb, require_wandb
from navrl_daemon.pipeline.cadence import Cadence
from navrl_daemon.runtime.distributed import World
from navrl_daemon.runtime.sd_notify import ProgressWatchdog, SystemdNotifier
from navrl_daemon.runtime.startup import StartupWatchdog
from navrl_daemon.runtime.supervisor import Shutdown, State
from navrl_daemon.storage.atomic import write_atomic
from navrl_daemon.storage.history import (
    DAEMON_FILE,
    HISTORY_FILE,
    RESULTS_FILE,
    HistoryFile,
    cut_rows,
)
from navrl_daemon.storage.run_config import record_run_config

log = structlog.get_logger("daemon")

# The (stage, phase) timings exported from the start, before their first observation.
STAGE_PHASES = (
    ("producer", "collect"),
    ("trainer", "update"),
    ("evaluator", "evaluate"),
    ("checkpoint_writer", "write"),
)
# Seconds of stop timeout asked of systemd at a time while draining (re-sent every third).
EXTEND_STOP_S = 30.0


class Telemetry:
    """Where what the stages report goes: logs, Prometheus, /healthz, systemd, and
    `STATE_DIR/history.jsonl` (one row per progress summary) once `run_starts` names the dir."""

    def __init__(
        self,
        cfg: Config,
        device: torch.device,
        observe: Callable[[IterationRecord], None] | None = None,
        world: World | None = None,
        cadence: Cadence | None = None,
    ) -> None:
        self.cfg = cfg
        self.world = world or World()
        # Frames of one iteration over all ranks.
        cadence = cadence or Cadence.of(cfg, self.world.world_size)
        self.frames_per_iteration = cadence.frames_per_iteration
        self.observe = observe
        self.notifier = SystemdNotifier()
        self.watchdog = ProgressWatchdog(self.notifier)
        # Until the first iteration ends; its phases are logged (runtime/startup.py).
        self.startup = StartupWatchdog(cfg.run.startup_timeout_s)
        self.metrics = Metrics(
            version=__version__,
            torch_version=torch.__version__,
            device=str(device),
            stage_phases=STAGE_PHASES,
            eval_interval=cfg.eval.interval,
        )
        self.health = Health(stall_after_s=cfg.metrics.stall_after_s)
        self.server: MetricsServer | None = None
        self.progress = ProgressLog(
            summary_interval=cfg.log.summary_interval,
            summary_seconds=cfg.log.summary_seconds,
            total_frames=cfg.run.total_frames,
            device=device,
            on_summary=self.summary,
            context=self._where_training_is,
            phase_labels={
                "collect": f"collecting {cfg.ppo.rollout_length} steps",
                "update": f"updating {cfg.ppo.epochs}×{cfg.ppo.minibatches} minibatches",
            },
        )
        self.history: HistoryFile | None = None
        self.tensorboard: TensorBoardLog | None = None
        self.wandb: WandbLog | None = None
        if cfg.log.wandb and self.world.leader:
            require_wandb()  # ConfigError (78) now, not a missing dashboard later
        self.daemon_file: Path | None = None
        self._row_iteration = 0  # the iteration the next history row's window starts after
        self._resumed_from: int | None = None
        self._checkpoint: dict[str, Any] = {}  # the last checkpoint written by this process
        self._stall_s = 0.0  # checkpoint stall seconds counted in earlier rows
        self._curriculum_stage: int | None = None  # with env.curriculum: the training stage
        self._level_shares: list[float] | None = None  # with map_levels: envs per level
        # ... and per level [episodes ended, reached, collided] in this row's window
        self._level_ends: list[list[float]] | None = None

    def start(self) -> None:
        if not self.cfg.metrics.enabled:
            return
        m = self.cfg.metrics
        # Every rank on a machine exports its own metrics: base port + local rank.
        port = m.port + self.world.local_rank if m.port else 0
        self.server = MetricsServer(self.metrics, self.health, m.address, port)
        try:
            self.server.start()
        except OSError as err:
            if err.errno != errno.EADDRINUSE or "port" in m.model_fields_set:
                # A port or address the config chose: restarting won't free it (exit 78).
                raise ConfigError(
                    f"metrics endpoint: {err.strerror}; runs side by side need a "
                    "metrics.port each (or metrics.enabled = false)"
                ) from err
            # The default port, taken by a run beside this one: a free one, said below
            # and in the state dir for `status`.
            log.warning("metrics port in use: serving on a free one", taken=port)
            self.server = MetricsServer(self.metrics, self.health, m.address, 0)
            self.server.start()
        log.info("metrics endpoint", url=f"http://{self.server.url_host}:{self.server.port}")

    def run_starts(self, state_dir: Path, iteration: int, frames: int) -> None:
        """The run starts after `iteration` (0, or the checkpoint it resumed from): its
        resolved config is recorded (only now, so a run refused at start-up leaves the last
        run's), history rows and evaluations after it are about to be redone (after a kill
        -9), so they go; `status` learns the endpoint. A file that cannot be written is
        logged; training goes on."""
        try:  # an earlier run's config.toml, if different, is kept in configs/
            kept = record_run_config(state_dir, to_toml(self.cfg))
        except OSError as err:
            log.error("resolved config not recorded", path=str(state_dir), error=str(err))
        else:
            if kept is not None:
                log.info("the earlier run's config kept", path=str(kept))
        history = HistoryFile(state_dir / HISTORY_FILE)
        if cut_back(history.path, iteration, "history", "no training history"):
            self.history = history
        # Evaluations of weights a kill -9 lost: the resumed run evaluates them anew.
        cut_back(state_dir / RESULTS_FILE, iteration, "evaluations", "evaluations past it kept")
        if self.cfg.log.tensorboard:
            self.tensorboard = open_tensorboard(state_dir, frames)
        if self.cfg.log.wandb:
            self.wandb = open_wandb(self.cfg.log, self.cfg.model_dump(mode="json"), state_dir)
        self.metrics.watch_state_dir(str(state_dir))
        self._row_iteration = iteration
        self._resumed_from = iteration or None
        self.metrics.checkpoint_schedule(self.cfg.checkpoint.interval, iteration)
        self.progress.starts_at(frames)  # rate, ETA and bar: this sitting's frames only
        url = None if self.server is None else f"http://{self.server.url_host}:{self.server.port}"
        doc = {"pid": os.getpid(), "url": url, "started": time.time(), "version": __version__}
        self.daemon_file = state_dir / DAEMON_FILE
        try:
            write_atomic(self.daemon_file, json.dumps(doc).encode())
        except OSError as err:
            log.warning("cannot record the endpoint for `status`", error=str(err))

    def state(self, state: State, reason: str | None) -> None:
        self.metrics.set_state(str(state))
        self.health.set_state(str(state))
        if state is State.DRAINING:
            self.notifier.stopping(f"draining: {reason or 'finished'}")

    async def last_scrape(self, state: str, final_scrape_s: float) -> None:
        """State "finished" (run.total_frames reached) or "stopped" (a stop signal, all
        flushed), served for `final_scrape_s` more seconds so that a scrape records it:
        the down alert tells a finished run or a clean stop from a crash by it."""
        self.metrics.set_state(state)
        self.health.set_state(state)
        if self.server is None or final_scrape_s <= 0:
            return
        log.info(f"{state}: serving metrics a last time", seconds=final_scrape_s)
        # The supervisor no longer owns the signals: a SIGINT/SIGTERM ends the wait early.
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            with anyio.move_on_after(final_scrape_s):
                async for _ in signals:
                    break

    async def extend_stop_timeout(self, shutdown: Shutdown) -> None:
        """While draining, keep asking systemd for EXTEND_STOP_S more, every third of it.

        The daemon enforces its own deadline (run.shutdown_timeout_s); systemd's stop
        timeout then only fires if the process stops sending, i.e. hangs."""
        await shutdown.stop.wait()
        while True:
            self.notifier.extend_timeout(EXTEND_STOP_S)
            await anyio.sleep(EXTEND_STOP_S / 3)

    def iteration(self, record: IterationRecord) -> None:
        self.startup.started()
        if record.iteration == 1:
            self.notifier.ready(f"training: iteration {record.iteration}")
        self.watchdog.progress()
        self.health.iteration_done()
        if record.rolled_back:
            self.metrics.rollback()
        self.metrics.iteration(
            frames_delta=self.frames_per_iteration,
            policy_version=record.iteration,
            policy_lag=record.policy_lag,
            losses=record.losses,
        )
        self.metrics.stage_time("producer", "collect", record.collect_s)
        self.metrics.stage_time("trainer", "update", record.update_s)
        self.progress(record)
        if self.observe is not None:
            self.observe(record)

    def summary(self, summary: dict[str, Any]) -> None:
        self.notifier.status(
            f"iteration {summary['iteration']}, {summary['frames_per_second']:.0f} frames/s"
        )
        self.metrics.episodes(
            {k.removeprefix("train_"): v for k, v in summary.items() if k.startswith("train_")}
        )
        for stage, ratio in summary["busy"].items():
            self.metrics.stage_busy(stage, ratio)
        if self.history is not None:
            row = self._history_row(summary)
            error = self.history.append(row)  # a failed row waits for the next one
            if error is not None:
                self.metrics.write_failed("history")
                log.warning("history row not written", iteration=row["iteration"], error=str(error))
            if self.tensorboard is not None:
                self.tensorboard.history_row(row)
            if self.wandb is not None:
                self.wandb.history_row(row)

    def _history_row(self, summary: dict[str, Any]) -> dict[str, Any]:
        """The summary as a history row: which iterations it covers (`iterations` ending at
        `iteration`), wall time, and the checkpoints' age, stall and size."""
        now = time.time()
        stall = self.metrics.registry.get_sample_value("navrl_checkpoint_stall_seconds_sum") or 0.0
        row = {
            "iteration": summary["iteration"],
            "iterations": summary["iteration"] - self._row_iteration,
            "frames": summary["frames"],
            "time": round(now, 3),
            **{k: v for k, v in summary.items() if k not in ("iteration", "frames", "phases")},
            "checkpoint_stall_s": round(stall - self._stall_s, 6),
            "checkpoint_age_s": (  # monotonic: a wall-clock step (NTP) changes no age
                round(time.monotonic() - self._checkpoint["at"], 3) if self._checkpoint else None
            ),
            "checkpoint_write_s": self._checkpoint.get("write_s"),
            "checkpoint_raw_bytes": self._checkpoint.get("raw_bytes"),
            "checkpoint_stored_bytes": self._checkpoint.get("stored_bytes"),
        }
        if self._resumed_from is not None:
            row["resumed_from"] = self._resumed_from
        if self._curriculum_stage is not None:
            row["curriculum_stage"] = self._curriculum_stage
        if self._level_shares is not None:
            row["level_shares"] = [round(share, 4) for share in self._level_shares]
        if self._level_ends is not None:
            row["level_outcomes"] = [_outcome(*ends) for ends in self._level_ends]
            self._level_ends = None
        self._row_iteration, self._stall_s, self._resumed_from = summary["iteration"], stall, None
        return row

    async def redraw_progress(self) -> None:
        """The bar's note on what runs now, every second, until cancelled."""
        while True:
            self.progress.tick()
            await anyio.sleep(1.0)

    def _where_training_is(self) -> dict[str, Any]:
        """The curriculum stage (and its name) and the share of training envs at each
        density level (by pillars), for the summary's log line and console block."""
        where: dict[str, Any] = {}
        stage = self._curriculum_stage
        if stage is not None:
            where["curriculum_stage"] = stage
            stages = self.cfg.env.curriculum
            if stage < len(stages) and stages[stage].name:
                where["curriculum_name"] = stages[stage].name
        if self._level_shares is not None:
            where["level_pillars"] = list(self.cfg.env.navigation.map_levels)
            where["level_shares"] = [round(share, 4) for share in self._level_shares]
        return where

    def curriculum_stage(self, stage: int) -> None:
        """The training env is now at curriculum stage `stage`."""
        self._curriculum_stage = stage
        self.metrics.curriculum_stage(stage)

    def levels(self, shares: list[float], ends: list[list[float]]) -> None:
        """After a rollout: the share of the training envs at each `env.navigation.map_levels`
        level, and per level [episodes ended, reached, collided] during it (summed per row)."""
        self._level_shares = shares
        self.metrics.level_shares(list(self.cfg.env.navigation.map_levels), shares)
        total = self._level_ends or [[0.0, 0.0, 0.0] for _ in ends]
        self._level_ends = [
            [a + b for a, b in zip(t, e, strict=True)] for t, e in zip(total, ends, strict=True)
        ]

    def evaluation(self, record: dict[str, Any]) -> None:
        self.metrics.evaluation(record)
        self.metrics.stage_time("evaluator", "evaluate", record["seconds"])
        if self.tensorboard is not None:
            self.tensorboard.evaluation(record)
        if self.wandb is not None:
            self.wandb.evaluation(record)

    def evaluation_video(self, record: dict[str, Any], gif: bytes) -> None:
        """An evaluation's video (`log.video_interval`): to TensorBoard and W&B."""
        if self.tensorboard is not None:
            self.tensorboard.video(record, gif)
        if self.wandb is not None:
            self.wandb.video(record, gif)

    def checkpoint_written(
        self, seconds: float, raw_bytes: int, stored_bytes: int, iteration: int
    ) -> None:
        self.metrics.checkpoint_written(seconds, raw_bytes, stored_bytes, iteration)
        self._checkpoint = {
            "at": time.monotonic(),
            "write_s": round(seconds, 6),
            "raw_bytes": raw_bytes,
            "stored_bytes": stored_bytes,
        }
        self.metrics.stage_time("checkpoint_writer", "write", seconds)

    def close(self) -> None:
        self.startup.close()
        self.progress.summarise()
        self.progress.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:  # the final policy, exported by now, as an artifact
            self.wandb.close(Path(self.wandb.log_dir.parent, "export", "policy.pt"))
        if self.server is not None:
            self.server.stop()
        if self.daemon_file is not None:
            self.daemon_file.unlink(missing_ok=True)
        self.notifier.close()


def _outcome(episodes: float, reached: float, collided: float) -> dict[str, float | int | None]:
    """One level's training episodes in a history row: how many ended there, and the share
    that reached their goal or collided (None when none ended)."""
    n = int(episodes)
    return {
        "episodes": n,
        "reach_goal": round(reached / n, 4) if n else None,
        "collision": round(collided / n, 4) if n else None,
    }


def cut_back(path: Path, iteration: int, what: str, otherwise: str) -> bool:
    """Drop the rows of the JSON-lines file `path` past `iteration` (`cut_rows`), logged as
    `what` cut back; False, logged as `otherwise`, when the file cannot be rewritten."""
    try:
        dropped = cut_rows(path, iteration)
    except OSError as err:
        log.warning(f"{otherwise}: cannot rewrite it", path=str(path), error=str(err))
        return False
    if dropped:
        log.info(f"{what} cut back to the checkpoint", iteration=iteration, dropped=dropped)
    return True
