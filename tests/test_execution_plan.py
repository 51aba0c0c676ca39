"""The execution plan (config/execution_plan.py): every mode a run executes in, chosen once
from its config and device, and the same choice for every config and device as the rules
it gathers made where they were applied (the learner, the env, the trainer's stream, the
LiDAR CNN), logged once at start. Devices are names: no GPU is needed to compute what one
would run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from navrl_daemon.config import Config, ConfigError, ExecutionPlan, set_dotted
from navrl_daemon.env.backends import resolve
from navrl_daemon.testing import TINY
from navrl_daemon.testing.command_line import navrl_cli

# (name, overrides, ranks, device, expected): expected is the plan's choices, or the start
# of a ConfigError's message, "load: ..." where the config itself does not load.
# Columns of a plan: update, compile, collect, reset, trainer stream, compressed, lidar.
DEFAULTS_CPU = ("eager", False, "eager", "indexed", False, False, "matmul")
DEFAULTS_CUDA = ("cuda_graph", False, "cuda_graph", "masked", False, False, "native")
BC = {
    "offline.objective": "ppo+bc",
    "prefetch.paths": ["x.h5"],
    "prefetch.layout": "archive",
}
CASES: list[tuple[str, dict[str, Any], int, str, Any]] = [
    ("defaults", {}, 1, "cpu", DEFAULTS_CPU),
    ("defaults", {}, 1, "cuda", DEFAULTS_CUDA),
    ("defaults", {}, 1, "cuda:1", DEFAULTS_CUDA),
    ("fused", {"ppo.update_path": "fused"}, 1, "cpu", ("fused", *DEFAULTS_CPU[1:])),
    ("fused", {"ppo.update_path": "fused"}, 1, "cuda", ("fused", *DEFAULTS_CUDA[1:])),
    ("eager", {"ppo.update_path": "eager"}, 1, "cuda", ("eager", *DEFAULTS_CUDA[1:])),
    ("graph", {"ppo.update_path": "cuda_graph"}, 1, "cpu", "ppo.update_path = 'cuda_graph'"),
    ("graph", {"ppo.update_path": "cuda_graph"}, 1, "cuda", DEFAULTS_CUDA),
    (
        "compile fused",
        {"ppo.update_path": "fused", "ppo.compile": True},
        1,
        "cpu",
        ("fused", True, *DEFAULTS_CPU[2:]),
    ),
    ("compile auto", {"ppo.compile": True}, 1, "cpu", "ppo.compile"),
    ("compile auto", {"ppo.compile": True}, 1, "cuda", ("cuda_graph", True, *DEFAULTS_CUDA[2:])),
    (
        "compile eager",
        {"ppo.update_path": "eager", "ppo.compile": True},
        1,
        "cuda",
        "load: ppo.compile",
    ),
    (
        "compressed",
        {"pipeline.compress_rollouts": True},
        1,
        "cpu",
        (*DEFAULTS_CPU[:5], True, "matmul"),
    ),
    (
        "compressed",
        {"pipeline.compress_rollouts": True},
        1,
        "cuda",
        ("eager", False, "cuda_graph", "masked", False, True, "native"),
    ),
    (
        "compressed fused",
        {"pipeline.compress_rollouts": True, "ppo.update_path": "fused"},
        1,
        "cuda",
        "load: ppo.update_path = 'fused' does not support env-group",
    ),
    ("ranks", {}, 2, "cpu", DEFAULTS_CPU),
    ("ranks", {}, 2, "cuda", ("eager", *DEFAULTS_CUDA[1:])),
    (
        "ranks fused",
        {"ppo.update_path": "fused"},
        2,
        "cuda",
        "ppo.update_path = 'fused' does not support data parallelism",
    ),
    ("ppo+bc", BC, 1, "cpu", DEFAULTS_CPU),
    ("ppo+bc", BC, 1, "cuda", ("fused", *DEFAULTS_CUDA[1:])),
    (
        "ppo+bc graph",
        {**BC, "ppo.update_path": "cuda_graph"},
        1,
        "cuda",
        "load: ppo.update_path = 'cuda_graph' does not support an extra loss term",
    ),
    ("indexed", {"env.navigation.reset_mode": "indexed"}, 1, "cpu", DEFAULTS_CPU),
    (
        "indexed",
        {"env.navigation.reset_mode": "indexed"},
        1,
        "cuda",
        ("cuda_graph", False, "eager", "indexed", False, False, "native"),
    ),
    (
        "masked",
        {"env.navigation.reset_mode": "masked"},
        1,
        "cpu",
        ("eager", False, "eager", "masked", False, False, "matmul"),
    ),
    ("masked", {"env.navigation.reset_mode": "masked"}, 1, "cuda", DEFAULTS_CUDA),
    (
        "collect eager",
        {"env.collect_path": "eager"},
        1,
        "cuda",
        ("cuda_graph", False, "eager", "indexed", False, False, "native"),
    ),
    (
        "collect graph",
        {"env.collect_path": "cuda_graph"},
        1,
        "cpu",
        "env.collect_path = 'cuda_graph' needs a CUDA device",
    ),
    ("collect graph", {"env.collect_path": "cuda_graph"}, 1, "cuda", DEFAULTS_CUDA),
    (
        "collect graph indexed",
        {"env.collect_path": "cuda_graph", "env.navigation.reset_mode": "indexed"},
        1,
        "cuda",
        "load: env.collect_path = 'cuda_graph' cannot hold the indexed reset",
    ),
    (
        "other backend",
        {"env.backend": "isaac"},
        1,
        "cuda",
        ("cuda_graph", False, "eager", "indexed", False, False, "native"),
    ),
    (
        "other backend graph",
        {"env.backend": "isaac", "env.collect_path": "cuda_graph"},
        1,
        "cuda",
        "env.collect_path = 'cuda_graph' captures the env's step; env.backend = 'isaac'",
    ),
    ("stream", {"pipeline.trainer_stream": True}, 1, "cpu", DEFAULTS_CPU),
    (
        "stream",
        {"pipeline.trainer_stream": True},
        1,
        "cuda",
        ("cuda_graph", False, "cuda_graph", "masked", True, False, "native"),
    ),
    ("lidar native", {"ppo.lidar_conv": "native"}, 1, "cpu", (*DEFAULTS_CPU[:6], "native")),
    ("lidar matmul", {"ppo.lidar_conv": "matmul"}, 1, "cuda", (*DEFAULTS_CUDA[:6], "matmul")),
]
IDS = [f"{name}-{device}-ranks{ranks}" for name, _, ranks, device, _ in CASES]


def captured(cfg: Config) -> bool:
    """What the daemon plans with: whether the registry says the backend is captured."""
    return resolve(cfg.env.backend).captured


def load(overrides: dict[str, Any]) -> Config:
    data: dict[str, Any] = {}
    for key, value in overrides.items():
        set_dotted(data, key, value, origin=key)
    return Config.model_validate(data)


def outcome(choose: Any, overrides: dict[str, Any], ranks: int, device: str) -> Any:
    """`choose(cfg, ranks, device)`'s tuple, or the message of the ConfigError it raises."""
    try:
        cfg = load(overrides)
    except ValidationError as err:  # exit 78 at load
        return "load: " + err.errors()[0]["msg"].removeprefix("Value error, ")
    try:
        return choose(cfg, ranks, device)
    except ConfigError as err:
        return str(err)


