"""The execution plan (config/execution_plan.py): every mode a run executes in, chosen once
from its config and device, and the same choice for every config and device as the rules
it gathers made where they were applied (the learner, the env, the trainer's stream, the
LiDAR CNN). Devices are names: no GPU is needed to compute what one would run."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from navrl_daemon.config import Config, ConfigError

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
    ("indexed", {"env.reset_mode": "indexed"}, 1, "cpu", DEFAULTS_CPU),
    (
        "indexed",
        {"env.reset_mode": "indexed"},
        1,
        "cuda",
        ("cuda_graph", False, "eager", "indexed", False, False, "native"),
    ),
    (
        "masked",
        {"env.reset_mode": "masked"},
        1,
        "cpu",
        ("eager", False, "eager", "masked", False, False, "matmul"),
    ),
    ("masked", {"env.reset_mode": "masked"}, 1, "cuda", DEFAULTS_CUDA),
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
        {"env.collect_path": "cuda_graph", "env.reset_mode": "indexed"},
        1,
        "cuda",
        'load: collect_path: "cuda_graph" cannot hold the indexed reset',
    ),
    (
        "other backend",
        {"env.backend": "isaac"},
        1,
        "cuda",
        ("cuda_graph", False, "eager", "indexed", False, False, "native"),
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


def load(overrides: dict[str, Any]) -> Config:
    data: dict[str, Any] = {}
    for key, value in overrides.items():
        section, name = key.split(".")
        data.setdefault(section, {})[name] = value
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


def todays_rules(cfg: Config, ranks: int, device: str) -> tuple[Any, ...]:
    """What the code chose before the plan, each mode where it was applied: the learner's
    update path (rl/fast_update.py) with what the daemon builds it with, the env's collect
    path and reset (env/), the trainer's stream (runtime/streams.py) and the LiDAR CNN's
    lowering (rl/lidar_cnn.py), the last two read off their code (one needs a GPU)."""
    import torch

    from navrl_daemon.config import NOT_FAST, NOT_GRAPH, check_compile
    from navrl_daemon.env.contract import collect_path
    from navrl_daemon.env.navigation.env import masked_reset
    from navrl_daemon.rl.fast_update import resolve

    why_not = None
    if ranks > 1:
        why_not = NOT_FAST["reducer"]
    elif cfg.pipeline.compress_rollouts:
        why_not = NOT_FAST["env_groups"]
    why_not_graph = NOT_GRAPH["aux_loss"] if cfg.offline.objective == "ppo+bc" else None
    path = resolve(
        cfg.ppo.update_path, torch.device(device), why_not=why_not, why_not_graph=why_not_graph
    )
    check_compile(cfg.ppo.compile, path)
    cuda = torch.device(device).type == "cuda"
    lidar = cfg.ppo.lidar_conv
    if lidar == "auto":
        lidar = "native" if cuda else "matmul"
    return (
        path,
        cfg.ppo.compile,
        collect_path(cfg.env, device),
        "masked" if masked_reset(cfg.env, device) else "indexed",
        cfg.pipeline.trainer_stream and cuda,
        cfg.pipeline.compress_rollouts,
        lidar,
    )


def matches(got: Any, expected: Any) -> bool:
    if isinstance(expected, str):
        return isinstance(got, str) and got.startswith(expected)
    return got == expected


@pytest.mark.parametrize(("name", "overrides", "ranks", "device", "expected"), CASES, ids=IDS)
def test_the_table_is_what_todays_rules_choose(
    name: str, overrides: dict[str, Any], ranks: int, device: str, expected: Any
) -> None:
    got = outcome(todays_rules, overrides, ranks, device)
    assert matches(got, expected), got
