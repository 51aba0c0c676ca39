"""The embedded NavRL navigation task (DESIGN §4): obstacles, LiDAR, flight model, TorchRL env."""

from __future__ import annotations

import torch

from navrl_daemon.config import EnvConfig
from navrl_daemon.env.navigation import Layout, NavigationEnv

__all__ = ["NavigationEnv", "make_env"]


def make_env(
    cfg: EnvConfig,
    *,
    device: str | torch.device = "cpu",
    seed: int = 0,
    num_envs: int | None = None,
    layout: Layout = "train",
) -> NavigationEnv:
    """Build the navigation env. `num_envs` overrides cfg.num_envs; `layout` "train" spawns
    per cfg.spawn, "navrl" is NavRL's deterministic crossing layout (SPEC §1.4)."""
    return NavigationEnv(cfg, device=device, seed=seed, num_envs=num_envs, layout=layout)
