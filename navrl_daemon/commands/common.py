"""What the commands share: the config and state-dir arguments, and JSON-or-text output."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from navrl_daemon.config import Config


def config_args(p: argparse.ArgumentParser, *, overrides: bool = True) -> argparse.ArgumentParser:
    """`--config F` and, where positionals are free, dotted `KEY=VALUE` overrides."""
    p.add_argument("--config", type=Path, help="TOML config file (default: built-in)")
    if overrides:
        p.add_argument(
            "overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, TOML values"
        )
    return p


def state_dir_arg(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--state-dir", type=Path, help="default: run.state_dir of the config")
    return p


def json_arg(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    return p


def state_dir(cfg: Config, args: argparse.Namespace) -> Path:
    return args.state_dir if args.state_dir is not None else Path(cfg.run.state_dir)


def print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")


def print_fields(fields: dict[str, Any]) -> None:
    """One `key: value` line per field; a dict value as `name count, name count`."""
    for k, v in fields.items():
        if isinstance(v, float):
            text = f"{v:.4f}"
        elif isinstance(v, dict):
            text = ", ".join(f"{name} {count}" for name, count in v.items())
        else:
            text = str(v)
        print(f"{k:>14}: {text}")


class StepProgress:
    """A tqdm bar over an evaluation's steps on a terminal (drones finished in its
    postfix); nothing off a terminal. Yields the `progress` callback `evaluate` takes
    (`eval`, and the replay `report` draws)."""

    def __init__(self, drones: int, max_steps: int) -> None:
        self.drones, self.max_steps = drones, max_steps
        self.bar: Any = None

    def __enter__(self) -> Callable[[int, int], None] | None:
        if not sys.stderr.isatty():
            return None
        from tqdm import tqdm

        self.bar = tqdm(total=self.max_steps, unit="step", desc="eval", leave=False)

        def progress(step: int, finished: int) -> None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix_str(f"{finished}/{self.drones} drones finished")

        return progress

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()
