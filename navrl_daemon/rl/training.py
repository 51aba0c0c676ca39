"""The compute of one training run, split the way the pipeline splits it. No I/O.

- `Collector`: the env, an acting copy of the policy, the env's running TensorDict and
  the per-episode stats; `collect(buffer)` fills one [N, T] rollout.
- `Learner`: the trained policy, its optimisers, the minibatch RNG, the policy version;
  `update(buffer)` runs the PPO update on one rollout.
- `Training`: both around one shared policy, stepped in turn. This is the core's bare
  loop: the plain `run` and the pipeline benchmark's baseline.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.envs import EnvBase

from navrl_daemon.config import Config, PPOConfig, UpdatePath
from navrl_daemon.env import check_backend, make_env
from navrl_daemon.env.contract import collect_path, step_record_bytes
from navrl_daemon.env.navigation import NavigationEnv
from navrl_daemon.rl import fast_update, ppo, schedules
from navrl_daemon.rl.captured_rollout import rollout_for
from navrl_daemon.rl.data_parallel import DataParallel
from navrl_daemon.rl.eval_config import eval_env_config, eval_steps
from navrl_daemon.rl.evaluate import Evaluation, Progress, Trajectories, evaluate_recorded
from navrl_daemon.rl.policy import NavRLPolicy
from navrl_daemon.rl.rollout import EpisodeStats, Rollout, collect, first_step, make_rollout_buffer

# Frames of the rollout the kl_adaptive schedule measures the KL on after each update.
KL_SAMPLE_ROWS = 1024


class NonFiniteTraining(RuntimeError):
    """Too many consecutive PPO updates produced non-finite losses."""


def make_policy(cfg: Config, device: torch.device | str) -> NavRLPolicy:
    return NavRLPolicy(
        action_limit=cfg.env.action_limit,
        gamma=cfg.ppo.gamma,
        lmbda=cfg.ppo.lmbda,
        separate_critic=cfg.ppo.separate_critic,
    ).to(device)


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
    # How rollouts run (`env.collect_path`): rollout.collect, or a CapturedRollout.
    rollout: Rollout = collect

    @classmethod
    def build(cls, cfg: Config, policy: NavRLPolicy, device: torch.device | str) -> Collector:
        device = torch.device(device)
        # The start-up gate: a backend that breaks the env contract is a ConfigError (78).
        check_backend(cfg.env, device=device, seed=cfg.run.seed)
        env = make_env(cfg.env, device=device, seed=cfg.run.seed)
        path = collect_path(cfg.env, device)
        rollout = rollout_for(path, device, fallback=cfg.env.collect_path == "auto")
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


@dataclass
class Learner:
    cfg: Config
    policy: NavRLPolicy
    optimizers: dict[str, torch.optim.Optimizer]
    generator: torch.Generator
    # The PPO update, its path (eager / fused / cuda_graph) resolved once when built
    # (rl/fast_update.py): ppo.update's options are the update's, not the learner's.
    ppo_update: fast_update.EagerUpdate | fast_update.FastUpdate = field(repr=False)
    # Data parallelism over torch.distributed ranks (None: this process alone); every
    # `distributed.check_interval` updates the ranks compare parameter checksums.
    reducer: DataParallel | None = None
    # Number of updates applied: the version of the weights in `policy`.
    version: int = 0
    nonfinite_streak: int = 0

    @classmethod
    def build(
        cls,
        cfg: Config,
        policy: NavRLPolicy,
        device: torch.device | str,
        *,
        reducer: DataParallel | None = None,
        minibatches: ppo.MinibatchSource = ppo.frame_minibatches,
        aux_loss: fast_update.AuxLoss | None = None,
    ) -> Learner:
        """The learner, complete: `minibatches` (NavRL's uniform frames, or env groups of
        a compressed copy: storage/compressed_rollout.py) and `aux_loss` (extra loss
        terms per minibatch: the BC term of "ppo+bc") go to its update, whose path is
        resolved here: ConfigError (exit 78) if `ppo.update_path` cannot run with them."""
        device = torch.device(device)
        generator = torch.Generator(device=device)
        generator.manual_seed(cfg.run.seed)
        optimizers = ppo.make_optimizers(policy, cfg.ppo)
        ppo_update = fast_update.build_update(
            cfg.ppo,
            policy,
            optimizers,
            device,
            reducer=reducer,
            aux_loss=aux_loss,
            minibatches=minibatches,
        )
        return cls(cfg, policy, optimizers, generator, ppo_update, reducer)

    @property
    def update_path(self) -> UpdatePath:
        return self.ppo_update.path

    def update(
        self,
        buffer: TensorDictBase,
        abort: threading.Event | None = None,
        release: Callable[[], None] | None = None,
    ) -> dict[str, float]:
        """PPO on one rollout. `abort` set → stop at the next minibatch boundary. `release`
        is called when `buffer` is no longer read, if that is before the update ends.

        The losses carry the actor's `lr` and the `entropy_coef` this update used, and
        what the update reports (compressed rollouts: ratio and seconds spent compressing
        and decoding).
        """
        ppo_cfg = self.apply_schedules()
        losses = self.ppo_update(buffer, ppo_cfg, self.generator, abort=abort, release=release)
        self._check_finite(losses)
        self.version += 1
        every = self.cfg.distributed.check_interval
        if self.reducer is not None and every and self.version % every == 0:
            self.reducer.check_same(self.policy)
        lr = self.optimizers["actor"].param_groups[0]["lr"]
        if ppo_cfg.lr_schedule == "kl_adaptive":
            losses["approx_kl"] = self._adapt_lr_to_kl(buffer)
        return {
            **losses,
            "lr": lr,
            "entropy_coef": ppo_cfg.entropy_coef,
            **self.ppo_update.report(),
        }

    def _adapt_lr_to_kl(self, buffer: TensorDictBase) -> float:
        """`ppo.lr_schedule = "kl_adaptive"`: measure how far this update moved the policy
        from the rollout's (every rank's mean) and set the next update's learning rates.
        They live in the optimisers' param groups, which checkpoints save, so a resumed
        run goes on with the same rates."""
        kl = ppo.approx_kl(self.policy, buffer, KL_SAMPLE_ROWS)
        if self.reducer is not None:
            kl = self.reducer.mean(kl.reshape(1))[0]
        kl_value = float(kl)
        cfg = self.cfg.ppo
        actor_lr = self.optimizers["actor"].param_groups[0]["lr"]
        scale = schedules.kl_adapted_lr(cfg, actor_lr, kl_value) / cfg.actor_lr
        for name, lr in ppo.learning_rates(cfg).items():
            for group in self.optimizers[name].param_groups:
                group["lr"] = lr * scale
        return kl_value

    @property
    def trained_frames(self) -> int:
        """Frames the applied updates trained on (every rank's): what schedules run on."""
        world = self.reducer.world_size if self.reducer is not None else 1
        return self.version * self.cfg.frames_per_iteration * world

    def apply_schedules(self) -> PPOConfig:
        """Set the optimisers' lrs for the next update; returns the PPO config it runs with.

        A pure function of `version` and the config, so a resumed learner continues the
        same schedule. Constant schedules (NavRL's) leave optimisers and config untouched.
        """
        ppo_cfg = self.cfg.ppo
        frames, span = self.trained_frames, ppo_cfg.schedule_frames
        if ppo_cfg.lr_schedule == "linear":  # kl_adaptive sets the rates after updates
            scale = schedules.lr_scale(ppo_cfg, frames, span)
            for name, lr in ppo.learning_rates(ppo_cfg).items():
                for group in self.optimizers[name].param_groups:
                    group["lr"] = lr * scale
        if ppo_cfg.entropy_schedule != "constant":
            coef = schedules.entropy_coef(ppo_cfg, frames, span)
            ppo_cfg = ppo_cfg.model_copy(update={"entropy_coef": coef})
        return ppo_cfg

    def weights(self) -> dict[str, torch.Tensor]:
        """A detached copy of the current weights, safe to hand to another thread."""
        return {k: v.detach().clone() for k, v in self.policy.state_dict().items()}

    def _check_finite(self, losses: dict[str, float]) -> None:
        if losses.get("nonfinite_updates", 0):
            self.nonfinite_streak += 1
        else:
            self.nonfinite_streak = 0
        limit = self.cfg.ppo.max_nonfinite_updates
        if self.nonfinite_streak > limit:
            raise NonFiniteTraining(
                f"{self.nonfinite_streak} consecutive iterations had non-finite PPO losses "
                f"(ppo.max_nonfinite_updates = {limit})"
            )


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


def acting_copy(policy: NavRLPolicy) -> NavRLPolicy:
    """A separate policy for collection or evaluation that weights are copied into."""
    clone = copy.deepcopy(policy)
    clone.requires_grad_(False)
    return clone


def make_eval_env(
    cfg: Config, device: str | torch.device, *, map_seed: int | None = None
) -> EnvBase:
    """The evaluation's env: the whole map (no density levels), `eval.num_maps` maps drawn
    from `map_seed` (default `eval.map_seed`; -1 there: run.seed, the training maps).

    An `eval.max_steps` above the env's `max_episode_length` lengthens the evaluation's
    episodes to it: a curriculum stage of short training episodes is still evaluated on
    NavRL's whole crossing (below it, the evaluation stops early, episodes unfinished)."""
    if map_seed is None:
        map_seed = cfg.eval.map_seed if cfg.eval.map_seed >= 0 else cfg.run.seed
    return make_env(
        eval_env_config(cfg),
        device=device,
        seed=map_seed,
        num_envs=cfg.eval.num_envs,
        layout=cfg.eval.layout,
    )


class Evaluations:
    """NavRL's evaluation (an `Evaluation`: captured where the env's steps are) on the eval
    section's maps and, with `eval.held_out_seed`, again on maps of that seed, reported as
    `held_out_<stat>`. Built once and called with each policy (one capture per env)."""

    def __init__(self, cfg: Config, device: str | torch.device) -> None:
        def on(env: EnvBase) -> Evaluation:
            return Evaluation.for_env(env, seed=cfg.eval.seed, max_steps=eval_steps(cfg))

        self.main = on(make_eval_env(cfg, device))
        held_out = cfg.eval.held_out_seed
        self.held_out = on(make_eval_env(cfg, device, map_seed=held_out)) if held_out >= 0 else None

    def __call__(self, policy: NavRLPolicy, *, progress: Progress | None = None) -> dict[str, Any]:
        return self._held_out(self.main(policy, progress), policy, progress)

    def recorded(
        self, policy: NavRLPolicy, *, progress: Progress | None = None
    ) -> tuple[dict[str, Any], Trajectories]:
        """The same evaluation with the main maps' paths recorded (`evaluate_recorded`: op
        by op, the same numbers), for a video. The embedded env only."""
        env = self.main.env
        if not isinstance(env, NavigationEnv):
            raise TypeError(f"a recorded evaluation needs the embedded env, not {type(env)}")
        main = self.main
        results, traj = evaluate_recorded(
            env, policy, seed=main.seed, max_steps=main.max_steps, progress=progress
        )
        return self._held_out(results, policy, progress), traj

    def _held_out(
        self, results: dict[str, Any], policy: NavRLPolicy, progress: Progress | None
    ) -> dict[str, Any]:
        """`results` and, with `eval.held_out_seed`, the held-out maps' as `held_out_<stat>`."""
        if self.held_out is not None:
            other = self.held_out(policy, progress)
            results.update({f"held_out_{k}": v for k, v in other.items()})
        return results
