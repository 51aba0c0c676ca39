"""An env backend whose factory never returns: a start-up that hangs while building its
envs, as a simulator that waits forever on a device or a licence server would."""

from __future__ import annotations

import threading
from typing import Any


def never_returns(*args: Any, **kwargs: Any) -> Any:
    threading.Event().wait()  # blocks this thread for good, as a stuck C call would
