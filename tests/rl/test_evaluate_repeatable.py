"""An evaluation reseeds its env, so the same weights give the same numbers every time."""

from __future__ import annotations

import torch

from navrl_daemon.config import load_config
from navrl_daemon.rl.evaluate import evaluate
from navrl_daemon.rl.evaluations import make_eval_env
from navrl_daemon.rl.policy import make_policy
from tests.conftest import TINY


def test_evaluating_twice_on_one_env_gives_identical_results() -> None:
    cfg = load_config(None, [*TINY, "env.num_dynamic_obstacles=16"], environ={})
    torch.manual_seed(0)
    policy = make_policy(cfg, "cpu")
    env = make_eval_env(cfg, "cpu")
    start = env.dynamic.pos.clone()
    first = evaluate(env, policy, seed=3, max_steps=60)
    assert not torch.equal(env.dynamic.pos, start)  # the obstacles moved meanwhile
    second = evaluate(env, policy, seed=3, max_steps=60)
    assert first == second
