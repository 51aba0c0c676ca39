"""Whether the directories of a state dir can hold what a run writes, checked once before
the run starts.

A run that cannot write its checkpoints would otherwise train for ever with every write
failing (and a kill then loses everything): `STATE_DIR/checkpoints` being a file, or a
read-only directory (a read-only mount: root ignores permission bits). The state dir
itself is checked by its lock (runtime/lock.py), which is taken first; here each directory
of it the run writes to that exists already must take a new file (a missing one is made
by the run, in the state dir the lock found writable); else ConfigError (exit 78) naming
it. Nothing is left behind: no probe file, no empty directory.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from navrl_daemon.errors import ConfigError


def check_writable(state_dir: Path, subdirs: Iterable[str]) -> None:
    """Each existing `state_dir/<name>` is a directory a file can be created in."""
    for directory in (state_dir / name for name in subdirs):
        if directory.exists() or directory.is_symlink():
            _check(directory)


def _check(directory: Path) -> None:
    if not directory.is_dir():
        raise ConfigError(f"{directory}: not a directory; the daemon writes files there")
    try:
        fd, probe = tempfile.mkstemp(prefix=".tmp-probe-", dir=directory)
    except OSError as err:
        raise ConfigError(f"{directory}: not writable: {err.strerror or err}") from None
    os.close(fd)
    os.unlink(probe)
