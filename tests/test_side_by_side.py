"""Two runs side by side on one machine: the second never dies of the metrics port with an
exit code systemd would restart forever. A port the config chose and that is taken is a
configuration error (exit 78, naming the key); the default port, taken, gives way to a
free one, which the log names."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path

from navrl_daemon.config import MetricsConfig
from tests.conftest import TINY, navrl_cli

UNPORTED = [a for a in TINY if not a.startswith("metrics.port=")]


@contextlib.contextmanager
def held(port: int) -> Iterator[int]:
    """A listening socket on 127.0.0.1:`port` (0: a free one) for the block's length; a
    port some other process already holds is as taken."""
    sock = socket.socket()
    try:
        with contextlib.suppress(OSError):
            sock.bind(("127.0.0.1", port))
            sock.listen(1)
        yield sock.getsockname()[1] if port == 0 else port
    finally:
        sock.close()


def events(stderr: str) -> list[dict]:
    return [json.loads(x) for x in stderr.splitlines() if x.startswith("{")]


def test_a_taken_port_the_config_chose_exits_78_naming_the_key(tmp_path: Path) -> None:
    with held(0) as port:
        proc = navrl_cli(
            "run", "--state-dir", str(tmp_path / "s"), *UNPORTED, f"metrics.port={port}"
        )
    assert proc.returncode == 78, proc.stderr[-2000:]
    assert "metrics.port" in proc.stderr and "Traceback" not in proc.stderr


def test_the_default_port_taken_gives_way_to_a_free_one(tmp_path: Path) -> None:
    default = MetricsConfig().port
    with held(default):
        proc = navrl_cli(
            "run", "--state-dir", str(tmp_path / "s"), *UNPORTED, "run.total_frames=64"
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = events(proc.stderr)
    [warned] = [e for e in log if e["event"] == "metrics port in use: serving on a free one"]
    assert warned["taken"] == default
    [endpoint] = [e for e in log if e["event"] == "metrics endpoint"]
    assert not endpoint["url"].endswith(f":{default}")
