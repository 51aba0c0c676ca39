"""`navrl-daemon eval`: NavRL's eval layout with Beta-mean actions on a saved policy.

The config comes from, first match: `--config F`; the run the policy belongs to
(`--state-dir D`'s `config.toml`, or that of the state dir holding the checkpoint file,
or the config a `.nrc` checkpoint carries); the built-in defaults. A policy trained on the
small task is then evaluated on that task, not at NavRL's full scale. `KEY=VALUE`
overrides apply on top. A config read from a file names a built-in or installed env
backend, never a module to import: that one the user names (exit 78 says how). The chosen
source is printed on stderr before the evaluation, which shows a progress bar on a
terminal.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from navrl_daemon.commands.common import (
    StepProgress,
    config_args,
    json_arg,
    print_fields,
    print_json,
    state_dir_arg,
)
from navrl_daemon.config import (
    Config,
    load_config,
    moved_key,
    parse_override,
    resolve_device,
    set_dotted,
    validate,
)
from navrl_daemon.errors import UsageError

RUN_CONFIG = "config.toml"  # written by `run` into its state dir
VIDEO = (".gif", ".mp4")


def register(sub: Any) -> None:
    p = sub.add_parser("eval", help="NavRL eval layout with Beta-mean actions")
    config_args(p)
    p.add_argument(
        "--checkpoint",
        type=Path,
        help="NavRL-layout state_dict (.pt) or checkpoint (.nrc); default: "
        "STATE_DIR/export/policy.pt",
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
        "--video",
        type=Path,
        metavar="FILE.gif|FILE.mp4",
        help="also write a video of the episodes, top-down and side view (embedded env)",
    )
    p.add_argument(
        "--probe",
        action="store_true",
        help="also probe LiDAR use (flown blind, action gap near pillars) and the altitude "
        "and path of each outcome (embedded env)",
    )
    p.add_argument(
        "--against",
        type=Path,
        metavar="POLICY",
        help="also fly this policy (.pt or .nrc, e.g. NavRL's checkpoint) on the same drones "
        "and compare the two drone by drone: the difference in reach_goal and collision with "
        "its exact 95 %% interval and McNemar's p-value",
    )
    json_arg(p)
    p.set_defaults(handler=handle)


def handle(cfg: Config, args: argparse.Namespace) -> int:
    from navrl_daemon.rl.eval_config import eval_steps
    from navrl_daemon.rl.evaluate import Evaluation
    from navrl_daemon.rl.evaluations import make_eval_env
    from navrl_daemon.rl.policy import make_policy
    from navrl_daemon.storage.policy_file import check_policy_layout, load_any_policy_state

    if args.episodes is not None and args.episodes < 1:
        raise UsageError("--episodes must be at least 1")
    drawn = [
        f for f, v in (("--plot", args.plot), ("--video", args.video), ("--probe", args.probe)) if v
    ]
    if args.against is not None and drawn:
        raise UsageError(f"--against compares two plain evaluations: not with {', '.join(drawn)}")
    for flag, path, suffixes in (("--plot", args.plot, (".png",)), ("--video", args.video, VIDEO)):
        if path is not None and path.suffix.lower() not in suffixes:
            raise UsageError(f"{flag} writes {' or '.join(suffixes)}: not {path}")
    path, cfg, source = eval_config(cfg, args)
    device = resolve_device(cfg)
    policy = make_policy(cfg, "cpu")
    state = load_any_policy_state(path)
    check_policy_layout(state, policy.state_dict(), path)
    policy.load_state_dict(state)
    policy.to(device)
    env = make_eval_env(cfg, device)
    max_steps = eval_steps(cfg)
    print(
        f"navrl-daemon: evaluating {path} with {source}: {cfg.eval.num_envs} drones, layout "
        f"{cfg.eval.layout}, up to {max_steps} steps on {device}",
        file=sys.stderr,
    )
    t0 = time.perf_counter()
    if args.against is not None:
        other = make_policy(cfg, "cpu")
        other_state = load_any_policy_state(args.against)
        check_policy_layout(other_state, other.state_dict(), args.against)
        other.load_state_dict(other_state)
        evaluation = Evaluation.for_env(env, seed=cfg.eval.seed, max_steps=max_steps)
        results = _paired(evaluation, policy, other.to(device), args.against, cfg.eval.num_envs)
        results = {"checkpoint": str(path), "config": source, "layout": cfg.eval.layout, **results}
        results["seconds"] = round(time.perf_counter() - t0, 3)
        if args.json:
            print_json(results)
        else:
            print_fields(_paired_text(results))
        return 0
    with StepProgress(cfg.eval.num_envs, max_steps) as progress:
        if args.plot is None and args.video is None:
            evaluation = Evaluation.for_env(env, seed=cfg.eval.seed, max_steps=max_steps)
            results = evaluation(policy, progress)
            results["outcomes"] = _counts(evaluation.outcomes())
        else:
            results = _evaluate_and_draw(cfg, env, policy, path, args, progress)
    if args.probe:
        results = {**results, **_probe(cfg, env, policy)}
    results = {
        "checkpoint": str(path),
        "config": source,
        "layout": cfg.eval.layout,
        **results,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    results.update(_intervals(results))
    if args.json:
        print_json(results)
    else:
        print_fields(_text(results))
    return 0


# A reach_goal interval wider than ±WIDE cannot tell apart policies as far apart as NavRL's
# 0.91 and a run's 0.75; the note then says how many drones give ±USEFUL.
WIDE, USEFUL = 0.1, 0.05
SHARES = ("reach_goal", "collision", "timed_out", "out_of_bounds")


def _counts(codes: str) -> dict[str, int]:
    """Drones per outcome (`rl.evaluate.OUTCOMES`) from one code letter per drone."""
    from navrl_daemon.rl.evaluate import OUTCOMES

    return {name: codes.count(name[0].upper()) for name in OUTCOMES}


def _intervals(results: dict[str, Any]) -> dict[str, Any]:
    """The share that timed out (of the outcome counts: NavRL's `truncated` also counts
    the drones that reached their goal, whose episodes end by the time limit too), and the
    95 % interval of each share of this many drones (ops/intervals.py)."""
    from navrl_daemon.ops.intervals import interval_of

    episodes = results["episodes"]
    shares = {**results, "timed_out": results["outcomes"]["timed out"] / episodes}
    extra: dict[str, Any] = {"timed_out": shares["timed_out"]}
    for name in SHARES:
        interval = interval_of(shares.get(name), episodes)
        if interval is not None:
            extra[f"{name}_ci95"] = [round(interval[0], 4), round(interval[1], 4)]
    return extra


def _text(results: dict[str, Any]) -> dict[str, Any]:
    """The fields as a person reads them: each share with its 95 % interval, `timed_out`
    in place of `truncated` (one name for one thing, as the console says it), and a note
    when the reach rate's interval is too wide to tell policies apart."""
    from navrl_daemon.ops.intervals import drones_for

    fields: dict[str, Any] = {}
    for key in results:
        if key in ("truncated", "timed_out") or key.endswith("_ci95"):
            continue
        fields[key] = _with_interval(results, key)
        if key == "collision":  # where `truncated` was
            fields["timed_out"] = _with_interval(results, "timed_out")
    if "reach_goal_ci95" in results:
        lo, hi = results["reach_goal_ci95"]
        if (hi - lo) / 2 > WIDE:
            drones = drones_for(min(max(0.5, lo), hi), USEFUL)  # the worst share it allows
            fields["note"] = (
                f"{results['episodes']} drones measure reach_goal only to about "
                f"±{(hi - lo) / 2:.2f}, too coarse to tell two policies apart; "
                f"~{drones} drones give ±{USEFUL}: --episodes {drones}"
            )
    return fields


