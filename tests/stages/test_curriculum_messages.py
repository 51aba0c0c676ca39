"""The curriculum between stages: the evaluator and the producer share no curriculum
object; the evaluator's decisions reach the producer as typed messages on a channel, which
the producer applies between rollouts."""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

from navrl_daemon.config import load_config
from navrl_daemon.pipeline.cadence import Cadence
from navrl_daemon.pipeline.context import RunContext
from navrl_daemon.pipeline.coordinator import SingleProcess
from navrl_daemon.pipeline.daemon import build_stages
from navrl_daemon.pipeline.telemetry import Telemetry
from navrl_daemon.runtime.channels import Channel, Receiver, Sender
from navrl_daemon.runtime.compute import ComputeThreads
from navrl_daemon.runtime.supervisor import Shutdown
from navrl_daemon.stages.evaluator import Evaluator
from navrl_daemon.stages.producer import RolloutProducer
from tests.conftest import TINY

CURRICULUM = (
    "env.curriculum=[{name = 'open', num_obstacles = 0, num_dynamic_obstacles = 0,"
    " promote = {reach_goal = 0.0, evals = 1}}, {name = 'full'}]"
)


def reachable(root: object) -> Iterator[object]:
    """Every object of this package reachable from `root` through attributes, containers,
    closures and bound methods; a channel's ends are where it stops (what crosses them is
    a message), and objects of other packages (torch, anyio) are not looked into."""
    seen: set[int] = set()
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        yield obj
        if isinstance(obj, (Sender, Receiver, Channel)):
            continue
        if isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
        elif isinstance(obj, functools.partial):
            todo.extend([obj.func, *obj.args, *obj.keywords.values()])
        elif isinstance(obj, types.FunctionType):
            todo.extend(cell.cell_contents for cell in obj.__closure__ or ())
        elif isinstance(obj, types.MethodType):
            todo.append(obj.__self__)
        elif type(obj).__module__.startswith("navrl_daemon.") and hasattr(obj, "__dict__"):
            todo.extend(vars(obj).values())


def curriculum_objects(root: object) -> dict[int, Any]:
    """What holds curriculum state among the objects reachable from `root`: the config's
    stages are read by both, never changed, and a frozen dataclass cannot change."""
    return {
        id(obj): obj
        for obj in reachable(root)
        if ("curriculum" in type(obj).__module__ or "Curriculum" in type(obj).__name__)
        and not type(obj).__module__.startswith("navrl_daemon.config")
        and not (dataclasses.is_dataclass(obj) and type(obj).__dataclass_params__.frozen)
    }


@pytest.fixture
def stages(tmp_path: Path) -> Iterator[list[Any]]:
    cfg = load_config(None, [*TINY, CURRICULUM, "eval.interval=1"])
    device = torch.device("cpu")
    cadence = Cadence.of(cfg, 1)
    threads = ComputeThreads("cpu")
    telemetry = Telemetry(cfg, device, None, None, cadence)
    ctx = RunContext(
        cfg, tmp_path, device, Shutdown(), threads, telemetry, SingleProcess(), cadence
    )
    try:
        yield build_stages(ctx)
    finally:
        telemetry.close()
        threads.close()


def test_the_evaluator_and_the_producer_share_no_curriculum_object(stages: list[Any]) -> None:
    [producer] = [s for s in stages if isinstance(s, RolloutProducer)]
    [evaluator] = [s for s in stages if isinstance(s, Evaluator)]
    producers, evaluators = curriculum_objects(producer), curriculum_objects(evaluator)
    assert producers and evaluators  # both hold curriculum state: the walk sees it
    shared = [type(producers[i]).__name__ for i in producers.keys() & evaluators.keys()]
    assert not shared, f"changed by one stage, read by the other: {shared}"


def test_a_promotion_reaches_the_producer_as_a_message_between_rollouts(
    stages: list[Any],
) -> None:
    [producer] = [s for s in stages if isinstance(s, RolloutProducer)]
    [evaluator] = [s for s in stages if isinstance(s, Evaluator)]
    follower, before = producer.curriculum, producer.collector.env
    evaluator.curriculum.observe({"iteration": 1, "reach_goal": 1.0, "collision": 0.0})
    assert evaluator.curriculum.curriculum.stage == 1  # promoted: one pass of a 1-eval rule
    assert follower.curriculum.stage == 0  # nothing reached the producer but a message
    assert follower.wanted() == 1  # taken from its channel, between rollouts
    follower.agreed(1)
    anyio.run(follower.before_rollout, 1)
    assert follower.curriculum.applied == 1
    assert producer.collector.env is not before  # the next rollout runs on stage 1's env
