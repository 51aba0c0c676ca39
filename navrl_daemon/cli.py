"""`navrl-daemon` command line. The one place where errors become exit codes (DESIGN.md §3).

Each command lives in `navrl_daemon/commands/<name>.py`; this file only builds the parser
from them, resolves the config and maps `NavrlError`s to their exit codes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from navrl_daemon.commands import (
    archive,
    checkpoints,
    config,
    dataset,
    env,
    eval,
    report,
    run,
    status,
)
from navrl_daemon.config import load_config
from navrl_daemon.errors import NavrlError
from navrl_daemon.ops.logging import configure_logging

COMMANDS = (run, eval, config, checkpoints, archive, dataset, env, report, status)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="navrl-daemon",
        description="Long-running training service for NavRL's drone-navigation PPO policy.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = load_config(getattr(args, "config", None), getattr(args, "overrides", ()))
        configure_logging(cfg.log)
        return args.handler(cfg, args)
    except NavrlError as e:
        print(f"navrl-daemon: error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