def _with_interval(results: dict[str, Any], key: str) -> Any:
    value, interval = results[key], results.get(f"{key}_ci95")
    if interval is None:
        return value
    return f"{value:.4f} (95 %: {interval[0]:.2f}–{interval[1]:.2f})"


def _paired(
    evaluation: Any, policy: Any, other: Any, other_path: Path, drones: int
) -> dict[str, Any]:
    """Both policies flown by one `Evaluation` (the same drones), compared drone by drone:
    the policy's results and outcomes, `against` (the other's), `paired` (analysis/paired.py)."""
    from navrl_daemon.analysis.paired import compare_outcomes

    flown = []
    for one in (policy, other):
        with StepProgress(drones, evaluation.max_steps) as progress:
            results = evaluation(one, progress)
        flown.append({**results, "outcomes": evaluation.outcomes()})
    mine, theirs = flown
    return {
        **mine,
        "against": {"checkpoint": str(other_path), **theirs},
        "paired": compare_outcomes(mine["outcomes"], theirs["outcomes"]),
    }


def _paired_text(results: dict[str, Any]) -> dict[str, Any]:
    """`--against`'s fields for the text output: each number of both policies, then the
    difference (this policy's minus the other's) with its interval and p-value."""
    against = results["against"]
    fields = {k: v for k, v in results.items() if k not in ("against", "paired", "outcomes")}
    fields["against"] = against["checkpoint"]
    for name, paired in results["paired"].items():
        lo, hi = paired["ci95"]
        fields[f"{name} vs"] = (
            f"{paired['share_a']:.4f} against {paired['share_b']:.4f}: "
            f"{paired['difference']:+.4f} (95 %: {lo:+.4f} to {hi:+.4f}), drones only this "
            f"one {paired['only_a']}, only the other {paired['only_b']}, "
            f"McNemar p {paired['p']:.3g}"
        )
    return fields


