"""`navrl-daemon` command line. The one place where errors become exit codes (DESIGN.md §3)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import structlog

from navrl_daemon.config import Config, load_config, to_toml
from navrl_daemon.errors import NavrlError, UsageError
from navrl_daemon.ops.logging import configure_logging

log = structlog.get_logger("cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="navrl-daemon",
        description="Long-running training service for NavRL's drone-navigation PPO policy.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--config", type=Path, help="TOML config file (default: built-in)")
        p.add_argument(
            "overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, TOML values"
        )
        return p

    run = with_config(sub.add_parser("run", help="train until run.total_frames or a signal"))
    run.add_argument("--state-dir", type=Path, help="default: run.state_dir")

    ev = with_config(sub.add_parser("eval", help="NavRL eval layout with Beta-mean actions"))
    ev.add_argument("--checkpoint", type=Path, help="NavRL-layout state_dict (.pt)")
    ev.add_argument("--state-dir", type=Path, help="default: run.state_dir")
    ev.add_argument("--episodes", type=int, help="drones, one first episode each")
    ev.add_argument("--json", action="store_true", help="one JSON document on stdout")

    cfg = sub.add_parser("config", help="configuration tools")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    with_config(cfg_sub.add_parser("show", help="print the resolved config as TOML"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        configure_logging(cfg.log)
        match args.command:
            case "run":
                return _run(cfg, args)
            case "eval":
                return _eval(cfg, args)
            case "config":
                sys.stdout.write(to_toml(cfg))
                return 0
        raise UsageError(f"unknown command {args.command}")
    except NavrlError as e:
        print(f"navrl-daemon: error: {e}", file=sys.stderr)
        return e.exit_code


def _state_dir(cfg: Config, args: argparse.Namespace) -> Path:
    return args.state_dir if args.state_dir is not None else Path(cfg.run.state_dir)


def _run(cfg: Config, args: argparse.Namespace) -> int:
    from navrl_daemon import daemon

    return daemon.run(cfg, _state_dir(cfg, args))


def _eval(cfg: Config, args: argparse.Namespace) -> int:
    from navrl_daemon.config import resolve_device
    from navrl_daemon.rl.evaluate import evaluate
    from navrl_daemon.rl.training import eval_steps, make_eval_env, make_policy
    from navrl_daemon.storage.policy_file import check_policy_layout, load_policy_state

    if args.episodes is not None:
        if args.episodes < 1:
            raise UsageError("--episodes must be at least 1")
        cfg = load_config(args.config, [*args.overrides, f"eval.num_envs={args.episodes}"])
    path = args.checkpoint or _state_dir(cfg, args) / "export" / "policy.pt"
    device = resolve_device(cfg)
    policy = make_policy(cfg, "cpu")
    state = load_policy_state(path)
    check_policy_layout(state, policy.state_dict(), path)
    policy.load_state_dict(state)
    policy.to(device)
    env = make_eval_env(cfg, device)
    t0 = time.perf_counter()
    results = evaluate(env, policy, seed=cfg.eval.seed, max_steps=eval_steps(cfg))
    results = {
        "checkpoint": str(path),
        "layout": cfg.eval.layout,
        **results,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    if args.json:
        print(json.dumps(results))
    else:
        for k, v in results.items():
            print(f"{k:>12}: {v:.4f}" if isinstance(v, float) else f"{k:>12}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