def planned(cfg: Config, ranks: int, device: str) -> tuple[Any, ...]:
    plan = ExecutionPlan.of(cfg, device, captured=captured(cfg), ranks=ranks)
    return (
        plan.update_path.value,
        plan.compile.value,
        plan.collect_path.value,
        plan.reset.value,
        plan.trainer_stream.value,
        plan.compressed_rollouts.value,
        plan.lidar_conv.value,
    )


def matches(got: Any, expected: Any) -> bool:
    if isinstance(expected, str):
        return isinstance(got, str) and got.startswith(expected)
    return got == expected


@pytest.mark.parametrize(("name", "overrides", "ranks", "device", "expected"), CASES, ids=IDS)
def test_the_plan_chooses_what_the_rules_chose_where_they_were_applied(
    name: str, overrides: dict[str, Any], ranks: int, device: str, expected: Any
) -> None:
    """The table was first held to the rules where they were applied (the learner's
    update path with what the daemon builds it with, the env's collect path and reset,
    the trainer's stream, the LiDAR CNN's lowering); the plan makes the same choices."""
    got = outcome(planned, overrides, ranks, device)
    assert matches(got, expected), got


def test_every_choice_says_which_rule_made_it() -> None:
    plan = ExecutionPlan.of(load({"ppo.update_path": "fused"}), "cuda", captured=True)
    fields = plan.fields()
    assert set(fields["why"]) == set(plan.choices) == set(fields) - {"device", "why"}
    assert fields["why"]["update_path"] == "ppo.update_path = 'fused'"
    assert fields["why"]["collect_path"] == "auto: the backend's step captured on CUDA"
    assert fields["why"]["reset"] == "auto: masked, the steps are captured"
    assert json.loads(json.dumps(fields)) == fields  # one JSON log line


def test_what_is_built_on_the_cpu_follows_the_plan() -> None:
    """The learner, the env and the policy apply the plan's rules to what they are built
    with: on this CPU, what they run is what the plan says."""
    from navrl_daemon.env import make_env
    from navrl_daemon.rl.learner import Learner
    from navrl_daemon.rl.policy import make_policy

    small = {"env.num_envs": 4, "env.num_obstacles": 4, "env.num_dynamic_obstacles": 8}
    for overrides in (
        {},
        {"ppo.update_path": "fused", "env.navigation.reset_mode": "masked"},
        {"ppo.lidar_conv": "native"},
    ):
        cfg = load({**small, **overrides})
        plan = ExecutionPlan.of(cfg, "cpu", captured=captured(cfg))
        policy = make_policy(cfg, "cpu")
        assert Learner.build(cfg, policy, "cpu").update_path == plan.update_path.value
        env = make_env(cfg.env, device="cpu", seed=0)
        assert env.collect_path == plan.collect_path.value
        assert env.masked_reset == (plan.reset.value == "masked")
        assert policy.feature_extractor.module[0].module.lowering == plan.lidar_conv.value


def test_a_run_logs_its_plan_once_at_start(tmp_path: Path) -> None:
    proc = navrl_cli("run", "--state-dir", str(tmp_path / "s"), *TINY, "run.total_frames=128")
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = [json.loads(x) for x in proc.stderr.splitlines() if x.startswith("{")]
    plans = [e for e in log if e["event"] == "execution plan"]
    assert len(plans) == 1, plans
    plan = plans[0]
    assert (plan["device"], plan["update_path"], plan["reset"]) == ("cpu", "eager", "indexed")
    assert plan["why"]["update_path"] == "auto: eager off CUDA, where no launch overhead is saved"
    assert plan["why"]["lidar_conv"] == "auto: matmul on the CPU"
    events = [e["event"] for e in log]
    assert events.index("execution plan") < events.index("progress")  # before training
