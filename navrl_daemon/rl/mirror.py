"""The task's left-right mirror in the goal frame (`ppo.mirror`).

Every observation and action of NavRL's task is expressed in the goal frame: x towards the
goal, y to its left, z up; the LiDAR's column i looks 10·i° to the left of the goal
direction. Reflecting the world in the vertical plane through the drone along the goal
direction maps a flight to another flight of the same task: the reflected pillar field is
as likely as the real one, the dynamics and every reward term are unchanged by it, and in
the goal frame the reflection is only

- state [r̂ (3), d_xy, d_z, v (3)]: r̂_y and v_y change sign;
- LiDAR [.., 36, 4]: column i becomes column (36 − i) mod 36 (10·i° left becomes right);
- moving obstacles [.., 10] = [r̂ (3), d_xy, d_z, v (3), width, height]: r̂_y and v_y
  change sign (empty slots stay zeros);
- action a ∈ (0, 1)³, the velocity (2a − 1)·L: a_y becomes 1 − a_y.

So each collected step is also a step of the reflected task with the same reward, value
and advantage. The mirror is its own inverse, and it keeps volumes in the action space, so
the density of the reflected action under the reflected behaviour policy is the original's.
"""

from __future__ import annotations

import torch
from torch import Tensor

# The features whose sign the mirror flips (the y components), by position.
STATE_Y = (1, 6)  # r̂_y, v_y
DYNAMIC_Y = (1, 6)  # r̂_y, v_y of each obstacle
ACTION_Y = 1

# Plain slicing only, no constant tensors: a host-to-device copy cannot run inside a
# captured CUDA graph (ppo.update_path = "cuda_graph" captures these in the update).


def _negate(x: Tensor, columns: tuple[int, ...]) -> Tensor:
    out = x.clone()
    for c in columns:
        out[..., c] = -x[..., c]
    return out


def mirror_state(state: Tensor) -> Tensor:
    """[.., 8] state features of the reflected flight."""
    return _negate(state, STATE_Y)


def mirror_lidar(lidar: Tensor) -> Tensor:
    """[.., 36, 4] LiDAR image (columns × elevations) of the reflected flight: column i
    reads column (36 − i) mod 36, i.e. the order 0, 35, 34, ..., 1."""
    return torch.cat((lidar[..., :1, :], lidar[..., 1:, :].flip(-2)), -2)


def mirror_dynamic(dynamic: Tensor) -> Tensor:
    """[.., 10] moving-obstacle features of the reflected flight."""
    return _negate(dynamic, DYNAMIC_Y)


def mirror_action(action: Tensor) -> Tensor:
    """[.., 3] normalised action in (0, 1) of the reflected flight: a_y → 1 − a_y."""
    out = action.clone()
    out[..., ACTION_Y] = 1.0 - action[..., ACTION_Y]
    return out


def with_mirror(
    state: Tensor, lidar: Tensor, dynamic: Tensor, action: Tensor, *shared: Tensor
) -> tuple[Tensor, ...]:
    """A flat minibatch of B rows and its reflection, 2B rows: the observations and actions
    reflected, every tensor of `shared` (advantage, behaviour log-prob, value, target)
    repeated as it is, in the same order as the arguments."""
    doubled = (
        torch.cat((state, mirror_state(state))),
        torch.cat((lidar, mirror_lidar(lidar))),
        torch.cat((dynamic, mirror_dynamic(dynamic))),
        torch.cat((action, mirror_action(action))),
    )
    return (*doubled, *(torch.cat((t, t)) for t in shared))
