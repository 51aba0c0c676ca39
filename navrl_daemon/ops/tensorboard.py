"""TensorBoard event files of a run: `STATE_DIR/tensorboard/`, `tensorboard --logdir`.

The scalars are those of `history.jsonl` (every number of each row, at step = the row's
frames, with its wall time) and of `eval/results.jsonl` (under `eval/`), so TensorBoard,
the report and the history never disagree. Tags are grouped the way a reader looks for
them: `train/`, `loss/` (everything the update reported, by its name), `throughput/`,
`checkpoint/`, `eval/`, `run/`; W&B (ops/wandb_log.py)
gets the same tags. With `log.video_interval`, evaluation videos go in as `eval/video`.

A resumed run re-trains the iterations after its checkpoint; the writer is opened with
`purge_step` at the checkpoint's frames + 1, so TensorBoard drops the earlier run's points
from there on, as `history.jsonl` drops its rows.
"""

from __future__ import annotations

import io
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import structlog

from navrl_daemon.ops.statistics import is_row_field

log = structlog.get_logger("tensorboard")

LOG_DIR = "tensorboard"
FLUSH_S = 30  # the writer thread flushes at least this often; close() flushes the rest
VIDEO_TAG = "eval/video"  # an evaluation's video (`log.video_interval`), in TensorBoard and W&B

_THROUGHPUT = {"frames_per_second", "policy_lag"}
_NOT_SCALARS = {"frames", "time"}  # the step and the wall time of every point


def history_tag(key: str) -> str | None:
    """The tag of a history row's key (None: not written as a scalar)."""
    if key in _NOT_SCALARS:
        return None
    if key.startswith("train_"):
        return f"train/{key.removeprefix('train_')}"
    if key in _THROUGHPUT or key.startswith("busy_"):
        return f"throughput/{key}"
    if key.startswith("checkpoint_"):
        return f"checkpoint/{key.removeprefix('checkpoint_')}"
    if is_row_field(key):
        return f"run/{key}"
    return f"loss/{key}"  # what the update reported, whatever its name (ops/statistics.py)


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The numbers of a row by key; nested dicts (`busy`) flattened as `busy_producer`."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if isinstance(value, dict):
            out.update(scalars({f"{key}_{k}": v for k, v in value.items()}))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = float(value)
    return out


def history_scalars(row: dict[str, Any]) -> dict[str, float]:
    """A history row's scalars by tag (what TensorBoard and W&B plot at its frames)."""
    tags = ((history_tag(k), v) for k, v in scalars(row).items())
    return {tag: v for tag, v in tags if tag is not None}


def evaluation_scalars(record: dict[str, Any]) -> dict[str, float]:
    """An evaluation's scalars by tag, under `eval/`."""
    return {f"eval/{k}": v for k, v in scalars(record).items() if k not in _NOT_SCALARS}


class TensorBoardLog:
    """A SummaryWriter on `log_dir`; rows and evaluations go in as they are written."""

    def __init__(self, log_dir: Path, *, resumed_at_frames: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        self.writer = SummaryWriter(
            log_dir=str(log_dir),
            purge_step=resumed_at_frames + 1 if resumed_at_frames else None,
            flush_secs=FLUSH_S,
        )

        self.failed: str | None = None  # why writing stopped (then every call is a no-op)

    def history_row(self, row: dict[str, Any]) -> None:
        self._add(history_scalars(row), int(row["frames"]), row.get("time"))

    def evaluation(self, record: dict[str, Any]) -> None:
        self._add(evaluation_scalars(record), int(record["frames"]), record.get("time"))

    def video(self, record: dict[str, Any], gif: bytes) -> None:
        """An evaluation's video (`ops/video.py`) as `eval/video` at its frames: an image
        summary holding the animated GIF, which TensorBoard's Images tab plays (what
        `add_video` writes, without the moviepy it needs to encode one)."""
        if self.failed is not None:
            return
        try:
            from PIL import Image
            from tensorboard.compat.proto.summary_pb2 import Summary

            width, height = Image.open(io.BytesIO(gif)).size
            image = Summary.Image(
                height=height, width=width, colorspace=3, encoded_image_string=gif
            )
            summary = Summary(value=[Summary.Value(tag=VIDEO_TAG, image=image)])
            self.writer._get_file_writer().add_summary(
                summary, global_step=int(record["frames"]), walltime=record.get("time")
            )
        except Exception as err:
            self._fail(err)

    def close(self) -> None:
        if self.failed is None:
            try:
                self.writer.close()
            except Exception as err:  # the writer thread died (its dir went away, a full disk)
                self._fail(err)

    def _add(self, scalars: dict[str, float], step: int, when: float | None) -> None:
        """TensorBoard files are a view of history.jsonl: a failure to write them is logged
        once and turns them off until the next start; training never notices."""
        if self.failed is not None:
            return
        try:
            for tag, value in scalars.items():
                self.writer.add_scalar(tag, value, global_step=step, walltime=when)
        except Exception as err:
            self._fail(err)

    def _fail(self, err: Exception) -> None:
        self.failed = f"{type(err).__name__}: {err}"
        log.error(
            "TensorBoard event files not written: off until the daemon restarts "
            "(history.jsonl has every row)",
            path=str(self.log_dir),
            error=self.failed,
        )


def open_tensorboard(state_dir: Path, resumed_at_frames: int) -> TensorBoardLog | None:
    """`STATE_DIR/tensorboard`, or None (logged) when it cannot be written: training goes on."""
    log_dir = state_dir / LOG_DIR
    try:
        board = TensorBoardLog(log_dir, resumed_at_frames=resumed_at_frames)
    except (ImportError, OSError) as err:
        log.warning("no TensorBoard event files", path=str(log_dir), error=str(err))
        return None
    log.info("TensorBoard event files", logdir=str(log_dir), view=view_command(log_dir))
    return board


def view_command(log_dir: Path) -> str:
    """`tensorboard --logdir DIR` as it runs from here: the `tensorboard` installed beside
    this Python (`.venv/bin/tensorboard` after `make`) by its path unless PATH finds that
    same one (a venv that is not activated is not on PATH)."""
    beside = Path(sys.executable).parent / "tensorboard"
    program = "tensorboard"
    if beside.exists():
        on_path = shutil.which("tensorboard")
        if on_path is None or Path(on_path).resolve() != beside.resolve():
            program = shlex.quote(_relative(beside))
    return f"{program} --logdir {shlex.quote(str(log_dir))}"


def _relative(path: Path) -> str:
    try:
        return str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
