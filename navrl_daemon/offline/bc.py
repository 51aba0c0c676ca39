"""Behaviour cloning (offline objective "bc", and the auxiliary term of "ppo+bc").

Two policies, two losses, one step:

- `ImageJointPolicy`: the small image+joint encoder for the multimodal layout (docs/design.md,
  design §6). One CNN shared by the three cameras (uint8 `[B, 3, 3, S, S]` in, scaled to [0, 1]
  here, so batches can stay uint8 until they reach the device), an MLP for the joint
  vector, an MLP head to the action. It predicts *normalised* actions
  (`(a - mean) / std`, the dataset's action statistics, computed once at load) and
  `act()` maps back.
- `mse_bc_loss`: mean squared error on normalised actions (a deterministic policy).
- `beta_bc_loss`: for the NavRL policy, the negative log-likelihood of recorded
  normalised actions under its Beta distribution; this is the term `ppo+bc` adds to the
  PPO loss with weight `offline.bc_coef`.
- `bc_step`: one gradient step of any such loss, with gradient clipping.
- `BCLearner`: the trained policy of a purely offline ("bc") run with its optimiser and
  step count; `step(batch)` is one gradient step, `state()` / `load()` what a checkpoint
  holds of it.

Pure compute: no files, no processes, no asyncio.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn as nn
import torch.nn.functional as F
from tensordict import TensorDictBase
from torch.nn.utils import clip_grad_norm_

from navrl_daemon.rl.policy import NavRLPolicy

CAMERAS = 3
# Where a rollout (archive) batch holds the recorded actions, normalised to (0, 1)³.
ACTION_KEY = ("agents", "action_normalized")
# Keeps Beta log-probs finite for recorded actions that sit on the (0, 1) boundary.
BETA_EPS = 1e-4


class ImageJointPolicy(nn.Module):
    """`images` uint8 `[B, 3 cameras, 3, S, S]` + `joint [B, J]` → normalised action `[B, A]`."""

    in_keys = ("images", "joint")
    out_keys = ("action",)

    def __init__(
        self,
        joint_dim: int,
        action_dim: int,
        action_mean: torch.Tensor,
        action_std: torch.Tensor,
        channels: int = 32,
        hidden: int = 128,
    ) -> None:
        super().__init__()
        self.camera = nn.Sequential(  # any S >= 16: strided convs, then a global average
            nn.Conv2d(3, channels // 2, kernel_size=5, stride=4, padding=2),
            nn.ReLU(),
            nn.Conv2d(channels // 2, channels, kernel_size=3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.joint = nn.Sequential(nn.Linear(joint_dim, hidden), nn.ReLU())
        self.head = nn.Sequential(
            nn.Linear(CAMERAS * channels + hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, action_dim),
        )
        self.register_buffer("action_mean", action_mean.float().clone())
        self.register_buffer("action_std", action_std.float().clone())

    def forward(self, images: torch.Tensor, joint: torch.Tensor) -> torch.Tensor:
        """The normalised action."""
        b = images.shape[0]
        x = images.reshape(b * CAMERAS, *images.shape[2:]).float() / 255.0
        per_camera = self.camera(x).reshape(b, -1)
        return self.head(torch.cat([per_camera, self.joint(joint.float())], dim=-1))

    def normalise(self, action: torch.Tensor) -> torch.Tensor:
        return (action - self.action_mean) / self.action_std

    def act(self, images: torch.Tensor, joint: torch.Tensor) -> torch.Tensor:
        """The action in the dataset's units."""
        return self.forward(images, joint) * self.action_std + self.action_mean


def mse_bc_loss(policy: ImageJointPolicy, batch: TensorDictBase) -> torch.Tensor:
    """MSE between predicted and recorded normalised actions of a prefetched batch."""
    predicted = policy(batch.get("images"), batch.get("joint"))
    return F.mse_loss(predicted, policy.normalise(batch.get("action")))


def beta_bc_loss(
    policy: NavRLPolicy, batch: TensorDictBase, action_key: tuple[str, ...]
) -> torch.Tensor:
    """Mean negative log-likelihood of the recorded normalised actions `batch[action_key]`
    (in (0, 1)³) under the NavRL policy's Beta distribution at the batch's observations."""
    dist = policy.distribution(policy.observe(batch))
    target = batch.get(action_key).clamp(BETA_EPS, 1.0 - BETA_EPS)
    return -dist.log_prob(target).mean()


