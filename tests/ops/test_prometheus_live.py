"""A real Prometheus scraping a real `navrl-daemon run`: every expression of the dashboard
and of the alert rules is valid against the live data and returns some (or is declared
below as one that may be empty in this run), and every alert rule is loaded and healthy."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from ops_assets import (
    ALERTS,
    dashboard_queries,
    family,
    read_alert_rules,
    require_tool,
    scan,
    substitute,
)

from tests.conftest import REPO, TINY

JOB = "navrl-daemon"  # the job name the alert rules select on
# Grafana's $__rate_interval for 1 s scrapes: several samples in every window.
RATE_INTERVAL = "10s"
# Start-up and checks must be done by then; the daemon then gets STOP_S to drain and exit.
BUDGET_S = 65.0
STOP_S = 20.0
T = TypeVar("T")

# Metrics whose expressions may legitimately be empty (or NaN only) in this short, online,
# CPU-only run; an expression is excused if it reads one of them. Remove an entry once the
# stage behind it exists and reports within the first iterations.
MAY_BE_EMPTY = {
    # The RolloutArchiver is not in the pipeline yet (and is off unless configured).
    "navrl_archive_bytes_total": "no archiver in this run",
    "navrl_archive_segments_total": "no archiver in this run",
    "navrl_archive_dropped_total": "no archiver in this run",
    "navrl_archive_disk_bytes": "no archiver in this run",
    "navrl_archive_files": "no archiver in this run",
    "navrl_archive_rotated_files_total": "no archiver in this run",
    "navrl_archive_rotated_bytes_total": "no archiver in this run",
    # The HDF5Prefetcher only runs for offline training ("bc", "ppo+bc"); this run is online.
    "navrl_prefetch_wait_seconds": "no offline training in this run",
    "navrl_prefetch_batches_total": "no offline training in this run",
    # run.device=cpu: there is no GPU memory to report.
    "navrl_gpu_memory_bytes": "CPU run",
}


@dataclass(frozen=True)
class LivePrometheus:
    proc: subprocess.Popen
    api: PrometheusAPI
    log: Path


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[int], LivePrometheus]]:
    """`prometheus(metrics_port)`: a real Prometheus that scrapes the daemon on that port
    every second and evaluates the alert rules, stopped when the test ends."""
    binary = require_tool("prometheus")
    with ExitStack() as running:

        def start(metrics_port: int) -> LivePrometheus:
            port = free_port()
            config = tmp_path / "prometheus.yml"
            config.write_text(json.dumps(prometheus_config(metrics_port)))  # JSON is YAML
            log = tmp_path / "prometheus.log"
            command = [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ]
            proc = running.enter_context(started(command, log))
            return LivePrometheus(proc, PrometheusAPI(f"http://127.0.0.1:{port}"), log)

        yield start


def test_every_dashboard_and_alert_expression_returns_data(
    tmp_path: Path, prometheus: Callable[[int], LivePrometheus]
) -> None:
    deadline = time.monotonic() + BUDGET_S
    metrics_port = free_port()

    daemon_log = tmp_path / "daemon.log"
    daemon_cmd = [
        sys.executable,
        "-m",
        "navrl_daemon",
        "run",
        "--state-dir",
        str(tmp_path / "state"),
        *TINY,
        "env.navigation.map_levels=[0, 4]",  # every panel has data: the density levels' too
        "eval.interval=2",
        "checkpoint.interval=2",
        f"checkpoint.mirror={tmp_path / 'mirror'}",  # the mirror's panels too
        "metrics.address=127.0.0.1",
        f"metrics.port={metrics_port}",
    ]
    with started(daemon_cmd, daemon_log, cwd=REPO) as daemon:

        def daemon_diagnosis() -> str:
            return f"daemon exit code {daemon.poll()}; log tail:\n{tail(daemon_log)}"

        healthz = f"http://127.0.0.1:{metrics_port}/healthz"
        wait_until(
            "the daemon's /healthz to answer 200",
            lambda: http_status(healthz) == 200,
            deadline,
            daemon,
            daemon_diagnosis,
        )

        live = prometheus(metrics_port)
        prom, api = live.proc, live.api

        def diagnosis() -> str:
            return f"{daemon_diagnosis()}\nprometheus log tail:\n{tail(live.log)}"

        # Scraped, trained a while, evaluated once, and enough samples for every rate().
        for what, expr in [
            ("the daemon scraped", f'up{{job="{JOB}"}} == 1'),
            ("10 iterations", "navrl_iterations_total >= 10"),
            ("an evaluation", "navrl_evaluations_total >= 1"),
            ("5 scrapes", f'count_over_time(up{{job="{JOB}"}}[{RATE_INTERVAL}]) >= 5'),
        ]:
            wait_until(what, lambda e=expr: api.has_data(e), deadline, prom, diagnosis)
        rules = wait_until(
            "every rule evaluated",
            lambda: api.rules_if_all_evaluated(),
            deadline,
            prom,
            diagnosis,
        )

        problems = check_rules(rules) + check_dashboard(api) + check_alerts(api, rules)
        if problems:
            pytest.fail("\n".join(problems) + f"\n{diagnosis()}")

        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(timeout=STOP_S)
        assert code == 0, daemon_diagnosis()


def check_rules(rules: list[dict[str, Any]]) -> list[str]:
    """Every alert of alerts.yml is loaded and evaluates without error."""
    problems = []
    loaded = {r["name"] for r in rules if r["type"] == "alerting"}
    expected = {r.name for r in read_alert_rules(ALERTS)}
    if loaded != expected:
        problems.append(f"alert rules loaded {sorted(loaded)}, expected {sorted(expected)}")
    for rule in rules:
        if rule["health"] != "ok":
            problems.append(f"rule {rule['name']}: health {rule['health']}: {rule['lastError']}")
        if rule.get("state") == "firing":
            problems.append(f"alert {rule['name']} fires on a healthy daemon")
    return problems


def check_dashboard(api: PrometheusAPI) -> list[str]:
    problems = []
    for query in dashboard_queries():
        expr = substitute(query.expr, rate_interval=RATE_INTERVAL)
        where = f"panel {query.panel!r} {query.ref_id}: {expr}"
        status, error, result = api.query(expr)
        if status != "success":
            problems.append(f"{where}: {error}")
        elif not has_values(result) and not excused(expr):
            problems.append(f"{where}: no data")
    return problems


def check_alerts(api: PrometheusAPI, rules: list[dict[str, Any]]) -> list[str]:
    """An alert is empty while it does not fire, so: the whole expression is valid on live
    data, and each series it reads exists, so that it can fire."""
    problems = []
    for rule in rules:
        status, error, _ = api.query(rule["query"])
        if status != "success":
            problems.append(f"alert {rule['name']}: {error}")
        for selector in scan(rule["query"])[0]:
            if excused(selector.text):
                continue
            status, error, result = api.query(selector.text)
            if status != "success" or not has_values(result):
                problems.append(f"alert {rule['name']} reads {selector.text}: no data {error}")
    return problems


def excused(expr: str) -> bool:
    return any(family(s.name) in MAY_BE_EMPTY for s in scan(expr)[0])


def has_values(result: list[dict[str, Any]]) -> bool:
    """Some sample is a number (a histogram quantile with nothing observed is NaN)."""
    return any(not math.isnan(float(series["value"][1])) for series in result)


def prometheus_config(metrics_port: int) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {"job_name": JOB, "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}
        ],
    }


class PrometheusAPI:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> dict[str, Any]:
        """The API's JSON answer, error answers included; a connection error → status "down"."""
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.load(response)
        except urllib.error.HTTPError as e:  # 400/422/503 carry the error as JSON
            try:
                return json.load(e)
            except ValueError:
                return {"status": "error", "error": f"HTTP {e.code}"}
        except OSError as e:
            return {"status": "down", "error": str(e)}

    def query(self, expr: str) -> tuple[str, str, list[dict[str, Any]]]:
        answer = self.get("/api/v1/query", query=expr)
        result = answer.get("data", {}).get("result", [])
        return answer["status"], answer.get("error", ""), result

    def has_data(self, expr: str) -> bool:
        status, _, result = self.query(expr)
        return status == "success" and has_values(result)

    def rules_if_all_evaluated(self) -> list[dict[str, Any]] | None:
        answer = self.get("/api/v1/rules")
        if answer["status"] != "success":
            return None
        rules = [r for group in answer["data"]["groups"] for r in group["rules"]]
        if not rules or any(r["health"] == "unknown" for r in rules):
            return None
        return rules


