"""Reading a config: TOML file < `NAVRL_` environment < dotted `KEY=VALUE` overrides,
validated into a `Config` (config/sections.py); and writing one back as TOML. Every error
names the key path and what is allowed, and maps to exit 78 through `ConfigError`."""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, get_args, get_origin

import structlog
from pydantic import (
    BaseModel,
    ValidationError,
)

from navrl_daemon.config.sections import ENV_PREFIX, KEY_RE, Config
from navrl_daemon.errors import ConfigError

log = structlog.get_logger("config")

# Tables and arrays inside one another: NavRL's config nests 4 deep (env.curriculum[0].
# promote.evals), a backend's options a few more; far deeper is a crafted file, which
# Python's recursive TOML parser (and everything after it) would end in RecursionError.
MAX_DEPTH = 32
TOO_DEEP = f"nested too deeply: tables and arrays nest at most {MAX_DEPTH} levels"


def load_config(
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Resolve a config: file, then `NAVRL_SECTION__KEY` variables, then `KEY=VALUE` args."""
    data: dict[str, Any] = {}
    if path is not None:
        data = read_toml(Path(path))
        run = data.get("run")
        if isinstance(run, dict) and "state_dir" not in run:
            run["state_dir"] = default_state_dir(Path(path))
        elif run is None:
            data["run"] = {"state_dir": default_state_dir(Path(path))}
    # Moved keys go to their new place here, before the layers meet, so an old name in a
    # later layer still wins over the new one in an earlier layer.
    data, moved = with_moved_keys(data)
    env_items = environ if environ is not None else os.environ
    variables: dict[str, str] = {}  # dotted key -> the environment variable that set it
    for name, raw in sorted(env_items.items()):
        if name.startswith(ENV_PREFIX) and "__" in name:
            key = moved_key(name[len(ENV_PREFIX) :].lower().replace("__", "."), moved)
            origin = f"environment variable {name}"
            set_dotted(data, key, parse_value(raw, origin=origin), origin=origin)
            variables[key] = name
    for item in overrides:
        key, value = parse_override(item)
        key = moved_key(key, moved)
        set_dotted(data, key, value, origin=f"override {item!r}")
        variables.pop(key, None)  # the override wins, and is what an error is about
    return validate(data, variables, moved)


def default_state_dir(config_file: Path) -> str:
    """A config file's own state dir when it names none: `runs/<file name without .toml>`."""
    return f"runs/{config_file.stem}"


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: not valid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"config file {path}: {TOO_DEEP}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {path}: not UTF-8 text (TOML must be): byte {e.object[e.start]:#04x} "
            f"at offset {e.start}"
        ) from None
    except OSError as e:
        raise ConfigError(f"config file {path}: cannot read: {e.strerror}") from None


def parse_override(item: str) -> tuple[str, Any]:
    """`a.b=VALUE`: VALUE is parsed as TOML; a bare word is taken as a string."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep:
        raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. env.num_envs=64")
    if not KEY_RE.match(key):
        raise ConfigError(
            f"override {item!r}: key {key!r} is not a dotted path like section.key "
            "(letters, digits and _ separated by dots)"
        )
    return key, parse_value(raw, origin=f"override {key}")


def parse_value(raw: str, *, origin: str) -> Any:
    text = raw.strip()
    if not text:
        raise ConfigError(f"{origin}: empty value")
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except RecursionError:
        raise ConfigError(f"{origin}: {TOO_DEEP}") from None
    except tomllib.TOMLDecodeError:
        if re.fullmatch(r"[A-Za-z0-9_.:/@+-]+", text):
            return text  # bare word such as cuda:0 or a path
        raise ConfigError(
            f"{origin}: value {raw!r} is not a TOML value (numbers, true/false, "
            '"strings", [lists]) nor a bare word'
        ) from None


def set_dotted(data: dict[str, Any], key: str, value: Any, *, origin: str) -> None:
    """Set `key` (`section.key`, sections made as needed) in `data` to `value`. A number
    picks an entry of a list already there: `env.curriculum.1.num_dynamic_obstacles=8`
    sets one stage's key and keeps the rest of the list."""
    parts = key.split(".")
    node: Any = data
    for depth, part in enumerate(parts):
        where, last = ".".join(parts[:depth]), depth == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(
                    f"{where}: a list of {len(node)} entries, so {key} names none of them "
                    f"(from {origin}); an entry is named by its index, from 0"
                )
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif not isinstance(node, dict):
            raise ConfigError(
                f"{where}: is a value, not a section; cannot set {key} (from {origin})"
            )
        elif part.isdigit():
            raise ConfigError(
                f"{where}: is not a list the config holds, so {key} cannot index it "
                f"(from {origin}); set the whole list instead"
            )
        elif last:
            node[part] = value
        else:
            node = node.setdefault(part, {})


