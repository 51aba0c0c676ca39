"""The learning half of training: the trained policy, its optimisers, the minibatch RNG and
the policy version; `Learner.update(buffer)` runs the PPO update on one rollout. No I/O."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDictBase

from navrl_daemon.config import Config, PPOConfig, UpdatePath
from navrl_daemon.rl import fast_update, ppo, schedules
from navrl_daemon.rl.data_parallel import DataParallel
from navrl_daemon.rl.policy import NavRLPolicy
from navrl_daemon.rl.snapshot import saved_optimizer

# Frames of the rollout the kl_adaptive schedule measures the KL on after each update.
KL_SAMPLE_ROWS = 1024


class NonFiniteTraining(RuntimeError):
    """Too many consecutive PPO updates produced non-finite losses."""


@dataclass
class Learner:
    cfg: Config
    policy: NavRLPolicy
    optimizers: dict[str, torch.optim.Optimizer]
    generator: torch.Generator
    # The fused or CUDA-graph update, its path resolved once when built (rl/fast_update.py);
    # None: the eager path, ppo.update with the options below.
    fast: fast_update.FastUpdate | None = field(repr=False)
    # Data parallelism over torch.distributed ranks (None: this process alone); every
    # `distributed.check_interval` updates the ranks compare parameter checksums.
    reducer: DataParallel | None = None
    # ppo.update's minibatch source and extra loss terms (offline "ppo+bc").
    minibatches: ppo.MinibatchSource = field(default=ppo.frame_minibatches, repr=False)
    aux_loss: ppo.AuxLoss | None = field(default=None, repr=False)
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
        fast = fast_update.build_update(
            cfg.ppo,
            policy,
            optimizers,
            device,
            reducer=reducer,
            aux_loss=aux_loss,
            minibatches=minibatches,
        )
        return cls(cfg, policy, optimizers, generator, fast, reducer, minibatches, aux_loss)

    @property
    def update_path(self) -> UpdatePath:
        return "eager" if self.fast is None else self.fast.path

    @property
    def capture_error(self) -> str | None:
        """Why a CUDA graph capture failed, where "auto" went on fused (None otherwise)."""
        return None if self.fast is None else self.fast.capture_error

    def update(
        self,
        buffer: TensorDictBase,
        abort: threading.Event | None = None,
        release: Callable[[], None] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> dict[str, float]:
        """PPO on one rollout. `abort` set → stop at the next minibatch boundary. `release`
        is called when `buffer` is no longer read, if that is before the update ends;
        `progress(done, total)` as minibatch steps are done.

        The losses carry the actor's `lr` and the `entropy_coef` this update used, and
        what the update reports (compressed rollouts: ratio and seconds spent compressing
        and decoding).
        """
        ppo_cfg = self.apply_schedules()
        if self.fast is not None:
            losses = self.fast(buffer, ppo_cfg, self.generator, abort, release, progress)
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
                progress=progress,
            )
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
            **self._source_report(),
        }

    def _source_report(self) -> dict[str, float]:
        """What the minibatch source reports, if it has a `report()` (compressed rollouts:
        ratio and seconds spent compressing and decoding)."""
        report = getattr(self.minibatches, "report", None)
        return report() if callable(report) else {}

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

    def state_dict(self) -> dict[str, Any]:
        """Policy (with its ValueNorm), every optimiser, the minibatch RNG, the policy
        version and the non-finite streak. References, not copies: stage them
        (storage/staging.py) before the next update."""
        return {
            "policy": self.policy.state_dict(),
            "optimizers": {k: opt.state_dict() for k, opt in self.optimizers.items()},
            "generator": self.generator.get_state(),
            "version": self.version,
            "nonfinite_streak": self.nonfinite_streak,
        }

    def load_state_dict(self, state: Mapping[str, Any], *, counters: bool = True) -> None:
        """Load policy, optimisers and minibatch RNG; `counters=False` keeps the version (a
        rollback continues numbering versions forward). Learning rates come from the
        config, not the file: a user who changes `ppo.actor_lr` and restarts gets the new
        one; except under `ppo.lr_schedule = "kl_adaptive"`, where the adapted rates are
        the run's state and go on from the file's."""
        self.policy.load_state_dict(state["policy"])
        lrs = ppo.learning_rates(self.cfg.ppo)
        adapted = self.cfg.ppo.lr_schedule == "kl_adaptive"
        for name, opt in self.optimizers.items():
            saved = saved_optimizer(state, name)
            if saved is None:  # a new own critic: fresh moments, at the critic's rate
                opt.state.clear()  # (a rollback to such a file drops the ones trained since)
                for group in opt.param_groups:
                    group["lr"] = self.optimizers["critic"].param_groups[0]["lr"]
                continue
            opt.load_state_dict(saved)
            for group in opt.param_groups if not adapted else ():
                group["lr"] = lrs[name]
        self.generator.set_state(state["generator"].cpu())
        if counters:
            self.version = int(state["version"])
        self.nonfinite_streak = 0

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
