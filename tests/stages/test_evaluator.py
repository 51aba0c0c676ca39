"""Evaluator as a stage: a fake evaluation, real channels, files and compute thread.

What it promises (stages/evaluator.py): each weights version it receives is evaluated
with those weights loaded; every result is one line of eval/results.jsonl, logged, and
handed to `on_result` and its output channel; while shutting down it drains without
evaluating, and an evaluation in flight stops at its next progress check; a torn last
line (kill -9) is skipped when the results are read back.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

from navrl_daemon.pipeline.messages import PolicyWeights
from navrl_daemon.rl.evaluate import Progress
from navrl_daemon.runtime.channels import Channel
from navrl_daemon.runtime.compute import ComputeThread
from navrl_daemon.runtime.supervisor import Shutdown
from navrl_daemon.stages.evaluator import (
    BestPolicy,
    Evaluate,
    Evaluator,
    EvaluatorContext,
    EvaluatorEvents,
)
from navrl_daemon.storage.history import eval_scores, read_results


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def weight_as_score(policy: torch.nn.Module, *, progress: Progress | None = None) -> dict[str, Any]:
    """Scores that say which weights were loaded: reach_goal = the weight / 10."""
    if progress is not None:
        progress(16, 0)
    return {"reach_goal": float(policy.weight.detach()) / 10, "collision": 0.0}


def one_weight_evaluator(
    evaluate: Evaluate,
    weights: Channel[PolicyWeights],
    path: Path,
    shutdown: Shutdown,
    compute: ComputeThread,
    **more: Any,
) -> Evaluator:
    """An Evaluator of a policy with one weight (`weight_as_score` reads it)."""
    return Evaluator(
        torch.nn.Linear(1, 1, bias=False),  # type: ignore[arg-type]
        evaluate,
        weights.receiver(),
        context=EvaluatorContext(path, shutdown, compute),
        **more,
    )


def run_evaluator(
    path: Path, versions: list[int], *, stop_before: int | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    weights: Channel[PolicyWeights] = Channel("evaluations", len(versions) + 1)
    results: Channel[dict[str, Any]] = Channel("results", len(versions) + 1)
    shutdown = Shutdown()
    seen: list[dict[str, Any]] = []
    compute = ComputeThread("test")

    def on_result(record: dict[str, Any]) -> None:
        seen.append(record)
        if stop_before is not None and record["iteration"] == stop_before - 1:
            shutdown.request("test", 10)

    evaluator = one_weight_evaluator(
        weight_as_score,
        weights,
        path,
        shutdown,
        compute,
        results=results.sender(),
        events=EvaluatorEvents(on_result=on_result),
    )

    async def main() -> list[dict[str, Any]]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(evaluator.run)
            async with weights.sender() as sender:
                for v in versions:
                    await sender.send(PolicyWeights(v, v * 32, {"weight": torch.full((1, 1), v)}))
        await evaluator.flush(math.inf)
        out = []
        async for record in results.receiver():
            out.append(record)
        return out

    try:
        sent = anyio.run(main)
    finally:
        compute.close()
    return seen, sent


def test_each_version_is_evaluated_with_its_weights_and_recorded(tmp_path) -> None:
    path = tmp_path / "eval" / "results.jsonl"
    path.parent.mkdir()
    seen, sent = run_evaluator(path, [2, 4, 6])
    assert [r["iteration"] for r in seen] == [2, 4, 6]
    assert [r["reach_goal"] for r in seen] == [0.2, 0.4, 0.6]  # each with its own weights
    assert [r["frames"] for r in seen] == [64, 128, 192]
    assert sent == seen
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == seen
    assert eval_scores(path) == {2: 0.2, 4: 0.4, 6: 0.6}


def test_while_shutting_down_it_drains_without_evaluating(tmp_path) -> None:
    path = tmp_path / "results.jsonl"
    seen, _ = run_evaluator(path, [1, 2, 3, 4], stop_before=3)
    assert [r["iteration"] for r in seen] == [1, 2]
    assert [r["iteration"] for r in read_results(path)] == [1, 2]


def test_a_stop_ends_the_evaluation_in_flight_at_its_next_check(tmp_path: Path) -> None:
    """An evaluation that would step for 10 s (NavRL's 2,200 steps at a slow pace) ends
    at the progress check after the stop; its result is dropped, the stage returns."""
    shutdown = Shutdown()
    compute = ComputeThread("test")
    steps: list[int] = []
    started = threading.Event()

    def slow(policy: torch.nn.Module, *, progress: Progress | None = None) -> dict[str, Any]:
        started.set()
        for step in range(1, 1_001):
            time.sleep(0.01)
            steps.append(step)
            if progress is not None and step % 16 == 0:
                progress(step, 0)
        return {"reach_goal": 1.0, "collision": 0.0}

    weights: Channel[PolicyWeights] = Channel("evaluations", 2)
    path = tmp_path / "results.jsonl"
    evaluator = one_weight_evaluator(slow, weights, path, shutdown, compute)

    async def main() -> float:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(evaluator.run)
                async with weights.sender() as sender:  # closed: the stage returns
                    await sender.send(PolicyWeights(1, 32, {"weight": torch.ones(1, 1)}))
                    assert await anyio.to_thread.run_sync(started.wait, 10)
                    await anyio.sleep(0.3)
                    t0 = time.monotonic()
                    shutdown.request("test", 10)
            return time.monotonic() - t0

    try:
        stopped_after = anyio.run(main)
    finally:
        compute.close()
    assert stopped_after < 2  # not the 10 s the evaluation would have taken
    assert 16 <= len(steps) < 200
    assert list(read_results(path)) == []  # nothing written for the stopped evaluation


def test_a_torn_last_line_is_skipped_when_results_are_read_back(tmp_path) -> None:
    path = tmp_path / "results.jsonl"
    run_evaluator(path, [1, 2])
    with path.open("a") as f:
        f.write('{"iteration": 3, "reach_go')  # kill -9 mid-write
    assert [r["iteration"] for r in read_results(path)] == [1, 2]
    assert eval_scores(path) == {1: 0.1, 2: 0.2}


def test_a_best_policy_that_cannot_be_written_is_counted_and_offered_again(
    tmp_path: Path,
) -> None:
    failures: list[int] = []
    export = tmp_path / "export"
    export.write_text("a file where the export directory belongs")
    best = BestPolicy(export / "best.pt", on_failed=lambda: failures.append(1))
    state = {"w": torch.ones(2)}
    record = {"iteration": 3, "reach_goal": 0.5, "collision": 0.1, "return": 1.0}
    assert not best.offer(record, state)
    assert failures == [1]  # counted like a failed export (NavrlWriteFailures)
    export.unlink()
    export.mkdir()
    # Not remembered as the best: the same record is written once the disk takes it.
    assert best.offer(record, state)
    assert (export / "best.pt").exists() and failures == [1]
