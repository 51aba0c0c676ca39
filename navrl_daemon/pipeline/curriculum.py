"""The curriculum (env/curriculum.py) in the pipeline: the evaluator's results promote
it (`promote`), and the producer follows it between rollouts (`CurriculumFollower`).

Before each rollout the producer hands the follower the stage the ranks agreed on (one
process: its own); when that is not the stage the training env is built at, the follower
builds that stage's env and resets it, so the rollout starts fresh episodes there (the
episodes running in the old env are dropped, their stats never counted). With
`env.stage_switch = "episodes"` (and stages that differ only in per-episode keys) the
new env takes over the old one's state instead: the episodes in flight finish, and each
env starts the new stage's episodes at its next reset. The stage
travels in the collector state (rl/stage_switch.py's `CurriculumState`), so a resumed run
trains at the stage it stopped at.
Without a curriculum the producer has a `NoCurriculum`, which votes for stage 0 and
does nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import structlog

from navrl_daemon.env.curriculum import Curriculum
from navrl_daemon.rl.collector import Collector
from navrl_daemon.rl.stage_switch import use_stage
from navrl_daemon.runtime.compute import ComputeThread

log = structlog.get_logger("curriculum")


class CurriculumFollower:
    def __init__(
        self,
        curriculum: Curriculum,
        collector: Collector,
        compute: ComputeThread,
        on_stage: Callable[[int], None] = lambda _: None,
    ) -> None:
        self.curriculum = curriculum
        self.collector = collector
        self.compute = compute
        self.on_stage = on_stage  # the training env is now at this stage
        self._agreed: int | None = None

    @property
    def stage(self) -> int:
        """The stage this process wants training at (its evaluator's decision)."""
        return self.curriculum.stage

    def agreed(self, stage: int) -> None:
        """The ranks agreed to train at `stage` from the next rollout on (never back)."""
        self.curriculum.follow(stage)
        self._agreed = stage

    async def before_rollout(self, iteration: int) -> None:
        """Put the collector on the agreed stage's env, if it is not on it already."""
        curriculum = self.curriculum
        # Every rank applies the stage they voted for at this rollout, not its own newest
        # (rank 0's evaluator may have promoted since the vote).
        stage = curriculum.stage if self._agreed is None else self._agreed
        if stage == curriculum.applied:
            return
        carry = curriculum.carries_episodes(curriculum.applied, stage)
        carried = await self.compute.run(use_stage, self.collector, curriculum, stage, carry)
        log.info(
            "curriculum stage applied",
            iteration=iteration,  # the first rollout at the new stage
            stage=stage,
            name=curriculum.name(stage),
            env=curriculum.stages[stage].env_overrides(),
            episodes="carried" if carried else "reset",
        )
        self.on_stage(stage)


class NoCurriculum:
    """The follower of a run without a curriculum: one env, stage 0, nothing to keep."""

    stage = 0

    def agreed(self, stage: int) -> None:
        pass

    async def before_rollout(self, iteration: int) -> None:
        pass


def promote(curriculum: Curriculum, record: Mapping[str, Any]) -> None:
    """Feed an evaluation result to the curriculum, which decides promotions (the
    producer applies them between rollouts); a promotion is logged."""
    promotion = curriculum.observe(record)
    if promotion is None:
        return
    rule = curriculum.stages[promotion.from_stage].promote
    log.info(
        "curriculum promotion",
        from_stage=promotion.from_stage,
        to_stage=promotion.to_stage,
        name=curriculum.name(promotion.to_stage),
        rule=rule.model_dump() if rule else None,
        **promotion.result,
    )
