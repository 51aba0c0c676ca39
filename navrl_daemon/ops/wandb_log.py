"""Weights & Biases beside TensorBoard (`log.wandb`): a view of the run for those whose
dashboards are there, as NavRL, rsl_rl, SB3 and CleanRL log.

What goes in is what TensorBoard gets (ops/tensorboard.py: the same tags, x-axis `frames`,
so the two never disagree), the resolved config, the evaluation videos, and at the end
`export/policy.pt` as a model artifact. W&B's files are in `STATE_DIR/wandb`; the run's id
is kept there (`run_id`), so a resumed daemon continues the same W&B run. A run resumed
after a kill -9 logs the iterations after its checkpoint again (TensorBoard drops the
earlier points; W&B keeps both).

`wandb` is an extra (`pip install -e '.[wandb]'`), imported only when `log.wandb` is on.
Like TensorBoard's files it is a view: a failure (no login, the service gone) is logged once
and turns it off; training never stops for it.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import structlog

from navrl_daemon.config import LogConfig
from navrl_daemon.errors import ConfigError
from navrl_daemon.ops.tensorboard import VIDEO_TAG, evaluation_scalars, history_scalars

log = structlog.get_logger("wandb")

LOG_DIR = "wandb"  # under the state dir; W&B's own files and `run_id`
RUN_ID_FILE = "run_id"
STEP = "frames"  # the x-axis of every W&B chart, as TensorBoard's step
INSTALL = "pip install -e '.[wandb]'"


def require_wandb() -> None:
    """ConfigError (78) when `log.wandb` is on and the package is not installed: found at
    start-up, before any training, not as a missing dashboard hours later. Imported, not
    only looked up: a broken install fails here too (the run imports it next anyway)."""
    try:
        import wandb  # noqa: F401
    except ImportError as err:
        needs = f"log.wandb = true needs the wandb package ({err})"
        raise ConfigError(f"{needs}: {INSTALL}, or set log.wandb = false") from None


class WandbLog:
    """A W&B run (`wandb.init`'s); rows, evaluations and videos go in as they are written."""

    def __init__(self, run: Any, log_dir: Path) -> None:
        self.run = run
        self.log_dir = log_dir
        self.frames = 0  # of the last point logged: the artifact's metadata
        self.failed: str | None = None  # why logging stopped (then every call is a no-op)

    def history_row(self, row: dict[str, Any]) -> None:
        self._log(history_scalars(row), int(row["frames"]))

    def evaluation(self, record: dict[str, Any]) -> None:
        self._log(evaluation_scalars(record), int(record["frames"]))

    def video(self, record: dict[str, Any], gif: bytes) -> None:
        """An evaluation's video (an animated GIF) as `eval/video`."""
        if self.failed is not None:
            return
        try:
            import wandb

            caption = f"iteration {record['iteration']}"
            clip = wandb.Video(io.BytesIO(gif), caption=caption, format="gif")
        except Exception as err:
            self._fail(err)
            return
        self._log({VIDEO_TAG: clip}, int(record["frames"]))

    def close(self, policy: Path | None = None) -> None:
        """`policy` (the final export) as a "model" artifact, then the run finished (online:
        its files uploaded)."""
        if self.failed is not None:
            return
        try:
            if policy is not None and policy.exists():
                import wandb

                artifact = wandb.Artifact(
                    f"policy-{self.run.id}", type="model", metadata={STEP: self.frames}
                )
                artifact.add_file(str(policy))
                self.run.log_artifact(artifact, aliases=["latest", f"frames-{self.frames}"])
            self.run.finish()
        except Exception as err:
            self._fail(err)

    def _log(self, data: dict[str, Any], frames: int) -> None:
        if self.failed is not None:
            return
        try:
            self.run.log({**data, STEP: frames})
        except Exception as err:
            self._fail(err)
            return
        self.frames = max(self.frames, frames)

    def _fail(self, err: Exception) -> None:
        self.failed = f"{type(err).__name__}: {err}"
        log.error(
            "W&B logging failed: off until the daemon restarts (history.jsonl has every row)",
            path=str(self.log_dir),
            error=self.failed,
        )


def open_wandb(cfg: LogConfig, config: dict[str, Any], state_dir: Path) -> WandbLog | None:
    """The W&B run of `state_dir` (the one its `wandb/run_id` names, else a new one), or
    None (logged) when it cannot start: training goes on."""
    log_dir = state_dir / LOG_DIR
    try:
        import wandb

        log_dir.mkdir(parents=True, exist_ok=True)
        id_file = log_dir / RUN_ID_FILE
        run = wandb.init(
            project=cfg.wandb_project,
            entity=cfg.wandb_entity or None,
            name=cfg.wandb_run_name or None,
            mode=cfg.wandb_mode or None,
            id=_read_run_id(id_file),  # None: a new run, with a new id
            resume="allow",
            dir=str(state_dir),  # W&B adds the `wandb/`
            config=config,
            # The console stays the daemon's: W&B would otherwise wrap stdout and stderr,
            # and its `wandb:` lines would break the JSON log off a terminal. Its own
            # messages go to its run dir's logs/debug.log; the daemon logs the run's URL.
            settings=wandb.Settings(console="off", silent=True),
        )
        id_file.write_text(f"{run.id}\n")
        run.define_metric(STEP)
        run.define_metric("*", step_metric=STEP)
    except Exception as err:  # ImportError, OSError, or W&B's own (no login, no network)
        log.error("no W&B logging", path=str(log_dir), error=f"{type(err).__name__}: {err}")
        return None
    url = "offline: `wandb sync`" if run.offline else run.url  # .url warns when offline
    log.info("W&B run", id=run.id, dir=str(log_dir), url=url)
    return WandbLog(run, log_dir)


def _read_run_id(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None
