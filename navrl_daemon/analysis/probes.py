"""Probes of what a trained policy does, next to NavRL's evaluation. No I/O.

- `lidar_use`: does the policy read its LiDAR? The evaluation flown twice, once with the
  real scans and once with every scan zeroed ("nothing within range"), and along the real
  flight the gap between the policy's action and the one it would take blind: overall,
  and on the steps where a pillar is within 1.5 m (where it must steer). A policy that
  flies as well blind, or whose action does not change near pillars, has memorised a
  route rather than learned to avoid what it sees.
- `path_stats`: altitude and path shape of each outcome (reached / collided / out of bounds /
  timed out) from recorded trajectories: does it fly over the low pillars, detour, hover?
- `collision_hazard`: collisions per 100 m flown, and the collision share of episodes by
  their start-goal distance. A policy whose collisions grow with the distance it flies
  collides mid-flight at a rate per metre (what a 48 m crossing magnifies); one whose
  collisions do not grow with distance fails at the start or at the goal.
- `collision_approach`: how each collision of a static map happened: the drone's heading
  over its last steps against the direction to the pillar it hit (head-on, oblique or
  glancing), its speed, and that pillar's height. A policy that flies head-on into
  pillars it had seen for metres decided late; one that grazes them cut a corner.
- `pillar_pass`: a scripted scene, one pillar on the goal line and nothing else, shifted
  sideways by a few centimetres per drone: does the policy pass it, on which side, and how
  close? A policy that mirrors its choice with the pillar's offset (as `ppo.mirror`
  trains it to) has a tie near the line, where it may pass closer; one that keeps to one
  side has none.
- `goal_distance_use`: the evaluation flown again with the goal distance the policy reads
  (the state's d_xy, in metres and not normalised) capped at each of some distances. A
  policy trained on short hops that flies NavRL's 48 m crossing differently when it reads
  at most 16 m is reading a goal distance it never trained on.
- `goal_hover_share`: how training frames are spent. The env's own spawn rule flown with
  auto-reset and actions sampled as in training; the share of frames flown within reach
  of the goal. NavRL's reach is not terminal, so a drone that reached its goal hovers
  there until the time-out: frames that teach little once hovering is learned
  (`env.navigation.reach_hold` gives them to new flights).
"""

from __future__ import annotations

import statistics
from itertools import pairwise
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import Tensor
from torchrl.envs import EnvBase

from navrl_daemon.config import EnvConfig
from navrl_daemon.env import make_env
from navrl_daemon.env.contract import RecordableEnv, ScriptedScene
from navrl_daemon.env.navigation import COLLISION_DISTANCE, REACH_RADIUS
from navrl_daemon.env.navigation.lidar import LIDAR_RANGE
from navrl_daemon.errors import UsageError
from navrl_daemon.rl.evaluate import OUTCOMES, Trajectories, evaluate_op_by_op
from navrl_daemon.rl.policy import OBS_KEY, NavRLPolicy

LIDAR_KEY = (*OBS_KEY, "lidar")
STATE_KEY = (*OBS_KEY, "state")
GOAL_DISTANCE = 3  # the state's d_xy: [r̂_g (3), d_xy, d_z, v_g (3)]
# A LiDAR value above this (range 4 m minus distance) is a hit closer than 1.5 m.
NEAR_VALUE = 4.0 - 1.5


class BlindPolicy:
    """`policy` acting on observations whose LiDAR scan is all zeros (nothing in range)."""

    def __init__(self, policy: NavRLPolicy) -> None:
        self.policy = policy

    def act(self, td: TensorDictBase, deterministic: bool = False) -> TensorDictBase:
        td.set(LIDAR_KEY, torch.zeros_like(td.get(LIDAR_KEY)))
        return self.policy.act(td, deterministic)


