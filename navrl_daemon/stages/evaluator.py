"""Evaluator: NavRL's evaluation of the newest published weights, off the training path.

It has its own env (same map as training) and its own policy copy; its work runs on the
compute thread it is given (on CPU the one training uses, so evaluation costs training
exactly its own compute); its input channel coalesces, so a slow evaluation skips versions instead
of slowing the trainer. Results go to `eval/results.jsonl` (one fsynced line each), the
log, and an optional output channel (the checkpoint writer's keep-best).

With a curriculum (env/curriculum.py) it evaluates at the curriculum's current stage
(`StageEvaluation` rebuilds the eval env when the stage changes; `eval.layout` still
chooses the spawn rule), and feeds every result to the curriculum, which decides
promotions; the producer applies them between rollouts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import structlog

from navrl_daemon.config import Config
from navrl_daemon.env.curriculum import Curriculum
from navrl_daemon.rl.evaluate import Evaluation
from navrl_daemon.rl.policy import NavRLPolicy
from navrl_daemon.rl.training import eval_steps, make_eval_env
from navrl_daemon.runtime.channels import Receiver, Sender
from navrl_daemon.runtime.compute import ComputeThread
from navrl_daemon.runtime.supervisor import Shutdown
from navrl_daemon.stages.messages import PolicyWeights
from navrl_daemon.storage.atomic import append_line

log = structlog.get_logger("evaluator")


class Evaluator:
    name = "evaluator"

    def __init__(
        self,
        policy: NavRLPolicy,
        evaluate: Callable[[NavRLPolicy], dict[str, Any]],
        weights: Receiver[PolicyWeights],
        *,
        results_path: Path,
        shutdown: Shutdown,
        compute: ComputeThread,
        results: Sender[dict[str, Any]] | None = None,
        on_result: Callable[[dict[str, Any]], None] = lambda _: None,
        curriculum: Curriculum | None = None,
    ) -> None:
        self.policy = policy
        self.evaluate = evaluate
        self.weights = weights
        self.results_path = results_path
        self.results = results
        self.on_result = on_result
        self.shutdown = shutdown
        self.compute = compute
        self.curriculum = curriculum

    async def run(self) -> None:
        try:
            async for weights in self.weights:
                if self.shutdown.stopping:
                    continue  # drain without evaluating: shutting down
                structlog.contextvars.bind_contextvars(
                    iteration=weights.version, policy_version=weights.version
                )
                record = await self.compute.run(self._evaluate, weights)
                await anyio.to_thread.run_sync(append_line, self.results_path, json.dumps(record))
                log.info("evaluation", **record)
                if self.curriculum is not None:
                    self._promote(self.curriculum, record)
                self.on_result(record)
                if self.results is not None:
                    await self.results.send(record)
        finally:
            if self.results is not None:
                self.results.close()

    def _evaluate(self, weights: PolicyWeights) -> dict[str, Any]:
        self.policy.load_state_dict(weights.state)
        t0 = time.perf_counter()
        results = self.evaluate(self.policy)
        return {
            "iteration": weights.version,
            "frames": weights.frames,
            "policy_version": weights.version,
            "time": time.time(),
            "seconds": round(time.perf_counter() - t0, 3),
            **results,
        }

    def _promote(self, curriculum: Curriculum, record: dict[str, Any]) -> None:
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

    async def flush(self, deadline: float) -> None:
        """Every result is appended and fsynced as it is made: nothing left to write."""


class StageEvaluation:
    """`evaluate` at the curriculum's current stage, on an eval env rebuilt when the stage
    changes; the result says which stage it was (`curriculum_stage`)."""

    def __init__(self, cfg: Config, curriculum: Curriculum, device: Any) -> None:
        self.cfg = cfg
        self.curriculum = curriculum
        self.device = device
        self._evaluation: tuple[int, Evaluation] | None = None  # stage, its evaluation

    def __call__(self, policy: NavRLPolicy) -> dict[str, Any]:
        stage = self.curriculum.stage
        if self._evaluation is None or self._evaluation[0] != stage:
            cfg = self.cfg.model_copy(update={"env": self.curriculum.env_config(stage)})
            env = make_eval_env(cfg, self.device)
            evaluation = Evaluation.for_env(env, seed=cfg.eval.seed, max_steps=eval_steps(cfg))
            self._evaluation = (stage, evaluation)
        results = self._evaluation[1](policy)
        return {**results, "curriculum_stage": stage}


def read_results(path: Path) -> Iterator[dict[str, Any]]:
    """The rows of `eval/results.jsonl` in order, skipping a torn last line (kill -9)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "iteration" in row:
            yield row


def eval_scores(path: Path) -> dict[int, float]:
    """reach_goal by iteration from the earlier evaluations in `path` (keep_best)."""
    scores: dict[int, float] = {}
    for row in read_results(path):
        try:
            scores[int(row["iteration"])] = float(row["reach_goal"])
        except (KeyError, TypeError, ValueError):
            continue
    return scores
