"""Env backends for the pipeline (navrl-task §1).

The embedded NavRL navigation task (obstacles, LiDAR, flight model, TorchRL env) is the
"navigation" backend; `backends.py` resolves the others by name, `contract.py` states
what every backend must provide and `conformance.py` checks it.
"""

from __future__ import annotations

import torch
from torchrl.envs import EnvBase

from navrl_daemon.config import EnvConfig
from navrl_daemon.env.backends import backend_of, check_backend
from navrl_daemon.env.contract import Layout, check_specs
from navrl_daemon.env.navigation import NavigationEnv
from navrl_daemon.errors import ConfigError

__all__ = ["NavigationEnv", "check_backend", "make_env"]


def make_env(
    cfg: EnvConfig,
    *,
    device: str | torch.device = "cpu",
    seed: int = 0,
    num_envs: int | None = None,
    layout: Layout = "train",
) -> EnvBase:
    """Build an env of the backend `cfg.backend`. `num_envs` overrides cfg.num_envs;
    `layout` "train" spawns per the training rule, "navrl" is NavRL's deterministic
    crossing layout (navrl-task §1.4).

    The declared specs are checked against the contract on every build (cheap: no
    stepping), and the config against what the backend supports; a mismatch is a
    ConfigError naming the backend and the check.
    `check_backend` runs the whole conformance suite, once, at start-up.
    """
    factory = backend_of(cfg).load()
    env = factory(cfg, device=device, seed=seed, num_envs=num_envs, layout=layout)
    n = cfg.num_envs if num_envs is None else int(num_envs)
    if not isinstance(env, EnvBase):
        raise ConfigError(
            f"env.backend = {cfg.backend!r}: build: the factory returned "
            f"{type(env).__name__}, not a TorchRL EnvBase"
        )
    failures = check_specs(env, num_envs=n, device=device)
    if failures:
        lines = "\n  ".join(str(f) for f in failures)
        raise ConfigError(f"env.backend = {cfg.backend!r} fails the env contract:\n  {lines}")
    return env
