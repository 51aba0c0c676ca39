"""The operations assets as shipped: the systemd unit passes `systemd-analyze verify`, the
Prometheus config and alert rules pass promtool (and their unit tests), and every PromQL
expression of the dashboard and the rules parses and names only metrics the daemon exports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ops_assets import (
    ALERTS,
    ALERTS_TEST,
    ENV_FILE,
    HISTOGRAM,
    LABELS,
    METRICS,
    PROMETHEUS_DIR,
    REPO,
    UNIT,
    dashboard_panels,
    dashboard_queries,
    family,
    load_dashboard,
    rated_series,
    read_alert_rules,
    require_tool,
    scan,
    substitute,
)

from navrl_daemon.config import RunConfig, load_config
from navrl_daemon.ops.intervals import share_interval

REQUIRED_ALERTS = {
    "NavrlDaemonDown",
    "NavrlRunFinished",
    "NavrlLearningRegressed",
    "NavrlNoEvaluation",
    "NavrlStateDirDiskLow",
    "NavrlGpuMemoryHigh",
    "NavrlTrainingStalled",
    "NavrlCheckpointTooOld",
    "NavrlCheckpointFailures",
    "NavrlNonFiniteUpdates",
    "NavrlQueueSaturated",
    "NavrlArchiveDropping",
    "NavrlCheckpointsMissed",
}


def run_tool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LC_ALL": "C", "SYSTEMD_LOG_LEVEL": "info", "SYSTEMD_COLORS": "0"}
    return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=cwd, env=env)


def promtool(*args: str, cwd: Path | None = None) -> str:
    result = run_tool(require_tool("promtool"), *args, cwd=cwd)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


# ------------------------------------------------------------------------------ systemd


def unit_settings(text: str) -> dict[str, list[str]]:
    """`Section.Key` → values in order (a unit may repeat a key), continuation lines joined."""
    settings: dict[str, list[str]] = {}
    section = ""
    logical = re.sub(r"\\\n", " ", text)
    for line in logical.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        settings.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return settings


def seconds(span: str) -> float:
    """A systemd time span such as `5min`, `30s` or `1h 30min`."""
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "hour": 3600, "d": 86400}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span)
    assert parts, f"not a time span: {span!r}"
    return sum(float(n) * units[u] for n, u in parts)


def test_unit_passes_systemd_analyze_verify_silently(tmp_path: Path) -> None:
    analyze = require_tool("systemd-analyze")
    shipped = UNIT.read_text()
    # verify insists that ExecStart's binary exists; only that path is swapped for one that does.
    tested = re.sub(r"(?m)^ExecStart=\S+", f"ExecStart={sys.executable}", shipped)
    changed = [a for a, b in zip(shipped.splitlines(), tested.splitlines(), strict=True) if a != b]
    assert len(changed) == 1 and changed[0].startswith("ExecStart="), changed
    unit = tmp_path / UNIT.name  # the unit name is part of what verify checks
    unit.write_text(tested)

    result = run_tool(analyze, "verify", str(unit))

    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_unit_settings_the_daemon_relies_on() -> None:
    unit = unit_settings(UNIT.read_text())

    def one(key: str) -> str:
        assert len(unit.get(key, [])) == 1, f"{key}: expected exactly one, got {unit.get(key)}"
        return unit[key][0]

    assert one("Service.Type") == "notify"
    assert one("Service.NotifyAccess") == "main"
    assert seconds(one("Service.WatchdogSec")) > 0
    assert one("Service.KillMode") == "mixed"
    assert one("Service.KillSignal") == "SIGTERM"
    assert one("Service.Restart") == "on-failure"
    assert "78" in one("Service.RestartPreventExitStatus").split()
    assert "75" not in one("Service.RestartPreventExitStatus").split()  # a lock holder may exit
    # The stop timeout must leave room for the final flush the daemon itself bounds.
    assert seconds(one("Service.TimeoutStopSec")) > RunConfig().shutdown_timeout_s
    # The daemon's own start-up limit fires first, with its phase and stacks in the journal,
    # and its exit (70) is one systemd restarts.
    assert seconds(one("Service.TimeoutStartSec")) > RunConfig().startup_timeout_s
    assert "70" not in one("Service.RestartPreventExitStatus").split()
    assert one("Service.StateDirectory") == "navrl-daemon"
    assert one("Service.LogsDirectory") == "navrl-daemon"
    assert one("Service.User") == "navrl"
    assert unit.get("Service.DynamicUser", ["no"]) == ["no"]
    exec_start = one("Service.ExecStart").split()
    assert exec_start[:2] == ["/opt/navrl-daemon/.venv/bin/navrl-daemon", "run"]
    assert exec_start[exec_start.index("--state-dir") + 1] == "${STATE_DIRECTORY}"
    assert one("Service.EnvironmentFile") == "-/etc/navrl-daemon/navrl-daemon.env"
    # /dev/nvidia* must stay reachable: any of these closes the device list.
    assert unit.get("Service.PrivateDevices", ["no"]) == ["no"]
    assert "Service.DeviceAllow" not in unit
    assert unit.get("Service.DevicePolicy", ["auto"]) == ["auto"]
    assert unit.get("Service.ProtectClock", ["no"]) == ["no"]  # implies DeviceAllow=char-rtc
    for hardening in ("NoNewPrivileges", "ProtectHome", "PrivateTmp"):
        assert one(f"Service.{hardening}") == "yes"
    assert one("Service.ProtectSystem") == "strict"


def test_env_file_examples_are_valid_config_overrides() -> None:
    examples = re.findall(r"(?m)^#?(NAVRL_\w+)=(.*)$", ENV_FILE.read_text())
    assert len(examples) >= 5
    for name, value in examples:
        load_config(environ={name: value})  # raises ConfigError naming the key if wrong


# ------------------------------------------------------------------------------ prometheus


def test_prometheus_config_and_alert_rules_pass_promtool() -> None:
    assert "SUCCESS" in promtool("check", "config", "prometheus.yml", cwd=PROMETHEUS_DIR)
    output = promtool("check", "rules", str(ALERTS))
    found = re.search(r"SUCCESS: (\d+) rules found", output)
    assert found, output
    # The tests below read the rules without a YAML library; make sure they saw them all.
    assert int(found.group(1)) == len(read_alert_rules())


def test_alert_rules_unit_tests_pass() -> None:
    promtool("test", "rules", ALERTS_TEST.name, cwd=ALERTS_TEST.parent)


def series_values(text: str, metric: str, instance: str) -> list[float]:
    """The value of each term, in order, of one input series of alerts_test.yml:
    "0.9x180 0.5x60" → [0.9, 0.5] (the regression tests hold each evaluation's value)."""
    selector = rf"{metric}\{{[^}}]*instance=\"{instance}\"[^}}]*\}}"
    found = re.search(rf"- series: '{selector}'\s*\n\s*values: \"([^\"]*)\"", text)
    assert found, f"alerts_test.yml: no {metric} for {instance}"
    return [float(term.split("x")[0]) for term in found.group(1).split()]


# The drones each regression test's evaluations flew (its comment in alerts_test.yml).
REGRESSION_DRONES = {"gpu1:9841": 64, "gpu2:9841": 64, "gpu3:9841": 16, "gpu4:9841": 1024}


@pytest.mark.parametrize("instance", sorted(REGRESSION_DRONES))
def test_regression_tests_give_the_interval_the_daemon_exports(instance: str) -> None:
    """promtool cannot call Python, so the regression tests' interval bounds are written out
    by hand; they must be the ones `Metrics.evaluation` exports for that share and count."""
    text = ALERTS_TEST.read_text()
    shares = series_values(text, "navrl_eval_reach_goal_ratio", instance)
    lows = series_values(text, "navrl_eval_reach_goal_low_ratio", instance)
    highs = series_values(text, "navrl_eval_reach_goal_high_ratio", instance)
    assert len(shares) == len(lows) == len(highs) == 2  # the best, then the drop
    for share, low, high in zip(shares, lows, highs, strict=True):
        interval = share_interval(share, REGRESSION_DRONES[instance])
        assert interval is not None
        assert low == pytest.approx(interval[0], abs=5e-4), (instance, share)
        assert high == pytest.approx(interval[1], abs=5e-4), (instance, share)


def test_alerts_are_complete_and_annotated() -> None:
    rules = read_alert_rules()
    names = [r.name for r in rules]
    assert len(names) == len(set(names))
    assert set(names) >= REQUIRED_ALERTS
    for rule in rules:
        assert rule.expr, rule.name
        assert "for" in rule.keys, f"{rule.name}: no `for:`"
        assert rule.keys.get("severity") in {"critical", "warning", "info"}, rule.name
        assert rule.keys.get("summary") and rule.keys.get("description"), rule.name


def test_every_alert_has_a_runbook_section_in_the_docs() -> None:
    """runbook_url points at a heading of docs/alerts.md (GitHub's anchor for it)."""
    anchors: dict[str, set[str]] = {}
    for rule in read_alert_rules():
        url = rule.keys.get("runbook_url", "")
        path, _, anchor = url.partition("#")
        assert path == "docs/alerts.md" and anchor, f"{rule.name}: runbook_url {url!r}"
        if path not in anchors:
            text = (REPO / path).read_text()
            anchors[path] = {
                re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"(?m)^#+ (.+)$", text)
            }
        assert anchor in anchors[path], f"{rule.name}: no heading for #{anchor} in {path}"


