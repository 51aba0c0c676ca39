"""`navrl-daemon run`: train until run.total_frames or a signal, resuming if it can; then
say where the results are and what to run next (commands/run_summary.py)."""

from __future__ import annotations

import argparse
from typing import Any

from navrl_daemon.commands.common import config_args, state_dir, state_dir_arg
from navrl_daemon.config import Config, state_dir_problem
from navrl_daemon.errors import ConfigError


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="train until run.total_frames or a signal")
    state_dir_arg(config_args(p))
    p.set_defaults(handler=handle)


def handle(cfg: Config, args: argparse.Namespace) -> int:
    from navrl_daemon.commands.run_summary import print_run_summary
    from navrl_daemon.offline.wiring import OBJECTIVES
    from navrl_daemon.ops.log_stream import LOG_FILE
    from navrl_daemon.pipeline import daemon
    from navrl_daemon.runtime.distributed import World

    root = state_dir(cfg, args)
    # Before anything is made there; run.state_dir was checked with the config.
    problem = state_dir_problem(str(root)) if args.state_dir is not None else None
    if problem is not None:
        raise ConfigError(f"--state-dir {problem}")
    leader = World.from_environ().leader  # rank 0 owns the state dir
    if leader:  # where the log goes on if stderr loses its reader
        args.log_stream.continue_in(root / LOG_FILE)
    code = daemon.run(cfg, root, args.stop_signals, offline=OBJECTIVES)
    if leader:
        print_run_summary(cfg, root)
    return code
