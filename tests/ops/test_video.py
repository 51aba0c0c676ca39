"""`eval --video`: the frames show both views, the drones in their outcome colours and the
dynamic obstacles moving; the video stays small (frame count and size capped)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from navrl_daemon.config import load_config
from navrl_daemon.ops.plots import DYNAMIC_COLOUR, OUTCOME_COLOURS
from navrl_daemon.ops.video import MAX_FRAMES, SIZE_PX, frames, gif_bytes
from navrl_daemon.rl.evaluate import Trajectories, evaluate_recorded
from navrl_daemon.rl.evaluations import make_eval_env
from navrl_daemon.rl.policy import make_policy
from tests.conftest import TINY


def colour_mask(image: np.ndarray, hex_colour: str, tolerance: int = 40) -> np.ndarray:
    rgb = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])
    return np.abs(image[..., :3].astype(int) - rgb).max(-1) <= tolerance


@pytest.fixture(scope="module")
def trajectories() -> Trajectories:
    cfg = load_config(None, [*TINY, "env.max_episode_length=100", "eval.num_envs=6"])
    torch.manual_seed(0)
    policy = make_policy(cfg, "cpu")
    env = make_eval_env(cfg, "cpu")
    _, traj = evaluate_recorded(env, policy, seed=0, max_steps=100)
    return traj


def test_frames_show_moving_obstacles_and_outcome_colours(trajectories: Trajectories) -> None:
    images = [np.asarray(im) for im in frames(trajectories, "test")]
    assert 2 <= len(images) <= MAX_FRAMES
    assert images[0].shape == (SIZE_PX[1], SIZE_PX[0], 3)
    first, last = (colour_mask(im, DYNAMIC_COLOUR, tolerance=60) for im in (images[0], images[-1]))
    assert first.sum() > 50 and last.sum() > 50  # the obstacles are drawn...
    assert (first ^ last).sum() > 0.2 * first.sum()  # ...and not where they were
    outcomes = set(trajectories.outcomes())
    drawn = {k for k in outcomes if colour_mask(images[-1], OUTCOME_COLOURS[k]).sum() > 5}
    assert drawn == outcomes


def test_gif_is_small_and_loops(trajectories: Trajectories) -> None:
    data = gif_bytes(trajectories, max_frames=30)
    assert len(data) < 2_000_000
    with Image.open(io.BytesIO(data)) as gif:
        assert gif.n_frames <= 31 and gif.info.get("loop") == 0 and gif.size == SIZE_PX
