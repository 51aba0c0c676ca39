"""Evaluation videos in TensorBoard (`log.video_interval`): a real run's event file, read
back with TensorBoard's own reader, holds an animated GIF of the 1st evaluation and of
every N-th after it, at its frames; a recorded evaluation gives the numbers the plain one
does (a video costs no different result)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from navrl_daemon.config import load_config
from navrl_daemon.ops.tensorboard import VIDEO_TAG
from navrl_daemon.ops.video import SIZE_PX
from navrl_daemon.rl.evaluations import Evaluations
from navrl_daemon.rl.policy import make_policy
from tests.conftest import TINY, navrl_cli

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def test_every_second_evaluation_s_video_reaches_the_tensorboard_event_file(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    run = [*TINY, "run.total_frames=512", "eval.interval=2", "log.video_interval=2"]
    proc = navrl_cli("run", "--state-dir", str(state), *run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (state / "eval" / "results.jsonl").read_text().splitlines()
    evaluations = [json.loads(line) for line in lines]
    assert len(evaluations) >= 2  # a slow one may coalesce the next away, not the last

    acc = event_accumulator.EventAccumulator(
        str(state / "tensorboard"), size_guidance={"images": 0, "scalars": 0}
    )
    acc.Reload()
    videos = acc.Images(VIDEO_TAG)
    assert [v.step for v in videos] == [e["frames"] for e in evaluations[::2]]
    for video in videos:
        assert (video.width, video.height) == SIZE_PX
        gif = Image.open(io.BytesIO(video.encoded_image_string))
        assert gif.format == "GIF" and gif.n_frames > 10  # animated: the episode, step by step
    # the scalars beside them as before
    assert [e.step for e in acc.Scalars("eval/reach_goal")] == [e["frames"] for e in evaluations]


def test_a_recorded_evaluation_gives_the_plain_evaluation_s_numbers() -> None:
    cfg = load_config(None, [*TINY, "eval.held_out_seed=7"], environ={})
    torch.manual_seed(0)
    policy = make_policy(cfg, "cpu")
    evaluations = Evaluations(cfg, "cpu")
    plain = evaluations(policy)
    recorded, traj = evaluations.recorded(policy)
    assert recorded == plain
    assert "held_out_reach_goal" in recorded
    assert traj.positions.shape[1] == cfg.eval.num_envs
    assert len(traj.outcomes()) == recorded["episodes"]
