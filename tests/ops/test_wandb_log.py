"""W&B beside TensorBoard, with the real `wandb` package in offline mode (no network): a
short run's W&B files, read back record by record, hold every history row's scalars and
every evaluation's at their frames, the config, the videos and the final policy; the run
resumed continues the same W&B run id; a missing package is a bad config (78); a failing
W&B run is logged once and turned off."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from navrl_daemon.config import LogConfig
from navrl_daemon.ops.tensorboard import evaluation_scalars, history_scalars
from navrl_daemon.ops.wandb_log import open_wandb
from tests.conftest import REPO, SUBPROCESS_ENV, TINY, navrl_cli

wandb_pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")

# 64 frames an iteration: 6 iterations, then resumed to 10; evaluated every 2nd, a video
# of every 2nd evaluation.
RUN = [
    *TINY,
    "eval.interval=2",
    "checkpoint.interval=2",
    "log.wandb=true",
    "log.wandb_mode=offline",
    "log.wandb_project=navrl-test",
    "log.video_interval=2",
]


def wandb_env(tmp: Path) -> dict[str, str]:
    """W&B silent, offline, and its caches in `tmp`, not the user's home."""
    return {
        "WANDB_SILENT": "true",
        "WANDB_MODE": "offline",
        "WANDB_CONFIG_DIR": str(tmp / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp / "wandb-cache"),
        "WANDB_DATA_DIR": str(tmp / "wandb-data"),
        "WANDB_ARTIFACT_DIR": str(tmp / "wandb-artifacts"),
    }


# A `.wandb` file: a 7-byte header (":W&B", magic, version), then LevelDB-log records in
# 32 KiB blocks (a 7-byte header: CRC, length, type; a record may span blocks), each a
# protobuf `Record`.
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[Any]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header: padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, LAST):
            record = wandb_pb.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""


def read_run(run_dir: Path) -> dict[str, Any]:
    """An offline run's id, config, history rows ({key: value}) and artifacts."""
    (path,) = run_dir.glob("run-*.wandb")
    out: dict[str, Any] = {"id": None, "config": {}, "rows": [], "artifacts": []}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["id"] = record.run.run_id
            for item in record.run.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "history":
            out["rows"].append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
        elif kind == "artifact":
            files = [entry.path for entry in record.artifact.manifest.contents]
            out["artifacts"].append((record.artifact.name, record.artifact.type, files))
    return out


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def points(rows: list[dict[str, Any]], tag: str) -> dict[int, float]:
    return {int(row["frames"]): row[tag] for row in rows if tag in row}


def check_scalars(logged: list[dict[str, Any]], expected: dict[str, float], frames: int) -> None:
    """Every scalar of `expected` is in `logged` at `frames`, with its value."""
    assert expected
    for tag, value in expected.items():
        assert points(logged, tag).get(frames) == pytest.approx(value), (tag, frames)


def test_a_run_and_its_resume_are_one_wandb_run_with_the_training_and_evaluation_scalars(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    env = wandb_env(tmp_path)
    del env["WANDB_SILENT"]  # as a user runs it: W&B's silence is the daemon's doing
    first = navrl_cli("run", "--state-dir", str(state), *RUN, "run.total_frames=384", env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    # Off a terminal every line is JSON: W&B's own `wandb:` lines go to its debug.log.
    for line in (first.stdout + first.stderr).splitlines():
        assert json.loads(line), line
    (run_dir,) = (state / "wandb").glob("offline-run-*")
    run = read_run(run_dir)
    assert run["id"] == (state / "wandb" / "run_id").read_text().strip()
    # the resolved config, section by section
    assert run["config"]["env"]["num_envs"] == 8 and run["config"]["log"]["video_interval"] == 2

    history, evaluations = jsonl(state / "history.jsonl"), jsonl(state / "eval" / "results.jsonl")
    assert len(history) == 6 and evaluations
    for row in history:
        check_scalars(run["rows"], history_scalars(row), row["frames"])
    for record in evaluations:
        check_scalars(run["rows"], evaluation_scalars(record), record["frames"])
    # The first evaluation's video (every 2nd from the first), a GIF W&B keeps beside it.
    videos = points(run["rows"], "eval/video/path")
    assert evaluations[0]["frames"] in videos
    gif = run_dir / "files" / videos[evaluations[0]["frames"]]
    assert gif.read_bytes()[:6] == b"GIF89a"
    # The final policy, as a model artifact.
    assert run["artifacts"] == [(f"policy-{run['id']}", "model", ["policy.pt"])]

    again = navrl_cli("run", "--state-dir", str(state), *RUN, "run.total_frames=640", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    second_dir = next(d for d in (state / "wandb").glob("offline-run-*") if d != run_dir)
    resumed = read_run(second_dir)
    assert resumed["id"] == run["id"]  # the same W&B run: `wandb sync` appends to it
    later = [row for row in jsonl(state / "history.jsonl") if row["frames"] > 384]
    assert [row["iteration"] for row in later] == [7, 8, 9, 10]
    for row in later:
        check_scalars(resumed["rows"], history_scalars(row), row["frames"])
    assert min(points(resumed["rows"], "train/episodes")) > 384  # only the resumed part


def test_log_wandb_without_the_package_is_a_bad_config(tmp_path: Path) -> None:
    """A Python where `import wandb` fails (as without the extra) exits 78 naming the
    install, before training anything."""
    script = (
        "import sys; sys.modules['wandb'] = None\n"  # `import wandb` raises ImportError
        "from navrl_daemon.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    state = tmp_path / "state"
    proc = subprocess.run(
        [sys.executable, "-c", script, "run", "--state-dir", str(state), *TINY, "log.wandb=true"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**SUBPROCESS_ENV, **wandb_env(tmp_path)},
        cwd=REPO,
    )
    assert proc.returncode == 78, proc.stderr[-3000:]
    assert "pip install -e '.[wandb]'" in proc.stderr
    assert not (state / "checkpoints").exists() or not any((state / "checkpoints").iterdir())


def test_a_failing_wandb_run_is_logged_once_and_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in wandb_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    cfg = LogConfig(wandb=True, wandb_mode="offline", wandb_project="navrl-test")
    board = open_wandb(cfg, {"run": {"seed": 0}}, tmp_path)
    assert board is not None
    board.history_row({"frames": 64, "iteration": 1, "train_reach_goal": 0.5})
    board.run.finish()  # the run gone under it: W&B raises on every call from here
    for frames in (128, 192):
        board.history_row({"frames": frames, "iteration": 2, "train_reach_goal": 0.5})
    board.evaluation({"frames": 192, "iteration": 3, "reach_goal": 0.25})
    board.close(None)  # never raises: training must not notice
    assert board.failed is not None and "finished" in board.failed
    assert capsys.readouterr().out.count("W&B logging failed") == 1
    assert board.frames == 64