def eval_config(cfg: Config, args: argparse.Namespace) -> tuple[Path, Config, str]:
    """(policy file, config, where the config came from): see the module docstring. A
    stored config's backend is a built-in or installed one, or the one `cfg` (the user's
    own) names (env/backends.py `check_stored`)."""
    from navrl_daemon.env.backends import check_stored

    root = args.state_dir if args.state_dir is not None else Path(cfg.run.state_dir)
    path = args.checkpoint or root / "export" / "policy.pt"
    extra = [f"eval.num_envs={args.episodes}"] if args.episodes is not None else []
    run_config = _run_config_file(path, args.state_dir)
    if args.config is not None:
        cfg = _with(cfg, args, extra)
        _note_other_task(cfg, path, run_config)
        return path, cfg, str(args.config)
    if run_config is not None:
        stored = load_config(run_config, [*args.overrides, *extra])
        source = f"{run_config} (the run's config)"
    else:
        embedded = _embedded_config(path)
        if embedded is None:
            return path, _with(cfg, args, extra), "the built-in defaults (no run config found)"
        stored = _with_overrides(embedded, [*args.overrides, *extra])
        source = f"the config stored in {path}"
    check_stored(stored.env.backend, named=cfg.env.backend, source=source)
    return path, stored, source


def _note_other_task(cfg: Config, path: Path, run_config: Path | None) -> None:
    """Say so when `cfg` sets other task or algorithm keys than the run that trained
    `path` (its state dir's config.toml, or the config a `.nrc` carries): a policy flown
    on another task than its own, on purpose or not."""
    from navrl_daemon.pipeline.resume import changed_settings

    if run_config is not None:
        trained: dict[str, Any] | None = load_config(run_config).model_dump()
        where = str(run_config)
    else:
        trained, where = _embedded_config(path), f"the config stored in {path}"
    if trained is None:
        return
    changed = changed_settings(cfg, {"config": trained})
    if changed:
        print(
            f"navrl-daemon: note: this config differs from the one {path} was trained with "
            f"({where}): {', '.join(changed)}",
            file=sys.stderr,
        )


def _run_config_file(policy: Path, state_dir: Path | None) -> Path | None:
    """The config.toml of the run a policy file belongs to: that of `--state-dir`, else
    that of the state dir holding the file (STATE_DIR/export/*.pt,
    STATE_DIR/checkpoints/*.nrc)."""
    if state_dir is not None:
        candidate = state_dir / RUN_CONFIG
    elif policy.parent.name in ("export", "checkpoints"):
        candidate = policy.parent.parent / RUN_CONFIG
    else:
        return None
    return candidate if candidate.is_file() else None


