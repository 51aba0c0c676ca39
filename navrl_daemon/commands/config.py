"""`navrl-daemon config show`: the resolved config as TOML, itself a valid --config."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from navrl_daemon.commands.common import config_args
from navrl_daemon.config import Config, to_toml


def register(sub: Any) -> None:
    p = sub.add_parser("config", help="configuration tools")
    cmds = p.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    show = config_args(cmds.add_parser("show", help="print the resolved config as TOML"))
    show.set_defaults(handler=handle_show)


def handle_show(cfg: Config, args: argparse.Namespace) -> int:
    sys.stdout.write(to_toml(cfg))
    return 0
