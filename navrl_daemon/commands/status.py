"""`navrl-daemon status`: is a daemon training on this state dir, and is it healthy?

Whether one runs is the state-dir lock (a non-blocking flock probe, released at once; the
pid comes from the lock file). How it is doing comes from its health endpoint
(`/healthz`, `/metrics`, at the URL it records in `STATE_DIR/daemon.json`) when reachable,
else from the files (`history.jsonl`, the newest checkpoint). Exit 0: running and healthy;
1: running but unhealthy (stalled, starting, draining, or its endpoint does not answer);
3: not running.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from navrl_daemon.commands.common import config_args, json_arg, print_json, state_dir, state_dir_arg
from navrl_daemon.config import Config
from navrl_daemon.errors import DataError
from navrl_daemon.ops.intervals import interval_text
from navrl_daemon.runtime.lock import StateDirLock
from navrl_daemon.storage.checkpoint import CheckpointDir, read_header
from navrl_daemon.storage.history import DAEMON_FILE, HISTORY_FILE, read_jsonl

EXIT_UNHEALTHY = 1
EXIT_NOT_RUNNING = 3
HTTP_TIMEOUT_S = 2.0
EVAL_RESULTS = Path("eval") / "results.jsonl"


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="whether a daemon runs on the state dir, and its health")
    json_arg(state_dir_arg(config_args(p, overrides=False)))
    p.set_defaults(handler=handle)


def handle(cfg: Config, args: argparse.Namespace) -> int:
    root = state_dir(cfg, args)
    doc: dict[str, Any] = {"state_dir": str(root), "running": lock_held(root)}
    doc["pid"] = StateDirLock.holder_pid(root) if doc["running"] else None
    doc.update(healthy=None, state=None, reason=None, source="files")
    doc.update(_from_files(root))
    if not doc["running"]:
        doc["reason"] = "no daemon holds the state dir" if root.is_dir() else "no such state dir"
        code = EXIT_NOT_RUNNING
    else:
        url = _endpoint(root, doc["pid"])
        if url is None:
            doc.update(
                healthy=False,
                reason=f"no health endpoint in {DAEMON_FILE} (still starting, "
                "or metrics.enabled = false)",
            )
        else:
            doc.update(_from_endpoint(url))
        code = 0 if doc["healthy"] else EXIT_UNHEALTHY
    if args.json:
        print_json(doc)
    else:
        _print_text(doc)
    return code


def lock_held(root: Path) -> bool:
    """Whether a process holds the state dir's flock. The probe takes the lock for a moment
    when it is free (a `run` starting in that instant would be told the dir is locked)."""
    try:
        fd = os.open(root / "lock", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # no lock file: no daemon ever ran here, or not ours to read
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _endpoint(root: Path, pid: int | None) -> str | None:
    """The URL the running daemon recorded, if it is that daemon's (same pid)."""
    try:
        info = json.loads((root / DAEMON_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or info.get("pid") != pid or not info.get("url"):
        return None
    return str(info["url"])


def _from_endpoint(url: str) -> dict[str, Any]:
    out: dict[str, Any] = {"endpoint": url}
    try:
        code, body = _get(url + "/healthz")
        health = json.loads(body)
    except (OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        out.update(healthy=False, reason=f"health endpoint {url} did not answer: {reason}")
        return out
    out.update(
        source="endpoint",
        healthy=code == 200,
        state=health.get("state"),
        reason=health.get("reason"),
        last_iteration_age_s=health.get("last_iteration_age_s"),
    )
    with contextlib.suppress(OSError, ValueError):
        out.update(_metrics(_get(url + "/metrics")[1]))
    return out


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:  # 503 carries the JSON body that says why
        return err.code, err.read().decode()


def _metrics(text: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Any] = {}
    queues: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "navrl_policy_version":
                out["iteration"] = int(sample.value)
            elif sample.name == "navrl_frames_per_second":
                out["frames_per_second"] = sample.value
            elif sample.name == "navrl_queue_depth":
                queues[sample.labels.get("queue", "?")] = sample.value
    out["queues"] = queues
    return out


def _from_files(root: Path) -> dict[str, Any]:
    """The last history row and the newest readable checkpoint header."""
    out: dict[str, Any] = {
        "iteration": None,
        "frames": None,
        "frames_per_second": None,
        "last_checkpoint": None,
        "last_eval": None,
        "queues": None,
    }
    now = time.time()
    rows = read_jsonl(root / HISTORY_FILE, required=("iteration",)).rows
    if rows:
        last = rows[-1]
        out.update(
            iteration=last.get("iteration"),
            frames=last.get("frames"),
            frames_per_second=last.get("frames_per_second"),
        )
        if isinstance(last.get("time"), int | float):
            out["history_age_s"] = round(now - last["time"], 1)
    evals = read_jsonl(root / EVAL_RESULTS, required=("iteration",)).rows
    if evals:
        last_eval = evals[-1]
        out["last_eval"] = {
            k: last_eval.get(k)
            for k in ("iteration", "frames", "episodes", "reach_goal", "collision", "return")
        }
        if isinstance(last_eval.get("time"), int | float):
            out["last_eval"]["age_s"] = round(now - last_eval["time"], 1)
    for path in reversed(CheckpointDir(root / "checkpoints").files()):
        try:
            header = read_header(path)
        except DataError:
            continue
        out["last_checkpoint"] = {
            "path": str(path),
            "iteration": header.iteration,
            "age_s": round(now - header.created, 1) if header.created else None,
        }
        break
    return out


def _print_text(doc: dict[str, Any]) -> None:
    if not doc["running"]:
        print(f"not running: {doc['reason']} ({doc['state_dir']})")
    else:
        health = "healthy" if doc["healthy"] else f"UNHEALTHY: {doc['reason']}"
        print(f"running: pid {doc['pid']}, {doc.get('state') or 'state unknown'}, {health}")
    fps = doc.get("frames_per_second")
    if doc.get("iteration") is not None:
        rate = f", {fps:.0f} frames/s" if isinstance(fps, int | float) else ""
        print(f"iteration {doc['iteration']}{rate} (from the {doc['source']})")
    ckpt = doc.get("last_checkpoint")
    if ckpt:
        print(f"last checkpoint: {Path(ckpt['path']).name}, {ckpt['age_s']} s old")
    ev = doc.get("last_eval")
    if ev:
        age = f", {ev['age_s']:.0f} s ago" if isinstance(ev.get("age_s"), int | float) else ""
        reach = ev.get("reach_goal")
        within = interval_text(reach, ev.get("episodes"))
        print(
            f"last eval: iteration {ev['iteration']}, reach_goal {_fmt(reach)}{within}, "
            f"collision {_fmt(ev.get('collision'))}{age}"
        )
    if doc.get("queues"):
        print("queues: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(doc["queues"].items())))


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)
