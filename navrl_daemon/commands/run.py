"""`navrl-daemon run`: train until run.total_frames or a signal, resuming if it can."""

from __future__ import annotations

import argparse
from typing import Any

from navrl_daemon.commands.common import config_args, state_dir, state_dir_arg
from navrl_daemon.config import Config


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="train until run.total_frames or a signal")
    state_dir_arg(config_args(p))
    p.set_defaults(handler=handle)


def handle(cfg: Config, args: argparse.Namespace) -> int:
    from navrl_daemon.pipeline import daemon

    return daemon.run(cfg, state_dir(cfg, args))
