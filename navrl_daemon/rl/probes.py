"""Probes of what a trained policy does (issue #23), next to NavRL's evaluation. No I/O.

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
- `goal_distance_use`: the evaluation flown again with the goal distance the policy reads
  (the state's d_xy, in metres and not normalised) capped at each of some distances. A
  policy trained on short hops that flies NavRL's 48 m crossing differently when it reads
  at most 16 m is reading a goal distance it never trained on.
- `goal_hover_share`: how training frames are spent. The env's own spawn rule flown with
  auto-reset and actions sampled as in training; the share of frames flown within reach
  of the goal. NavRL's reach is not terminal, so a drone that reached its goal hovers
  there until the time-out: frames that teach little once hovering is learned
  (`env.reach_hold` gives them to new flights).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.envs import EnvBase

from navrl_daemon.env.navigation import REACH_RADIUS
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
        near = (env.goal - env.pos).norm(dim=-1) < REACH_RADIUS
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
