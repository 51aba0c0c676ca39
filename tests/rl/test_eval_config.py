"""rl/eval_config.py reads configs only: importing it (and benchmarks/learning.py, which
`gpu_session.sh` runs with --check-config on every launch) imports no torch."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO, SUBPROCESS_ENV

NO_TORCH = "import sys, runpy; {}; assert 'torch' not in sys.modules, 'torch imported'"


def test_eval_config_and_learning_py_import_no_torch() -> None:
    for code in (
        "import navrl_daemon.rl.eval_config",
        "runpy.run_path('benchmarks/learning.py', run_name='not_main')",
    ):
        done = subprocess.run(
            [sys.executable, "-c", NO_TORCH.format(code)],
            cwd=REPO,
            env=SUBPROCESS_ENV,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (code, done.stderr[-2000:])
