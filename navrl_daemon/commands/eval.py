"""`navrl-daemon eval`: NavRL's eval layout with Beta-mean actions on a saved policy."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from navrl_daemon.commands.common import (
    config_args,
    json_arg,
    print_fields,
    print_json,
    state_dir,
    state_dir_arg,
)
from navrl_daemon.config import Config, load_config, resolve_device
from navrl_daemon.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("eval", help="NavRL eval layout with Beta-mean actions")
    config_args(p)
    p.add_argument(
        "--checkpoint", type=Path, help="NavRL-layout state_dict (.pt) or checkpoint (.nrc)"
    )
    state_dir_arg(p)
    p.add_argument("--episodes", type=int, help="drones, one first episode each")
    p.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="also draw the map and each drone's path, coloured by outcome (embedded env)",
    )
    p.add_argument(
        "--probe",
        action="store_true",
        help="also probe LiDAR use (flown blind, action gap near pillars) and the altitude "
        "and path of each outcome (embedded env)",
    )
    json_arg(p)
    p.set_defaults(handler=handle)


def handle(cfg: Config, args: argparse.Namespace) -> int:
    from navrl_daemon.rl.evaluate import evaluate
    from navrl_daemon.rl.training import eval_steps, make_eval_env, make_policy
    from navrl_daemon.storage.policy_file import check_policy_layout, load_any_policy_state

    if args.episodes is not None:
        if args.episodes < 1:
            raise UsageError("--episodes must be at least 1")
        cfg = load_config(args.config, [*args.overrides, f"eval.num_envs={args.episodes}"])
    path = args.checkpoint or state_dir(cfg, args) / "export" / "policy.pt"
    device = resolve_device(cfg)
    policy = make_policy(cfg, "cpu")
    state = load_any_policy_state(path)
    check_policy_layout(state, policy.state_dict(), path)
    policy.load_state_dict(state)
    policy.to(device)
    env = make_eval_env(cfg, device)
    t0 = time.perf_counter()
    if args.plot is None:
        results = evaluate(env, policy, seed=cfg.eval.seed, max_steps=eval_steps(cfg))
    else:
        results = _evaluate_and_plot(cfg, env, policy, path, args.plot)
    if args.probe:
        results = {**results, **_probe(cfg, env, policy)}
    results = {
        "checkpoint": str(path),
        "layout": cfg.eval.layout,
        **results,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    if args.json:
        print_json(results)
    else:
        print_fields(results)
    return 0


def _probe(cfg: Config, env: Any, policy: Any) -> dict[str, Any]:
    """rl/probes.py on this evaluation: LiDAR use, and path statistics per outcome."""
    from navrl_daemon.env.navigation import NavigationEnv
    from navrl_daemon.rl.evaluate import evaluate_recorded
    from navrl_daemon.rl.probes import lidar_use, path_stats
    from navrl_daemon.rl.training import eval_steps

    if not isinstance(env, NavigationEnv):
        raise UsageError(f"--probe needs env.backend = 'navigation', not {cfg.env.backend!r}")
    steps = eval_steps(cfg)
    use = lidar_use(env, policy, seed=cfg.eval.seed, max_steps=steps)
    _, traj = evaluate_recorded(env, policy, seed=cfg.eval.seed, max_steps=steps)
    return {"lidar_use": use, "paths": path_stats(traj, env.cfg.dt)}


def _evaluate_and_plot(
    cfg: Config, env: Any, policy: Any, checkpoint: Path, out: Path
) -> dict[str, Any]:
    """`evaluate` with the paths recorded, drawn to `out`; the same numbers as without."""
    from navrl_daemon.env.navigation import NavigationEnv
    from navrl_daemon.ops.plots import trajectory_plot, write_png
    from navrl_daemon.rl.evaluate import evaluate_recorded
    from navrl_daemon.rl.training import eval_steps

    if not isinstance(env, NavigationEnv):
        raise UsageError(
            f"--plot draws the embedded env's map and needs env.backend = 'navigation', "
            f"not {cfg.env.backend!r}"
        )
    if out.suffix.lower() != ".png":
        raise UsageError(f"--plot writes a PNG: give a FILE.png, not {out}")
    results, traj = evaluate_recorded(env, policy, seed=cfg.eval.seed, max_steps=eval_steps(cfg))
    title = f"{checkpoint.name}, layout {cfg.eval.layout}, seed {cfg.eval.seed}"
    try:
        write_png(out, trajectory_plot(traj, title))
    except OSError as err:
        raise UsageError(f"--plot {out}: {err.strerror or err}") from err
    outcomes = traj.outcomes()
    counts = {k: outcomes.count(k) for k in ("reached", "collided", "timed out")}
    return {**results, "outcomes": counts, "plot": str(out)}
