"""The training curriculum (`env.curriculum`): env stages, easiest first, each
left for the next once enough evaluations in a row pass its promotion rule.

A stage is the env section with a few keys replaced (obstacle counts, dynamic obstacle
speeds, goal distance, spawn rule, episode length: `config.CurriculumStage`). One
`Curriculum` object is shared by two stages of the pipeline, each writing its own half:

- the evaluator feeds it every evaluation result (`observe`), which decides the stage
  training should be at (`stage`) and counts the passes in a row (`streak`);
- the producer, between two rollouts, sees `stage != applied`, builds the env of the new
  stage, resets it and sets `applied`.

Both run on the event loop thread, so nothing here needs a lock; `progress` is replaced
whole, never mutated, so a snapshot taken from a worker thread reads a consistent one.
No I/O, no asyncio.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torchrl.envs import EnvBase

from navrl_daemon.config import EnvConfig, PromotionRule
from navrl_daemon.env import make_env
from navrl_daemon.env.contract import DensityLevels

# Stage keys that act only where an episode starts (spawns) or on how it is scored and
# ended, never on the world a running episode flies in: with `env.stage_switch =
# "episodes"`, a switch between stages that differ in these alone lets the episodes in
# flight finish. Obstacle counts and speeds, and min_level (it moves envs to denser maps),
# change the world: a switch that changes them resets every env.
PER_EPISODE_KEYS = frozenset(
    {
        "spawn",
        "spawn_margin",
        "spawn_height",
        "goal_distance",
        "crossing_share",
        "max_episode_length",
        "reach_hold",
        "safety_weight",
    }
)


@dataclass(frozen=True)
class Progress:
    # The stage training should be at (the evaluator's decision).
    stage: int = 0
    # Evaluations in a row at `stage` that passed its promotion rule.
    streak: int = 0
    # Iteration of the newest evaluation counted (-1: none yet).
    last_eval: int = -1


@dataclass(frozen=True)
class Promotion:
    iteration: int
    from_stage: int
    to_stage: int
    result: dict[str, float]


def passes(rule: PromotionRule, result: Mapping[str, Any]) -> bool:
    """One evaluation against a stage's rule (a NaN fails: it says nothing)."""
    reach, collision = float(result["reach_goal"]), float(result["collision"])
    return reach >= rule.reach_goal and collision <= rule.collision


class Curriculum:
    def __init__(self, env: EnvConfig) -> None:
        if not env.curriculum:
            raise ValueError("env.curriculum is empty: no curriculum to follow")
        self.env = env
        self.stages = env.curriculum
        self.progress = Progress()
        # The stage the training env is built at (the producer's, or a resume's).
        self.applied = 0

    @property
    def stage(self) -> int:
        return self.progress.stage

    @property
    def last(self) -> int:
        return len(self.stages) - 1

    def name(self, stage: int) -> str:
        return self.stages[stage].name or f"stage {stage}"

    def env_config(self, stage: int) -> EnvConfig:
        """The env section as it reads at `stage`."""
        return self.env.stage_env(stage)

    def build_env(
        self,
        stage: int,
        *,
        device: str | torch.device,
        seed: int,
        previous: EnvBase | None = None,
        **kwargs: Any,
    ) -> EnvBase:
        """A fresh env of `stage` (same seed: its maps are the ones a run starting there gets).

        With `env.map_levels`, each env keeps the density level it reached in `previous`
        (the stage's env before), so a promotion changes the stage's keys without sending
        every env back to the sparsest level; envs below the stage's `min_level` move up
        to it."""
        env = make_env(self.env_config(stage), device=device, seed=seed, **kwargs)
        if (
            self.env.map_levels
            and isinstance(previous, DensityLevels)
            and isinstance(env, DensityLevels)
            and env.level.shape == previous.level.shape
        ):
            env.level.copy_(previous.level.clamp_min(env.min_level))
        return env

    def carries_episodes(self, from_stage: int, to_stage: int) -> bool:
        """Whether a switch from `from_stage` to `to_stage` lets the episodes in flight
        finish (`env.stage_switch = "episodes"` and no world key differs)."""
        if self.env.stage_switch != "episodes":
            return False
        before = self.env_config(from_stage).model_dump()
        after = self.env_config(to_stage).model_dump()
        return all(before[k] == after[k] for k in before if k not in PER_EPISODE_KEYS)

    def observe(self, result: Mapping[str, Any]) -> Promotion | None:
        """Count one evaluation result (`iteration`, `reach_goal`, `collision`, and the
        `curriculum_stage` it was evaluated at). Results already counted, or evaluated at
        another stage than the current one, change nothing but `last_eval`."""
        p = self.progress
        iteration = int(result["iteration"])
        if iteration <= p.last_eval:
            return None
        rule = self.stages[p.stage].promote
        if rule is None or int(result.get("curriculum_stage", p.stage)) != p.stage:
            self.progress = Progress(p.stage, p.streak, iteration)
            return None
        streak = p.streak + 1 if passes(rule, result) else 0
        if streak < rule.evals:
            self.progress = Progress(p.stage, streak, iteration)
            return None
        self.progress = Progress(p.stage + 1, 0, iteration)
        scores = {k: float(result[k]) for k in ("reach_goal", "collision")}
        return Promotion(iteration, p.stage, p.stage + 1, scores)

    def follow(self, stage: int) -> None:
        """Training moves to `stage` because another rank's evaluator promoted it (a
        distributed run: rank 0 alone evaluates). Never backwards."""
        if stage > self.progress.stage:
            self.progress = Progress(min(stage, self.last), 0, self.progress.last_eval)

    def replay(self, results: Iterable[Mapping[str, Any]], *, upto: int) -> list[Promotion]:
        """Count the results of evaluations up to iteration `upto` that a checkpoint's
        progress missed (they finished after it was taken). Where a crash made an
        iteration appear twice, its last result counts."""
        newest: dict[int, Mapping[str, Any]] = {}
        for row in results:
            if int(row["iteration"]) <= upto:
                newest[int(row["iteration"])] = row
        promotions = [self.observe(newest[i]) for i in sorted(newest)]
        return [p for p in promotions if p is not None]

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint keeps: the progress and the stage the training env was at."""
        return {**asdict(self.progress), "applied": self.applied}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """A stage past the end (the curriculum was shortened since) becomes the last one."""
        stage = min(int(state["stage"]), self.last)
        streak = int(state["streak"]) if stage == int(state["stage"]) else 0
        self.progress = Progress(stage, streak, int(state["last_eval"]))
        self.applied = min(int(state["applied"]), self.last)
