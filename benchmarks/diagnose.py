"""What a trained policy has learned (issue #23): NavRL's evaluation of saved policies on
the maps they trained on and on maps they never saw, at several densities and spawn
layouts, with the LiDAR-use probe and path statistics (analysis/probes.py), as JSON.

Each row is one (checkpoint, pillars, layout, maps) evaluation:
- pillars `K` builds maps of K pillars (a curriculum stage's maps are drawn that way);
  `N:K` keeps the first K pillars of N-pillar maps (the density levels of
  `env.navigation.map_levels`, where the N-pillar maps are the training maps).
- maps `train` are the maps the checkpoint trained on: for a `.nrc`, its own run's
  (run.seed, env.navigation.num_maps, from the config saved in it); for a `.pt` (no config), the
  command line's. `held_out` are `--held-out-maps` maps drawn from `--held-out-seed`.
  Every row names the seed of its maps (`maps_seed`).
- layout `navrl` is NavRL's crossing evaluation, `train` the training spawn rule.
With `--probe`, NavRL-layout rows also fly blind (LiDAR zeroed), measure the action gap
near pillars, and give altitude and path statistics per outcome. With
`--goal-distance-caps 16 30`, they are flown again with the goal distance the policy reads
capped at 16 and at 30 m (`goal_distance_use`). With `--hover-share STEPS`, each checkpoint
also flies the training env (of curriculum stage `--stage`, envs at the checkpoint's
density levels when it is a `.nrc` that holds them) for STEPS steps with actions sampled
as in training, and reports the share of frames flown within reach of the goal
(`goal_hover_share`). With `--hazard`, every row also gives collisions per 100 m flown and
the collision share by start-goal distance (`collision_hazard`): on the training layout's
hops, whether a policy collides mid-flight at a rate per metre or at the start and goal;
and how each collision met its pillar (`collision_approach`: head-on, oblique or glancing,
the speed, the pillar's height). With `--pillar-pass`, each checkpoint also flies the
scripted scene of one pillar on the goal line shifted sideways by -0.4..0.4 m
(`pillar_pass`): whether it passes, on which side, and its shortest beam.
Every row keeps its drones' outcomes (`outcomes`, one of "RCOT" per drone: reached,
collided, out of bounds, timed out): two policies' rows of the same maps and drones compare
drone by drone with `benchmarks/paired.py`.

Run: `.venv/bin/python benchmarks/diagnose.py --checkpoint A.nrc [B.pt ...] --config
config/navrl-original.toml --pillars 100 350 350:100 --probe --out diag.json [KEY=VALUE ...]`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from navrl_daemon.analysis.probes import (
    collision_approach,
    collision_hazard,
    goal_distance_use,
    goal_hover_share,
    lidar_use,
    path_stats,
    pillar_pass,
    pillar_pass_env,
)
from navrl_daemon.config import Config, load_config
from navrl_daemon.env import make_env
from navrl_daemon.rl.eval_config import eval_steps
from navrl_daemon.rl.evaluate import evaluate_outcomes, evaluate_recorded
from navrl_daemon.rl.policy import make_policy
from navrl_daemon.rl.run_state import migrate
from navrl_daemon.storage.policy_file import check_policy_layout, load_any_policy


def pillar_spec(text: str) -> tuple[int, int | None]:
    """ "K" → (K, None): K-pillar maps; "N:K" → (N, K): the first K pillars of N-pillar maps."""
    whole, _, prefix = text.partition(":")
    return int(whole), int(prefix) if prefix else None


def eval_env(cfg: Config, spec: tuple[int, int | None], layout: str, seed: int, maps: int):
    whole, prefix = spec
    env_cfg = cfg.env.replaced(
        num_obstacles=whole,
        map_levels=[] if prefix is None else [prefix],
        min_level=0,
        num_maps=maps,
        curriculum=[],
    )
    return make_env(env_cfg, seed=seed, num_envs=cfg.eval.num_envs, layout=layout)


def training_maps(cfg: Config, snap: dict[str, Any] | None) -> tuple[int, int]:
    """(seed, count) of the maps a checkpoint trained on: its run's config when it holds
    one (a `.nrc`), else `cfg`'s. A policy of run.seed = 1 flown on seed 0's maps would be
    flown on maps it never saw."""
    saved = (migrate(snap, "checkpoint").get("config") if snap else None) or {}
    if "run" in saved and "env" in saved:
        return int(saved["run"]["seed"]), int(saved["env"]["navigation"]["num_maps"])
    return cfg.run.seed, cfg.env.navigation.num_maps


def saved_levels(snap: dict[str, Any] | None) -> torch.Tensor | None:
    """The training envs' density levels a `.nrc` checkpoint holds (None: a `.pt`, or
    no env state)."""
    return ((snap or {}).get("collector") or {}).get("env", {}).get("level")


def hover_row(
    cfg: Config, policy, snap: dict[str, Any] | None, args: argparse.Namespace
) -> dict[str, Any]:
    env_cfg = cfg.env.stage_env(args.stage) if cfg.env.curriculum else cfg.env
    seed, count = training_maps(cfg, snap)
    n = cfg.eval.num_envs
    env = make_env(env_cfg.replaced(num_maps=count), seed=seed, num_envs=n)
    levels = saved_levels(snap)
    at_levels = bool(env_cfg.navigation.map_levels) and levels is not None and len(levels) >= n
    if at_levels:
        env.level.copy_(levels[:n])
    row: dict[str, Any] = {
        "probe": "hover_share",
        "stage": args.stage,
        "saved_levels": at_levels,
        "maps_seed": seed,
    }
    row.update(goal_hover_share(env, policy, steps=args.hover_share, seed=cfg.eval.seed))
    return row


def diagnose(cfg: Config, path: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    state, snap = load_any_policy(path)  # a `.nrc` is read once, for its policy and its maps
    policy = make_policy(cfg, "cpu")
    check_policy_layout(state, policy.state_dict(), Path("policy"))
    policy.load_state_dict(state)
    steps = eval_steps(cfg)
    every = {
        "train": training_maps(cfg, snap),
        "held_out": (args.held_out_seed, args.held_out_maps),
    }
    maps = {k: every[k] for k in args.maps}
    rows = []
    for text in args.pillars:
        for layout in args.layouts:
            for which, (seed, count) in maps.items():
                env = eval_env(cfg, pillar_spec(text), layout, seed, count)
                t0 = time.perf_counter()
                row: dict[str, Any] = {
                    "pillars": text,
                    "layout": layout,
                    "maps": which,
                    "maps_seed": seed,
                    "maps_count": count,
                }
                probe = args.probe and layout == "navrl"
                if args.hazard or probe:  # one flight: `evaluate`'s numbers and the paths
                    result, flown = evaluate_recorded(
                        env, policy, seed=cfg.eval.seed, max_steps=steps
                    )
                    outcomes = flown.codes()
                else:
                    result, outcomes = evaluate_outcomes(
                        env, policy, seed=cfg.eval.seed, max_steps=steps
                    )
                row.update(result)
                row["outcomes"] = outcomes  # per drone: benchmarks/paired.py compares them
                if args.hazard:
                    row["hazard"] = collision_hazard(flown)
                    boxes = [env.pillars.boxes(m, env.level_counts[-1]) for m in range(count)]
                    row["hazard"]["approach"] = collision_approach(flown, boxes, env.cfg.dt)
                if probe:
                    row["lidar_use"] = lidar_use(env, policy, seed=cfg.eval.seed, max_steps=steps)
                    row["paths"] = path_stats(flown, env.cfg.dt)
                if args.goal_distance_caps and layout == "navrl":
                    row["goal_distance_use"] = goal_distance_use(
                        env, policy, args.goal_distance_caps, seed=cfg.eval.seed, max_steps=steps
                    )
                row["seconds"] = round(time.perf_counter() - t0, 1)
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.pillar_pass:
        t0 = time.perf_counter()
        scene = pillar_pass_env(cfg.env)
        row = {"probe": "pillar_pass", **pillar_pass(scene, policy)}
        row["seconds"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.hover_share:
        t0 = time.perf_counter()
        row = hover_row(cfg, policy, snap, args)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, nargs="+", required=True)
    p.add_argument("--config", type=Path, default=Path("config/navrl-original.toml"))
    p.add_argument("--pillars", nargs="*", default=["100", "350"])
    p.add_argument("--layouts", nargs="+", default=["navrl", "train"])
    p.add_argument(
        "--maps", nargs="+", default=["train", "held_out"], choices=["train", "held_out"]
    )
    p.add_argument("--held-out-seed", type=int, default=1000)
    p.add_argument("--held-out-maps", type=int, default=16)
    p.add_argument("--probe", action="store_true")
    p.add_argument(
        "--goal-distance-caps",
        type=float,
        nargs="+",
        default=[],
        help="NavRL-layout rows again with the goal distance the policy reads capped (m)",
    )
    p.add_argument(
        "--hover-share",
        type=int,
        default=0,
        metavar="STEPS",
        help="fly the training env STEPS steps: the share of frames within reach of the goal",
    )
    p.add_argument("--stage", type=int, default=0, help="curriculum stage for --hover-share")
    p.add_argument(
        "--hazard",
        action="store_true",
        help="every row also gives collisions per 100 m flown and by start-goal distance",
    )
    p.add_argument(
        "--pillar-pass",
        action="store_true",
        help="also fly the scripted scene of one pillar on the goal line, shifted sideways "
        "(analysis/probes.py pillar_pass): collisions, the shortest beam and the side passed",
    )
    p.add_argument("--out", type=Path)
    p.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides")
    args = p.parse_args()
    cfg = load_config(args.config, args.overrides, environ={})
    if cfg.run.torch_threads:
        torch.set_num_threads(cfg.run.torch_threads)
    load_before = os.getloadavg()
    results = {str(path): diagnose(cfg, path, args) for path in args.checkpoint}
    out = {
        "benchmark": "diagnose",
        "config": str(args.config),
        "overrides": args.overrides,
        "eval": {
            "episodes": cfg.eval.num_envs,
            "max_steps": eval_steps(cfg),
            "seed": cfg.eval.seed,
            # the world flown besides the pillars: rows of runs that differ here are other drones
            "dynamic_obstacles": cfg.env.num_dynamic_obstacles,
            "dynamic_speed_range": list(cfg.env.navigation.dynamic_speed_range),
        },
        "held_out": {"seed": args.held_out_seed, "maps": args.held_out_maps},
        "results": results,
        "machine": {
            "platform": platform.platform(),
            "torch_threads": torch.get_num_threads(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
