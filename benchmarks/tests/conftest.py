"""The benchmarks' own tests. Each imports the script it checks by its name, as the scripts
import each other: benchmarks/ is on the path, as running one of them puts it there."""

import sys
from pathlib import Path

from navrl_daemon.testing.fixtures import (  # noqa: F401 (autouse, for every test)
    _restore_logging_setup,
    _restore_signal_handlers,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
