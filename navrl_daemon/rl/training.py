"""The bare training loop: a `Collector` (rl/collector.py) and a `Learner` (rl/learner.py)
around one shared policy, stepped in turn, and NavRL's evaluation beside them
(rl/evaluations.py). The plain `run` of the learning test and the pipeline benchmark's
baseline; the daemon's stages split the same two halves over threads. No I/O."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDictBase

from navrl_daemon.config import Config
from navrl_daemon.rl.collector import Collector
from navrl_daemon.rl.evaluations import Evaluations
from navrl_daemon.rl.learner import Learner
from navrl_daemon.rl.policy import NavRLPolicy, make_policy


@dataclass
class IterationResult:
    iteration: int
    frames: int
    collect_s: float
    update_s: float
    losses: dict[str, float]


@dataclass
class Training:
    """The bare loop: collect, then update, with one shared policy."""

    cfg: Config
    device: torch.device
    collector: Collector
    learner: Learner
    buffer: TensorDictBase
    frames: int = 0
    evaluations: Evaluations | None = field(default=None, repr=False)

    @classmethod
    def build(cls, cfg: Config, device: str | torch.device) -> Training:
        device = torch.device(device)
        torch.manual_seed(cfg.run.seed)
        policy = make_policy(cfg, device)
        collector = Collector.build(cfg, policy, device)
        buffer = collector.new_buffer()
        return cls(cfg, device, collector, Learner.build(cfg, policy, device), buffer)

    @property
    def policy(self) -> NavRLPolicy:
        return self.learner.policy

    @property
    def iteration(self) -> int:
        return self.learner.version

    def step(self) -> IterationResult:
        """One iteration: a rollout of `ppo.rollout_length` steps, then the PPO update."""
        collect_s = self.collector.collect(self.buffer)
        t0 = time.perf_counter()
        losses = self.learner.update(self.buffer)
        update_s = time.perf_counter() - t0
        self.frames += self.cfg.frames_per_iteration
        return IterationResult(self.iteration, self.frames, collect_s, update_s, losses)

    def evaluate(self) -> dict[str, Any]:
        """NavRL's evaluation on separate envs (`Evaluations`: the eval section's maps)."""
        if self.evaluations is None:
            self.evaluations = Evaluations(self.cfg, self.device)
        return self.evaluations(self.policy)
