"""What `run` says when it ends: how far it got, where the results are, the best evaluation,
and what to run next, with the command spelled the way this process was started (so a user
who ran `make run` learns it is `.venv/bin/navrl-daemon`).

Read from the state dir's files after the daemon stopped, so it says what is on disk. On a
terminal it is a block of text on stderr; otherwise one JSON log line (`run summary`).
"""

from __future__ import annotations

import importlib.util
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import structlog

from navrl_daemon.config import Config
from navrl_daemon.ops.tensorboard import view_command

log = structlog.get_logger("run")


def run_summary(cfg: Config, state_dir: Path) -> dict[str, Any]:
    """The facts of the summary, from the state dir."""
    from navrl_daemon.pipeline.resume import newest_header
    from navrl_daemon.rl.evaluate import eval_rank
    from navrl_daemon.storage.checkpoint import CheckpointDir
    from navrl_daemon.storage.history import HISTORY_FILE, RESULTS_FILE, read_jsonl

    evals = read_jsonl(state_dir / "eval" / "results.jsonl", required=("iteration",)).rows
    # The newest checkpoint, as the stop log says it: history rows come every
    # log.summary_interval iterations (and one may have failed to be written).
    last = newest_header(state_dir)
    frames = None if last is None else last.frames
    finished = frames is not None and frames >= cfg.run.total_frames
    scored = [r for r in evals if isinstance(r.get("reach_goal"), int | float)]
    best = max(scored, key=eval_rank) if scored else None
    exports = state_dir / "export"
    tensorboard = state_dir / "tensorboard"
    checkpoints = CheckpointDir(state_dir / "checkpoints").files()
    doc: dict[str, Any] = {
        "outcome": "finished run.total_frames" if finished else "stopped before run.total_frames",
        "iteration": None if last is None else last.iteration,
        "frames": frames,
        "total_frames": cfg.run.total_frames,
        "state_dir": str(state_dir),
        "files": [n for n in (HISTORY_FILE, RESULTS_FILE) if (state_dir / n).is_file()],
        "checkpoints": len(checkpoints),
        "policy": _existing(exports / "policy.pt"),
        "best_policy": _existing(exports / "best.pt"),
        "best_eval": None
        if best is None
        else {k: best.get(k) for k in ("iteration", "frames", "reach_goal", "collision")},
        "last_eval": None
        if not scored
        else {k: scored[-1].get(k) for k in ("iteration", "reach_goal", "collision")},
        "tensorboard": view_command(tensorboard) if tensorboard.is_dir() else None,
    }
    evaluated = {r["iteration"] for r in scored}
    steps = next_steps(
        cfg, state_dir, doc, exportable_best=any(_iteration(p) in evaluated for p in checkpoints)
    )
    doc["next"] = [command for command, _ in steps]
    doc["next_why"] = [why for _, why in steps]
    return doc


def next_steps(
    cfg: Config, state_dir: Path, doc: dict[str, Any], *, exportable_best: bool
) -> list[tuple[str, str]]:
    """What to run next, each with why: only commands that succeed on the state dir as it
    is (a report needs a record, a video a policy, `export --best` an evaluated checkpoint,
    ONNX its packages), and a `run` that trains: past run.total_frames when it was reached."""
    cmd = command_prefix()
    sd = shlex.quote(str(state_dir))
    steps: list[tuple[str, str]] = []
    if doc["files"] or doc["checkpoints"]:
        steps.append(
            (f"{cmd} report --state-dir {sd}", "learning curves, paths, checkpoints: report.html")
        )
    if doc["policy"]:
        steps.append(
            (
                f"{cmd} eval --state-dir {sd} --video eval.gif",
                "watch the policy fly: top-down and side view",
            )
        )
    if exportable_best:
        onnx = all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxscript"))
        fmt, why = (
            ("onnx", "the best policy for ONNX Runtime (robots, ROS)")
            if onnx
            else ("navrl", "the best policy in NavRL's layout (ONNX: pip install '.[export]')")
        )
        steps.append((f"{cmd} checkpoints export --state-dir {sd} --best --format {fmt}", why))
    resume = _resume_args(state_dir)
    if doc["frames"] is None:
        why = "start again: no checkpoint to resume from"
    elif doc["frames"] >= cfg.run.total_frames:
        more = 2 * cfg.run.total_frames
        resume = [a for a in resume if not a.startswith("run.total_frames=")]
        resume.append(f"run.total_frames={more}")
        why = f"train on to {more:,} frames: resumes from the newest checkpoint"
    else:
        why = "train on: resumes from the newest checkpoint"
    steps.append((f"{cmd} {' '.join(resume)}", why))
    return steps


def print_run_summary(cfg: Config, state_dir: Path) -> None:
    doc = run_summary(cfg, state_dir)
    fmt = cfg.log.format
    if fmt == "json" or (fmt == "auto" and not _isatty()):
        log.info("run summary", **doc)
        return
    try:
        sys.stderr.write(render(doc))
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # the terminal is gone: into the log
        log.info("run summary", **doc)


def render(doc: dict[str, Any]) -> str:
    frames = doc["frames"]
    where = (
        f"at iteration {doc['iteration']} ({frames:,} of {doc['total_frames']:,} frames)"
        if isinstance(frames, int)
        else "with no checkpoint"
    )
    held = [*doc["files"], f"{doc['checkpoints']} checkpoint file(s)"]
    lines = [
        "",
        f"navrl-daemon: run {doc['outcome']} {where}; exit 0",
        f"  state dir    {doc['state_dir']}  ({', '.join(held)})",
    ]
    if doc["policy"]:
        lines.append(f"  policy       {doc['policy']}  (the last weights, NavRL's layout)")
    best = doc["best_eval"]
    if best:
        where = f"{doc['best_policy']}  " if doc["best_policy"] else ""
        lines.append(
            f"  best eval    {where}(iteration {best['iteration']}: reach_goal "
            f"{best['reach_goal']:.3f}, collision {best['collision']:.3f})"
        )
    if doc["tensorboard"]:
        lines.append(f"  TensorBoard  {doc['tensorboard']}")
    lines.append("  next:")
    for command, why in zip(doc["next"], doc["next_why"], strict=True):
        lines += [f"    # {why}", f"    {command}"]
    return "\n".join(lines) + "\n"


def command_prefix() -> str:
    """`navrl-daemon` if that is what PATH finds for this program, else its path (relative
    to the working directory when under it), else `python -m navrl_daemon`."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if argv0 is not None and argv0.name == "navrl-daemon":
        on_path = shutil.which("navrl-daemon")
        if on_path and Path(on_path).resolve() == argv0.resolve():
            return "navrl-daemon"
        return shlex.quote(_short(argv0))
    return f"{shlex.quote(_short(Path(sys.executable)))} -m navrl_daemon"


def _resume_args(state_dir: Path) -> list[str]:
    """`run` with the arguments this process was given (the same config and overrides)."""
    args = sys.argv[1:]
    if "run" not in args:  # called in-process (tests): not this program's own arguments
        args = ["run", "--config", str(state_dir / "config.toml"), "--state-dir", str(state_dir)]
    return [shlex.quote(a) for a in args]


def _short(path: Path) -> str:
    """`path` relative to the working directory when it is under it, else as it is."""
    try:
        return str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _iteration(path: Path) -> int | None:
    from navrl_daemon.errors import DataError
    from navrl_daemon.storage.checkpoint import read_header

    try:
        return read_header(path).iteration
    except DataError:
        return None


def _existing(path: Path) -> str | None:
    return str(path) if path.exists() else None


def _isatty() -> bool:
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):
        return False
