"""benchmarks/faults.py's start-up signal sweep judges each exit as docs/operations.md
gives it: a signal before `main` is Python's default action (-15, nothing printed)."""

from __future__ import annotations

import signal

import faults
import pytest


@pytest.mark.parametrize(
    ("code", "printed", "documented"),
    [
        (0, True, True),  # stopped
        (78, True, True),  # bad config
        (-signal.SIGTERM, False, True),  # before `main`: nothing logged or printed
        (-signal.SIGTERM, True, False),  # after a log line the handler owns the signal
        (134, True, False),  # an abort
        (-signal.SIGABRT, False, False),
        (1, True, False),  # a traceback's exit
        (None, False, False),  # never exited
    ],
)
def test_a_stop_signals_exit_is_judged_as_documented(code, printed, documented) -> None:
    assert faults.documented_stop(code, printed) is documented