# Keys taken out of the config, with the value a config saved while they existed may hold
# and still mean today's behaviour: a state dir's config.toml or a checkpoint's config
# written then loads (the key dropped); any other value is a ConfigError saying why.
RETIRED: dict[tuple[str, str], tuple[Any, str]] = {
    ("ppo", "mirror_ratio"): (
        "behaviour",
        'removed: "own" diverged within 50 iterations where it was tried (docs/results.md); '
        "ppo.mirror always takes a reflection's ratio over the collected row's "
        'log-prob ("behaviour")',
    ),
}


def _without_retired(data: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(data)
    for (section, key), (kept, why) in RETIRED.items():
        table = out.get(section)
        if not isinstance(table, Mapping) or key not in table:
            continue
        if table[key] != kept:
            raise ConfigError(f"invalid configuration:\n  {section}.{key} = {table[key]!r}: {why}")
        out[section] = {k: v for k, v in table.items() if k != key}
    return out


# Keys moved to another section, by their old and new dotted names: a config that names
# one the old way loads as if it named it the new way, with one warning per load.
MOVED: dict[str, str] = {
    f"env.{key}": f"env.navigation.{key}"
    for key in (
        "num_maps",
        "border_width",
        "dynamic_speed_range",
        "reach_hold",
        "spawn",
        "crossing_share",
        "spawn_height",
        "smoothness_penalty",
        "safety_weight",
        "thrust_to_weight",
        "reset_mode",
        "map_levels",
        "min_level",
    )
}


def moved_key(key: str, moved: list[str]) -> str:
    """A dotted key (or one under it: `env.map_levels.0`) by its new name; its old name is
    added to `moved`."""
    for old, new in MOVED.items():
        if key == old or key.startswith(f"{old}."):
            moved.append(old)
            return new + key[len(old) :]
    return key


def with_moved_keys(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`data` (a new dict; tables on the way copied) with every MOVED key in its new place,
    and the old names found. Both names with different values: a ConfigError (which one
    was meant is not ours to guess)."""
    out, moved = dict(data), []
    for old, new in MOVED.items():
        *old_path, old_key = old.split(".")
        *new_path, new_key = new.split(".")
        source = _table(out, old_path)
        if source is None or old_key not in source:
            continue
        value = source.pop(old_key)
        target = _table(out, new_path, make=True)
        if target is None:
            raise ConfigError(
                f"invalid configuration:\n  {'.'.join(new_path)}: is a value, not a section; "
                f"{old} moved to {new}"
            )
        if new_key in target and target[new_key] != value:
            raise ConfigError(
                f"invalid configuration:\n  {old} = {value!r} and {new} = "
                f"{target[new_key]!r}: {old} is the old name of {new}; set {new} only"
            )
        target[new_key] = value
        moved.append(old)
    return out, moved


def _table(data: dict[str, Any], path: list[str], *, make: bool = False) -> dict[str, Any] | None:
    """The table at `path` in `data`, copied there so that the caller's stays as it was;
    None where there is none (or a value). `make`: missing tables are made."""
    node = data
    for part in path:
        inner = node.get(part)
        if inner is None and make:
            inner = {}
        if not isinstance(inner, Mapping):
            return None
        node[part] = node = dict(inner)
    return node


def validate(
    data: Mapping[str, Any],
    variables: Mapping[str, str] | None = None,
    moved: Iterable[str] = (),
) -> Config:
    """`variables`: dotted key -> the `NAVRL_` environment variable that set it, named in
    the message of an error at or under that key. Retired keys (RETIRED) at their kept
    value are dropped; moved keys (MOVED) go to their new place, and one warning names
    them with those `moved` already (`load_config`'s layers)."""
    too_deep = _too_deep(data)
    if too_deep is not None:
        raise ConfigError(f"invalid configuration:\n  {too_deep}: {TOO_DEEP}")
    data, found = with_moved_keys(data)
    names = sorted(set(moved) | set(found))
    if names:
        log.warning(
            "config keys under their old names: they load, but write them under the new "
            "ones (config show prints the config that way)",
            moved=[f"{old} -> {MOVED[old]}" for old in names],
        )
    data = _without_retired(data)
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_describe(e, variables or {})) from None


def _too_deep(data: Mapping[str, Any]) -> str | None:
    """The path of a value nested deeper than MAX_DEPTH, or None; walked without recursion."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        node, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            return where.removeprefix(".")
        items = node.items() if isinstance(node, Mapping) else enumerate(node)
        for key, value in items:
            if isinstance(value, Mapping | list):
                inner = f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}"
                stack.append((value, inner, depth + 1))
    return None


def _describe(err: ValidationError, variables: Mapping[str, str]) -> str:
    lines = []
    for item in err.errors():
        # ("env", "curriculum", 0, "spawn") reads env.curriculum[0].spawn
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in item["loc"])
        where = where.removeprefix(".") or "config"
        # The variables that set this key, something under it, or the section it is in.
        setters = [
            name for key, name in variables.items() if _nested(where, key) or _nested(key, where)
        ]
        source = f" (from environment variable {', '.join(setters)})" if setters else ""
        kind = item["type"]
        if kind == "extra_forbidden":
            parent = _section_model(item["loc"][:-1])
            allowed = ", ".join(parent.model_fields) if parent else "?"
            lines.append(f"{where}: unknown key{source}; allowed here: {allowed}")
            continue
        msg = item["msg"].removeprefix("Value error, ")
        got = item.get("input")
        shown = "" if kind == "value_error" or isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"{where}: {msg}{shown}{source}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def _nested(inner: str, outer: str) -> bool:
    """Whether dotted path `inner` is `outer` or lies under it."""
    return inner == outer or inner.startswith((f"{outer}.", f"{outer}["))


def _section_model(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] = Config
    for part in loc:
        if isinstance(part, int):
            continue  # an item of a list of sections (env.curriculum)
        field = model.model_fields.get(str(part))
        ann = field.annotation if field else None
        if get_origin(ann) is list or (ann is not None and type(None) in get_args(ann)):
            ann = next((a for a in get_args(ann) if isinstance(a, type)), None)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model


# ---------------------------------------------------------------------------- TOML out


def to_toml(cfg: Config) -> str:
    """The resolved config as TOML; `load_config` of this text gives back `cfg`."""
    out: list[str] = []
    values = cfg.model_dump()
    for section in values:
        _write_table(out, section, getattr(cfg, section), values[section])
    return "\n".join(out)


def _write_table(out: list[str], name: str, section: BaseModel, values: dict[str, Any]) -> None:
    """`[name]` with its values, then the sections it holds (`[env.navigation]`) as tables
    of their own; a dict that is one value (`env.options`) stays an inline table."""
    inner = [k for k in values if isinstance(getattr(section, k), BaseModel)]
    out.append(f"[{name}]")
    out.extend(f"{k} = {_toml_value(v)}" for k, v in values.items() if k not in inner)
    out.append("")
    for key in inner:
        _write_table(out, f"{name}.{key}", getattr(section, key), values[key])


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isinf(v) or math.isnan(v):
            raise ValueError(f"cannot write non-finite {v} to TOML")
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # env.options: an inline table
        return (
            "{" + ", ".join(f"{_toml_value(str(k))} = {_toml_value(x)}" for k, x in v.items()) + "}"
        )
    raise TypeError(f"cannot write {type(v).__name__} to TOML")
