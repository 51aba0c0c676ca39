"""The "isaac" backend: NavRL's own Isaac Sim `NavigationEnv` behind the env contract.

NOT exercised in this project's CI: Isaac Sim cannot be installed there. Only the
"not installed" path is tested. The build below follows NavRL's
isaac-training/training/scripts/train.py (commit 8d3ca96): compose NavRL's Hydra config,
start the SimulationApp, build `NavigationEnv(cfg)` and put OmniDrones' `VelController`
in front, so the env takes the world-frame velocity ("agents", "action") our policy emits.
docs/backends.md "Env backends and Isaac Sim" has the recipe and what is known to differ.

`env.options` for this backend:
  navrl_training_dir  path to NavRL's isaac-training/training (holds cfg/ and scripts/)
  headless            run Isaac Sim without a window (default true)
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, ValidationError
from torchrl.envs import EnvBase

from navrl_daemon.config import EnvConfig
from navrl_daemon.env.contract import Layout
from navrl_daemon.errors import ConfigError

INSTALL_HINT = (
    "env.backend = 'isaac' needs Isaac Sim and NavRL's OmniDrones in this Python "
    "environment: Isaac Sim 5.0/5.1 (the Python 3.11 releases), "
    "pip install 'isaacsim[all,extscache]==5.1.0' --extra-index-url https://pypi.nvidia.com, "
    "then pip install -e NavRL/isaac-training/third_party/OmniDrones hydra-core; see "
    "docs/backends.md 'Env backends and Isaac Sim'"
)
GRAVITY = 9.81


class IsaacOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    navrl_training_dir: str
    headless: bool = True


def make_isaac_env(
    cfg: EnvConfig,
    *,
    device: str | torch.device = "cuda",
    seed: int = 0,
    num_envs: int | None = None,
    layout: Layout = "train",
) -> EnvBase:
    needed = ("isaacsim", "omni_drones", "hydra")
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"{INSTALL_HINT} (not importable: {', '.join(missing)})")
    try:
        options = IsaacOptions.model_validate(cfg.options)
    except ValidationError as e:
        fields = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
        raise ConfigError(f"env.options (isaac backend): {fields}") from None
    training = Path(options.navrl_training_dir)
    if not (training / "scripts" / "env.py").is_file():
        raise ConfigError(
            f"env.options.navrl_training_dir = {str(training)!r}: no scripts/env.py there "
            "(expected NavRL's isaac-training/training)"
        )

    # Order matters as in NavRL's train.py: the SimulationApp starts before any omni import.
    from hydra import compose, initialize_config_dir
    from isaacsim import SimulationApp

    n = cfg.num_envs if num_envs is None else int(num_envs)
    with initialize_config_dir(config_dir=str(training / "cfg"), version_base=None):
        navrl_cfg = compose(
            "train",
            overrides=[
                f"headless={options.headless}",
                f"device={device}",
                f"seed={seed}",
                f"env.num_envs={n}",
                f"env.max_episode_length={cfg.max_episode_length}",
                f"env.num_obstacles={cfg.num_obstacles}",
                f"env_dyn.num_obstacles={cfg.num_dynamic_obstacles}",
                f"algo.actor.action_limit={cfg.action_limit}",
            ],
        )
    SimulationApp({"headless": navrl_cfg.headless, "anti_aliasing": 1})
    sys.path.insert(0, str(training / "scripts"))
    from env import NavigationEnv as IsaacNavigationEnv  # NavRL's scripts/env.py
    from omni_drones.controllers import LeePositionController
    from omni_drones.utils.torchrl.transforms import VelController
    from torchrl.envs.transforms import Compose, TransformedEnv

    base = IsaacNavigationEnv(navrl_cfg)
    controller = LeePositionController(GRAVITY, base.drone.params).to(device)
    env = TransformedEnv(base, Compose(VelController(controller, yaw_control=False)))
    env = env.eval() if layout == "navrl" else env.train()
    env.set_seed(seed)
    # PhysX on the GPU and NavRL's wall-clock obstacle placement: not reproducible.
    env.deterministic = False
    return env
