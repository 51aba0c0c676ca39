"""Goal frame (navrl-task §1.5) against explicit rotation matrices."""

from __future__ import annotations

import math

import torch

from navrl_daemon.env.navigation.geometry import goal_to_world, world_to_goal, yaw_of


def rz(theta: float) -> torch.Tensor:
    c, s = math.cos(theta), math.sin(theta)
    return torch.tensor([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)


def test_goal_frame_matches_rotation_matrices():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(7, 3, generator=g, dtype=torch.float64)
    yaw = torch.rand(7, generator=g, dtype=torch.float64) * 6 - 3
    for i in range(7):
        r = rz(float(yaw[i]))
        torch.testing.assert_close(world_to_goal(v[i], yaw[i]), r.T @ v[i])
        torch.testing.assert_close(goal_to_world(v[i], yaw[i]), r @ v[i])
    torch.testing.assert_close(goal_to_world(world_to_goal(v, yaw), yaw), v)


def test_goal_direction_becomes_x_axis():
    d = torch.tensor([[-3.0, 4.0, 2.0]])
    yaw = yaw_of(d)
    assert math.isclose(float(yaw), math.atan2(4, -3), rel_tol=1e-6)
    flat = torch.tensor([[-3.0, 4.0, 0.0]])
    torch.testing.assert_close(world_to_goal(flat, yaw), torch.tensor([[5.0, 0.0, 0.0]]))


def test_broadcasts_over_obstacles():
    v = torch.randn(4, 5, 3)
    yaw = torch.randn(4)
    out = world_to_goal(v, yaw[:, None])
    for k in range(5):
        torch.testing.assert_close(out[:, k], world_to_goal(v[:, k], yaw))
