"""`navrl-daemon env check|list`: run the env contract's conformance suite; list backends."""

from __future__ import annotations

import argparse
from typing import Any

from navrl_daemon.commands.common import config_args, json_arg, print_json
from navrl_daemon.config import Config, load_config, resolve_device


def register(sub: Any) -> None:
    p = sub.add_parser("env", help="env backends: conformance check, registered backends")
    cmds = p.add_subparsers(dest="env_command", required=True, metavar="SUBCOMMAND")
    check = config_args(cmds.add_parser("check", help="run the conformance suite on a backend"))
    check.add_argument("--backend", help="backend to check (default: env.backend of the config)")
    check.add_argument(
        "--steps", type=int, default=50, help="env steps timed at env.num_envs (default 50)"
    )
    json_arg(check)
    check.set_defaults(handler=handle_check)
    listing = json_arg(config_args(cmds.add_parser("list", help="show the registered backends")))
    listing.set_defaults(handler=handle_list)


def handle_check(cfg: Config, args: argparse.Namespace) -> int:
    """Exit 0 when every check passes or is skipped, 1 when one fails; 78 (ConfigError)
    when the backend cannot be resolved or refuses its env.options."""
    from navrl_daemon.env.backends import backend_of
    from navrl_daemon.env.conformance import measure_throughput, run_conformance
    from navrl_daemon.errors import UsageError

    if args.steps < 1:
        raise UsageError("--steps must be at least 1")
    if args.backend is not None:
        cfg = load_config(args.config, [*args.overrides, f'env.backend="{args.backend}"'])
    device = resolve_device(cfg)
    factory = backend_of(cfg.env).load()
    report = run_conformance(
        factory, cfg.env, backend=cfg.env.backend, device=device, seed=cfg.run.seed
    )
    if report.ok:
        report.throughput = measure_throughput(
            factory, cfg.env, device=device, seed=cfg.run.seed, steps=args.steps
        )
    if args.json:
        print_json(report.to_dict())
    else:
        print(f"backend {report.backend} on {report.device}")
        for r in report.results:
            print(f"  {r.status:4}  {r.name:<12} {r.detail}".rstrip())
        if report.throughput:
            t = report.throughput
            print(
                f"  {t['steps_per_second']:.1f} steps/s x {t['num_envs']} envs = "
                f"{t['frames_per_second']:.0f} frames/s ({t['steps']} steps, {t['seconds']:.2f} s)"
            )
        print("ok" if report.ok else f"FAILED: {', '.join(r.name for r in report.failures)}")
    return 0 if report.ok else 1


def handle_list(cfg: Config, args: argparse.Namespace) -> int:
    from navrl_daemon.env.backends import registered

    backends = registered()
    if args.json:
        print_json([{"name": b.name, "target": b.target, "origin": b.origin} for b in backends])
    else:
        for b in backends:
            print(f"{b.name:<12} {b.target:<45} {b.origin}")
        print("or env.backend = 'package.module:factory'")
    return 0
