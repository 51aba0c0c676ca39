"""kill -9 a real `navrl-daemon run` at random moments, many times, and restart it. JSON out.

The same loop as tests/test_resume.py (10 trials there), at a scale that finds rare races:
each trial starts `run` on one state dir (checkpoint.interval = 1 and archive.interval = 1,
so a checkpoint and an archive write are in flight much of the time), kills it with
SIGKILL after a random delay — one in five during start-up (after the imports: each
start is a fork of a pre-imported interpreter, navrl_daemon/testing/forked.py), the others
while training —
and checks that the next start resumed from the newest valid checkpoint there was (never
a temp file, never an older one), removed and logged the temp files left behind, that
iterations only went forward (a start never resumes from an older checkpoint than the
start before it, the newest checkpoint on disk never goes back), and after every kill
that each checkpoint file is valid, the archive verifies (index rows and blobs, as
`archive verify`) and no (iteration, env) is archived twice
(navrl_daemon/testing/daemon_process.py).

Run: `.venv/bin/python benchmarks/kill9_resume.py [--trials 100] [--seed 0]`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from navrl_daemon.testing.daemon_process import crash_and_resume  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-delay-s", type=float, default=3.0)
    args = ap.parse_args()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        error = None
        try:
            counts = crash_and_resume(
                Path(tmp) / "state",
                args.trials,
                seed=args.seed,
                max_delay_s=args.max_delay_s,
                plant_temp_at=args.trials // 2,
            )
        except AssertionError as err:
            counts, error = {}, repr(err)
    print(
        json.dumps(
            {
                "benchmark": "kill9_resume",
                "passed": error is None,
                "error": error,
                **counts,
                "seconds": round(time.monotonic() - t0, 1),
                "seed": args.seed,
                "machine": platform.machine(),
                "cores": os.cpu_count(),
                "loadavg": [round(x, 2) for x in os.getloadavg()],
            },
            indent=1,
        )
    )
    sys.exit(0 if error is None else 1)


if __name__ == "__main__":
    main()
