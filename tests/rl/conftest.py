"""Fixtures for the rl tests: NavRL's published checkpoint and synthetic rollout batches."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from navrl_daemon.rl.policy import NavRLPolicy

CHECKPOINT = Path(__file__).resolve().parents[1] / "data" / "navrl_checkpoint.pt"


@pytest.fixture(scope="session")
def navrl_state_dict() -> dict[str, torch.Tensor]:
    return torch.load(CHECKPOINT, weights_only=True, map_location="cpu")


@pytest.fixture
def navrl_policy(navrl_state_dict: dict[str, torch.Tensor]) -> NavRLPolicy:
    policy = NavRLPolicy()
    policy.load_state_dict(navrl_state_dict, strict=True)
    return policy


def random_observation(shape: tuple[int, ...], g: torch.Generator) -> TensorDict:
    """Observations with NavRL's shapes and roughly its value ranges."""
    return TensorDict(
        {
            "state": torch.randn(*shape, 8, generator=g),
            "lidar": 4.0 * torch.rand(*shape, 1, 36, 4, generator=g),
            "direction": torch.randn(*shape, 1, 3, generator=g) * torch.tensor([1.0, 1.0, 0.0]),
            "dynamic_obstacle": torch.randn(*shape, 1, 5, 10, generator=g),
        },
        batch_size=shape,
    )


def synthetic_batch(policy: NavRLPolicy, num_envs: int, steps: int, seed: int = 0) -> TensorDict:
    """A [N, T] batch laid out as the rollout collector writes it, with random obs/rewards."""
    g = torch.Generator().manual_seed(seed)
    shape = (num_envs, steps)
    td = TensorDict({"agents": {"observation": random_observation(shape, g)}}, batch_size=shape)
    with torch.no_grad():
        policy.act(td, deterministic=False)
    terminated = torch.rand(*shape, 1, generator=g) < 0.05
    truncated = (torch.rand(*shape, 1, generator=g) < 0.05) & ~terminated
    td["next"] = TensorDict(
        {
            "agents": {
                "observation": random_observation(shape, g),
                "reward": torch.randn(*shape, 1, generator=g),
            },
            "terminated": terminated,
            "truncated": truncated,
            "done": terminated | truncated,
        },
        batch_size=shape,
    )
    return td


@pytest.fixture
def make_batch() -> Callable[..., TensorDict]:
    return synthetic_batch
