"""What the pipeline needs from an env backend, as code (navrl-task §1, navrl-task §1.6-§1.10).

A backend is a factory `factory(cfg, *, device, seed, num_envs=None, layout="train")`
returning a TorchRL `EnvBase` that:

- has batch size [num_envs] (cfg.num_envs when None) and lives on `device`;
- declares in its specs, and emits, the keys of `REQUIRED` with the per-env shapes and
  dtypes given there: NavRL's observation ("agents", "observation", state | lidar |
  direction | dynamic_obstacle), the world-frame velocity action ("agents", "action"),
  the reward ("agents", "reward"), root done / terminated / truncated, and the
  per-episode ("stats", return | episode_len | reach_goal | collision | truncated);
- keeps `done = terminated | truncated` and truncates at cfg.max_episode_length steps;
- `stats.episode_len` counts the steps since the env's reset (0 in the reset output);
  reach_goal, collision and truncated are 0 or 1;
- resets only the envs flagged by `_reset` (TorchRL's auto-reset after a done step);
- builds the layouts "train" (the training spawn rule) and "navrl" (NavRL's eval crossing,
  which places every start and goal itself: it reads none of the spawn rule's keys,
  `spawn`, `goal_distance`, `crossing_share` and `spawn_height`);
- is deterministic under a seed: two envs built with the same config and seed give the
  same outputs for the same actions. A backend that cannot be (Isaac Sim's PhysX) sets
  the attribute `deterministic = False` (`Determinism`); the check is then skipped, not
  passed.

Optional capabilities are the protocols below; a backend has one by implementing it, and a
caller checks once with `isinstance(env, Protocol)`, taking the plain path otherwise:

- `ResumableEnv`, for exact resume: `state_dict_env()` and `load_state_dict_env(state)`;
  without it a resumed run restarts its episodes;
- `CapturableEnv`: a step on fixed tensors drawing from one generator, which a CUDA graph
  can hold (`rl/captured_rollout.py`); without it steps run op by op;
- `DensityLevels`: per-env density levels (`env.navigation.map_levels`), kept across a curriculum
  stage or a resume and reported as telemetry;
- `Determinism`: a backend that cannot be deterministic says so with
  `deterministic = False`, and the determinism check is skipped.
- `RecordableEnv`: where its drones, their goals and the moving obstacles are, and the
  scene they fly in, for recorded evaluations (`eval --plot/--video/--probe`, the
  report's paths, `log.video_interval`); without it those say the backend cannot.
- `ScriptedScene`: pillars and drones placed by the caller, for the probes that fly a
  scene of their own (`analysis/probes.py`: pillar_pass).

`check_specs` is the cheap part (declared specs only, no stepping) that `make_env` runs on
every build; `conformance.py` steps envs through all of the above.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import torch
from tensordict import TensorDictBase
from torch import Tensor
from torchrl.envs import EnvBase

from navrl_daemon.config import CollectPath, EnvConfig

NestedKey = tuple[str, ...]
# "train": the training spawn rule; "navrl": NavRL's deterministic eval crossing.
Layout = Literal["train", "navrl"]

OBS = ("agents", "observation")
ACTION_KEY = ("agents", "action")
REWARD_KEY = ("agents", "reward")
# The per-episode stats, in the order every stats tensor [N, 5] holds them.
STAT_KEYS = ("return", "episode_len", "reach_goal", "collision", "truncated")
DONE_KEYS = (("done",), ("terminated",), ("truncated",))
# The stats that are 0/1 flags (navrl-task §1.10).
STAT_FLAGS = ("reach_goal", "collision", "truncated")


class EnvFactory(Protocol):
    def __call__(
        self,
        cfg: EnvConfig,
        *,
        device: str | torch.device,
        seed: int,
        num_envs: int | None = None,
        layout: Layout = "train",
    ) -> EnvBase: ...


@runtime_checkable
class ResumableEnv(Protocol):
    """Exact resume: every piece of mutable state out and back in. The saved tensors belong
    to the caller: stepping the env must not change them (copies, or tensors the env no
    longer writes to); checkpoints keep them without copying again."""

    def state_dict_env(self) -> dict[str, Tensor]: ...

    def load_state_dict_env(self, state: dict[str, Tensor]) -> None: ...


@runtime_checkable
class CapturableEnv(Protocol):
    """A step a CUDA graph can hold: it reads and writes `state_tensors()` in place (steps,
    resets, reseeds and `load_state_dict_env` keep their storage), draws its random numbers
    from `generator` only, and auto-resets without a host read when `masked_reset` is set.
    `graph_objects()` are the other objects a captured step holds by identity (rebuilt
    ones, such as a new obstacle grid, need a new capture). `collect_path` is how its
    steps run (its config's `collect_path`, resolved for its device), `collect_fallback`
    whether a failed capture may go on op by op (the config asked for "auto")."""

    masked_reset: bool
    collect_path: CollectPath
    collect_fallback: bool

    @property
    def generator(self) -> torch.Generator: ...

    def state_tensors(self) -> dict[str, Tensor]: ...

    def graph_objects(self) -> tuple[object, ...]: ...


@runtime_checkable
class DensityLevels(Protocol):
    """Per-env density levels (`env.navigation.map_levels`): `level` [N] (long, updated in place),
    at least `min_level`; the share of envs at each level and the episodes ended there."""

    level: Tensor
    min_level: int

    def level_shares(self) -> list[float]: ...

    def level_outcomes(self) -> list[list[float]]: ...


@runtime_checkable
class Determinism(Protocol):
    """A backend that states whether it is deterministic under a seed (one that says
    nothing must be)."""

    deterministic: bool


@dataclass(frozen=True)
class Whereabouts:
    """Where everything is now, as the env holds it (a recorder copies what it keeps):
    drones [N, 3] and their goals [N, 3], and map 0's moving obstacles [D, 3], in m."""

    drones: Tensor
    goals: Tensor
    moving: Tensor


@dataclass(frozen=True)
class Scene:
    """What stays while an evaluation flies: the map each drone is on [N], map 0's moving
    obstacles' (width, width, height) [D, 3] and its pillars [B, 5] (x0, y0, x1, y1,
    height), the field's side in m and the number of maps."""

    map_id: Tensor
    moving_size: Tensor
    pillars: Tensor
    field_size: float
    num_maps: int


@runtime_checkable
class RecordableEnv(Protocol):
    """Paths a recorded evaluation can keep and a plot draw: `whereabouts()` after every
    step and reset, `scene()` once."""

    def whereabouts(self) -> Whereabouts: ...

    def scene(self) -> Scene: ...


@runtime_checkable
class ScriptedScene(Protocol):
    """A scene the caller lays out: `set_pillars` replaces the pillars (one [B, 5] tensor
    for every map, or one per map), `place_drones` starts the episodes of `env_ids` (all
    when None) at `start` [k, 3] facing `goal` [k, 3] and returns the observation of
    every env, as a reset does. `cfg` is the config the env was built from."""

    cfg: EnvConfig
    num_maps: int

    def set_pillars(self, boxes: Tensor | Sequence[Tensor]) -> None: ...

    def place_drones(
        self, start: Tensor, goal: Tensor, env_ids: Tensor | None = None
    ) -> TensorDictBase: ...


@dataclass(frozen=True)
class KeySpec:
    """One key of the contract: the per-env shape and dtype, and which spec declares it."""

    key: NestedKey
    shape: tuple[int, ...]
    dtype: torch.dtype
    spec: Literal["observation", "action", "reward", "done"]


REQUIRED: tuple[KeySpec, ...] = (
    KeySpec((*OBS, "state"), (8,), torch.float32, "observation"),
    KeySpec((*OBS, "lidar"), (1, 36, 4), torch.float32, "observation"),
    KeySpec((*OBS, "direction"), (1, 3), torch.float32, "observation"),
    KeySpec((*OBS, "dynamic_obstacle"), (1, 5, 10), torch.float32, "observation"),
    *(KeySpec(("stats", k), (1,), torch.float32, "observation") for k in STAT_KEYS),
    KeySpec(ACTION_KEY, (1, 3), torch.float32, "action"),
    KeySpec(REWARD_KEY, (1,), torch.float32, "reward"),
    *(KeySpec(k, (1,), torch.bool, "done") for k in DONE_KEYS),
)
# What reset and step outputs carry (the action is the caller's input, not an output).
OUTPUT_KEYS = tuple(k for k in REQUIRED if k.spec in ("observation", "done"))
STEP_KEYS = tuple(k for k in REQUIRED if k.spec != "action")


def step_record_bytes() -> int:
    """Bytes one env's step takes in a rollout buffer, at least: every key above, the
    observations twice (the step's own and the next one, as TorchRL records a step)."""
    total = 0
    for k in REQUIRED:
        size = math.prod(k.shape) * torch.empty((), dtype=k.dtype).element_size()
        total += size * (2 if k.spec == "observation" else 1)
    return total


@dataclass(frozen=True)
class Failure:
    """A named contract check that failed, and why."""

    check: str
    detail: str

    def __str__(self) -> str:
        return f"{self.check}: {self.detail}"


def show(key: NestedKey) -> str:
    return ".".join(key)


def check_specs(env: EnvBase, *, num_envs: int, device: torch.device | str) -> list[Failure]:
    """The declared side of the contract: batch, device, keys, shapes, dtypes. No stepping."""
    failures: list[Failure] = []
    n = int(num_envs)
    if tuple(env.batch_size) != (n,):
        failures.append(Failure("batch", f"batch size {tuple(env.batch_size)}, expected ({n},)"))
    if not _same_device(env.device, device):
        failures.append(Failure("device", f"env on {env.device}, expected {device}"))
    specs = {
        "observation": env.full_observation_spec,
        "action": env.full_action_spec,
        "reward": env.full_reward_spec,
        "done": env.full_done_spec,
    }
    for want in REQUIRED:
        try:
            spec = specs[want.spec][want.key]
        except KeyError:
            failures.append(Failure("keys", f"{show(want.key)} missing from the {want.spec} spec"))
            continue
        shape = (n, *want.shape)
        if tuple(spec.shape) != shape:
            failures.append(
                Failure("shapes", f"{show(want.key)} spec shape {tuple(spec.shape)}, need {shape}")
            )
        if spec.dtype != want.dtype:
            failures.append(
                Failure("dtypes", f"{show(want.key)} spec dtype {spec.dtype}, need {want.dtype}")
            )
    return failures


def check_output(
    td: object, keys: tuple[KeySpec, ...], *, num_envs: int, where: str
) -> list[Failure]:
    """The emitted side: `td` (a reset output or a step's "next") carries `keys` as specified."""
    failures: list[Failure] = []
    for want in keys:
        try:
            value = td[want.key]  # type: ignore[index]
        except KeyError:
            failures.append(Failure("keys", f"{where} output lacks {show(want.key)}"))
            continue
        shape = (num_envs, *want.shape)
        if tuple(value.shape) != shape:
            failures.append(
                Failure(
                    "shapes",
                    f"{where} output {show(want.key)} shape {tuple(value.shape)}, need {shape}",
                )
            )
        if value.dtype != want.dtype:
            failures.append(
                Failure(
                    "dtypes",
                    f"{where} output {show(want.key)} dtype {value.dtype}, need {want.dtype}",
                )
            )
    return failures


def _same_device(a: torch.device | str, b: torch.device | str) -> bool:
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    # "cuda" and "cuda:0" name the same device when the current device is 0.
    index = torch.cuda.current_device() if a.type == "cuda" and torch.cuda.is_available() else 0
    return (a.index if a.index is not None else index) == (
        b.index if b.index is not None else index
    )
