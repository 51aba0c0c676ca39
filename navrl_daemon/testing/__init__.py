"""What the tests and the benchmarks both use to drive a real navrl-daemon: the CLI in
this process or as a process of its own (forked from one pre-imported interpreter), a
daemon whose log is read as it runs, crafted hostile inputs, a full disk, and counters
of host reads in a hot loop.

Here, in the package, rather than in tests/ or benchmarks/: neither of those folders
imports the other, and a backend's author tests a backend the way the project tests its
own (an env step with no host read, a daemon that resumes after kill -9, a crafted file
refused with exit 65). Nothing else in the package imports it (an import-linter contract).
"""

from __future__ import annotations

import os
from pathlib import Path

# The checkout the package runs from (an editable install): a daemon started without a
# working directory of its own runs there, where config/default.toml is.
CHECKOUT = Path(__file__).resolve().parents[2]

# A tiny config every daemon process of a test can afford on a small CPU.
TINY = [
    "run.device=cpu",
    "env.num_envs=8",
    "env.field_size=10.0",
    "env.num_obstacles=4",
    "env.num_dynamic_obstacles=8",
    "env.max_episode_length=50",
    "env.navigation.spawn=local",
    "ppo.rollout_length=8",
    "ppo.minibatches=4",
    "ppo.epochs=1",
    "eval.num_envs=4",
    "eval.layout=train",
    "log.summary_interval=1",
    "metrics.port=0",
]

# One intra-op thread in every daemon a test starts: results are only bitwise repeatable
# between runs with the same thread count.
SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def env_overrides(keys: dict[str, object]) -> list[str]:
    """Dotted `KEY=VALUE` overrides of env keys named as a curriculum stage names them
    (`num_envs`, `spawn`): the embedded backend's own go under `env.navigation`."""
    from navrl_daemon.config import NavigationConfig

    return [
        f"env.{'navigation.' if key in NavigationConfig.model_fields else ''}{key}="
        + repr(value).replace("'", '"')
        for key, value in keys.items()
    ]
