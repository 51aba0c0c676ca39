"""NavRL's goal frame (navrl-task §1.5): a yaw-only frame whose x axis points at the goal.

Observations, the action and the LiDAR all live in this frame. With d the start→goal vector
with its z set to 0 and θ = atan2(d_y, d_x), a world vector v is expressed in the goal frame
as R_z(θ)ᵀ v, and a goal-frame vector goes back to the world as R_z(θ) v. Yaw tensors
broadcast against the vectors' leading dimensions (`yaw[..., None]` against `v[..., :]`).
"""

from __future__ import annotations

import torch
from torch import Tensor


def yaw_of(direction: Tensor) -> Tensor:
    """Yaw [...] of direction vectors [..., 3] (or [..., 2]); only x and y count."""
    return torch.atan2(direction[..., 1], direction[..., 0])


def world_to_goal(v: Tensor, yaw: Tensor) -> Tensor:
    """Express world vectors v [..., 3] in the goal frame of the given yaw: R_z(yaw)ᵀ v."""
    c, s = torch.cos(yaw), torch.sin(yaw)
    x, y = v[..., 0], v[..., 1]
    return torch.stack((c * x + s * y, -s * x + c * y, v[..., 2]), dim=-1)


def goal_to_world(v: Tensor, yaw: Tensor) -> Tensor:
    """Inverse of `world_to_goal`: R_z(yaw) v for goal-frame vectors v [..., 3]."""
    c, s = torch.cos(yaw), torch.sin(yaw)
    x, y = v[..., 0], v[..., 1]
    return torch.stack((c * x - s * y, s * x + c * y, v[..., 2]), dim=-1)
