"""Imported by tests/runtime/test_signals.py: sends this process a SIGTERM while its own
import runs, then keeps running Python inside the import for a while."""

from __future__ import annotations

import os
import signal
import time

os.kill(os.getpid(), signal.SIGTERM)
deadline = time.monotonic() + 0.5
while time.monotonic() < deadline:  # the handler runs here, inside the import
    pass
completed = True
