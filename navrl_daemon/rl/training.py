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

from navrl_daemon.config import Config, PPOConfig
from navrl_daemon.env import check_backend, make_env
from navrl_daemon.env.navigation import collect_path
from navrl_daemon.rl import fast_update, ppo, schedules
from navrl_daemon.rl.captured_rollout import rollout_for
from navrl_daemon.rl.data_parallel import DataParallel
from navrl_daemon.rl.evaluate import Evaluation
from navrl_daemon.rl.policy import NavRLPolicy
from navrl_daemon.rl.rollout import EpisodeStats, Rollout, collect, first_step, make_rollout_buffer


class NonFiniteTraining(RuntimeError):
    """Too many consecutive PPO updates produced non-finite losses."""


def make_policy(cfg: Config, device: torch.device | str) -> NavRLPolicy:
    return NavRLPolicy(
        action_limit=cfg.env.action_limit, gamma=cfg.ppo.gamma, lmbda=cfg.ppo.lmbda
    ).to(device)


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
    # Number of updates applied: the version of the weights in `policy`.
    version: int = 0
    nonfinite_streak: int = 0
    # Data parallelism over torch.distributed ranks (None: this process alone), and every
    # how many updates the ranks compare parameter checksums (0: never).
    reducer: DataParallel | None = None
    check_interval: int = 0
    # Extra loss terms per minibatch (ppo.update's `aux_loss`): the BC term of "ppo+bc".
    aux_loss: Callable[[NavRLPolicy], dict[str, torch.Tensor]] | None = None
    # How the batch is cut into minibatches: NavRL's uniform frames, or env groups decoded
    # from a compressed copy (`pipeline.compress_rollouts`, storage/compressed_rollout.py).
    minibatches: ppo.MinibatchSource = ppo.frame_minibatches
    # The fused/graph update (rl/fast_update.py), made when the path first resolves to
    # one (`update_path`); None: only the eager path has run.
    fast: fast_update.FastUpdate | None = field(default=None, repr=False)

    @classmethod
    def build(cls, cfg: Config, policy: NavRLPolicy, device: torch.device | str) -> Learner:
        generator = torch.Generator(device=device)
        generator.manual_seed(cfg.run.seed)
        return cls(cfg, policy, ppo.make_optimizers(policy, cfg.ppo), generator)

    def update(
        self,
        buffer: TensorDictBase,
        abort: threading.Event | None = None,
        release: Callable[[], None] | None = None,
    ) -> dict[str, float]:
        """PPO on one rollout. `abort` set → stop at the next minibatch boundary. `release`
        is called when `buffer` is no longer read, if that is before the update ends.

        The losses carry the actor's `lr` and the `entropy_coef` this update used, and
        what the minibatch source reports, if it has a `report()` (compressed rollouts:
        ratio and seconds spent compressing and decoding).
        """
        ppo_cfg = self.apply_schedules()
        if self.update_path() != "eager":
            assert self.fast is not None
            losses = self.fast(buffer, ppo_cfg, self.generator, abort=abort)
        else:
            losses = ppo.update(
                self.policy,
                self.optimizers,
                buffer,
                ppo_cfg,
                self.generator,
                abort=abort,
                reducer=self.reducer,
                aux_loss=self.aux_loss,
                minibatches=self.minibatches,
                release=release,
            )
        self._check_finite(losses)
        self.version += 1
        every = self.check_interval
        if self.reducer is not None and every and self.version % every == 0:
            self.reducer.check_same(self.policy)
        lr = self.optimizers["actor"].param_groups[0]["lr"]
        report = getattr(self.minibatches, "report", None)  # e.g. the compressed source's
        extra = report() if callable(report) else {}
        return {**losses, "lr": lr, "entropy_coef": ppo_cfg.entropy_coef, **extra}

    def update_path(self) -> fast_update.UpdatePath:
        """`ppo.update_path` resolved for this learner as it is wired now (ConfigError if
        it cannot run); resolved again at every update, since stages set the fields above
        after building the learner."""
        device = next(self.policy.parameters()).device
        path = fast_update.resolve(
            self.cfg.ppo.update_path, device, why_not=self._fast_unsupported()
        )
        if path != "eager" and (self.fast is None or self.fast.requested != path):
            self.fast = fast_update.FastUpdate(
                self.policy,
                self.optimizers,
                device,
                graphs=path == "cuda_graph",
                fallback=self.cfg.ppo.update_path == "auto",
            )
        return path

    def _fast_unsupported(self) -> str | None:
        if self.reducer is not None:
            return "data parallelism over ranks (distributed)"
        if self.aux_loss is not None:
            return "an extra loss term (offline.objective = 'ppo+bc')"
        if self.minibatches is not ppo.frame_minibatches:
            return "env-group minibatches (pipeline.compress_rollouts)"
        return None

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
        if ppo_cfg.lr_schedule != "constant":
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
    evaluation: Evaluation | None = field(default=None, repr=False)

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
        """NavRL's evaluation on a separate env that shares the training map."""
        if self.evaluation is None:
            self.evaluation = Evaluation.for_env(
                make_eval_env(self.cfg, self.device),
                seed=self.cfg.eval.seed,
                max_steps=eval_steps(self.cfg),
            )
        return self.evaluation(self.policy)


def acting_copy(policy: NavRLPolicy) -> NavRLPolicy:
    """A separate policy for collection or evaluation that weights are copied into."""
    clone = copy.deepcopy(policy)
    clone.requires_grad_(False)
    return clone


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
