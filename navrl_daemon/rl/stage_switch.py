"""The collector onto another curriculum stage's env: reset, or carrying the episodes in
flight over (env/curriculum.py builds the env; pipeline/curriculum.py says when), and
the curriculum's progress as a part of a checkpoint's collector state."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from navrl_daemon.env.contract import ResumableEnv
from navrl_daemon.env.curriculum import Curriculum
from navrl_daemon.rl.collector import Collector


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