class GoalDistanceCap:
    """`policy` acting on observations whose goal distance d_xy is at most `cap` metres
    (the env, and the drone's flight in it, are unchanged)."""

    def __init__(self, policy: NavRLPolicy, cap: float) -> None:
        self.policy = policy
        self.cap = cap

    def act(self, td: TensorDictBase, deterministic: bool = False) -> TensorDictBase:
        state = td.get(STATE_KEY).clone()
        state[..., GOAL_DISTANCE].clamp_(max=self.cap)
        td.set(STATE_KEY, state)
        return self.policy.act(td, deterministic)


class ActionGap:
    """`policy` acting normally, measuring on every step the gap (m/s, goal frame, 3D norm)
    between its Beta-mean action and the one it takes with the scan zeroed."""

    def __init__(self, policy: NavRLPolicy) -> None:
        self.policy = policy
        self.sums = torch.zeros(2, dtype=torch.float64)  # gap: all steps, near steps
        self.counts = torch.zeros(2, dtype=torch.float64)

    @torch.no_grad()
    def act(self, td: TensorDictBase, deterministic: bool = False) -> TensorDictBase:
        lidar = td.get(LIDAR_KEY)
        feature = self.policy.observe(td.clone().set(LIDAR_KEY, torch.zeros_like(lidar)))
        blind = self.policy.distribution(feature).mean
        td = self.policy.act(td, deterministic)
        gap = (td.get(("agents", "action_normalized")) - blind).norm(dim=-1)
        gap = (2.0 * self.policy.action_limit * gap).double().cpu()  # normalised → m/s
        near = (lidar.flatten(1).amax(-1) > NEAR_VALUE).cpu()
        self.sums += torch.stack((gap.sum(), gap[near].sum()))
        self.counts += torch.tensor([gap.numel(), int(near.sum())], dtype=torch.float64)
        return td

    def means(self) -> dict[str, float]:
        mean = (self.sums / self.counts.clamp_min(1)).tolist()
        return {
            "action_gap_mps": mean[0],
            "action_gap_near_mps": mean[1],
            "near_step_share": float(self.counts[1] / self.counts[0].clamp_min(1)),
        }


def lidar_use(env: EnvBase, policy: NavRLPolicy, *, seed: int, max_steps: int) -> dict[str, Any]:
    """The evaluation with the real scans (and the action gap along it) and blind."""
    gap = ActionGap(policy)  # op by op: its act reads the gap on the host every step
    seen = evaluate_op_by_op(env, gap, seed=seed, max_steps=max_steps)  # type: ignore[arg-type]
    blind = evaluate_op_by_op(env, BlindPolicy(policy), seed=seed, max_steps=max_steps)  # type: ignore[arg-type]
    keys = ("reach_goal", "collision", "truncated")
    return {
        **{k: seen[k] for k in keys},
        **{f"blind_{k}": blind[k] for k in keys},
        **gap.means(),
    }


def path_stats(traj: Trajectories, dt: float) -> dict[str, dict[str, float]]:
    """Per outcome: episodes, mean and max altitude (m), share of steps above 2.5 m (over
    the spawn band), mean speed (m/s), path length over the start-goal distance, and the
    horizontal distance left to the goal at the end (m)."""
    outcomes = traj.outcomes()
    lengths = flown_metres(traj).tolist()
    out: dict[str, dict[str, float]] = {}
    for outcome in OUTCOMES:
        rows = [i for i, o in enumerate(outcomes) if o == outcome]
        if not rows:
            continue
        per = [_one_path(traj, i, lengths[i], dt) for i in rows]
        out[outcome] = {
            "episodes": float(len(rows)),
            **{k: sum(p[k] for p in per) / len(per) for k in per[0]},
        }
    return out


def flown_metres(traj: Trajectories) -> torch.Tensor:
    """Path length [n] (m) of every drone from its start to the end of its episode (the
    positions after it, an auto-reset's jump included, are not flight)."""
    last = traj.positions.shape[0] - 1
    moved = (traj.positions[1:] - traj.positions[:-1]).norm(dim=-1)  # [T-1, n]
    alive = torch.arange(1, last + 1)[:, None] <= traj.steps.long().clamp(0, last)[None, :]
    return (moved * alive).sum(0)


