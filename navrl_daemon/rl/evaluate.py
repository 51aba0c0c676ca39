"""NavRL's evaluation (navrl-task §4): Beta-mean actions, each env's first episode. No I/O."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torchrl.envs import EnvBase
from torchrl.envs.utils import step_mdp

from navrl_daemon.env.navigation import NavigationEnv
from navrl_daemon.rl.policy import NavRLPolicy
from navrl_daemon.rl.rollout import STAT_KEYS


@dataclass(frozen=True)
class Trajectories:
    """Each drone's first episode of an evaluation on the embedded env, on the CPU.

    positions [T+1,N,3] m (row 0: the start; row t: after step t); drone i's episode is
    rows 0..steps[i]. stats [N,len(STAT_KEYS)]: its first-episode stats (as `evaluate`
    averages them). map_id [N]: the map each drone flew on. Of map 0 only (a plot shows one
    map; recording all of NavRL's up to 1024 maps would cost gigabytes): dynamic [T+1,D,3]
    the moving obstacles, dynamic_size [D,3] their (width, width, height), pillars [B,5]
    the boxes (x0, y0, x1, y1, height).
    """

    positions: Tensor
    steps: Tensor
    goal: Tensor
    map_id: Tensor
    stats: Tensor
    dynamic: Tensor
    dynamic_size: Tensor
    pillars: Tensor
    field_size: float
    num_maps: int

    def outcomes(self) -> list[str]:
        """Per drone: "collided", else "reached" (within the goal radius at its end), else
        "timed out" (truncated, or still flying when the evaluation stopped)."""
        reach = self.stats[:, STAT_KEYS.index("reach_goal")] > 0.5
        collision = self.stats[:, STAT_KEYS.index("collision")] > 0.5
        return [
            "collided" if c else "reached" if r else "timed out"
            for r, c in zip(reach.tolist(), collision.tolist(), strict=True)
        ]


# Told (steps done, envs whose first episode has finished) every CHECK_EVERY steps.
Progress = Callable[[int, int], None]
CHECK_EVERY = 16  # steps between the host syncs that check whether every env finished


@torch.no_grad()
def evaluate(
    env: EnvBase,
    policy: NavRLPolicy,
    *,
    seed: int,
    max_steps: int,
    progress: Progress | None = None,
) -> dict[str, float]:
    """Mean stats over the envs' first episodes.

    The env is reseeded and fully reset, so the same weights always give the same numbers.
    Stepping stops once every env has finished its first episode (later steps cannot change
    the result). An env still running after `max_steps` reports its stats so far and counts
    in `unfinished`.
    """
    return _evaluate(env, policy, seed=seed, max_steps=max_steps, recorder=None, progress=progress)


@torch.no_grad()
def evaluate_recorded(
    env: NavigationEnv,
    policy: NavRLPolicy,
    *,
    seed: int,
    max_steps: int,
    progress: Progress | None = None,
) -> tuple[dict[str, float], Trajectories]:
    """`evaluate`, plus every drone's path and the obstacles (the embedded env only): the
    same numbers as `evaluate`, at the cost of a copy of the positions per step."""
    recorder = _Recorder(env)
    results = _evaluate(
        env, policy, seed=seed, max_steps=max_steps, recorder=recorder, progress=progress
    )
    return results, recorder.trajectories()


def _evaluate(
    env: EnvBase,
    policy: NavRLPolicy,
    *,
    seed: int,
    max_steps: int,
    recorder: _Recorder | None,
    progress: Progress | None,
) -> dict[str, float]:
    env.set_seed(seed)
    td = env.reset()
    n = env.batch_size[0]
    first = torch.zeros(n, len(STAT_KEYS), device=env.device)
    finished = torch.zeros(n, dtype=torch.bool, device=env.device)
    last = first
    if recorder is not None:
        recorder.start()
    for step in range(max_steps):
        td = policy.act(td, deterministic=True)
        if recorder is None:
            record, td = env.step_and_maybe_reset(td)
        else:
            # step_and_maybe_reset split in two: the positions are read before the reset.
            record = env.step(td)
            recorder.step(finished)
            td = env.maybe_reset(step_mdp(record))
        last = torch.cat([record["next", "stats", k] for k in STAT_KEYS], dim=-1)
        newly = record["next", "done"].squeeze(-1) & ~finished
        first[newly] = last[newly]
        finished |= newly
        if step % CHECK_EVERY == CHECK_EVERY - 1:  # a host sync: not every step
            done = int(finished.sum())
            if progress is not None:
                progress(step + 1, done)
            if done == n:
                break
    first[~finished] = last[~finished]
    if recorder is not None:
        recorder.stats = first
    means = first.mean(dim=0).tolist()
    return {
        "episodes": n,
        **dict(zip(STAT_KEYS, means, strict=True)),
        "unfinished": int((~finished).sum()),
    }


def eval_rank(record: dict[str, Any]) -> tuple[float, float, float, float]:
    """How evaluation results compare (higher is better): the later curriculum stage (a
    harder task), then reach_goal, then fewer collisions, then the later iteration. The
    one rule for `export/best.pt`, `checkpoints list` and the report's best evaluation."""

    def number(key: str) -> float:
        v = record.get(key)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0

    return (
        number("curriculum_stage"),
        number("reach_goal"),
        -number("collision"),
        number("iteration"),
    )


class _Recorder:
    """Reads the embedded env's state between step and reset."""

    def __init__(self, env: NavigationEnv) -> None:
        self.env = env
        self.positions: list[Tensor] = []
        self.dynamic: list[Tensor] = []
        self.steps = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)
        self.goal = env.goal
        self.stats: Tensor | None = None

    def start(self) -> None:
        self.positions = [self.env.pos.clone()]
        self.goal = self.env.goal.clone()  # the first episodes' (a reset draws new ones)
        self.dynamic = [self.env.dynamic.pos[0].clone()]

    def step(self, finished: Tensor) -> None:
        """After a step; `finished`: drones whose first episode ended before this step."""
        self.positions.append(self.env.pos.clone())
        self.dynamic.append(self.env.dynamic.pos[0].clone())
        self.steps += (~finished).long()

    def trajectories(self) -> Trajectories:
        env = self.env
        assert self.stats is not None, "trajectories() before the evaluation ran"
        return Trajectories(
            positions=torch.stack(self.positions).cpu(),
            steps=self.steps.cpu(),
            goal=self.goal.cpu(),
            map_id=env.map_id.cpu(),
            stats=self.stats.cpu(),
            dynamic=torch.stack(self.dynamic).cpu(),
            dynamic_size=env.dynamic.size.cpu(),
            pillars=env.pillars.boxes(0),
            field_size=env.cfg.field_size,
            num_maps=env.num_maps,
        )
