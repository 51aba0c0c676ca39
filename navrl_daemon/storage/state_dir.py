"""Whether a state dir can hold what a run writes, checked once before the run starts.

A run that cannot write its checkpoints would otherwise train for ever with every write
failing (and a kill then loses everything): `STATE_DIR/checkpoints` being a file, or a
read-only directory (a read-only mount: root ignores permission bits). Each directory the
run writes to is created if missing and must take a new file; else ConfigError (exit 78)
naming it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from navrl_daemon.errors import ConfigError


def check_writable(state_dir: Path, subdirs: Iterable[str]) -> None:
    """`state_dir` and each `state_dir/<name>` are directories a file can be created in."""
    for directory in (state_dir, *(state_dir / name for name in subdirs)):
        _check(directory, state_dir)


def _check(directory: Path, state_dir: Path) -> None:
    where = f"state dir {state_dir}" if directory == state_dir else str(directory)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"{where}: not a directory; the daemon writes files there")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".tmp-probe-", dir=directory)
    except OSError as err:
        raise ConfigError(f"{where}: not writable: {err.strerror or err}") from None
    os.close(fd)
    os.unlink(probe)