def _one_path(traj: Trajectories, i: int, length: float, dt: float) -> dict[str, float]:
    steps = int(traj.steps[i])
    path = traj.positions[: steps + 1, i]  # [steps+1, 3]
    z = path[:, 2]
    straight = float((traj.goal[i] - path[0]).norm())
    duration = max(steps, 1) * dt
    return {
        "mean_z_m": float(z.mean()),
        "max_z_m": float(z.max()),
        "above_2_5m_share": float((z > 2.5).float().mean()),
        "speed_mps": length / duration,
        "path_over_straight": length / max(straight, 1e-6),
        "end_distance_xy_m": float((traj.goal[i, :2] - path[-1, :2]).norm()),
    }


# Start-goal distance bins (m) of `collision_hazard`; the last is open.
HAZARD_BINS = (0.0, 10.0, 20.0, 30.0)


def collision_hazard(traj: Trajectories, bins: tuple[float, ...] = HAZARD_BINS) -> dict[str, Any]:
    """Collisions per 100 m flown (path length of every drone until its episode ended) and,
    per bin of the horizontal start-goal distance, the episodes and their collision share."""
    outcomes = traj.outcomes()
    metres = float(flown_metres(traj).sum())
    collided = torch.tensor([o == "collided" for o in outcomes])
    distance = (traj.goal[:, :2] - traj.positions[0, :, :2]).norm(dim=-1)
    edges = [*bins, float("inf")]
    by_distance: dict[str, dict[str, float | None]] = {}
    for lo, hi in pairwise(edges):
        inside = (distance >= lo) & (distance < hi)
        count = int(inside.sum())
        name = f"{lo:g}-{hi:g}" if hi != float("inf") else f"{lo:g}-"
        share = float(collided[inside].float().mean()) if count else None
        by_distance[name] = {"episodes": float(count), "collision": share}
    return {
        "episodes": len(outcomes),
        "metres_flown": round(metres, 1),
        "collisions": int(collided.sum()),
        "collisions_per_100m": 100.0 * float(collided.sum()) / max(metres, 1e-6),
        "by_distance_m": by_distance,
    }


# `collision_approach`: cosines (heading against the direction to the pillar hit) at and
# above which a collision is head-on, below which it is glancing; steps the heading spans.
HEAD_ON_COS = 0.7
GLANCING_COS = 0.3
APPROACH_STEPS = 5


def collision_approach(traj: Trajectories, boxes: list[Tensor], dt: float) -> dict[str, Any]:
    """How the collided drones of a flight met their pillar. `boxes[m]` are map m's pillar
    boxes [B,5] (x0, y0, x1, y1, height). Per collision: the box nearest (in x-y) to the
    drone's last position; the horizontal heading over its last APPROACH_STEPS steps
    against the direction to that box's nearest point (cosine ≥ HEAD_ON_COS head-on,
    < GLANCING_COS glancing, oblique between) and its speed. A collision with no pillar
    within reach of a beam (the LiDAR's COLLISION_DISTANCE, plus 5 cm) is counted as
    `not_a_pillar` (a moving obstacle's, or the height band's)."""
    counts = dict.fromkeys(("head_on", "oblique", "glancing", "not_a_pillar"), 0)
    speeds: list[float] = []
    heights: list[float] = []
    for i, outcome in enumerate(traj.outcomes()):
        if outcome != "collided":
            continue
        end = int(traj.steps[i])
        p = traj.positions[end, i].double()
        back = min(end, APPROACH_STEPS)
        v = (p[:2] - traj.positions[end - back, i, :2].double()) / (max(back, 1) * dt)
        b = boxes[int(traj.map_id[i])].double()
        nearest = torch.stack(
            (
                torch.maximum(b[:, 0], torch.minimum(p[0], b[:, 2])),
                torch.maximum(b[:, 1], torch.minimum(p[1], b[:, 3])),
            ),
            -1,
        )  # [B,2]: each box's point closest to the drone
        gap = (nearest - p[:2]).norm(dim=-1)
        j = int(gap.argmin()) if len(gap) else -1
        if j < 0 or float(gap[j]) > COLLISION_DISTANCE + 0.05:
            counts["not_a_pillar"] += 1
            continue
        to = nearest[j] - p[:2]
        cos = float(v @ to) / max(float(v.norm() * to.norm()), 1e-9)
        kind = "head_on" if cos >= HEAD_ON_COS else "glancing" if cos < GLANCING_COS else "oblique"
        counts[kind] += 1
        speeds.append(float(v.norm()))
        heights.append(float(b[j, 4]))
    return {
        **counts,
        "speed_mps_median": _median(speeds),
        "pillar_height_m_median": _median(heights),
    }


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


