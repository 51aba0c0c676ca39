"""Evaluator: NavRL's evaluation of the newest published weights, off the training path.

It has its own env (same map as training) and its own policy copy; its work runs on the
compute thread it is given (on CPU the one training uses, so evaluation costs training
exactly its own compute); its input channel coalesces, so a slow evaluation skips versions instead
of slowing the trainer. Results go to `eval/results.jsonl` (one fsynced line each), the
log, and an optional output channel (the checkpoint writer's keep-best).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import structlog

from navrl_daemon.rl.policy import NavRLPolicy
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
    ) -> None:
        self.policy = policy
        self.evaluate = evaluate
        self.weights = weights
        self.results_path = results_path
        self.results = results
        self.on_result = on_result
        self.shutdown = shutdown
        self.compute = compute

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

    async def flush(self, deadline: float) -> None:
        """Every result is appended and fsynced as it is made: nothing left to write."""
