"""Stopping the worker processes of the prefetcher and the archive decode pool."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any


def stop_workers(procs: Sequence[Any], conns: Sequence[Connection], grace_s: float = 2.0) -> None:
    """Ask every worker to stop (`None` on its pipe), terminate those still running after
    `grace_s`, kill those that ignore that, then close the pipes. The processes stay
    joined but not closed: their `pid` and `exitcode` remain readable."""
    for conn in conns:
        with contextlib.suppress(OSError, ValueError):  # already gone
            conn.send(None)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(grace_s)
        if proc.is_alive():
            proc.kill()
            proc.join()
    for conn in conns:
        conn.close()
