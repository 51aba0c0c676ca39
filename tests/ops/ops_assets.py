"""What both ops tests read: the shipped dashboard and alert rules, the metric names the daemon
exports, and a small PromQL scanner that finds the metrics and labels an expression uses.

Parsing whether an expression is valid PromQL is left to promtool and Prometheus; the scanner
only has to find selectors and label names in expressions that already parse.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "config" / "grafana" / "dashboards" / "navrl-daemon.json"
PROMETHEUS_DIR = REPO / "config" / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERTS_TEST = Path(__file__).with_name("alerts_test.yml")
UNIT = REPO / "systemd" / "navrl-daemon.service"
ENV_FILE = REPO / "systemd" / "navrl-daemon.env"

# Every metric the daemon exports (design §3 and the metrics registry), by type. A name
# that is not here is a typo in a dashboard or a rule.
COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
METRICS: dict[str, str] = {
    # training
    "navrl_frames_total": COUNTER,
    "navrl_iterations_total": COUNTER,
    "navrl_frames_per_second": GAUGE,
    "navrl_policy_version": GAUGE,
    "navrl_episode_reach_goal_ratio": GAUGE,
    "navrl_episode_collision_ratio": GAUGE,
    "navrl_episode_return": GAUGE,
    "navrl_episode_length_steps": GAUGE,
    "navrl_episode_out_of_bounds_ratio": GAUGE,
    "navrl_loss": GAUGE,
    "navrl_grad_norm": GAUGE,
    "navrl_explained_variance": GAUGE,
    "navrl_policy_kl": GAUGE,
    "navrl_update_statistic": GAUGE,
    "navrl_kl_stopped_steps_total": COUNTER,
    "navrl_last_iteration_timestamp_seconds": GAUGE,
    "navrl_last_iteration_age_seconds": GAUGE,
    "navrl_policy_lag": HISTOGRAM,
    "navrl_nonfinite_updates_total": COUNTER,
    "navrl_rollbacks_total": COUNTER,
    # pipeline
    "navrl_stage_seconds": HISTOGRAM,
    "navrl_stage_busy_ratio": GAUGE,
    "navrl_queue_depth": GAUGE,
    "navrl_queue_capacity": GAUGE,
    "navrl_queue_blocked_seconds_total": COUNTER,
    "navrl_queue_dropped_total": COUNTER,
    "navrl_lease_pool_free": GAUGE,
    "navrl_lease_wait_seconds_total": COUNTER,
    "navrl_daemon_state": GAUGE,
    # checkpoints
    "navrl_checkpoint_write_seconds": HISTOGRAM,
    "navrl_checkpoint_stall_seconds": HISTOGRAM,
    "navrl_checkpoint_last_success_timestamp_seconds": GAUGE,
    "navrl_checkpoint_age_seconds": GAUGE,
    "navrl_checkpoint_bytes": GAUGE,
    "navrl_checkpoint_failures_total": COUNTER,
    "navrl_mirror_failures_total": COUNTER,
    "navrl_mirror_last_success_timestamp_seconds": GAUGE,
    "navrl_checkpoint_missed_intervals": GAUGE,
    # other state-dir files: eval results, history, export
    "navrl_write_failures_total": COUNTER,
    # archive
    "navrl_archive_bytes_total": COUNTER,
    "navrl_archive_segments_total": COUNTER,
    "navrl_archive_dropped_total": COUNTER,
    "navrl_archive_disk_bytes": GAUGE,
    "navrl_archive_files": GAUGE,
    "navrl_archive_rotated_files_total": COUNTER,
    "navrl_archive_rotated_bytes_total": COUNTER,
    # prefetch
    "navrl_prefetch_wait_seconds": HISTOGRAM,
    "navrl_prefetch_batches_total": COUNTER,
    # evaluation
    "navrl_eval_reach_goal_ratio": GAUGE,
    "navrl_eval_reach_goal_low_ratio": GAUGE,
    "navrl_eval_reach_goal_high_ratio": GAUGE,
    "navrl_eval_collision_ratio": GAUGE,
    "navrl_eval_return": GAUGE,
    "navrl_eval_episode_length_steps": GAUGE,
    "navrl_eval_out_of_bounds_ratio": GAUGE,
    "navrl_evaluations_total": COUNTER,
    "navrl_last_evaluation_timestamp_seconds": GAUGE,
    "navrl_eval_interval_iterations": GAUGE,
    "navrl_curriculum_stage": GAUGE,
    "navrl_env_level_share": GAUGE,
    # disk
    "navrl_state_dir_free_bytes": GAUGE,
    # process: prometheus_client's process collector, and ours
    "process_resident_memory_bytes": GAUGE,
    "process_virtual_memory_bytes": GAUGE,
    "process_cpu_seconds_total": COUNTER,
    "process_start_time_seconds": GAUGE,
    "process_open_fds": GAUGE,
    "process_max_fds": GAUGE,
    "navrl_gpu_memory_bytes": GAUGE,
    "navrl_build_info": GAUGE,
    # Prometheus' own per-target series
    "up": GAUGE,
}
# Label names the exprs may match or group on: the target's, the histograms' and ours.
LABELS = {"job", "instance", "le", "stage", "phase", "queue", "pool", "term", "group", "kind"}
LABELS |= {"state", "version", "torch", "device", "file", "pillars"}

_HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def family(series_name: str) -> str | None:
    """The exported metric a series name belongs to (`x_bucket` → `x`), None if unknown."""
    if series_name in METRICS:
        return series_name
    for suffix in _HISTOGRAM_SERIES:
        base = series_name.removesuffix(suffix)
        if base != series_name and METRICS.get(base) == HISTOGRAM:
            return base
    return None


def require_tool(name: str) -> str:
    """Path of a command-line tool; without it skip here, but fail in CI (.ci/run installs it)."""
    path = shutil.which(name)
    if path is not None:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{name} not found on PATH; CI must have it (.ci/run installs prometheus)")
    pytest.skip(f"{name} not installed (Debian: apt-get install prometheus); CI does not skip")


# ------------------------------------------------------------------------------ dashboard


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    ref_id: str
    expr: str  # as written in the dashboard, Grafana variables and all


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_panels(dashboard: dict) -> list[dict]:
    """Every panel, including those inside collapsed rows."""
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def dashboard_queries(dashboard: dict | None = None) -> list[PanelQuery]:
    dashboard = dashboard or load_dashboard()
    return [
        PanelQuery(panel["title"], target["refId"], target["expr"])
        for panel in dashboard_panels(dashboard)
        for target in panel.get("targets", [])
    ]


def substitute(expr: str, rate_interval: str, instance: str = ".*") -> str:
    """What Grafana sends: its variables replaced. Any other `$name` left over is an error."""
    out = expr.replace("$__rate_interval", rate_interval).replace("$__interval", rate_interval)
    out = out.replace("${instance}", instance).replace("$instance", instance)
    leftover = re.search(r"\$\{?\w+", out)
    assert leftover is None, f"unknown Grafana variable {leftover.group()} in {expr!r}"
    return out


# ------------------------------------------------------------------------------ alert rules


@dataclass
class AlertRule:
    name: str
    expr: str = ""
    keys: dict[str, str] = field(default_factory=dict)  # for, severity, summary, ...


_BLOCK_SCALAR = re.compile(r"[|>][+-]?")


def read_alert_rules(path: Path = ALERTS) -> list[AlertRule]:
    """The alerts of a rule file, for the layout alerts.yml uses: `- alert:` items whose
    `expr:` is a one-line or a block scalar. Tests cross-check the count with promtool's.

    No YAML library: the project does not depend on one, and promtool parses the file for real.
    """
    rules: list[AlertRule] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if m := re.match(r"\s*- alert:\s*(\S+)\s*$", line):
            rules.append(AlertRule(m.group(1)))
            continue
        m = re.match(r"(\s*)(\w+):\s*(.*?)\s*$", line)
        if not rules or not m or line.lstrip().startswith("#"):
            continue
        indent, key, value = len(m.group(1)), m.group(2), m.group(3)
        if _BLOCK_SCALAR.fullmatch(value):
            block = []
            while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > indent):
                block.append(lines[i].strip())
                i += 1
            value = "\n".join(block).strip()
        elif value[:1] in "'\"" and value[-1:] == value[:1]:
            value = value[1:-1]
        if key == "expr":
            rules[-1].expr = value
        else:
            rules[-1].keys[key] = value
    return rules


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


# ------------------------------------------------------------------------------ PromQL scan

_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_TOKEN = re.compile(
    r"""(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
      | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
      | (?P<selector>(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)?\s*(?P<matchers>\{[^{}]*\})?)""",
    re.VERBOSE,
)
_MATCHER_LABEL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}


@dataclass(frozen=True)
class Selector:
    name: str
    text: str  # `name{matchers}` as written


def scan(expr: str) -> tuple[list[Selector], set[str]]:
    """The vector selectors of an expression and every label name it matches or groups on."""
    text = "\n".join(line.split("#", 1)[0] for line in expr.splitlines())  # PromQL comments
    labels: set[str] = set()
    for m in _GROUPING.finditer(text):
        labels |= {label.strip() for label in m.group(2).split(",") if label.strip()}
    text = _RANGE.sub(" ", _GROUPING.sub(" ", text))
    selectors = []
    for m in _TOKEN.finditer(text):
        if not m.group("selector") or not m.group("selector").strip():
            continue
        name, matchers = m.group("name"), m.group("matchers")
        if matchers:
            labels |= set(_MATCHER_LABEL.findall(_strip_strings(matchers)))
        after = text[m.end() :].lstrip()
        if name and not matchers and (after.startswith("(") or name.lower() in _KEYWORDS):
            continue  # a function, an aggregation or an operator keyword
        assert name, f"selector without a metric name in {expr!r}: {m.group()!r}"
        selectors.append(Selector(name, m.group("selector").strip()))
    return selectors, labels


def _strip_strings(text: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', text)


_RATE_OF = re.compile(r"\b(rate|irate|increase)\s*\(\s*([A-Za-z_:][A-Za-z0-9_:]*)")


def rated_series(expr: str) -> list[str]:
    """Series names that rate()/irate()/increase() are taken of."""
    return [m.group(2) for m in _RATE_OF.finditer(expr)]
