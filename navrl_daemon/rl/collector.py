"""The collecting half of training: the env, an acting copy of the policy, the env's running
TensorDict and the per-episode stats; `Collector.collect(buffer)` fills one [N, T] rollout.
No I/O."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.envs import EnvBase

from navrl_daemon.config import Config
from navrl_daemon.env import check_backend, make_env
from navrl_daemon.env.contract import ResumableEnv, step_record_bytes
from navrl_daemon.rl.captured_rollout import rollout_for
from navrl_daemon.rl.policy import NavRLPolicy
from navrl_daemon.rl.rollout import EpisodeStats, Rollout, collect, first_step, make_rollout_buffer
from navrl_daemon.rl.snapshot import flatten, restore_rng, rng_state


def rollout_memory(cfg: Config) -> tuple[int, str]:
    """Bytes the rollout buffers take at least (the env contract's keys, every lease of the
    pool), and how that number is made."""
    per_step = step_record_bytes()
    need = cfg.pipeline.lease_pool * cfg.ppo.rollout_length * cfg.env.num_envs * per_step
    how = (
        f"the rollout buffers (pipeline.lease_pool = {cfg.pipeline.lease_pool} x "
        f"ppo.rollout_length = {cfg.ppo.rollout_length} x env.num_envs = {cfg.env.num_envs} "
        f"x {per_step} bytes per env and step)"
    )
    return need, how


@dataclass
class Collector:
    cfg: Config
    env: EnvBase
    policy: NavRLPolicy
    td: TensorDictBase
    episodes: EpisodeStats
    # Where actions are drawn from: the collector's own generator, never torch's default
    # one, which every CUDA graph capture (the trainer's, in its own thread) registers; a
    # draw from it during a capture fails. Built as a copy of the default generator of the
    # device, so a run seeded as before samples the same actions as before.
    sampler: torch.Generator = field(default_factory=torch.Generator)
    # How rollouts run (the env's `collect_path`): rollout.collect, or a CapturedRollout.
    rollout: Rollout = collect

    @classmethod
    def build(cls, cfg: Config, policy: NavRLPolicy, device: torch.device | str) -> Collector:
        device = torch.device(device)
        # The start-up gate: a backend that breaks the env contract is a ConfigError (78).
        check_backend(cfg.env, device=device, seed=cfg.run.seed)
        env = make_env(cfg.env, device=device, seed=cfg.run.seed)
        rollout = rollout_for(env)
        return cls(cfg, env, policy, env.reset(), EpisodeStats(device), sampler(device), rollout)

    def new_buffer(self) -> TensorDict:
        """A zeroed rollout buffer. Takes one throwaway step to learn the layout, then resets."""
        example = first_step(self.env, self.policy, self.td, self.sampler)
        self.td = self.env.reset()
        return make_rollout_buffer(example, self.cfg.ppo.rollout_length)

    def collect(self, buffer: TensorDictBase) -> float:
        """Fill `buffer` with the next rollout; returns the seconds it took."""
        t0 = time.perf_counter()
        self.td = self.rollout(self.env, self.policy, self.td, buffer, self.sampler)
        self.episodes.add(buffer)
        return time.perf_counter() - t0

    def state_dict(self) -> dict[str, Any] | None:
        """The env's `state_dict_env`, the running TensorDict the next rollout starts
        from, the action generator and the process RNGs: copies on the CPU (collecting
        goes on into the originals). None for an env backend that cannot save its state
        (a resume then starts new episodes)."""
        if not isinstance(self.env, ResumableEnv):
            return None
        env_state = self.env.state_dict_env()
        return {
            # Already the env's own copies (the contract; conformance's replay-after-load
            # check fails a backend whose saved tensors change as it steps): host only.
            "env": {k: v.detach().cpu() for k, v in env_state.items()},
            "td": flatten(self.td),
            "sampler": self.sampler.get_state(),
            "rng": rng_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Raises ValueError (leaving the collector as it was) when the env does not match."""
        env = self.env
        if not isinstance(env, ResumableEnv):
            raise ValueError(f"{type(env).__name__} is no ResumableEnv: it cannot load env state")
        current = self.td
        stored = state["td"]
        missing = sorted(set(flatten(current)) - set(stored))
        if missing:
            raise ValueError(f"env keys {missing} are not in the saved state")
        td = TensorDict({}, batch_size=current.batch_size, device=current.device)
        for key, value in stored.items():
            path = tuple(key.split("/"))
            if path in current.keys(include_nested=True) and current.get(path).shape != value.shape:
                raise ValueError(f"env key {key}: saved shape {tuple(value.shape)} differs")
            td.set(path, value.to(current.device))
        env.load_state_dict_env(state["env"])
        self.td = td
        # No episode counts: the episodes the checkpoint's rollout ended are in its
        # iteration's history row, and counting them again would report them twice.
        restore_rng(state["rng"])
        # A snapshot of another device kind (a CUDA run resumed on a CPU) cannot set it:
        # the generator then goes on as built.
        with contextlib.suppress(RuntimeError):
            self.sampler.set_state(state["sampler"].cpu())

    @property
    def capture_error(self) -> str | None:
        """Why a captured rollout fell back to eager steps, if it did (`auto`)."""
        return getattr(self.rollout, "capture_error", None)


def sampler(device: torch.device) -> torch.Generator:
    """A generator of `device` starting where the device's default generator stands."""
    state = torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()
    generator = torch.Generator(device=device)
    generator.set_state(state)
    return generator
