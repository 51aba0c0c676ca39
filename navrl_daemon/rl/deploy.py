"""The actor as a robot runs it: NavRL's four observation tensors in, the Beta-mean action
out. What `checkpoints export --format onnx|torch-export` writes (storage/deployment.py).

NavRL's ROS runners feed the policy ("agents", "observation") with the keys below and
command the world-frame velocity of the deterministic (Beta-mean) action; this module is
exactly that path of `NavRLPolicy.act(td, deterministic=True)`, with plain tensors for
inputs and outputs so that ONNX Runtime or libtorch can run it without tensordict.
"""

from __future__ import annotations

import torch
from torch import nn

from navrl_daemon.rl.policy import NavRLPolicy

# Input name → shape without the batch dim: NavRL's observation keys (the env's spec).
OBSERVATION_SHAPES: dict[str, tuple[int, ...]] = {
    # unit vector to the goal (3) and velocity (3) in the goal frame, horizontal and
    # vertical distance to the goal: [unit 3 | xy distance | z distance | velocity 3]
    "state": (8,),
    "lidar": (1, 36, 4),  # LiDAR range minus hit distance: 36 horizontal x 4 vertical beams
    "direction": (1, 3),  # goal − start with z = 0: the goal frame's heading
    "dynamic_obstacle": (1, 5, 10),  # the 5 nearest moving obstacles, 10 features each
}
OUTPUTS = ("action", "action_normalized")


class DeployedActor(nn.Module):
    """`forward(state, lidar, direction, dynamic_obstacle) -> (action, action_normalized)`:
    action [B,1,3] the world-frame velocity command (m/s), action_normalized [B,3] the
    Beta mean in (0,1)³ in the goal frame. Holds a copy of the policy whose LiDAR CNN runs
    torch's conv2d (what ONNX Runtime and libtorch run; rl/lidar_cnn.py)."""

    def __init__(self, policy: NavRLPolicy) -> None:
        super().__init__()
        native = NavRLPolicy(
            action_limit=policy.action_limit,
            separate_critic=policy.critic_extractor is not None,
            lidar_conv="native",
        )
        native.load_state_dict(policy.state_dict())
        self.policy = native.requires_grad_(False).eval()

    def forward(
        self,
        state: torch.Tensor,
        lidar: torch.Tensor,
        direction: torch.Tensor,
        dynamic_obstacle: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        feature = self.policy.features(state, lidar, dynamic_obstacle)
        alpha, beta = self.policy.beta_head(feature)
        action_normalized = alpha / (alpha + beta)  # the Beta mean, as dist.mean
        return self.policy.to_world(action_normalized, direction), action_normalized


def example_observation(
    batch: int = 2, generator: torch.Generator | None = None
) -> dict[str, torch.Tensor]:
    """Random inputs of the right shapes (export tracing, tests)."""
    return {
        name: torch.rand((batch, *shape), generator=generator)
        for name, shape in OBSERVATION_SHAPES.items()
    }
