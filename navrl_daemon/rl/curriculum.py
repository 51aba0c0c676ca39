"""The training curriculum (`env.curriculum`) in one place: its rules, its state, the
switch of the training env to another stage, its part of a checkpoint, and evaluation at
a stage. Env stages, easiest first, each left for the next once enough evaluations in a
row pass its promotion rule.

A stage is the env section with a few keys replaced (obstacle counts, dynamic obstacle
speeds, goal distance, spawn rule, episode length: `config.CurriculumStage`). Two stages
of the pipeline each own a `Curriculum` and never touch the other's:

- the evaluator's counts every evaluation result (`observe`), decides the stage training
  should be at and counts the passes in a row (`progress`), and evaluates at that stage
  (`StageEvaluation`); after each result it sends its `progress` to the producer, a typed
  message (pipeline/messages.py: `CurriculumProgress`);
- the producer's takes the newest message between two rollouts (`received`), and when
  its stage is not the one the training env is built at (`applied`), switches the env
  (`use_stage`). Its state is the one a checkpoint keeps (`CurriculumState`).

`progress` is replaced whole, never mutated, so a snapshot taken from a worker thread
reads a consistent one. No I/O, no asyncio.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torchrl.envs import EnvBase

from navrl_daemon.config import Config, EnvConfig, PromotionRule
from navrl_daemon.env import make_env
from navrl_daemon.env.contract import DensityLevels, ResumableEnv
from navrl_daemon.rl import evaluate
from navrl_daemon.rl.collector import Collector
from navrl_daemon.rl.evaluations import Evaluations
from navrl_daemon.rl.policy import NavRLPolicy

# Stage keys (by their plain names) that act only where an episode starts (spawns) or on
# how it is scored and ended, never on the world a running episode flies in: with
# `env.stage_switch = "episodes"`, a switch between stages that differ in these alone lets
# the episodes in flight finish. Obstacle counts and speeds, and min_level (it moves envs
# to denser maps), change the world: a switch that changes them resets every env.
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

        With `env.navigation.map_levels`, each env keeps the density level it reached in `previous`
        (the stage's env before), so a promotion changes the stage's keys without sending
        every env back to the sparsest level; envs below the stage's `min_level` move up
        to it."""
        env = make_env(self.env_config(stage), device=device, seed=seed, **kwargs)
        if (
            self.env.navigation.map_levels
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
        before = self.env_config(from_stage).plain()
        after = self.env_config(to_stage).plain()
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

    def received(self, progress: Progress) -> None:
        """The evaluator's newest decision, as its message carried it (the producer's)."""
        self.progress = progress

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

    def copy(self) -> Curriculum:
        """The same rules at the same progress, for another stage to own."""
        twin = Curriculum(self.env)
        twin.load_state_dict(self.state_dict())
        return twin

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint keeps: the progress and the stage the training env was at."""
        return {**asdict(self.progress), "applied": self.applied}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """A stage past the end (the curriculum was shortened since) becomes the last one."""
        stage = min(int(state["stage"]), self.last)
        streak = int(state["streak"]) if stage == int(state["stage"]) else 0
        self.progress = Progress(stage, streak, int(state["last_eval"]))
        self.applied = min(int(state["applied"]), self.last)


def progress_kept(
    saved: list[dict[str, Any]], now: list[dict[str, Any]], progress: dict[str, int]
) -> dict[str, int] | None:
    """A checkpoint's curriculum progress for a run whose env section changed: kept when
    the stages up to the one reached still train the same (names and promotion rules
    aside), so other env keys, later stages or the current stage's rule may change; the
    streak restarts when that rule changed. None (stage 0 anew) when a stage the run went
    through, or the one it is at, trains differently now."""
    stage = int(progress["stage"])
    if stage >= len(now) or _training(saved[: stage + 1]) != _training(now[: stage + 1]):
        return None
    same_rule = saved[stage].get("promote") == now[stage].get("promote")
    return {**progress, "streak": int(progress["streak"]) if same_rule else 0, "applied": 0}


def _training(stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What each stage trains on: its env keys, without its name and promotion rule."""
    return [{k: v for k, v in s.items() if k not in ("name", "promote")} for s in stages]


def use_stage(
    collector: Collector, curriculum: Curriculum, stage: int, carry: bool = False
) -> bool:
    """Put the collector on a fresh env of curriculum `stage`: reset, or with `carry`
    holding the episodes in flight (the old env's whole state copied in, the running td
    kept), which then end by the new stage's rules and start its episodes at their next
    reset. A backend that is no `ResumableEnv` resets. Returns whether episodes carried."""
    old = collector.env
    env = curriculum.build_env(stage, device=old.device, seed=collector.cfg.run.seed, previous=old)
    carried = False
    if carry and isinstance(old, ResumableEnv) and isinstance(env, ResumableEnv):
        env.load_state_dict_env(old.state_dict_env())
        collector.env, carried = env, True
    else:
        collector.env, collector.td = env, env.reset()
    curriculum.applied = stage
    return carried


class CurriculumState:
    """The curriculum's progress as a part of the collector's state: loading it puts the
    training env at the stage the file's was at, so that the env's state loads into an
    env of the stage it was saved at."""

    def __init__(self, curriculum: Curriculum, collector: Collector) -> None:
        self.curriculum = curriculum
        self.collector = collector

    def state_dict(self) -> dict[str, int]:
        return self.curriculum.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.curriculum.load_state_dict(state)
        if self.curriculum.applied != 0:
            use_stage(self.collector, self.curriculum, self.curriculum.applied)


class StageEvaluation:
    """`evaluate` at the curriculum's current stage, on an eval env rebuilt when the stage
    changes; the result says which stage it was (`curriculum_stage`)."""

    def __init__(self, cfg: Config, curriculum: Curriculum, device: Any) -> None:
        self.cfg = cfg
        self.curriculum = curriculum
        self.device = device
        self._evaluations: tuple[int, Evaluations] | None = None  # stage, its evaluations

    def __call__(
        self, policy: NavRLPolicy, *, progress: evaluate.Progress | None = None
    ) -> dict[str, Any]:
        stage, evaluations = self._at_stage()
        return {**evaluations(policy, progress=progress), "curriculum_stage": stage}

    @property
    def recordable(self) -> bool:
        """Whether `recorded` can run: asked once, at wiring, with `log.video_interval`."""
        return self._at_stage()[1].recordable

    def recorded(
        self, policy: NavRLPolicy, *, progress: evaluate.Progress | None = None
    ) -> tuple[dict[str, Any], evaluate.Trajectories]:
        stage, evaluations = self._at_stage()
        results, traj = evaluations.recorded(policy, progress=progress)
        return {**results, "curriculum_stage": stage}, traj

    def _at_stage(self) -> tuple[int, Evaluations]:
        """The curriculum's stage and its evaluations (built anew when it changed)."""
        stage = self.curriculum.stage
        if self._evaluations is None or self._evaluations[0] != stage:
            cfg = self.cfg.model_copy(update={"env": self.curriculum.env_config(stage)})
            self._evaluations = (stage, Evaluations(cfg, self.device))
        return self._evaluations
