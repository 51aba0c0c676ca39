"""One training run's compute state and its iteration: collect T steps, then PPO-update.

`Training` owns the env, the policy, the optimisers, the rollout buffer and the counters.
It does no I/O: the plain loop (`daemon.py`) and later the pipeline stages drive it and
decide what to log, evaluate and save.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.envs import EnvBase

from navrl_daemon.config import Config
from navrl_daemon.env import make_env
from navrl_daemon.rl import ppo
from navrl_daemon.rl.evaluate import evaluate
from navrl_daemon.rl.policy import NavRLPolicy
from navrl_daemon.rl.rollout import EpisodeStats, collect, first_step, make_rollout_buffer


class NonFiniteTraining(RuntimeError):
    """Too many consecutive PPO updates produced non-finite losses."""


@dataclass
class IterationResult:
    iteration: int
    frames: int
    collect_s: float
    update_s: float
    losses: dict[str, float]


@dataclass
class Training:
    cfg: Config
    device: torch.device
    env: EnvBase
    policy: NavRLPolicy
    optimizers: dict[str, torch.optim.Optimizer]
    generator: torch.Generator
    td: TensorDictBase
    buffer: TensorDictBase
    episodes: EpisodeStats
    iteration: int = 0
    frames: int = 0
    nonfinite_streak: int = 0
    eval_env: EnvBase | None = field(default=None, repr=False)

    @classmethod
    def build(cfg_cls, cfg: Config, device: str | torch.device) -> Training:
        device = torch.device(device)
        torch.manual_seed(cfg.run.seed)
        env = make_env(cfg.env, device=device, seed=cfg.run.seed)
        policy = NavRLPolicy(
            action_limit=cfg.env.action_limit, gamma=cfg.ppo.gamma, lmbda=cfg.ppo.lmbda
        ).to(device)
        generator = torch.Generator(device=device)
        generator.manual_seed(cfg.run.seed)
        td = env.reset()
        # One throwaway step shows the record's layout, which sizes the buffer.
        example = first_step(env, policy, td)
        td = env.reset()
        return cfg_cls(
            cfg=cfg,
            device=device,
            env=env,
            policy=policy,
            optimizers=ppo.make_optimizers(policy, cfg.ppo),
            generator=generator,
            td=td,
            buffer=make_rollout_buffer(example, cfg.ppo.rollout_length),
            episodes=EpisodeStats(device),
        )

    def step(self) -> IterationResult:
        """One iteration: a rollout of `ppo.rollout_length` steps, then the PPO update."""
        t0 = time.perf_counter()
        self.td = collect(self.env, self.policy, self.td, self.buffer)
        self.episodes.add(self.buffer)
        t1 = time.perf_counter()
        losses = ppo.update(
            self.policy, self.optimizers, self.buffer, self.cfg.ppo, generator=self.generator
        )
        t2 = time.perf_counter()
        self._check_finite(losses)
        self.iteration += 1
        self.frames += self.cfg.frames_per_iteration
        return IterationResult(self.iteration, self.frames, t1 - t0, t2 - t1, losses)

    def _check_finite(self, losses: dict[str, float]) -> None:
        if losses.get("nonfinite_updates", 0):
            self.nonfinite_streak += 1
        else:
            self.nonfinite_streak = 0
        if self.nonfinite_streak > self.cfg.ppo.max_nonfinite_updates:
            raise NonFiniteTraining(
                f"{self.nonfinite_streak} consecutive iterations had non-finite PPO losses "
                f"(ppo.max_nonfinite_updates = {self.cfg.ppo.max_nonfinite_updates})"
            )

    def evaluate(self) -> dict[str, Any]:
        """NavRL's evaluation on a separate env that shares the training map."""
        if self.eval_env is None:
            self.eval_env = make_eval_env(self.cfg, self.device)
        return evaluate(
            self.eval_env, self.policy, seed=self.cfg.eval.seed, max_steps=eval_steps(self.cfg)
        )


def make_eval_env(cfg: Config, device: str | torch.device) -> EnvBase:
    return make_env(
        cfg.env,
        device=device,
        seed=cfg.run.seed,
        num_envs=cfg.eval.num_envs,
        layout=cfg.eval.layout,
    )


def eval_steps(cfg: Config) -> int:
    return cfg.eval.max_steps or cfg.env.max_episode_length
