"""Cadence: one owner for which iterations checkpoint, are mirrored, archive and evaluate."""

from __future__ import annotations

from navrl_daemon.config import load_config
from navrl_daemon.pipeline.cadence import Cadence


def test_intervals_count_versions_and_rollouts_and_zero_means_never() -> None:
    cadence = Cadence(64, 640, checkpoint_interval=3, archive_interval=2, eval_interval=0)
    # The update on rollout i makes version i + 1: rollouts 2, 5, 8 feed checkpoints.
    assert [i for i in range(10) if cadence.checkpoints(i + 1)] == [2, 5, 8]
    assert [i for i in range(10) if cadence.archives(i)] == [0, 2, 4, 6, 8]
    assert not any(cadence.evaluates(v) for v in range(10))
    assert cadence.frames_left(576) and not cadence.frames_left(640)


def test_frames_per_iteration_counts_every_rank() -> None:
    cfg = load_config(None, ["env.num_envs=8", "ppo.rollout_length=8"], environ={})
    assert Cadence.of(cfg).frames_per_iteration == 64
    assert Cadence.of(cfg, world_size=3).frames_per_iteration == 192
    assert Cadence.of(cfg).checkpoint_interval == cfg.checkpoint.interval


def test_every_nth_checkpoint_is_mirrored() -> None:
    cfg = load_config(None, ["checkpoint.interval=3", "checkpoint.mirror_every=2"], environ={})
    cadence = Cadence.of(cfg)
    assert [v for v in range(1, 20) if cadence.mirrors(v)] == [6, 12, 18]
    only_final = Cadence.of(load_config(None, ["checkpoint.interval=0"], environ={}))
    assert not any(only_final.mirrors(v) for v in range(1, 20))