def bc_step(
    loss_fn: Callable[[], torch.Tensor],
    parameters: list[nn.Parameter],
    optimizer: torch.optim.Optimizer,
    max_grad_norm: float,
) -> dict[str, float]:
    """One gradient step on `loss_fn()`; a non-finite loss skips the step."""
    loss = loss_fn()
    if not torch.isfinite(loss):
        return {"bc_loss": float(loss.detach()), "grad_norm": float("nan"), "skipped": 1.0}
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = clip_grad_norm_(parameters, max_grad_norm)
    optimizer.step()
    return {"bc_loss": float(loss.detach()), "grad_norm": float(grad_norm), "skipped": 0.0}


PolicyKind = Literal["navigation", "image_joint"]


class NonFiniteBC(RuntimeError):
    """Too many consecutive BC steps had a non-finite loss."""


@dataclass
class BCLearner:
    """The policy of a purely offline run, its Adam, and how many steps it has taken.

    `kind` says which policy and loss: "navigation" (NavRLPolicy, `beta_bc_loss` on
    rollout-archive batches) or "image_joint" (ImageJointPolicy, `mse_bc_loss` on
    multimodal batches). A step with a non-finite loss is skipped but counted; more than
    `max_nonfinite` in a row raise `NonFiniteBC`.
    """

    kind: PolicyKind
    policy: nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    max_grad_norm: float
    max_nonfinite: int
    steps: int = 0
    nonfinite_streak: int = 0
    _parameters: list[nn.Parameter] = field(default_factory=list, repr=False)

    @classmethod
    def build(
        cls,
        kind: PolicyKind,
        policy: nn.Module,
        *,
        lr: float,
        max_grad_norm: float,
        max_nonfinite: int,
        device: torch.device,
    ) -> BCLearner:
        optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
        return cls(kind, policy, optimizer, device, max_grad_norm, max_nonfinite)

    def loss(self, batch: TensorDictBase) -> torch.Tensor:
        if self.kind == "navigation":
            return beta_bc_loss(self.policy, batch, ACTION_KEY)  # type: ignore[arg-type]
        return mse_bc_loss(self.policy, batch)  # type: ignore[arg-type]

    def step(self, batch: TensorDictBase) -> dict[str, float]:
        """One gradient step on a batch (moved to the device first)."""
        if not self._parameters:
            self._parameters = list(self.policy.parameters())
        on_device = batch.to(self.device, non_blocking=True)
        stats = bc_step(
            lambda: self.loss(on_device), self._parameters, self.optimizer, self.max_grad_norm
        )
        self.steps += 1
        self.nonfinite_streak = self.nonfinite_streak + 1 if stats["skipped"] else 0
        if self.nonfinite_streak > self.max_nonfinite:
            raise NonFiniteBC(
                f"{self.nonfinite_streak} consecutive BC steps had a non-finite loss "
                f"(ppo.max_nonfinite_updates = {self.max_nonfinite})"
            )
        return stats

    def state(self) -> dict[str, Any]:
        """References, not copies (stage them before the next step). A navigation policy
        also goes under `learner.policy`, where `checkpoints export` and `eval` look."""
        offline: dict[str, Any] = {
            "kind": self.kind,
            "optimizer": self.optimizer.state_dict(),
            "steps": self.steps,
        }
        if self.kind == "navigation":
            return {"learner": {"policy": self.policy.state_dict()}, "offline": offline}
        return {"offline": {**offline, "policy": self.policy.state_dict()}}

    def load(self, state: dict[str, Any]) -> None:
        """The inverse of `state()`; KeyError/ValueError/RuntimeError when it does not fit.
        The learning rate comes from the config, not the file."""
        offline = state["offline"]
        if offline["kind"] != self.kind:
            raise ValueError(f"it trained a {offline['kind']} policy, this run a {self.kind} one")
        policy = state["learner"]["policy"] if self.kind == "navigation" else offline["policy"]
        self.policy.load_state_dict(policy)
        lrs = [group["lr"] for group in self.optimizer.param_groups]
        self.optimizer.load_state_dict(offline["optimizer"])
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        self.steps = int(offline["steps"])
        self.nonfinite_streak = 0