@contextmanager
def started(cmd: list[str], log: Path, cwd: Path | None = None) -> Iterator[subprocess.Popen]:
    """Run cmd with its output in log; on the way out SIGTERM it, and SIGKILL if it lingers."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_until(
    what: str,
    check: Callable[[], T],
    deadline: float,
    proc: subprocess.Popen,
    diagnose: Callable[[], str],
) -> T:
    """Poll check() until it returns something truthy; fail at the deadline or if proc ends."""
    while True:
        result = check()
        if result:
            return result
        if proc.poll() is not None:
            pytest.fail(f"{Path(proc.args[0]).name} ended while waiting for {what}\n{diagnose()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}\n{diagnose()}")
        time.sleep(0.25)


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


# Panels every series of which has a number after a resume (others may show a term that
# this run does not compute, such as the BC loss, as NaN beside the ones it does).
WHOLLY_FINITE = ("navrl_checkpoint_bytes", "navrl_frames_per_second")


def test_after_a_resume_every_panel_reads_finite_numbers_and_a_stop_reads_stopped(
    tmp_path: Path, prometheus: Callable[[int], LivePrometheus]
) -> None:
    """A resumed daemon that has not written a checkpoint yet: the dashboard's panels
    are not NaN (the compression ratio reads the checkpoint it resumed from), frames/s
    moves; then a SIGTERM: its last scrape says "stopped", so NavrlDaemonStopped fires
    and NavrlDaemonDown does not (the state dir's run went on, nothing crashed)."""
    state = tmp_path / "state"
    same = [*TINY, "env.navigation.map_levels=[0, 4]", "eval.interval=2", "metrics.port=0"]
    same.append(f"checkpoint.mirror={tmp_path / 'mirror'}")  # the mirror's panels too
    run_cmd = [sys.executable, "-m", "navrl_daemon", "run", "--state-dir", str(state), *same]
    first = subprocess.run(
        [*run_cmd, "run.total_frames=256", "checkpoint.interval=2"],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == 0, first.stderr[-2000:]

    deadline = time.monotonic() + 2 * BUDGET_S
    metrics_port = free_port()
    daemon_log = tmp_path / "daemon.log"
    daemon_cmd = [*run_cmd, "run.total_frames=100000000", "checkpoint.interval=100000"]
    daemon_cmd += [f"metrics.port={metrics_port}", "metrics.final_scrape_s=5"]
    with started(daemon_cmd, daemon_log, cwd=REPO) as daemon:
        live = prometheus(metrics_port)
        prom, api = live.proc, live.api

        def diagnosis() -> str:
            return (
                f"daemon exit code {daemon.poll()}; log tail:\n{tail(daemon_log)}\n"
                f"prometheus log tail:\n{tail(live.log)}"
            )

        for what, expr in [
            ("the resumed daemon scraped", f'up{{job="{JOB}"}} == 1'),
            ("6 iterations", "navrl_iterations_total >= 6"),
            ("an evaluation", "navrl_evaluations_total >= 1"),
            ("5 scrapes", f'count_over_time(up{{job="{JOB}"}}[{RATE_INTERVAL}]) >= 5'),
        ]:
            wait_until(what, lambda e=expr: api.has_data(e), deadline, daemon, diagnosis)
        assert "resumed from checkpoint" in daemon_log.read_text()

        problems = []
        for query in dashboard_queries():
            expr = substitute(query.expr, rate_interval=RATE_INTERVAL)
            where = f"panel {query.panel!r} {query.ref_id}: {expr}"
            status, error, result = api.query(expr)
            values = [float(s["value"][1]) for s in result]
            if status != "success":
                problems.append(f"{where}: {error}")
            elif excused(expr) or "_bucket" in expr:
                continue  # a quantile over a window with nothing observed is NaN
            elif not any(math.isfinite(v) for v in values):  # a NaN (or empty) panel
                problems.append(f"{where}: {values or 'no data'}")
            elif any(m in expr for m in WHOLLY_FINITE) and not all(map(math.isfinite, values)):
                problems.append(f"{where}: {values}")
        if problems:
            pytest.fail("\n".join(problems) + f"\n{diagnosis()}")
        _, _, fps = api.query("navrl_frames_per_second")
        assert float(fps[0]["value"][1]) > 0, diagnosis()

        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=STOP_S + 10) == 0, diagnosis()
        rules = {r.name: r for r in read_alert_rules(ALERTS)}
        wait_until(
            "a failed scrape",
            lambda: api.has_data(f'up{{job="{JOB}"}} == 0'),
            time.monotonic() + 30,
            prom,
            diagnosis,
        )
        _, _, down = api.query(rules["NavrlDaemonDown"].expr)
        _, _, stopped = api.query(rules["NavrlDaemonStopped"].expr)
        assert not down and stopped, diagnosis()
