"""It learns: the default CPU task goes from reach_goal 0 to at least 0.5.

Learning is noisy (it can drop for a while), so the test passes on the first evaluation
that clears the bar and fails only if none does within the frame cap.
"""

from __future__ import annotations

import pytest
import torch

from navrl_daemon.config import load_config
from navrl_daemon.rl.training import Training
from tests.conftest import REPO

BAR = 0.5
FRAME_CAP = 800_000
EVAL_EVERY = 10  # iterations (20,480 frames)


@pytest.mark.slow
def test_default_config_learns_to_reach_goals() -> None:
    torch.set_num_threads(2)
    cfg = load_config(REPO / "config" / "default.toml", ["run.seed=0"], environ={})
    training = Training.build(cfg, "cpu")
    untrained = training.evaluate()
    assert untrained["reach_goal"] <= 0.05, untrained
    history = [(0, untrained["reach_goal"])]
    while training.frames < FRAME_CAP:
        result = training.step()
        if result.iteration % EVAL_EVERY == 0:
            reach = training.evaluate()["reach_goal"]
            history.append((training.frames, reach))
            if reach >= BAR:
                break
    assert history[-1][1] >= BAR, f"no evaluation reached {BAR}: {history}"
