"""EpisodeStats: the training episodes' outcome shares, out of bounds included."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from navrl_daemon.rl.rollout import EPISODE_KEYS, STAT_KEYS, EpisodeStats


def rollout(done: list[list[bool]], outcome: list[list[str]]) -> TensorDict:
    """A [N, T] rollout whose `next` stats say how each step's episode ended."""
    n, t = len(done), len(done[0])
    stats = {k: torch.zeros(n, t, 1) for k in STAT_KEYS}
    for i in range(n):
        for j in range(t):
            stats["episode_len"][i, j] = 10.0 * (j + 1)
            if outcome[i][j] == "collided":
                stats["collision"][i, j] = 1.0
            elif outcome[i][j] == "reached":
                stats["truncated"][i, j] = stats["reach_goal"][i, j] = 1.0
            elif outcome[i][j] == "timed out":
                stats["truncated"][i, j] = 1.0
    nxt = {"done": torch.tensor(done)[..., None], "stats": stats}
    return TensorDict({"next": nxt}, batch_size=[n, t])


def test_episodes_that_left_the_band_are_counted_apart_from_collisions_and_time_outs() -> None:
    episodes = EpisodeStats("cpu")
    episodes.add(
        rollout(
            done=[[False, True], [True, False], [True, True], [False, False]],
            # a step that is not done never counts, whatever its stats say
            outcome=[
                ["collided", "left"],
                ["collided", "left"],
                ["reached", "timed out"],
                ["left", "left"],
            ],
        )
    )
    out = episodes.take()
    assert out["episodes"] == 4
    assert out["collision"] == 0.25
    assert out["truncated"] == 0.5
    assert out["reach_goal"] == 0.25
    assert out["out_of_bounds"] == 0.25
    assert set(out) == {"episodes", *EPISODE_KEYS}
    assert episodes.take() == {}  # the window restarts
