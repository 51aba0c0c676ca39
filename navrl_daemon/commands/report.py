"""`navrl-daemon report`: one self-contained `report.html` of a state dir.

Reads (never locks, never writes the daemon's files, so it can run beside a running
daemon): `history.jsonl`, `eval/results.jsonl`, `config.toml` and the checkpoints. The
trajectory plot re-runs the evaluation (the run's `eval` config, on the CPU) with the
policy of the checkpoint of the latest evaluation, else the newest valid checkpoint.
Corrupt JSON lines are named (file:line) and skipped: the report is still written from the
other lines, and the command exits 65.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from navrl_daemon.commands.checkpoints import describe
from navrl_daemon.commands.common import (
    StepProgress,
    config_args,
    json_arg,
    print_json,
    state_dir,
    state_dir_arg,
)
from navrl_daemon.config import Config
from navrl_daemon.errors import DataError, NavrlError, UsageError
from navrl_daemon.storage.atomic import write_atomic
from navrl_daemon.storage.checkpoint import CheckpointDir, verify
from navrl_daemon.storage.history import HISTORY_FILE, read_jsonl
from navrl_daemon.storage.run_config import earlier_configs

if TYPE_CHECKING:
    from navrl_daemon.analysis.report import RunRecords

RESULTS_FILE = Path("eval") / "results.jsonl"


def register(sub: Any) -> None:
    p = sub.add_parser("report", help="learning curves, eval paths, checkpoints: report.html")
    state_dir_arg(config_args(p, overrides=False))
    p.add_argument("--out", type=Path, help="folder for report.html and PNGs (STATE_DIR/report)")
    p.add_argument(
        "--episodes", type=int, help="drones in the trajectory replay (default: eval.num_envs)"
    )
    p.add_argument(
        "--no-trajectories", action="store_true", help="skip re-running the evaluation to plot it"
    )
    json_arg(p)
    p.set_defaults(handler=handle)


def handle(cfg: Config, args: argparse.Namespace) -> int:
    from navrl_daemon.analysis.report import RunRecords, learning_curves, render_html

    root = state_dir(cfg, args)
    if args.episodes is not None and args.episodes < 1:
        raise UsageError("--episodes must be at least 1")
    if not root.is_dir():
        raise DataError(f"{root}: no such state dir: nothing to report")
    history = read_jsonl(root / HISTORY_FILE, required=("iteration", "frames"))
    evals = read_jsonl(root / RESULTS_FILE, required=("iteration",))
    files = CheckpointDir(root / "checkpoints").files()
    checkpoints = [describe(p, why) for p, why in verify(files)]
    config_path = root / "config.toml"
    config_text = config_path.read_text(errors="replace") if config_path.is_file() else None
    earlier = [(p.name, p.read_text(errors="replace")) for p in earlier_configs(root)]
    if not (history.rows or evals.rows or checkpoints or history.bad or evals.bad):
        raise DataError(
            f"{root}: no {HISTORY_FILE}, {RESULTS_FILE} or checkpoints: nothing to report "
            "(has `navrl-daemon run` used this state dir?)"
        )
    bad = [*history.bad, *evals.bad]
    records = RunRecords(
        state_dir=root,
        history=sorted(history.rows, key=lambda r: r["iteration"]),
        evals=sorted(evals.rows, key=lambda r: r["iteration"]),
        checkpoints=checkpoints,
        config_text=config_text,
        earlier_configs=earlier,
        problems=[f"{b} (line skipped)" for b in bad],
    )
    if args.no_trajectories:
        records.trajectory_caption = "not drawn (--no-trajectories)"
    else:
        _trajectories(records, config_path, args.episodes, cfg.env.backend)

    out = args.out if args.out is not None else root / "report"
    images = learning_curves(records.history, records.evals)
    images_to_write = dict(images)
    if records.trajectory_png is not None:
        images_to_write["trajectories.png"] = records.trajectory_png
    if records.video_gif is not None:
        images_to_write["episodes.gif"] = records.video_gif
    try:
        for name, png in images_to_write.items():
            write_atomic(out / name, png)
        write_atomic(out / "report.html", render_html(records, images).encode())
    except OSError as err:
        raise UsageError(f"--out {out}: {err.strerror or err}") from err
    page = out / "report.html"
    if args.json:
        print_json(
            {
                "report": str(page),
                "images": sorted(str(out / n) for n in images_to_write),
                "history_rows": len(records.history),
                "evaluations": len(records.evals),
                "checkpoints": len(checkpoints),
                "problems": [str(b) for b in bad],
            }
        )
    else:
        print(f"wrote {page} ({len(records.history)} history rows, {len(records.evals)} evals)")
    for b in bad:
        print(f"navrl-daemon: error: {b}", file=sys.stderr)
    return DataError.exit_code if bad else 0


def _trajectories(
    records: RunRecords, config_path: Path, episodes: int | None, named_backend: str
) -> None:
    """Replay the latest evaluation with its checkpoint's policy and plot it, or say why not
    in the caption (no config, no valid checkpoint, another env backend, a module as the
    backend that the user's own config does not name: env/backends.py `check_stored`)."""
    from navrl_daemon.config import load_config
    from navrl_daemon.env.backends import check_stored

    valid = [c for c in records.checkpoints if c["valid"] and c["iteration"] is not None]
    if not valid:
        records.trajectory_caption = "no valid checkpoint to replay an evaluation with"
        return
    if not config_path.is_file():
        records.trajectory_caption = f"no {config_path.name} in the state dir: cannot replay"
        return
    latest = records.evals[-1]["iteration"] if records.evals else None
    chosen = next((c for c in valid if c["iteration"] == latest), None)
    chosen = chosen or max(valid, key=lambda c: c["iteration"])
    overrides = ["run.device=cpu"]
    if episodes is not None:
        overrides.append(f"eval.num_envs={episodes}")
    try:
        cfg = load_config(config_path, overrides)
        check_stored(cfg.env.backend, named=named_backend, source=str(config_path))
        png, gif, results = _replay(cfg, Path(chosen["path"]))
    except NavrlError as err:
        records.trajectory_caption = f"not drawn: {err}"
        return
    if png is None:
        records.trajectory_caption = (
            f"not drawn: env.backend = {cfg.env.backend!r}; the plot needs the embedded env"
        )
        return
    records.trajectory_png, records.video_gif = png, gif
    records.moving_obstacles = results["moving_obstacles"]
    same = "the latest evaluation's" if chosen["iteration"] == latest else "the newest"
    records.trajectory_caption = (
        f"Checkpoint {Path(chosen['path']).name} ({same}), replayed by `report` on a fresh "
        f"eval env (layout {cfg.eval.layout}, seed {cfg.eval.seed}, {results['episodes']} "
        f"drones, CPU): reach_goal {results['reach_goal']:.3f}, collision "
        f"{results['collision']:.3f}."
    )
    if records.moving_obstacles:
        records.trajectory_caption += (
            " The daemon's own evaluations keep their moving obstacles moving between "
            "evaluations, so its numbers can differ."
        )


def _replay(cfg: Config, checkpoint: Path) -> tuple[bytes | None, bytes | None, dict[str, Any]]:
    """The evaluation with `checkpoint`'s policy: (plot PNG, video GIF, results)."""
    from navrl_daemon.env.contract import RecordableEnv
    from navrl_daemon.ops.plots import trajectory_plot
    from navrl_daemon.ops.video import gif_bytes
    from navrl_daemon.rl.eval_config import eval_steps
    from navrl_daemon.rl.evaluate import evaluate_recorded
    from navrl_daemon.rl.evaluations import make_eval_env
    from navrl_daemon.rl.policy import make_policy
    from navrl_daemon.storage.policy_file import check_policy_layout, load_any_policy_state

    policy = make_policy(cfg, "cpu")
    state = load_any_policy_state(checkpoint)
    check_policy_layout(state, policy.state_dict(), checkpoint)
    policy.load_state_dict(state)
    env = make_eval_env(cfg, "cpu")
    if not isinstance(env, RecordableEnv):
        return None, None, {}
    steps = eval_steps(cfg)
    # The replay takes as long as an evaluation (a minute at NavRL's scale on a CPU): say so.
    print(
        f"navrl-daemon: report: replaying {checkpoint.name} for the paths: "
        f"{cfg.eval.num_envs} drones, up to {steps} steps (--no-trajectories skips it)",
        file=sys.stderr,
    )
    with StepProgress(cfg.eval.num_envs, steps) as progress:
        results, traj = evaluate_recorded(
            env, policy, seed=cfg.eval.seed, max_steps=steps, progress=progress
        )
    title = f"{checkpoint.name}, layout {cfg.eval.layout}"
    results = {**results, "moving_obstacles": int(traj.dynamic.shape[1])}
    return trajectory_plot(traj, title), gif_bytes(traj, checkpoint.name), results
