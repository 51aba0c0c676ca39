"""`navrl-daemon config show`: the resolved config as TOML, itself a valid --config.

Each key is preceded by its description as a TOML comment: the comment written above the
field in navrl_daemon/config.py (one place says what a key means). The first lines say
where the values came from, so the built-in defaults (NavRL's full scale) are never
mistaken for what `make run` trains on (config/default.toml).
"""

from __future__ import annotations

import argparse
import inspect
import io
import sys
import tokenize
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from navrl_daemon.commands.common import config_args
from navrl_daemon.config import Config, load_config, to_toml
from navrl_daemon.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("config", help="configuration tools")
    cmds = p.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    show = config_args(cmds.add_parser("show", help="print the resolved config as TOML"))
    show.add_argument(
        "--state-dir",
        type=Path,
        help="show the config a run on this state dir used (STATE_DIR/config.toml)",
    )
    show.set_defaults(handler=handle_show)


def handle_show(cfg: Config, args: argparse.Namespace) -> int:
    if args.state_dir is not None:
        if args.config is not None:
            raise UsageError("--state-dir shows that run's config: give it or --config, not both")
        path = args.state_dir / "config.toml"
        if not path.is_file():
            raise UsageError(f"{path}: no such file (has `navrl-daemon run` used this state dir?)")
        cfg = load_config(path, args.overrides)
        source = f"the config of the run in {args.state_dir} ({path})"
    elif args.config is not None:
        source = f"{args.config}, then NAVRL_* variables and KEY=VALUE overrides"
    else:
        source = (
            "the built-in defaults: NavRL's full scale (1024 drones, 350 pillars, 80 moving "
            "obstacles).\n# `make run` trains on config/default.toml instead: "
            "`navrl-daemon config show --config config/default.toml`"
        )
    sys.stdout.write(f"# navrl-daemon config show: {source}\n\n")
    sys.stdout.write(described_toml(cfg))
    return 0


def described_toml(cfg: Config) -> str:
    """`to_toml(cfg)` with each key's description above it as a comment."""
    descriptions: dict[str, dict[str, list[str]]] = {}
    for section in type(cfg).model_fields:
        descriptions |= table_descriptions(type(getattr(cfg, section)), section)
    out: list[str] = []
    section = ""
    for line in to_toml(cfg).splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        else:
            key = line.partition(" = ")[0]
            for text in descriptions.get(section, {}).get(key, []):
                out.append(f"# {text}" if text else "#")
        out.append(line)
    return "\n".join(out) + "\n"


def table_descriptions(model: type[BaseModel], name: str) -> dict[str, dict[str, list[str]]]:
    """`key_descriptions` of a section, by its table's name, and of the sections it holds
    (`env.navigation`)."""
    out = {name: key_descriptions(model)}
    for key, field in model.model_fields.items():
        inner = field.annotation
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            out |= table_descriptions(inner, f"{name}.{key}")
    return out


def key_descriptions(model: type[BaseModel]) -> dict[str, list[str]]:
    """The comment lines written right above each field of `model`'s class body."""
    try:
        source = inspect.getsource(model)
    except (OSError, TypeError):
        return {}  # no source (a frozen install): no descriptions, the TOML is unchanged
    out: dict[str, list[str]] = {}
    pending: list[str] = []
    skip = (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        at_body = token.start[1] == 4  # the class body's indent
        if token.type == tokenize.COMMENT and at_body:
            pending.append(token.string.removeprefix("#").strip())
        elif token.type == tokenize.NAME and at_body and token.string in model.model_fields:
            if pending:
                out[token.string] = pending
            pending = []
        elif token.type not in skip and token.start[1] <= 4:
            pending = []  # a docstring, decorator or method: the comment was not a field's
    return out
