"""Behaviour cloning (offline objective "bc", and the auxiliary term of "ppo+bc").

Two policies, two losses, one step:

- `ImageJointPolicy`: the small image+joint encoder for the multimodal layout (DESIGN.md
  §6). One CNN shared by the three cameras (uint8 `[B, 3, 3, S, S]` in, scaled to [0, 1]
  here, so batches can stay uint8 until they reach the device), an MLP for the joint
  vector, an MLP head to the action. It predicts *normalised* actions
  (`(a - mean) / std`, the dataset's action statistics, computed once at load) and
  `act()` maps back.
- `mse_bc_loss`: mean squared error on normalised actions (a deterministic policy).
- `beta_bc_loss`: for the NavRL policy, the negative log-likelihood of recorded
  normalised actions under its Beta distribution; this is the term `ppo+bc` adds to the
  PPO loss with weight `offline.bc_coef`.
- `bc_step`: one gradient step of any such loss, with gradient clipping.

Pure compute: no files, no processes, no asyncio.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from tensordict import TensorDictBase
from torch.nn.utils import clip_grad_norm_

from navrl_daemon.rl.policy import NavRLPolicy

CAMERAS = 3
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