def _embedded_config(path: Path) -> dict[str, Any] | None:
    """The resolved config a `.nrc` checkpoint of a run carries (None for a `.pt` file)."""
    from navrl_daemon.errors import DataError
    from navrl_daemon.rl.run_state import migrate
    from navrl_daemon.storage.checkpoint import MAGIC, load_checkpoint

    try:
        with open(path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                return None
        _, state = load_checkpoint(path)
        state = migrate(state, path)  # an older file's config as it ran
    except (OSError, DataError):
        return None  # the policy load that follows says what is wrong with the file
    config = state.get("config")
    return config if isinstance(config, dict) else None


def _with_overrides(data: dict[str, Any], overrides: list[str]) -> Config:
    """A stored config's sections with dotted `KEY=VALUE` overrides set on top, validated
    (a key's old name sets its new one, as in `load_config`)."""
    data = copy.deepcopy(data)
    moved: list[str] = []
    for item in overrides:
        key, value = parse_override(item)
        set_dotted(data, moved_key(key, moved), value, origin=f"override {item!r}")
    return validate(data, moved=moved)


def _with(cfg: Config, args: argparse.Namespace, extra: list[str]) -> Config:
    return load_config(args.config, [*args.overrides, *extra]) if extra else cfg


def _probe(cfg: Config, env: Any, policy: Any) -> dict[str, Any]:
    """analysis/probes.py on this evaluation: LiDAR use, and path statistics per outcome."""
    from navrl_daemon.analysis.probes import lidar_use, path_stats
    from navrl_daemon.env.backends import able
    from navrl_daemon.env.contract import RecordableEnv
    from navrl_daemon.rl.eval_config import eval_steps
    from navrl_daemon.rl.evaluate import evaluate_recorded

    if not isinstance(env, RecordableEnv):
        raise UsageError(
            f"--probe records the drones' paths: env.backend = {cfg.env.backend!r} cannot "
            f"({able('recorded')} can)"
        )
    steps = eval_steps(cfg)
    use = lidar_use(env, policy, seed=cfg.eval.seed, max_steps=steps)
    _, traj = evaluate_recorded(env, policy, seed=cfg.eval.seed, max_steps=steps)
    return {"lidar_use": use, "paths": path_stats(traj, env.cfg.dt)}


def _evaluate_and_draw(
    cfg: Config,
    env: Any,
    policy: Any,
    checkpoint: Path,
    args: argparse.Namespace,
    progress: Callable[[int, int], None] | None,
) -> dict[str, Any]:
    """`evaluate` with the paths recorded, drawn to --plot and/or --video; the same
    numbers as without."""
    from navrl_daemon.env.backends import able
    from navrl_daemon.env.contract import RecordableEnv
    from navrl_daemon.ops.plots import trajectory_plot, write_png
    from navrl_daemon.rl.eval_config import eval_steps
    from navrl_daemon.rl.evaluate import evaluate_recorded

    if not isinstance(env, RecordableEnv):
        raise UsageError(
            f"--plot and --video draw the drones' paths: env.backend = {cfg.env.backend!r} "
            f"cannot record them ({able('recorded')} can)"
        )
    results, traj = evaluate_recorded(
        env, policy, seed=cfg.eval.seed, max_steps=eval_steps(cfg), progress=progress
    )
    title = f"{checkpoint.name}, layout {cfg.eval.layout}, seed {cfg.eval.seed}"
    out: dict[str, Any] = {}
    try:
        if args.plot is not None:
            write_png(args.plot, trajectory_plot(traj, title))
            out["plot"] = str(args.plot)
        if args.video is not None:
            from navrl_daemon.ops.video import write_video

            write_video(args.video, traj, title)
            out["video"] = str(args.video)
    except OSError as err:
        raise UsageError(f"{err.filename or 'output'}: {err.strerror or err}") from err
    return {**results, "outcomes": _counts(traj.codes()), **out}
