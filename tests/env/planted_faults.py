"""Backends with one planted contract fault each, built on the embedded env.

Each is a `module:factory` backend (env.backend = "tests.env.planted_faults:<name>") whose
specs agree with its outputs, so TorchRL's own spec checks would pass: only the contract
can tell. `FAULTS` maps each factory to the check that must report it.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torch import Tensor
from torchrl.data import Bounded

from navrl_daemon.config import EnvConfig
from navrl_daemon.env import NavigationEnv
from navrl_daemon.env.contract import OBS


class _WrongShape(NavigationEnv):
    """LiDAR with 3 vertical beams instead of 4."""

    def _observe(self, dyn_obs: Tensor) -> dict[str, Tensor]:
        obs = super()._observe(dyn_obs)
        obs["lidar"] = obs["lidar"][..., :3]
        return obs

    def _make_specs(self) -> None:
        super()._make_specs()
        lidar = Bounded(0.0, 4.0, (self.num_envs, 1, 36, 3), device=self.device)
        self.observation_spec[(*OBS, "lidar")] = lidar


class _MissingKey(NavigationEnv):
    """No `direction` observation."""

    def _observe(self, dyn_obs: Tensor) -> dict[str, Tensor]:
        obs = super()._observe(dyn_obs)
        del obs["direction"]
        return obs

    def _make_specs(self) -> None:
        super()._make_specs()
        del self.observation_spec[(*OBS, "direction")]


class _DoneNeverSet(NavigationEnv):
    """Episodes never end: done, terminated and truncated always false."""

    def _output(
        self, dyn_obs: Tensor, terminated: Tensor, truncated: Tensor, stats: Tensor
    ) -> TensorDictBase:
        never = torch.zeros_like(terminated)
        return super()._output(dyn_obs, never, never, stats)


class _Nondeterministic(NavigationEnv):
    """Ignores the seed for its spawns: draws them from a generator seeded by the OS."""

    def _set_seed(self, seed: int | None) -> None:
        self.generator.seed()


class _WrongDtype(NavigationEnv):
    """The state observation in float64."""

    def _observe(self, dyn_obs: Tensor) -> dict[str, Tensor]:
        obs = super()._observe(dyn_obs)
        obs["state"] = obs["state"].double()
        return obs

    def _make_specs(self) -> None:
        super()._make_specs()
        state = self.observation_spec[(*OBS, "state")]
        self.observation_spec[(*OBS, "state")] = state.to(torch.float64)


def _factory(cls: type[NavigationEnv]):
    def factory(
        cfg: EnvConfig,
        *,
        device: str | torch.device = "cpu",
        seed: int = 0,
        num_envs: int | None = None,
        layout: str = "train",
    ) -> NavigationEnv:
        return cls(cfg, device=device, seed=seed, num_envs=num_envs, layout=layout)  # type: ignore[arg-type]

    return factory


wrong_shape = _factory(_WrongShape)
missing_key = _factory(_MissingKey)
done_never_set = _factory(_DoneNeverSet)
nondeterministic = _factory(_Nondeterministic)
wrong_dtype = _factory(_WrongDtype)

# factory name -> the contract check that must name the fault
FAULTS = {
    "wrong_shape": "shapes",
    "missing_key": "keys",
    "done_never_set": "done",
    "nondeterministic": "determinism",
    "wrong_dtype": "dtypes",
}
