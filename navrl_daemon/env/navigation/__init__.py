"""The navigation backend: NavRL's task, embedded and torch-vectorised (env.backend =
"navigation", the default).

- `env.py`: `NavigationEnv`, the TorchRL environment (observation, reward, resets, stats);
- `dynamics.py`: the point-mass flight model; `geometry.py`: goal-frame rotations;
- `lidar.py`: the LiDAR cast against pillars and moving obstacles;
- `obstacles.py`: the static pillar maps and the dynamic obstacles.

What any backend must provide (keys, layouts, collect paths, optional capabilities) is
env/contract.py's, not this package's.
"""

from navrl_daemon.env.navigation.env import (
    COLLISION_DISTANCE,
    REACH_RADIUS,
    Z_MAX,
    Z_MIN,
    NavigationEnv,
)

__all__ = ["COLLISION_DISTANCE", "REACH_RADIUS", "Z_MAX", "Z_MIN", "NavigationEnv"]
