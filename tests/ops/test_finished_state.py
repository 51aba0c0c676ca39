"""A daemon that reaches run.total_frames says so before it exits: /metrics serves
`navrl_daemon_state{state="finished"} 1` for metrics.final_scrape_s, so a Prometheus
scrape records it (the down alert tells a finished run from a crash by it; the rule logic
is unit-tested in alerts_test.yml); a stop signal ends that wait early."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from pathlib import Path

from navrl_daemon.testing import forked
from tests.conftest import TINY


def scrape_state(state: Path) -> dict[str, float]:
    """The daemon_state samples from the endpoint it recorded, or {} if it does not answer."""
    try:
        url = json.loads((state / "daemon.json").read_text())["url"]
        with urllib.request.urlopen(url + "/metrics", timeout=2) as reply:
            text = reply.read().decode()
    except (OSError, ValueError, KeyError):
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("navrl_daemon_state{"):
            name = line.split('state="')[1].split('"')[0]
            out[name] = float(line.rsplit(" ", 1)[1])
    return out


def test_finished_state_is_served_before_exit(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cmd = ["run", "--state-dir", str(state), *TINY]
    # 20 iterations: long enough that the 0.2 s poll sees it running (at 3, an idle
    # machine finished the run before the first scrape answered).
    cmd += ["run.total_frames=1280", "eval.interval=0", "metrics.final_scrape_s=30"]
    log = (tmp_path / "daemon.log").open("w")
    proc = forked.start(cmd, stdout=log, stderr=log)
    seen: list[dict[str, float]] = []
    deadline = time.monotonic() + 600
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            sample = scrape_state(state)
            if sample and (not seen or sample != seen[-1]):
                seen.append(sample)
            if sample.get("finished") == 1:
                break
            time.sleep(0.2)
        # A stop signal ends the final-scrape wait early (30 s otherwise), still exit 0.
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        stopped_in = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert code == 0, (tmp_path / "daemon.log").read_text()[-2000:]
    assert seen and seen[-1]["finished"] == 1 and seen[-1]["running"] == 0, seen
    assert any(s.get("running") == 1 for s in seen), seen  # it was running before
    assert stopped_in < 20, stopped_in
