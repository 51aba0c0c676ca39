"""`navrl-daemon ARGS` run as a user runs it, its output and exit code captured: in this
process (`cli.main`, without a fresh interpreter's imports) or as a process of its own."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import structlog
import torch


def navrl_cli(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    cwd: Path | None = None,
    process: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run `navrl-daemon ARGS` as a user would, capturing output and exit code.

    In this process by default: `cli.main` from argument parsing to exit code, the same
    path a subprocess takes after its imports, which cost ~5 s of CPU per start. With
    `process=True`, an `env` or a `cwd`, or where the promise is about a process (signals,
    a crash's exit status), a process of its own (navrl_daemon/testing/forked.py)."""
    if process or env is not None or cwd is not None:
        from navrl_daemon.testing import forked

        return forked.run(list(args), timeout=timeout, env=env, cwd=cwd)
    return _cli_in_process(list(args))


def _cli_in_process(args: list[str]) -> subprocess.CompletedProcess[str]:
    """`cli.main(args)` with stdout and stderr captured, one intra-op torch thread (as
    SUBPROCESS_ENV gives a subprocess), and what the call sets process-wide put back: the
    signal handlers, structlog, threading's excepthook, torch's thread count and RNG."""
    import io
    import threading
    import traceback

    from navrl_daemon.cli import main

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2)
    handlers = {sig: signal.getsignal(sig) for sig in handled}
    saved = (sys.stdout, sys.stderr, threading.excepthook, structlog.get_config())
    threads, rng = torch.get_num_threads(), torch.random.get_rng_state()
    out, err = io.StringIO(), io.StringIO()
    sys.stdout, sys.stderr = out, err
    torch.set_num_threads(1)
    try:
        code = main(args)
    except SystemExit as e:  # argparse's usage errors, a command's own exit
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            err.write(e.code + "\n")
    except Exception:  # what the interpreter prints for an uncaught exception, and exit 1
        err.write(traceback.format_exc())
        code = 1
    finally:
        sys.stdout, sys.stderr, threading.excepthook, config = saved
        structlog.configure(**config)
        torch.set_num_threads(threads)
        torch.random.set_rng_state(rng)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return subprocess.CompletedProcess(
        ["navrl-daemon", *args], code, out.getvalue(), err.getvalue()
    )
