"""NavRL's evaluation as a run uses it: the eval section's envs, built once, and the
held-out maps beside them. No I/O."""

from __future__ import annotations

from typing import Any

import torch
from torchrl.envs import EnvBase

from navrl_daemon.config import Config
from navrl_daemon.env import make_env
from navrl_daemon.env.contract import RecordableEnv
from navrl_daemon.rl.eval_config import eval_env_config, eval_steps
from navrl_daemon.rl.evaluate import Evaluation, Progress, Trajectories, evaluate_recorded
from navrl_daemon.rl.policy import NavRLPolicy


def make_eval_env(
    cfg: Config, device: str | torch.device, *, map_seed: int | None = None
) -> EnvBase:
    """The evaluation's env: the whole map (no density levels), `eval.num_maps` maps drawn
    from `map_seed` (default `eval.map_seed`; -1 there: run.seed, the training maps).

    An `eval.max_steps` above the env's `max_episode_length` lengthens the evaluation's
    episodes to it: a curriculum stage of short training episodes is still evaluated on
    NavRL's whole crossing (below it, the evaluation stops early, episodes unfinished)."""
    if map_seed is None:
        map_seed = cfg.eval.map_seed if cfg.eval.map_seed >= 0 else cfg.run.seed
    return make_env(
        eval_env_config(cfg),
        device=device,
        seed=map_seed,
        num_envs=cfg.eval.num_envs,
        layout=cfg.eval.layout,
    )


class Evaluations:
    """NavRL's evaluation (an `Evaluation`: captured where the env's steps are) on the eval
    section's maps and, with `eval.held_out_seed`, again on maps of that seed, reported as
    `held_out_<stat>`. Built once and called with each policy (one capture per env)."""

    def __init__(self, cfg: Config, device: str | torch.device) -> None:
        def on(env: EnvBase) -> Evaluation:
            return Evaluation.for_env(env, seed=cfg.eval.seed, max_steps=eval_steps(cfg))

        self.main = on(make_eval_env(cfg, device))
        held_out = cfg.eval.held_out_seed
        self.held_out = on(make_eval_env(cfg, device, map_seed=held_out)) if held_out >= 0 else None

    def __call__(self, policy: NavRLPolicy, *, progress: Progress | None = None) -> dict[str, Any]:
        return self._held_out(self.main(policy, progress), policy, progress)

    @property
    def recordable(self) -> bool:
        """Whether `recorded` can run: the main maps' env is a `RecordableEnv`."""
        return isinstance(self.main.env, RecordableEnv)

    def recorded(
        self, policy: NavRLPolicy, *, progress: Progress | None = None
    ) -> tuple[dict[str, Any], Trajectories]:
        """The same evaluation with the main maps' paths recorded (`evaluate_recorded`: op
        by op, the same numbers), for a video. A `RecordableEnv` only."""
        env = self.main.env
        if not isinstance(env, RecordableEnv):
            raise TypeError(f"a recorded evaluation needs a RecordableEnv, not {type(env)}")
        main = self.main
        results, traj = evaluate_recorded(
            env, policy, seed=main.seed, max_steps=main.max_steps, progress=progress
        )
        return self._held_out(results, policy, progress), traj

    def _held_out(
        self, results: dict[str, Any], policy: NavRLPolicy, progress: Progress | None
    ) -> dict[str, Any]:
        """`results` and, with `eval.held_out_seed`, the held-out maps' as `held_out_<stat>`."""
        if self.held_out is not None:
            other = self.held_out(policy, progress)
            results.update({f"held_out_{k}": v for k, v in other.items()})
        return results
