"""`navrl-daemon launch`: `run` on several GPUs under torchrun, stopped like a plain `run`.

It starts `python -m torch.distributed.run --nproc-per-node N [TORCHRUN_ARGS] -m
navrl_daemon run ...` with the same config arguments, and turns a SIGTERM, SIGINT or
SIGHUP into a clean, joint stop of every rank with exit 0 (runtime/launcher.py), which
torchrun run directly does not give a service manager.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from navrl_daemon.commands.common import config_args, state_dir_arg
from navrl_daemon.config import Config
from navrl_daemon.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("launch", help="`run` under torchrun, with a clean stop on SIGTERM")
    p.add_argument(
        "--nproc-per-node", type=int, default=1, metavar="N", help="ranks on this machine"
    )
    p.add_argument(
        "--torchrun-args",
        default="",
        metavar="ARGS",
        help='more torchrun options as one string, written with "=" since it starts with '
        'a dash: --torchrun-args="--nnodes 2 --rdzv-backend c10d --rdzv-endpoint head:29400"',
    )
    state_dir_arg(config_args(p))
    p.set_defaults(handler=handle)


def handle(cfg: Config, args: argparse.Namespace) -> int:
    from navrl_daemon.runtime.launcher import Launcher

    if args.nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node: at least 1, got {args.nproc_per_node}")
    return Launcher(torchrun_command(args), args.stop_signals).run()


def torchrun_command(args: argparse.Namespace) -> list[str]:
    command = [sys.executable, "-m", "torch.distributed.run"]
    command += [f"--nproc-per-node={args.nproc_per_node}", *shlex.split(args.torchrun_args)]
    command += ["-m", "navrl_daemon", "run"]
    if args.config is not None:
        command += ["--config", str(args.config)]
    if args.state_dir is not None:
        command += ["--state-dir", str(args.state_dir)]
    return command + list(args.overrides)