def test_dashboard_expressions_parse(tmp_path: Path) -> None:
    """promtool parses each dashboard query as a recording rule (JSON is valid YAML)."""
    rules = [
        {"record": f"dashboard:query_{i}", "expr": substitute(q.expr, rate_interval="1m")}
        for i, q in enumerate(dashboard_queries())
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert f"SUCCESS: {len(rules)} rules found" in promtool("check", "rules", str(path))


def all_expressions() -> list[tuple[str, str]]:
    dashboard = [
        (f"panel {q.panel!r} {q.ref_id}", substitute(q.expr, rate_interval="1m"))
        for q in dashboard_queries()
    ]
    return dashboard + [(f"alert {r.name}", r.expr) for r in read_alert_rules()]


@pytest.mark.parametrize(("where", "expr"), all_expressions(), ids=lambda v: v[:60])
def test_expressions_name_only_exported_metrics_and_labels(where: str, expr: str) -> None:
    selectors, labels = scan(expr)
    assert selectors, f"{where}: no metric in {expr!r}"
    unknown = sorted({s.name for s in selectors if family(s.name) is None})
    assert not unknown, f"{where}: unknown metrics {unknown} in {expr!r}"
    assert labels <= LABELS, f"{where}: unknown labels {sorted(labels - LABELS)} in {expr!r}"
    for series in rated_series(expr):
        fam = family(series)
        assert series.endswith("_total") or (fam and METRICS[fam] == HISTOGRAM), (
            f"{where}: rate/increase of {series}, which is not a counter"
        )
    for selector in selectors:
        if METRICS.get(family(selector.name) or "") == HISTOGRAM:
            assert selector.name != family(selector.name), (
                f"{where}: histogram {selector.name} used without _bucket/_sum/_count"
            )


def test_dashboard_shows_every_navrl_metric() -> None:
    exprs = [substitute(q.expr, rate_interval="1m") for q in dashboard_queries()]
    used = {family(selector.name) for expr in exprs for selector in scan(expr)[0]}
    missing = sorted(m for m in METRICS if m.startswith("navrl_") and m not in used)
    assert not missing, f"metrics with no dashboard panel: {missing}"


# ------------------------------------------------------------------------------ grafana


def test_dashboard_layout_and_datasource() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] == "navrl-daemon"
    assert dashboard["schemaVersion"] >= 38
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = dashboard_panels(dashboard)
    assert len({p["id"] for p in panels}) == len(panels), "duplicate panel ids"
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":  # layout only: rows hold no queries
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert target["expr"].strip(), panel["title"]
    ref_ids = [(p["id"], t["refId"]) for p in panels for t in p.get("targets", [])]
    assert len(set(ref_ids)) == len(ref_ids), "duplicate refId within a panel"


