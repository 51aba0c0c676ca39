"""pytest fixtures every test of the CLI needs, in tests/ and benchmarks/tests/ alike: what
an in-process `cli.main` sets process-wide is put back after each test. A conftest.py
imports them by name."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _restore_logging_setup() -> Iterator[None]:
    """Tests that call `cli.main` in-process reconfigure structlog; undo it after each."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture(autouse=True)
def _restore_signal_handlers() -> Iterator[None]:
    """`cli.main` handles the stop signals and leaves them ignored when it returns (the
    process is exiting); in-process callers get the test runner's handlers back."""
    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    saved = {sig: signal.getsignal(sig) for sig in stop_signals}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
