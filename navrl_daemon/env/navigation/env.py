"""NavRL's navigation task as a torch-vectorised TorchRL environment (navrl-task §1, navrl-task §1).

N drones fly in parallel, env i on static map i % num_maps together with that map's dynamic
obstacles; drones do not see or touch each other. One step (navrl-task §1.1): the flight model
tracks the world-frame velocity command, the dynamic obstacles move, the LiDAR is cast, the
episode step counter advances, then observation, reward, termination and stats are computed.

Keys: observations under ("agents", "observation", state | lidar | direction |
dynamic_obstacle), the action ("agents", "action") [N,1,3] as a world-frame velocity in m/s,
the reward ("agents", "reward") [N,1], root done / terminated / truncated [N,1] and the
per-episode ("stats", k) [N,1] (zeroed at reset, reported in every step's output). The
action spec is Bounded to ±L·√2 in x, y and ±L in z (L = action_limit): a goal-frame command
in (-L, L)³ rotated about z. The policy maps its Beta sample through the goal frame itself;
the env does not clip the command, the thrust limit of the flight model bounds it.

Where we differ from NavRL on purpose: the LiDAR scan after a reset is cast at the new spawn
(NavRL returns the previous episode's scan), and `stats.return` counts each reward once
(NavRL adds the reset step's reward again).

Determinism: maps and dynamic-obstacle origins come from a CPU generator seeded with `seed`,
so envs built with the same config and seed share them whatever their num_envs, layout or
device. Step-time randomness (spawns, obstacle goals and speeds) comes from a generator on
the env's device that `set_seed` reseeds; `state_dict_env` / `load_state_dict_env` capture
all mutable state for exact resume.

Auto-reset (`step_and_maybe_reset`), two ways (`env.navigation.reset_mode`; `auto` picks
masked when the steps are captured as a CUDA graph, `collect_path`, and indexed otherwise):
- indexed: torchrl's loop. The host reads the done flags every step and, when an episode
  ended, the reset envs' indices (`nonzero`), so spawns and LiDAR are computed for those
  envs only: the least compute, about two host syncs per step and five more per reset.
- masked: no host sync at all. Every step draws spawns for all envs, casts the LiDAR at
  all of them and keeps the new values where an episode ended (`torch.where`): one more
  LiDAR cast per step, and a GPU that never waits for the host. The spawn RNG is drawn for
  all envs, so the two modes' episodes differ after the first reset, except in the
  `navrl` layout, whose spawns draw nothing: there the modes agree bit for bit.

In place: a step, a reset, a reseed and `load_state_dict_env` update the state tensors
(`state_tensors`) in place, and nothing in a step branches on its number, so a CUDA graph of
the step (rl/captured_rollout.py) replays it on the same tensors.

Density levels (`env.navigation.map_levels`, ours): each env flies the first k pillars of its map,
k = map_levels[level]; the LiDAR grid holds one slot per (map, level). An env's level
changes only when a new episode starts there: up one after an episode that reached its
goal, down one after a collision, unchanged after a time-out (per env, as legged robots'
terrain curricula do), so the share of envs at the denser levels rises with success and
nothing jumps at once. `env.navigation.min_level` is a floor: an env below it (a fresh one, one kept
from a stage or a checkpoint with a lower floor) is moved up to it, and a collision there
keeps it there. Without levels every env flies its whole map (NavRL). The move
is arithmetic on the ended episode's stats written in place (no host read, no branch on a
value), so a captured step moves levels as the eager one does.

Ending hops at the goal (`env.navigation.reach_hold`, ours): NavRL's reach is not terminal,
so a drone that reached its goal hovers there until the time-out. With reach_hold = k, an episode is
truncated (a time-out: the value bootstraps, reaching is not punished) once the drone has
been within REACH_RADIUS for k steps in a row (`held`, a state tensor updated in place), so
the frames go to new flights and levels move sooner. Evaluations keep NavRL's rule.

Test and scripting hooks: `set_pillars` replaces the static boxes, `place_drones` starts
episodes at given positions, and `dynamic` (a `DynamicObstacles`) exposes the moving
obstacles' tensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

from navrl_daemon.config import EnvConfig, execution_plan

# The contract's keys and literals, also importable from here as before.
from navrl_daemon.env.contract import ACTION_KEY as ACTION_KEY
from navrl_daemon.env.contract import OBS as OBS
from navrl_daemon.env.contract import REWARD_KEY as REWARD_KEY
from navrl_daemon.env.contract import STAT_KEYS as STAT_KEYS
from navrl_daemon.env.contract import Layout as Layout
from navrl_daemon.env.contract import Scene, Whereabouts
from navrl_daemon.env.navigation.dynamics import point_mass_step
from navrl_daemon.env.navigation.geometry import world_to_goal, yaw_of
from navrl_daemon.env.navigation.lidar import (
    HORIZONTAL_BEAMS,
    LIDAR_RANGE,
    NUM_BEAMS,
    VERTICAL_ANGLES_DEG,
    Lidar,
    PillarGrid,
)
from navrl_daemon.env.navigation.obstacles import DYN_WIDTH_STEP, DynamicObstacles, generate_pillars
from navrl_daemon.host_copy import host_copy

# --- navrl-task §1.6: dynamic-obstacle observation ------------------------------------------------
DYN_OBSERVED = 5  # feature_extractor.dyn_obs_num
DYN_FEATURES = 10
# --- navrl-task §1.8: reward ----------------------------------------------------------------------
SURVIVAL_BONUS = 1.0
SMOOTHNESS_WEIGHT = 0.1
HEIGHT_WEIGHT = 8.0
HEIGHT_MARGIN = 0.2  # m beyond [min, max] of the start and goal heights before the penalty
LOG_CLAMP_MIN = 1e-6
# --- navrl-task §1.9: termination -----------------------------------------------------------------
COLLISION_DISTANCE = 0.3  # m: static (a beam shorter than this) and dynamic margin
Z_MIN, Z_MAX = 0.2, 4.0
REACH_RADIUS = 0.5  # m (3D): reach_goal stat, not terminal (ends an episode only with reach_hold)
# --- navrl-task §1.4: eval layout ("navrl") -------------------------------------------------------
NAVRL_LAYOUT_SPAN = 0.8  # x spread of starts/goals as a fraction of the field (32 of 40 m)
NAVRL_LAYOUT_Z = 2.0
# Ours: "local" spawns are redrawn this many times (all at once) to clear the pillars.
LOCAL_SPAWN_CLEARANCE = 0.5
LOCAL_SPAWN_TRIES = 32

_STATS = tuple(enumerate(STAT_KEYS))
_REACH_GOAL, _COLLISION = STAT_KEYS.index("reach_goal"), STAT_KEYS.index("collision")
# The two as one slice: indexing with a tuple would copy a host index tensor to the device
# at every reset, which a CUDA graph capture refuses.
_OUTCOMES = slice(_REACH_GOAL, _COLLISION + 1)
assert _COLLISION == _REACH_GOAL + 1
_EPISODE_LEN = STAT_KEYS.index("episode_len")


class NavigationEnv(EnvBase):
    """The embedded NavRL navigation task; see the module docstring for the contract. It
    implements every optional capability of `contract.py`: `ResumableEnv`,
    `CapturableEnv`, `DensityLevels` and `Determinism`."""

    deterministic = True

    def __init__(
        self,
        cfg: EnvConfig,
        *,
        device: str | torch.device = "cpu",
        seed: int = 0,
        num_envs: int | None = None,
        layout: Layout = "train",
    ) -> None:
        if layout not in ("train", "navrl"):
            raise ValueError(f"layout must be 'train' or 'navrl', got {layout!r}")
        n = cfg.num_envs if num_envs is None else int(num_envs)
        super().__init__(device=device, batch_size=torch.Size([n]))
        self.cfg = cfg
        self.layout = layout
        self.num_envs = n
        self.num_maps = cfg.navigation.num_maps
        self.ground_half_extent = cfg.field_size / 2 + cfg.navigation.border_width
        self.map_id = torch.arange(n, device=self.device) % self.num_maps
        # Pillar counts of the density levels; one level (the whole map) without map_levels.
        self.level_counts = list(cfg.navigation.map_levels) or [cfg.num_obstacles]
        self.min_level = cfg.navigation.min_level
        self.safety_weight = cfg.navigation.safety_weight  # ours; NavRL: 1.0

        map_gen = torch.Generator().manual_seed(seed)
        self.pillars = generate_pillars(cfg.num_obstacles, cfg.field_size, map_gen, self.num_maps)
        self._build_lidar(
            [
                self.pillars.boxes(m, count)
                for m in range(self.num_maps)
                for count in self.level_counts
            ]
        )
        self.dynamic = DynamicObstacles.generate(
            self.num_maps,
            cfg.num_dynamic_obstacles,
            cfg.field_size,
            cfg.dt,
            tuple(cfg.navigation.dynamic_speed_range),
            map_gen,
            self.device,
        )
        # Reseeding restores this: the same seed then replays the same obstacle motion.
        self._dynamic_start = self.dynamic.state_dict()
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        # This env's steps are the ones a CUDA graph holds (its registry entry says so).
        mode = execution_plan.reset_mode(cfg, self.device, captured=True)
        self.masked_reset = mode.value == "masked"
        self.collect_path = execution_plan.collect_path(cfg, self.device, captured=True).value
        self.collect_fallback = cfg.collect_path == "auto"
        self._allocate_state()
        self._make_specs()

    # ------------------------------------------------------------------------ public helpers

    def set_pillars(self, boxes: Tensor | Sequence[Tensor]) -> None:
        """Replace the static map: boxes [B,5] (x0,y0,x1,y1,h in m) for every map, or one per map.

        Meant for tests and scripted scenes; the LiDAR grid is rebuilt and every drone's
        scan recast where it stands.
        """
        per_map = [boxes] * self.num_maps if isinstance(boxes, Tensor) else list(boxes)
        if len(per_map) != self.num_maps:
            raise ValueError(f"expected boxes for {self.num_maps} maps, got {len(per_map)}")
        self._build_lidar([b for b in per_map for _ in self.level_counts])
        self._rescan(torch.arange(self.num_envs, device=self.device))

    def place_drones(
        self, start: Tensor, goal: Tensor, env_ids: Tensor | None = None
    ) -> TensorDictBase:
        """Start fresh episodes at given positions [k,3] facing given goals [k,3].

        Meant for tests and scripted scenes. Returns the observation of all envs, like reset.
        """
        ids = torch.arange(self.num_envs, device=self.device) if env_ids is None else env_ids
        self._begin_episodes(ids.to(self.device), start.to(self.device), goal.to(self.device))
        return self._reset_output()

    def state_dict_env(self) -> dict[str, Tensor]:
        """Every piece of mutable state, for exact resume (`load_state_dict_env`)."""
        copy = host_copy if self.device.type == "cpu" else Tensor.clone
        state = {name: copy(getattr(self, name)) for name in _STATE_TENSORS}
        state.update({f"stats.{k}": copy(self.episode_stats[:, i]) for i, k in _STATS})
        state.update({f"dynamic.{k}": v for k, v in self.dynamic.state_dict().items()})
        state["generator"] = self._generator.get_state()
        return state

    def load_state_dict_env(self, state: dict[str, Tensor]) -> None:
        """Restore `state_dict_env` output (same config and num_envs; any device), copied
        into the state tensors: their addresses stay (see `state_tensors`)."""
        values = {}
        for name in _STATE_TENSORS:
            current = getattr(self, name)
            # States saved before map_levels / reach_hold existed hold no levels (all were
            # at 0) and no hold counts (nothing counted them).
            optional = name in ("level", "held")
            value = state.get(name, torch.zeros_like(current)) if optional else state[name]
            if value.shape != current.shape:
                raise ValueError(
                    f"env state {name}: shape {tuple(value.shape)}, "
                    f"this env needs {tuple(current.shape)}"
                )
            values[name] = value
        for name, value in values.items():
            getattr(self, name).copy_(value)
        self.level.clamp_(min=self.min_level)  # a state saved with a lower floor (or none)
        for i, k in _STATS:
            self.episode_stats[:, i].copy_(state[f"stats.{k}"])
        prefix = "dynamic."
        self.dynamic.load_state_dict(
            {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        )
        self._generator.set_state(state["generator"].cpu())

    @property
    def generator(self) -> torch.Generator:
        """The generator of every step-time random draw (spawns, obstacle goals and speeds),
        on the env's device; `set_seed` reseeds it."""
        return self._generator

    def whereabouts(self) -> Whereabouts:
        """`RecordableEnv`: the drones, their goals and map 0's moving obstacles now."""
        return Whereabouts(drones=self.pos, goals=self.goal, moving=self.dynamic.pos[0])

    def scene(self) -> Scene:
        """`RecordableEnv`: the maps the drones fly, map 0's obstacles drawn."""
        return Scene(
            map_id=self.map_id,
            moving_size=self.dynamic.size,
            pillars=self.pillars.boxes(0),
            field_size=self.cfg.field_size,
            num_maps=self.num_maps,
        )

    def graph_objects(self) -> tuple[object, ...]:
        """What a captured step holds besides its state tensors: the LiDAR, whose grid
        `set_pillars` rebuilds."""
        return (self.lidar,)

    def state_tensors(self) -> dict[str, Tensor]:
        """Every tensor a step reads and writes, by name. Steps, resets, reseeds and
        `load_state_dict_env` update them in place, so they keep their storage: what a
        CUDA graph of the step, which replays on fixed addresses, needs."""
        dyn = self.dynamic
        return {
            **{name: getattr(self, name) for name in _STATE_TENSORS},
            "episode_stats": self.episode_stats,
            **{f"dynamic.{k}": getattr(dyn, k) for k in ("pos", "goal", "vel", "step_count")},
        }

    # ------------------------------------------------------------------------ TorchRL hooks

    def _set_seed(self, seed: int | None) -> None:
        """Reseed the spawn RNG; with a seed, also put the dynamic obstacles back where they
        started, so that evaluations (which reseed) see the same world every time."""
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(int(seed))
            if hasattr(self, "_dynamic_start"):
                self.dynamic.load_state_dict(self._dynamic_start)

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        mask = None if tensordict is None else tensordict.get("_reset", None)
        if mask is None:
            ids = torch.arange(self.num_envs, device=self.device)
        else:
            # One host sync per partial reset (torchrl already synced to find a done env):
            # the spawn and the LiDAR are then computed for the reset envs only.
            ids = mask.reshape(self.num_envs).nonzero().squeeze(-1)
            # Only these episodes ended; a full reset (no mask: the collector's start, a
            # resume, a new curriculum stage) abandons whatever was in flight instead, so
            # it neither moves levels nor counts episodes in level_outcomes().
            self._advance_levels(ids)
        start, goal = self._draw_spawns(ids)
        self._begin_episodes(ids, start, goal)
        return self._reset_output()

    def step_and_maybe_reset(
        self, tensordict: TensorDictBase
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """torchrl's step + auto-reset; with `masked_reset`, without a host sync.

        Same outputs as torchrl's: the step's record (with the true final observation under
        `next`) and the td to continue from, which holds the new episodes' observation,
        zeroed stats and cleared done flags where an episode ended. Without an ended
        episode the reset output equals the step's own (same state, same functions), so it
        is written for all envs and no mask is needed there.
        """
        if not self.masked_reset:
            return super().step_and_maybe_reset(tensordict)
        if tensordict.device != self.device:
            tensordict = tensordict.to(self.device)
        record = self.step(tensordict)
        following = self._step_mdp(record)
        if self._post_step_mdp_hooks is not None:
            record, following = self._post_step_mdp_hooks(record, following)
        done = record.get(("next", "done")).reshape(self.num_envs)
        self._advance_levels(self._all_ids, where=done)
        start, goal = self._draw_spawns(self._all_ids)
        self._begin_episodes_where(done, start, goal)
        following.update(self._reset_output())
        return record, following

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        cfg = self.cfg
        # Detached: the state is updated in place, and the env is not differentiable.
        v_cmd = tensordict.get(ACTION_KEY).detach().reshape(self.num_envs, 3).to(torch.float32)
        self.prev_vel.copy_(self.vel)
        pos, vel = point_mass_step(
            self.pos,
            self.vel,
            v_cmd,
            dt=cfg.dt,
            tau=cfg.velocity_time_constant,
            thrust_to_weight=cfg.navigation.thrust_to_weight,
        )
        self.pos.copy_(pos)
        self.vel.copy_(vel)
        self.dynamic.step(self._generator)
        self.scan.copy_(self.lidar.distances(self.pos, self.yaw, self.slot))
        self.step_count.add_(1)

        dyn_obs, dyn_clearance, dyn_collision = self._dynamic_view()
        to_goal = self.goal - self.pos
        dist = to_goal.norm(dim=-1)
        reward = self._reward(to_goal, dist, dyn_clearance)
        lidar_value = LIDAR_RANGE - self.scan
        static_collision = lidar_value.amax(-1) > LIDAR_RANGE - COLLISION_DISTANCE
        collision = static_collision | dyn_collision
        z = self.pos[:, 2]
        terminated = collision | (z < Z_MIN) | (z > Z_MAX)
        truncated = self.step_count >= cfg.max_episode_length
        if cfg.navigation.reach_hold:  # a config constant: the same branch at every step
            near = dist < REACH_RADIUS
            torch.where(near, self.held + 1, torch.zeros_like(self.held), out=self.held)
            truncated = truncated | (self.held >= cfg.navigation.reach_hold)
        stats = torch.stack(  # in STAT_KEYS order
            (
                self.episode_stats[:, 0] + reward,
                self.step_count.to(torch.float32),
                (dist < REACH_RADIUS).to(torch.float32),
                collision.to(torch.float32),
                truncated.to(torch.float32),
            ),
            -1,
        )
        self.episode_stats.copy_(stats)

        out = self._output(dyn_obs, terminated, truncated, stats)
        out.set(REWARD_KEY, reward[:, None])
        return out

    # ------------------------------------------------------------------------ episode logic

    def _draw_spawns(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        if self.layout == "navrl":
            return self._navrl_layout(ids)
        k = ids.shape[0]
        if self.cfg.navigation.spawn == "border" and self.cfg.navigation.crossing_share > 0:
            return self._mixed_spawns(k)
        if self.cfg.navigation.spawn == "border":
            return self._border_point(k), self._border_point(k)
        if self.cfg.navigation.spawn == "crossing":
            return self._crossings(k)
        if self.cfg.navigation.crossing_share > 0:  # a config constant: the same branch every time
            return self._local_spawns_and_crossings(ids)
        return self._local_spawns(ids)

    def _crossings(self, k: int) -> tuple[Tensor, Tensor]:
        """Start on a random side of the square, goal on the opposite side."""
        side = self._random_side(k)
        return self._border_point(k, side), self._border_point(k, side ^ 1)

    def _local_spawns_and_crossings(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Hops in the field, of which a `crossing_share` of the episodes are crossings
        instead (both are drawn for every env, so the draws do not depend on the mix)."""
        start, goal = self._local_spawns(ids)
        cross_start, cross_goal = self._crossings(ids.shape[0])
        crossing = (self._rand(ids.shape[0]) < self.cfg.navigation.crossing_share)[:, None]
        return torch.where(crossing, cross_start, start), torch.where(crossing, cross_goal, goal)

    def _navrl_layout(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """navrl-task §1.4 eval: drone i crosses the field from y=+S to y=-S, S = F/2 + margin."""
        n, span = self.num_envs, NAVRL_LAYOUT_SPAN * self.cfg.field_size
        side = self.cfg.field_size / 2 + self.cfg.spawn_margin
        i = ids.to(torch.float32)
        goal_x = torch.linspace(-0.5, 0.5, n, device=self.device)[ids] * span
        z = torch.full_like(i, NAVRL_LAYOUT_Z)
        start = torch.stack(((i / n - 0.5) * span, torch.full_like(i, side), z), -1)
        goal = torch.stack((goal_x, torch.full_like(i, -side), z), -1)
        return start, goal

    def _mixed_spawns(self, k: int) -> tuple[Tensor, Tensor]:
        """NavRL's border rule, except that a `crossing_share` of the episodes put the goal
        on the side opposite the start."""
        side, other = self._random_side(k), self._random_side(k)
        crossing = self._rand(k) < self.cfg.navigation.crossing_share
        goal_side = torch.where(crossing, side ^ 1, other)
        return self._border_point(k, side), self._border_point(k, goal_side)

    def _random_side(self, k: int) -> Tensor:
        """Sides of the square: 0 (y = +S), 1 (y = -S), 2 (x = +S), 3 (x = -S)."""
        return torch.randint(4, (k,), generator=self._generator, device=self.device)

    def _border_point(self, k: int, side: Tensor | None = None) -> Tensor:
        """navrl-task §1.4 training: a uniform side of the square at ±S (or the given sides),
        uniform along it. Side `i ^ 1` is the one opposite side `i`."""
        s = self.cfg.field_size / 2 + self.cfg.spawn_margin
        side = self._random_side(k) if side is None else side
        along = (2 * self._rand(k) - 1) * s
        x = torch.where(side < 2, along, torch.where(side == 2, s, -s))
        y = torch.where(side == 0, s, torch.where(side == 1, -s, along))
        return torch.stack((x, y, self._spawn_z(k)), -1)

    def _local_spawns(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Start anywhere in the field, goal at a horizontal distance U(goal_distance) from it.

        LOCAL_SPAWN_TRIES candidate pairs are drawn at once; each env keeps its first pair
        whose start and goal both clear the pillars by LOCAL_SPAWN_CLEARANCE (else the last).
        """
        k, tries = ids.shape[0], LOCAL_SPAWN_TRIES
        half = self.cfg.field_size / 2
        lo, hi = self.cfg.goal_distance
        start_xy = (2 * self._rand(tries, k, 2) - 1) * half
        heading = 2 * math.pi * self._rand(tries, k)
        reach = lo + (hi - lo) * self._rand(tries, k)
        offset = torch.stack((torch.cos(heading), torch.sin(heading)), -1) * reach[..., None]
        goal_xy = (start_xy + offset).clamp(-half, half)
        start = torch.cat((start_xy, self._spawn_z(tries, k)[..., None]), -1)
        goal = torch.cat((goal_xy, self._spawn_z(tries, k)[..., None]), -1)
        maps = self.slot[ids].repeat(tries)
        free = self._pillar_clearance(start.reshape(-1, 3), maps) > LOCAL_SPAWN_CLEARANCE
        free &= self._pillar_clearance(goal.reshape(-1, 3), maps) > LOCAL_SPAWN_CLEARANCE
        free = free.reshape(tries, k)
        pick = torch.where(free.any(0), free.int().argmax(0), tries - 1)
        cols = torch.arange(k, device=self.device)
        return start[pick, cols], goal[pick, cols]

    def _pillar_clearance(self, points: Tensor, slot: Tensor) -> Tensor:
        """3D distance [P] from points [P,3] to the nearest pillar of their grid slots [P]
        (capped at the LiDAR range)."""
        boxes = self.lidar.grid.candidates(points, slot)  # [P,K,5]
        p = points[:, None, :]
        dx = torch.maximum(boxes[..., 0] - p[..., 0], p[..., 0] - boxes[..., 2]).clamp_min(0)
        dy = torch.maximum(boxes[..., 1] - p[..., 1], p[..., 1] - boxes[..., 3]).clamp_min(0)
        dz = torch.maximum(-p[..., 2], p[..., 2] - boxes[..., 4]).clamp_min(0)
        dist = torch.sqrt(dx * dx + dy * dy + dz * dz).amin(-1)
        return dist.clamp_max(LIDAR_RANGE)

    def _spawn_z(self, *shape: int) -> Tensor:
        lo, hi = self.cfg.navigation.spawn_height
        return lo + (hi - lo) * self._rand(*shape)

    def _rand(self, *shape: int) -> Tensor:
        return torch.rand(shape, generator=self._generator, device=self.device)

    def _episode_start(self, start: Tensor, goal: Tensor) -> dict[str, Tensor]:
        """Initial state of new episodes (navrl-task §1.4): at rest, facing the goal, stats zeroed.

        Rows per new episode, keyed by state attribute."""
        zeros3 = torch.zeros_like(start)
        heights = torch.stack((start[:, 2], goal[:, 2]), -1)
        zeros = torch.zeros(start.shape[0], device=self.device)
        return {
            "pos": start,
            "vel": zeros3,
            "prev_vel": zeros3,
            "start": start,
            "goal": goal,
            "yaw": yaw_of(goal - start),
            "height_range": torch.stack((heights.amin(-1), heights.amax(-1)), -1),
            "step_count": zeros.to(self.step_count.dtype),
            "held": zeros.to(self.held.dtype),
            "episode_stats": zeros[:, None].expand(-1, len(STAT_KEYS)),
        }

    def _begin_episodes(self, ids: Tensor, start: Tensor, goal: Tensor) -> None:
        """New episodes in envs `ids` (start, goal: [len(ids), 3])."""
        for name, rows in self._episode_start(start, goal).items():
            getattr(self, name).index_copy_(0, ids, rows)
        self._rescan(ids)

    def _begin_episodes_where(self, mask: Tensor, start: Tensor, goal: Tensor) -> None:
        """New episodes where `mask` [N] is set (start, goal: [N, 3]); no host sync."""
        for name, rows in self._episode_start(start, goal).items():
            old = getattr(self, name)
            torch.where(mask.view(-1, *[1] * (old.dim() - 1)), rows, old, out=old)
        scan = self.lidar.distances(self.pos, self.yaw, self.slot)
        torch.where(mask[:, None], scan, self.scan, out=self.scan)

    @property
    def slot(self) -> Tensor:
        """Each env's LiDAR grid slot [N]: its map and density level."""
        return self.map_id * len(self.level_counts) + self.level

    def _advance_levels(self, ids: Tensor, where: Tensor | None = None) -> None:
        """Move envs `ids` whose episode just ended (`where` [len(ids)], default all) one
        level up if it reached its goal, down if it collided; in place, without a host
        read (a captured step replays it). Without map_levels (one level) this changes
        nothing and is skipped."""
        top = len(self.level_counts) - 1
        if top == 0:
            return
        ended = self.episode_stats[ids]
        flown = ended[:, _EPISODE_LEN] > 0  # not the first reset of a fresh env
        weight = (flown if where is None else flown & where).to(ended.dtype)
        outcome = ended[:, _OUTCOMES] * weight[:, None]
        level = self.level[ids]
        self.level_ends.index_add_(0, level, torch.cat((weight[:, None], outcome), -1))
        step = outcome[:, 0] - outcome[:, 1]
        moved = (level + step.to(self.level.dtype)).clamp(self.min_level, top)
        self.level.index_copy_(0, ids, moved)

    def level_shares(self) -> list[float]:
        """The share of envs at each density level (one entry without map_levels)."""
        counts = torch.bincount(self.level, minlength=len(self.level_counts))
        return (counts.double() / self.num_envs).tolist()

    def level_outcomes(self) -> list[list[float]]:
        """Per density level, [episodes ended, reached, collided] at that level since the
        last call (which zeroes them): how well the policy flies each density. Counted with
        the level moves (so only with map_levels)."""
        counts = self.level_ends.tolist()
        self.level_ends.zero_()
        return counts

    def _rescan(self, ids: Tensor) -> None:
        """Cast the LiDAR of these envs at their current pose (fresh scan after a reset)."""
        scan = self.lidar.distances(self.pos[ids], self.yaw[ids], self.slot[ids])
        self.scan.index_copy_(0, ids, scan)

    # ------------------------------------------------------------------------ obs and reward

    def _reward(self, to_goal: Tensor, dist: Tensor, dyn_clearance: Tensor | None) -> Tensor:
        """navrl-task §1.8 per env [N]."""
        toward = to_goal / dist.clamp_min(1e-6)[:, None]
        reward = (self.vel * toward).sum(-1) + SURVIVAL_BONUS
        # One add per term as before (no extra kernel in the step); x * 1.0 is x, so the
        # default is NavRL's reward bit for bit.
        w = self.safety_weight
        reward = reward.add(
            torch.log(self.scan.clamp(LOG_CLAMP_MIN, LIDAR_RANGE)).mean(-1), alpha=w
        )
        if dyn_clearance is not None:
            clearance = torch.log(dyn_clearance.clamp(LOG_CLAMP_MIN, LIDAR_RANGE)).mean(-1)
            reward = reward.add(clearance, alpha=w)
        if self.cfg.navigation.smoothness_penalty:
            reward = reward - SMOOTHNESS_WEIGHT * (self.vel - self.prev_vel).norm(dim=-1)
        z = self.pos[:, 2]
        above = (z - (self.height_range[:, 1] + HEIGHT_MARGIN)).clamp_min(0)
        below = ((self.height_range[:, 0] - HEIGHT_MARGIN) - z).clamp_min(0)
        return reward - HEIGHT_WEIGHT * (above * above + below * below)

    def _observe(self, dyn_obs: Tensor) -> dict[str, Tensor]:
        """navrl-task §1.6 observations of all envs from the current state and cached scan."""
        to_goal = self.goal - self.pos
        unit = to_goal / to_goal.norm(dim=-1, keepdim=True).clamp_min(1e-6)
        state = torch.cat(
            (
                world_to_goal(unit, self.yaw),
                to_goal[:, :2].norm(dim=-1, keepdim=True),
                to_goal[:, 2:3],
                world_to_goal(self.vel, self.yaw),
            ),
            -1,
        )
        direction = self.goal - self.start
        direction = torch.cat((direction[:, :2], torch.zeros_like(direction[:, 2:])), -1)
        lidar = (LIDAR_RANGE - self.scan).reshape(self.num_envs, 1, HORIZONTAL_BEAMS, -1)
        return {
            "state": state,
            "lidar": lidar,
            "direction": direction[:, None, :],
            "dynamic_obstacle": dyn_obs[:, None],
        }

    def _dynamic_view(self) -> tuple[Tensor, Tensor | None, Tensor]:
        """The 5 nearest dynamic obstacles (navrl-task §1.6): features [N,5,10], clearance [N,k]
        for the safety reward (None without obstacles), and dynamic collision [N]."""
        n, dyn = self.num_envs, self.dynamic
        features = torch.zeros(n, DYN_OBSERVED, DYN_FEATURES, device=self.device)
        if dyn.count == 0:
            return features, None, torch.zeros(n, dtype=torch.bool, device=self.device)
        k = min(DYN_OBSERVED, dyn.count)
        standing = dyn.is_cylinder[None, :, None]
        rel = dyn.pos.index_select(0, self.map_id) - self.pos[:, None, :]  # [N,D,3]
        rel = torch.where(
            standing, torch.cat((rel[..., :2], torch.zeros_like(rel[..., 2:])), -1), rel
        )
        dist_xy, idx = rel[..., :2].norm(dim=-1).topk(k, dim=-1, largest=False)  # [N,k]
        rel = rel.gather(1, idx[..., None].expand(-1, -1, 3))
        vel = dyn.vel.index_select(0, self.map_id).gather(1, idx[..., None].expand(-1, -1, 3))
        size = dyn.size[idx]  # [N,k,3]
        masked = dist_xy > LIDAR_RANGE
        yaw = self.yaw[:, None]
        rel_g = world_to_goal(rel, yaw)
        rel_norm = rel.norm(dim=-1)
        feats = torch.cat(
            (
                rel_g / rel_norm.clamp_min(1e-6)[..., None],
                rel_g[..., :2].norm(dim=-1, keepdim=True),
                rel_g[..., 2:3],
                world_to_goal(vel, yaw),
                (size[..., :1] / DYN_WIDTH_STEP - 1),
                (size[..., 2:3] <= 1.0).to(torch.float32),
            ),
            -1,
        )
        features[:, :k] = torch.where(masked[..., None], 0.0, feats)
        clearance = torch.where(masked, LIDAR_RANGE, rel_norm - size[..., 0] / 2)
        hit_xy = dist_xy <= size[..., 0] / 2 + COLLISION_DISTANCE
        hit_z = rel[..., 2].abs() <= size[..., 2] / 2 + COLLISION_DISTANCE
        collision = (~masked & hit_xy & hit_z).any(-1)
        return features, clearance, collision

    def _reset_output(self) -> TensorDictBase:
        dyn_obs, _, _ = self._dynamic_view()
        none = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        return self._output(dyn_obs, none, none, self.episode_stats.clone())

    def _output(
        self, dyn_obs: Tensor, terminated: Tensor, truncated: Tensor, stats: Tensor
    ) -> TensorDictBase:
        """The step/reset output; `stats` [N, 5] in STAT_KEYS order, a tensor of its own
        (not the state, which the next step changes in place)."""
        n = self.num_envs
        out = TensorDict(
            {
                "agents": {"observation": self._observe(dyn_obs)},
                "stats": {k: stats[:, i, None] for i, k in _STATS},
                "terminated": terminated[:, None],
                "truncated": truncated[:, None],
                "done": (terminated | truncated)[:, None],
            },
            batch_size=[n],
            device=self.device,
        )
        return out

    # ------------------------------------------------------------------------ setup

    def _build_lidar(self, boxes_per_map: list[Tensor]) -> None:
        grid = PillarGrid.build(boxes_per_map, reach=LIDAR_RANGE, device=self.device)
        self.lidar = Lidar(grid, self.ground_half_extent)

    def _allocate_state(self) -> None:
        n, dev = self.num_envs, self.device
        self._all_ids = torch.arange(n, device=dev)
        self.pos = torch.zeros(n, 3, device=dev)
        self.vel = torch.zeros(n, 3, device=dev)
        self.prev_vel = torch.zeros(n, 3, device=dev)
        self.start = torch.zeros(n, 3, device=dev)
        self.goal = torch.zeros(n, 3, device=dev)
        self.goal[:, 0] = 1.0  # any goal off the start until the first reset
        self.yaw = torch.zeros(n, device=dev)
        self.height_range = torch.zeros(n, 2, device=dev)
        self.step_count = torch.zeros(n, dtype=torch.long, device=dev)
        self.level = torch.full((n,), self.min_level, dtype=torch.long, device=dev)
        # Steps in a row within REACH_RADIUS of the goal (env.navigation.reach_hold).
        self.held = torch.zeros(n, dtype=torch.long, device=dev)
        # Per level: episodes ended there, reached, collided, since level_outcomes() read
        # them (telemetry, not state: a checkpoint does not hold it).
        self.level_ends = torch.zeros(len(self.level_counts), 3, device=dev)
        self.scan = torch.full((n, NUM_BEAMS), LIDAR_RANGE, device=dev)
        self.episode_stats = torch.zeros(n, len(STAT_KEYS), device=dev)  # STAT_KEYS order
        self._rescan(torch.arange(n, device=dev))

    def _make_specs(self) -> None:
        n, dev = self.num_envs, self.device
        limit = self.cfg.action_limit
        observation = Composite(
            state=Unbounded((n, 8), device=dev),
            lidar=Bounded(
                0.0, LIDAR_RANGE, (n, 1, HORIZONTAL_BEAMS, len(VERTICAL_ANGLES_DEG)), device=dev
            ),
            direction=Unbounded((n, 1, 3), device=dev),
            dynamic_obstacle=Unbounded((n, 1, DYN_OBSERVED, DYN_FEATURES), device=dev),
            shape=(n,),
            device=dev,
        )
        stats = Composite(
            {k: Unbounded((n, 1), device=dev) for k in STAT_KEYS}, shape=(n,), device=dev
        )
        self.observation_spec = Composite(
            agents=Composite(observation=observation, shape=(n,), device=dev),
            stats=stats,
            shape=(n,),
            device=dev,
        )
        # A goal-frame command in (-L, L)³ rotated about z: |x|, |y| <= L·√2 in the world.
        bound = torch.tensor([limit * math.sqrt(2), limit * math.sqrt(2), limit], device=dev)
        self.action_spec = Composite(
            agents=Composite(
                action=Bounded(
                    -bound.expand(n, 1, 3), bound.expand(n, 1, 3), (n, 1, 3), device=dev
                ),
                shape=(n,),
                device=dev,
            ),
            shape=(n,),
            device=dev,
        )
        self.reward_spec = Composite(
            agents=Composite(reward=Unbounded((n, 1), device=dev), shape=(n,), device=dev),
            shape=(n,),
            device=dev,
        )
        flag = Categorical(2, (n, 1), dtype=torch.bool, device=dev)
        self.done_spec = Composite(
            done=flag.clone(),
            terminated=flag.clone(),
            truncated=flag.clone(),
            shape=(n,),
            device=dev,
        )


# Per-env state tensors saved by `state_dict_env` (besides stats, dynamic obstacles, RNG).
_STATE_TENSORS = (
    "pos",
    "vel",
    "prev_vel",
    "start",
    "goal",
    "yaw",
    "height_range",
    "step_count",
    "scan",
    "level",
    "held",
)
