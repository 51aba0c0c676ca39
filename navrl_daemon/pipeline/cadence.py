"""The pace of a run, decided in one place for every stage: how many frames an iteration
is, when the run ends, how far collection may run ahead of training, and which
iterations checkpoint, are mirrored, archive and evaluate.

Iteration i is rollout i (counted from 0) and the update on it, which makes policy
version i + 1. The producer asks about the version the update on its rollout will make
(it captures the env state for that checkpoint, right after the rollout); the trainer
asks about the version it has just made: both ask `checkpoints(version)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from navrl_daemon.config import Config


@dataclass(frozen=True)
class Cadence:
    # Frames of one iteration over every rank: env.num_envs x ppo.rollout_length x ranks.
    frames_per_iteration: int
    total_frames: int
    # Rollouts collected ahead of the weights that trained on the one before (0: on-policy).
    max_policy_lag: int = 0
    checkpoint_interval: int = 0  # 0: never
    archive_interval: int = 0
    eval_interval: int = 0
    mirror_interval: int = 0  # checkpoint.interval x checkpoint.mirror_every
    eval_first: bool = False  # the first update (version 1) is evaluated too

    @classmethod
    def of(cls, cfg: Config, world_size: int = 1) -> Cadence:
        return cls(
            frames_per_iteration=cfg.frames_per_iteration * world_size,
            total_frames=cfg.run.total_frames,
            max_policy_lag=cfg.pipeline.max_policy_lag,
            checkpoint_interval=cfg.checkpoint.interval,
            archive_interval=cfg.archive.interval,
            eval_interval=cfg.eval.interval,
            mirror_interval=cfg.checkpoint.interval * cfg.checkpoint.mirror_every,
            eval_first=cfg.eval.first_iteration,
        )

    def checkpoints(self, version: int) -> bool:
        """Whether the learner after update `version` is checkpointed."""
        return _every(self.checkpoint_interval, version)

    def mirrors(self, version: int) -> bool:
        """Whether the checkpoint of update `version` is copied to `checkpoint.mirror`
        (besides the final one, which always is)."""
        return _every(self.mirror_interval, version)

    def evaluates(self, version: int) -> bool:
        """Whether the weights after update `version` go to the evaluator."""
        first = self.eval_first and version == 1
        return _every(self.eval_interval, version) or (bool(self.eval_interval) and first)

    def archives(self, rollout: int) -> bool:
        """Whether rollout `rollout` (counted from 0) goes to the archiver."""
        return _every(self.archive_interval, rollout)

    def frames_left(self, frames: int) -> bool:
        return frames < self.total_frames


@dataclass(frozen=True)
class Position:
    """Where a run starts: the iterations and frames already trained (a checkpoint's)."""

    iteration: int = 0
    frames: int = 0


def _every(interval: int, n: int) -> bool:
    return bool(interval) and n % interval == 0