# `pillar_pass`: the pillar's sideways offsets from the goal line (m) and the drone's
# start distances before it (m).
PASS_OFFSETS = tuple(round(-0.4 + 0.05 * k, 2) for k in range(17))
PASS_STARTS = (3.0, 6.0)


def pillar_pass_env(
    cfg: EnvConfig, drones: int = len(PASS_OFFSETS), device: str | torch.device = "cpu"
) -> EnvBase:
    """An env of `cfg`'s backend, dynamics and sensor with `drones` drones, each on a map of
    its own (the scene `pillar_pass` lays out), no moving obstacles and no curriculum."""
    scene = cfg.replaced(
        num_obstacles=1,
        map_levels=[],
        min_level=0,
        num_maps=drones,
        num_dynamic_obstacles=0,
        curriculum=[],
    )
    return make_env(scene, device=device, num_envs=drones, layout="navrl")


@torch.no_grad()
def pillar_pass(
    env: EnvBase,
    policy: NavRLPolicy,
    *,
    offsets: tuple[float, ...] = PASS_OFFSETS,
    starts: tuple[float, ...] = PASS_STARTS,
    width: float = 0.8,
    beyond: float = 8.0,
    altitude: float = 2.0,
) -> dict[str, Any]:
    """One square pillar `width` wide (5 m tall) centred `offsets[k]` m beside the goal
    line, drone k starting `start` m before it and its goal `beyond` m after it, at
    `altitude`, flown with deterministic actions (the evaluation's) for each of `starts`.
    `env` holds one drone per offset (`pillar_pass_env`). Per start and offset: collided,
    the shortest beam while flying (m), and the side it passed on (+1 / -1: the sign of its
    x less the pillar's centre where it crossed the pillar's line; 0 if it never did; x is
    left of the flight for a drone flying towards -y). Summary: collisions, the
    shortest beam of all, and `one_side_share`, the share of passes on the side taken most."""
    if not isinstance(env, ScriptedScene) or not isinstance(env, RecordableEnv):
        raise UsageError(
            "pillar_pass lays out a scene and records the drones' paths: this backend "
            "cannot (env/contract.py: ScriptedScene, RecordableEnv)"
        )
    n = len(offsets)
    if env.batch_size[0] != n or env.num_maps != n:
        raise ValueError(f"pillar_pass: one drone and one map per offset ({n}): pillar_pass_env")
    device = env.device
    off = torch.tensor(offsets, dtype=torch.float32, device=device)
    half = width / 2
    env.set_pillars([torch.tensor([[o - half, -half, o + half, half, 5.0]]) for o in offsets])
    speed = policy.action_limit  # the fastest the action flies along one axis (m/s)
    by_start: dict[str, dict[str, list[Any]]] = {}
    for start in starts:
        start_at = torch.zeros(n, 3, device=device)
        start_at[:, 1], start_at[:, 2] = start, altitude
        goal = start_at.clone()
        goal[:, 1] = -beyond
        td = env.place_drones(start_at, goal)
        ended = torch.zeros(n, dtype=torch.bool, device=device)
        collided = torch.zeros_like(ended)
        beam = torch.full((n,), float("inf"), device=device)
        side = torch.zeros(n, device=device)
        past = torch.zeros_like(ended)  # crossed the pillar's line (y = 0) while flying
        steps = int(2 * (start + beyond) / (speed * env.cfg.dt))  # 2x the fastest flight
        for _ in range(steps):
            record, td = env.step_and_maybe_reset(policy.act(td.copy(), deterministic=True))
            end = record.get(("next", "done")).reshape(-1) & ~ended
            hit = record.get(("next", "stats", "collision")).reshape(-1) > 0.5
            collided |= end & hit
            # The step's scan from its record (an ended drone's env is already reset).
            seen = LIDAR_RANGE - record.get(("next", *LIDAR_KEY)).flatten(1).amax(-1)
            beam = torch.where(ended, beam, torch.minimum(beam, seen))
            drones = env.whereabouts().drones
            cross = ~ended & ~end & ~past & (drones[:, 1] <= 0)
            side = torch.where(cross, torch.sign(drones[:, 0] - off), side)
            past |= cross
            ended |= end
            if bool((ended | (past & (drones[:, 1] < -2 * width))).all()):
                break
        by_start[f"{start:g}"] = {
            "collided": collided.tolist(),
            "shortest_beam_m": [round(v, 3) for v in beam.tolist()],
            "side": [int(v) for v in side.tolist()],
        }
    sides = [s for row in by_start.values() for s in row["side"] if s != 0]
    most = max(sides.count(1), sides.count(-1)) if sides else 0
    return {
        "offsets_m": list(offsets),
        "by_start_m": by_start,
        "collisions": sum(sum(row["collided"]) for row in by_start.values()),
        "shortest_beam_m": min(min(row["shortest_beam_m"]) for row in by_start.values()),
        "one_side_share": round(most / len(sides), 3) if sides else None,
    }


