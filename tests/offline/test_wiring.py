"""The daemon runs an offline objective only where its caller hands the objectives in
(pipeline/context.py: OfflineObjectives): the training core never imports navrl_daemon/offline,
so a caller of `serve` without them gets a clear ConfigError, not a silent PPO run. With
them, `navrl-daemon run` trains both objectives: tests/test_offline_run.py."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import anyio
import pytest

from navrl_daemon.config import load_config
from navrl_daemon.errors import ConfigError
from navrl_daemon.pipeline import daemon
from tests.conftest import TINY


@pytest.mark.parametrize("objective", ["bc", "ppo+bc"])
def test_serve_without_the_offline_objectives_refuses_an_offline_config(
    tmp_path: Path, objective: str
) -> None:
    layout = ["prefetch.layout=archive"] if objective == "ppo+bc" else []
    cfg = load_config(
        None,
        [*TINY, f"offline.objective={objective}", "prefetch.paths=['data.h5']", *layout],
    )
    message = f'offline.objective: "{objective}" needs the offline objectives'
    with pytest.raises(ConfigError, match=re.escape(message)):
        anyio.run(functools.partial(daemon.serve, cfg, tmp_path / "state"))
