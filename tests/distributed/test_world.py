"""The launcher's environment, and which env state a rank resumes with."""

from __future__ import annotations

import pytest
import torch

from navrl_daemon.errors import ConfigError
from navrl_daemon.pipeline.coordinator import collector_for_rank
from navrl_daemon.rl.data_parallel import checksum
from navrl_daemon.rl.policy import NavRLPolicy
from navrl_daemon.runtime.distributed import World


def test_no_launcher_or_one_rank_is_the_plain_daemon() -> None:
    assert World.from_environ({}) == World()
    one = World.from_environ({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"})
    assert not one.distributed and one.leader


def test_torchrun_variables_are_read() -> None:
    env = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    world = World.from_environ(env)
    assert (world.rank, world.local_rank, world.world_size, world.local_world_size) == (3, 1, 4, 2)
    assert world.distributed and not world.leader
    assert world.device("cuda") == torch.device("cuda", 1)
    assert world.device("cpu") == torch.device("cpu")


@pytest.mark.parametrize(
    "env",
    [
        {"WORLD_SIZE": "two", "RANK": "0"},
        {"WORLD_SIZE": "2", "RANK": "2"},
        {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "-1"},
    ],
)
def test_a_broken_launcher_environment_is_a_config_error(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="launcher environment"):
        World.from_environ(env)


def test_each_rank_resumes_its_own_env_state_only_in_the_same_world() -> None:
    saved = {"rng": "r0", "peers": [{"rng": "r1"}, {"rng": "r2"}], "world_size": 3}
    assert collector_for_rank(saved, World(0, 0, 3, 3))["rng"] == "r0"
    assert collector_for_rank(saved, World(2, 2, 3, 3)) == {"rng": "r2"}
    assert collector_for_rank(saved, World(1, 1, 2, 2)) is None  # re-seeded
    assert collector_for_rank(saved, World()) is None
    single = {"rng": "only"}  # a checkpoint of a plain run
    assert collector_for_rank(single, World()) is single
    assert collector_for_rank(single, World(0, 0, 2, 2)) is None
    assert collector_for_rank(None, World()) is None


def test_checksum_sees_any_change_and_swaps() -> None:
    policy = NavRLPolicy()
    before = checksum(policy)
    assert torch.equal(before, checksum(policy))
    with torch.no_grad():
        w = policy.actor.parameters().__next__().view(-1)
        w[0], w[1] = w[1].item(), w[0].item()  # same sum, different place
    after = checksum(policy)
    assert after[0] == pytest.approx(before[0].item(), rel=1e-12)
    assert not torch.equal(before, after)
