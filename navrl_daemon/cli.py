"""`navrl-daemon` command line. The one place where errors become exit codes (design §3).

Each command lives in `navrl_daemon/commands/<name>.py`; this file only builds the parser
from them, resolves the config and maps `NavrlError`s to their exit codes. Stop signals are
handled from the first line of `main` (runtime/signals.py), before the commands are
imported: some import torch, which takes seconds. So is SIGUSR2, from then on: it writes
every thread's Python traceback to stderr and changes nothing else, to see where a process
that seems stuck is (a start-up that never reaches its first iteration, a stage that
stopped moving) without stopping it (docs/operations.md, runtime/signals.py).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Sequence

from navrl_daemon import __version__
from navrl_daemon.errors import NavrlError
from navrl_daemon.ops.log_stream import LOST, LogStream, ensure_std_fds
from navrl_daemon.runtime.signals import StopRequested, StopSignals, dump_stacks_on


def build_parser() -> argparse.ArgumentParser:
    from navrl_daemon.commands import (
        archive,
        checkpoints,
        config,
        dataset,
        doctor,
        env,
        eval,
        launch,
        report,
        run,
        status,
    )

    parser = argparse.ArgumentParser(
        prog="navrl-daemon",
        description="Long-running training service for NavRL's drone-navigation PPO policy.",
    )
    parser.add_argument("--version", action="version", version=f"navrl-daemon {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = (
        run,
        launch,
        eval,
        config,
        checkpoints,
        archive,
        dataset,
        env,
        report,
        status,
        doctor,
    )
    for command in commands:
        command.register(sub)
    return parser


STACKS_SIGNAL = signal.SIGUSR2  # every thread's traceback to stderr; the process goes on


def main(argv: Sequence[str] | None = None) -> int:
    ensure_std_fds()  # before anything opens a file that could get descriptor 2
    signals = StopSignals().install()
    dump_stacks_on(STACKS_SIGNAL)
    log_stream: LogStream | None = None
    try:
        args = build_parser().parse_args(argv)
        from navrl_daemon.config import LogConfig, load_config
        from navrl_daemon.ops.logging import configure_logging

        configure_logging(LogConfig())  # a note while the config loads goes to stderr
        cfg = load_config(getattr(args, "config", None), getattr(args, "overrides", ()))
        log_stream = configure_logging(cfg.log)
        args.log_stream = log_stream  # `run` names the file the log goes on in
        args.stop_signals = signals  # `run` hands them to its event loop
        return args.handler(cfg, args)
    except StopRequested as stop:  # before `run` reached its event loop, or another command
        # The process is only exiting now: a later stop signal (another one, or the repeat
        # of one that arrived inside an import) must not raise into the lines below.
        signals.finish()
        _stopped(stop.signal_name, log_stream)
        return 0
    except NavrlError as e:
        signals.finish()
        _say(f"navrl-daemon: error: {e}", log_stream)
        return e.exit_code
    finally:
        signals.finish()


def _stopped(signal_name: str, log_stream: LogStream | None) -> None:
    """A stop signal with nothing to save (no training yet): a clean exit, one line."""
    if log_stream is not None:
        import structlog

        structlog.get_logger("cli").info("stopped by a signal", signal=signal_name)
    else:
        _say(f"navrl-daemon: stopped by {signal_name}", None)


def _say(line: str, log_stream: LogStream | None) -> None:
    """A line to stderr, through the log's stream once there is one (which goes on in a
    file when stderr has lost its reader); a stderr that takes nothing is no error."""
    if log_stream is not None:
        log_stream.write(line + "\n")
        return
    with contextlib.suppress(*LOST):
        print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
