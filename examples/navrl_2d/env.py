"""A second backend, written the way a plug-in author would: a standalone TorchRL env.

The world of NavRL's CPU quick demos: drones fly in a horizontal plane at a fixed altitude
through a field of round pillars (infinitely tall cylinders), shared by all envs and drawn
from the seed. It differs from the embedded task in its flight model: the z command is
ignored (altitude hold) and the horizontal velocity tracks the command as an exact
first-order lag (time constant env.velocity_time_constant), with no thrust limit. There are
no dynamic obstacles.

It emits NavRL's observation layout unchanged (that is what the policy reads), with every
vertical component 0: state [8] (goal-frame unit vector to the goal, horizontal distance,
height difference 0, goal-frame velocity), lidar [1,36,4] (4 m - hit distance, beams 10°
apart from the goal heading at elevations -10, 0, 10, 20°; the ground counts for the -10°
beams), direction [1,3], dynamic_obstacle [1,5,10] (zeros). The reward is NavRL's without
the dynamic, smoothness and height terms: velocity towards the goal + 1 + mean log of the
beam distances. A drone whose centre comes within 0.3 m of a pillar has collided
(terminated); episodes are truncated at env.max_episode_length steps.

Config used: num_envs, field_size, num_obstacles, max_episode_length, goal_distance,
spawn_margin, action_limit, dt, velocity_time_constant. `env.options`: see PlanarOptions.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tensordict import TensorDict, TensorDictBase
from torch import Tensor
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

from navrl_daemon.config import EnvConfig
from navrl_daemon.errors import ConfigError

LIDAR_RANGE = 4.0
BEAMS = 36
ELEVATIONS_DEG = (-10.0, 0.0, 10.0, 20.0)
COLLISION_DISTANCE = 0.3
REACH_RADIUS = 0.5
SPAWN_CLEARANCE = 0.6
SPAWN_TRIES = 16
STAT_KEYS = ("return", "episode_len", "reach_goal", "collision", "truncated")
_STATE = ("pos", "vel", "start", "goal", "yaw", "step_count")


class PlanarOptions(BaseModel):
    """`env.options` of this backend."""

    model_config = ConfigDict(extra="forbid", strict=True)
    # Flight height (m); below 0.69 m the -10° beams see the ground within 4 m.
    altitude: Annotated[float, Field(gt=0.0, le=10.0)] = 1.5
    # Pillar radii are drawn uniformly from [min, max] (m).
    pillar_radius: Annotated[list[float], Field(min_length=2, max_length=2)] = [0.2, 0.6]


def make_env(
    cfg: EnvConfig,
    *,
    device: str | torch.device = "cpu",
    seed: int = 0,
    num_envs: int | None = None,
    layout: Literal["train", "navrl"] = "train",
) -> Planar2DEnv:
    """The backend factory: validates `env.options`, then builds the env."""
    try:
        options = PlanarOptions.model_validate(cfg.options)
    except ValidationError as e:
        fields = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
        raise ConfigError(f"env.options (navrl-2d backend): {fields}") from None
    lo, hi = options.pillar_radius
    if not 0 < lo <= hi:
        raise ConfigError(f"env.options.pillar_radius: need 0 < min <= max, got [{lo}, {hi}]")
    n = cfg.num_envs if num_envs is None else int(num_envs)
    return Planar2DEnv(cfg, options, device=device, seed=seed, num_envs=n, layout=layout)


class Planar2DEnv(EnvBase):
    def __init__(
        self,
        cfg: EnvConfig,
        options: PlanarOptions,
        *,
        device: str | torch.device,
        seed: int,
        num_envs: int,
        layout: Literal["train", "navrl"],
    ) -> None:
        super().__init__(device=device, batch_size=torch.Size([num_envs]))
        self.cfg, self.options, self.layout, self.n = cfg, options, layout, num_envs
        world = torch.Generator().manual_seed(seed)
        half, (r_lo, r_hi) = cfg.field_size / 2, options.pillar_radius
        m = cfg.num_obstacles
        centres = (torch.rand(m, 2, generator=world) * 2 - 1) * half
        radii = r_lo + (r_hi - r_lo) * torch.rand(m, generator=world)
        self.pillars = torch.cat((centres, radii[:, None]), -1).to(self.device)  # [M, 3]
        self._gen = torch.Generator(device=self.device).manual_seed(seed)
        elevation = torch.tensor(ELEVATIONS_DEG, device=self.device) * math.pi / 180
        self._beam_scale = 1 / torch.cos(elevation)  # horizontal distance -> along the beam
        ground = options.altitude / torch.sin(-elevation).clamp_min(1e-9)
        self._ground = torch.where(elevation < 0, ground, math.inf)
        z = torch.zeros(num_envs, 2, device=self.device)
        self.pos, self.vel, self.start, self.goal = z, z.clone(), z.clone(), z.clone()
        self.goal[:, 0] = 1.0
        self.yaw = torch.zeros(num_envs, device=self.device)
        self.step_count = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self._stats = {k: torch.zeros(num_envs, device=self.device) for k in STAT_KEYS}
        self._make_specs()

    # ---------------------------------------------------------------- exact resume (optional)

    def state_dict_env(self) -> dict[str, Tensor]:
        state = {k: getattr(self, k).clone() for k in _STATE}
        state.update({f"stats.{k}": v.clone() for k, v in self._stats.items()})
        state["generator"] = self._gen.get_state()
        return state

    def load_state_dict_env(self, state: dict[str, Tensor]) -> None:
        for k in _STATE:
            setattr(self, k, state[k].to(self.device).clone())
        self._stats = {k: state[f"stats.{k}"].to(self.device).clone() for k in STAT_KEYS}
        self._gen.set_state(state["generator"].cpu())

    # ---------------------------------------------------------------- TorchRL hooks

    def _set_seed(self, seed: int | None) -> None:
        if seed is None:
            self._gen.seed()
        else:
            self._gen.manual_seed(int(seed))

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        mask = None if tensordict is None else tensordict.get("_reset", None)
        if mask is None:
            ids = torch.arange(self.n, device=self.device)
        else:
            ids = mask.reshape(self.n).nonzero().squeeze(-1)
        start, goal = self._spawns(ids.shape[0]) if self.layout == "train" else self._crossing(ids)
        self.pos = self.pos.index_copy(0, ids, start)
        self.vel = self.vel.index_fill(0, ids, 0.0)
        self.start = self.start.index_copy(0, ids, start)
        self.goal = self.goal.index_copy(0, ids, goal)
        d = goal - start
        self.yaw = self.yaw.index_copy(0, ids, torch.atan2(d[:, 1], d[:, 0]))
        self.step_count = self.step_count.index_fill(0, ids, 0)
        self._stats = {k: v.index_fill(0, ids, 0.0) for k, v in self._stats.items()}
        none = torch.zeros(self.n, dtype=torch.bool, device=self.device)
        return self._output(self._scan(), none, none)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        cfg = self.cfg
        v_cmd = tensordict.get(("agents", "action")).reshape(self.n, 3)[:, :2].float()
        keep = math.exp(-cfg.dt / cfg.velocity_time_constant)
        self.vel = v_cmd + (self.vel - v_cmd) * keep
        self.pos = self.pos + self.vel * cfg.dt
        self.step_count = self.step_count + 1

        scan = self._scan()
        to_goal = self.goal - self.pos
        dist = to_goal.norm(dim=-1)
        toward = (self.vel * to_goal).sum(-1) / dist.clamp_min(1e-6)
        reward = toward + 1.0 + torch.log(scan.clamp(1e-6, LIDAR_RANGE)).mean((-1, -2))
        collision = self._clearance(self.pos) < COLLISION_DISTANCE
        truncated = self.step_count >= cfg.max_episode_length
        self._stats["return"] = self._stats["return"] + reward
        self._stats["episode_len"] = self.step_count.float()
        self._stats["reach_goal"] = (dist < REACH_RADIUS).float()
        self._stats["collision"] = collision.float()
        self._stats["truncated"] = truncated.float()
        out = self._output(scan, collision, truncated)
        out.set(("agents", "reward"), reward[:, None])
        return out

    # ---------------------------------------------------------------- world

    def _clearance(self, points: Tensor) -> Tensor:
        """Distance [P] from points [P,2] to the nearest pillar surface (inf without pillars)."""
        if self.pillars.shape[0] == 0:
            return torch.full(points.shape[:1], math.inf, device=self.device)
        gap = torch.cdist(points, self.pillars[:, :2]) - self.pillars[:, 2]
        return gap.amin(-1)

    def _scan(self) -> Tensor:
        """Beam distances [N, 36, 4] (m, capped at the LiDAR range): pillars, then ground."""
        angle = self.yaw[:, None] + torch.arange(BEAMS, device=self.device) * (2 * math.pi / BEAMS)
        d = torch.stack((torch.cos(angle), torch.sin(angle)), -1)  # [N, 36, 2]
        horizontal = torch.full((self.n, BEAMS), math.inf, device=self.device)
        if self.pillars.shape[0]:
            rel = self.pos[:, None, :] - self.pillars[None, :, :2]  # [N, M, 2]
            b = torch.einsum("nbk,nmk->nbm", d, rel)
            c = (rel * rel).sum(-1) - self.pillars[:, 2] ** 2  # [N, M]
            disc = b * b - c[:, None, :]
            t = -b - torch.sqrt(disc.clamp_min(0))
            hit = (disc >= 0) & (t >= 0)
            t = torch.where(c[:, None, :] < 0, 0.0, torch.where(hit, t, math.inf))  # inside: 0
            horizontal = t.amin(-1)
        along = horizontal[..., None] * self._beam_scale
        return torch.minimum(along, self._ground).clamp_max(LIDAR_RANGE)

    def _spawns(self, k: int) -> tuple[Tensor, Tensor]:
        """Start anywhere clear of pillars, goal at a distance U(goal_distance) from it."""
        half, (lo, hi) = self.cfg.field_size / 2, self.cfg.goal_distance
        start = (self._rand(SPAWN_TRIES, k, 2) * 2 - 1) * half
        heading = 2 * math.pi * self._rand(SPAWN_TRIES, k)
        reach = lo + (hi - lo) * self._rand(SPAWN_TRIES, k)
        offset = torch.stack((torch.cos(heading), torch.sin(heading)), -1) * reach[..., None]
        goal = (start + offset).clamp(-half, half)
        free = self._clearance(start.reshape(-1, 2)) > SPAWN_CLEARANCE
        free &= self._clearance(goal.reshape(-1, 2)) > SPAWN_CLEARANCE
        free = free.reshape(SPAWN_TRIES, k)
        pick = torch.where(free.any(0), free.int().argmax(0), SPAWN_TRIES - 1)
        cols = torch.arange(k, device=self.device)
        return start[pick, cols], goal[pick, cols]

    def _crossing(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """NavRL's eval layout (navrl-task §1.4) in the plane: drone i crosses from y=+S to y=-S."""
        span, side = 0.8 * self.cfg.field_size, self.cfg.field_size / 2 + self.cfg.spawn_margin
        i = ids.float()
        x_goal = torch.linspace(-0.5, 0.5, self.n, device=self.device)[ids] * span
        start = torch.stack(((i / self.n - 0.5) * span, torch.full_like(i, side)), -1)
        goal = torch.stack((x_goal, torch.full_like(i, -side)), -1)
        return start, goal

    def _rand(self, *shape: int) -> Tensor:
        return torch.rand(shape, generator=self._gen, device=self.device)

    # ---------------------------------------------------------------- outputs and specs

    def _goal_frame(self, v: Tensor) -> Tensor:
        """Planar world vectors [N,2] as 3D goal-frame vectors [N,3] (z = 0)."""
        c, s = torch.cos(self.yaw), torch.sin(self.yaw)
        x, y = v[:, 0], v[:, 1]
        return torch.stack((c * x + s * y, -s * x + c * y, torch.zeros_like(x)), -1)

    def _output(self, scan: Tensor, terminated: Tensor, truncated: Tensor) -> TensorDictBase:
        n = self.n
        to_goal = self.goal - self.pos
        dist = to_goal.norm(dim=-1, keepdim=True)
        state = torch.cat(
            (
                self._goal_frame(to_goal / dist.clamp_min(1e-6)),
                dist,
                torch.zeros_like(dist),
                self._goal_frame(self.vel),
            ),
            -1,
        )
        direction = torch.cat((self.goal - self.start, torch.zeros(n, 1, device=self.device)), -1)
        observation = {
            "state": state,
            "lidar": (LIDAR_RANGE - scan)[:, None],
            "direction": direction[:, None],
            "dynamic_obstacle": torch.zeros(n, 1, 5, 10, device=self.device),
        }
        return TensorDict(
            {
                "agents": {"observation": observation},
                "stats": {k: v[:, None] for k, v in self._stats.items()},
                "terminated": terminated[:, None],
                "truncated": truncated[:, None],
                "done": (terminated | truncated)[:, None],
            },
            batch_size=[n],
            device=self.device,
        )

    def _make_specs(self) -> None:
        n, dev, limit = self.n, self.device, self.cfg.action_limit

        def group(**specs: object) -> Composite:
            return Composite(specs, shape=(n,), device=dev)

        self.observation_spec = group(
            agents=group(
                observation=group(
                    state=Unbounded((n, 8), device=dev),
                    lidar=Bounded(0.0, LIDAR_RANGE, (n, 1, BEAMS, len(ELEVATIONS_DEG)), device=dev),
                    direction=Unbounded((n, 1, 3), device=dev),
                    dynamic_obstacle=Unbounded((n, 1, 5, 10), device=dev),
                )
            ),
            stats=group(**{k: Unbounded((n, 1), device=dev) for k in STAT_KEYS}),
        )
        # The policy's goal-frame command in (-L, L)³, rotated about z.
        bound = torch.tensor([limit * math.sqrt(2), limit * math.sqrt(2), limit], device=dev)
        low, high = -bound.expand(n, 1, 3), bound.expand(n, 1, 3)
        self.action_spec = group(agents=group(action=Bounded(low, high, (n, 1, 3), device=dev)))
        self.reward_spec = group(agents=group(reward=Unbounded((n, 1), device=dev)))
        flag = Categorical(2, (n, 1), dtype=torch.bool, device=dev)
        self.done_spec = group(done=flag.clone(), terminated=flag.clone(), truncated=flag.clone())