def test_grafana_provisioning_points_at_the_dashboard() -> None:
    provisioning = PROMETHEUS_DIR.parent / "grafana" / "provisioning"
    datasource = (provisioning / "datasources" / "prometheus.yaml").read_text()
    assert re.search(r"(?m)^\s+type: prometheus$", datasource)
    # $__rate_interval is only right when Grafana knows the scrape interval.
    assert re.search(r"(?m)^\s+timeInterval: 15s$", datasource)
    provider = (provisioning / "dashboards" / "navrl-daemon.yaml").read_text()
    assert re.search(r"(?m)^\s+type: file$", provider)
    path = re.search(r"(?m)^\s+path: (\S+)$", provider)
    assert path and path.group(1).endswith("config/grafana/dashboards"), provider


TORCHRUN_DROP_IN = UNIT.parent / "torchrun.conf"


def test_torchrun_drop_in_passes_systemd_analyze_verify_silently(tmp_path: Path) -> None:
    analyze = require_tool("systemd-analyze")
    swap = f"ExecStart={sys.executable}"  # verify insists that ExecStart's binary exists
    unit = tmp_path / UNIT.name
    unit.write_text(re.sub(r"(?m)^ExecStart=\S+", swap, UNIT.read_text()))
    drop_in = tmp_path / f"{UNIT.name}.d" / TORCHRUN_DROP_IN.name
    drop_in.parent.mkdir()
    drop_in.write_text(re.sub(r"(?m)^ExecStart=/\S+", swap, TORCHRUN_DROP_IN.read_text()))

    result = run_tool(analyze, "verify", str(unit))

    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_torchrun_drop_in_runs_launch_and_keeps_the_stop_settings() -> None:
    drop_in = unit_settings(TORCHRUN_DROP_IN.read_text())
    assert drop_in["Service.ExecStart"][0] == ""  # replaces the unit's `run`
    exec_start = drop_in["Service.ExecStart"][1].split()
    assert exec_start[:2] == ["/opt/navrl-daemon/.venv/bin/navrl-daemon", "launch"]
    assert exec_start[exec_start.index("--state-dir") + 1] == "${STATE_DIRECTORY}"
    assert drop_in["Service.NotifyAccess"] == ["all"]  # the ranks notify, not the launcher
    # The stop goes to the launcher alone, which stops the ranks (tests/distributed).
    assert "Service.KillMode" not in drop_in
    assert unit_settings(UNIT.read_text())["Service.KillMode"] == ["mixed"]
