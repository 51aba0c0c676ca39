"""One error type per failure a user can act on; `cli.py` maps each to its exit code."""

from __future__ import annotations


class NavrlError(Exception):
    """Base class: every error here carries the sysexits code the CLI exits with."""

    exit_code = 1


class StageFailed(NavrlError):
    """A pipeline stage crashed; the daemon stops."""

    exit_code = 1


class UsageError(NavrlError):
    """The command line itself is wrong."""

    exit_code = 2


class DataError(NavrlError):
    """A data file (checkpoint, archive, dataset) is unreadable or corrupt (EX_DATAERR)."""

    exit_code = 65


class StateLocked(NavrlError):
    """Another process holds the state dir's lock (EX_TEMPFAIL)."""

    exit_code = 75


class ConfigError(NavrlError):
    """Bad configuration: restarting won't help (EX_CONFIG)."""

    exit_code = 78