def goal_distance_use(
    env: EnvBase, policy: NavRLPolicy, caps: list[float], *, seed: int, max_steps: int
) -> dict[str, dict[str, float]]:
    """The evaluation's results with the goal distance the policy reads capped at each of
    `caps` metres (same env, seed and step cap as `evaluate`)."""
    return {
        f"{cap:g}": evaluate_op_by_op(
            env,
            GoalDistanceCap(policy, cap),
            seed=seed,
            max_steps=max_steps,  # type: ignore[arg-type]
        )
        for cap in caps
    }


@torch.no_grad()
def goal_hover_share(env: EnvBase, policy: NavRLPolicy, *, steps: int, seed: int) -> dict[str, Any]:
    """`steps` steps of the env's own episodes (auto-reset, actions sampled from `seed`);
    over the second half (the first starts every episode at once): the share of frames
    flown within REACH_RADIUS of the goal, and the episodes that ended and reached."""
    if not isinstance(env, RecordableEnv):
        raise UsageError(
            "goal_hover_share reads where the drones and their goals are: this backend "
            "cannot (env/contract.py: RecordableEnv)"
        )
    env.set_seed(seed)
    generator = torch.Generator(env.device).manual_seed(seed)
    td = env.reset()
    # Over the second half: [frames near the goal, episodes ended, of those reached].
    counts = torch.zeros(3, device=env.device)
    half = steps // 2
    for step in range(steps):
        td = policy.act(td, generator=generator)
        record, td = env.step_and_maybe_reset(td)
        if step < half:
            continue
        now = env.whereabouts()
        near = (now.goals - now.drones).norm(dim=-1) < REACH_RADIUS
        done = record.get(("next", "done")).reshape(-1)
        reached = record.get(("next", "stats", "reach_goal")).reshape(-1) > 0
        counts += torch.stack((near.sum(), done.sum(), (done & reached).sum())).float()
    frames_near, episodes, reached_goal = counts.tolist()
    return {
        "frames_at_goal": round(frames_near / ((steps - half) * env.batch_size[0]), 4),
        "steps": steps,
        "envs": env.batch_size[0],
        "episodes": int(episodes),
        "reached": int(reached_goal),
    }
