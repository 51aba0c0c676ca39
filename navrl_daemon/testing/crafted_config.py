"""Crafted configs, as an attacker would hand them over: TOML nested far deeper than any
config, and checkpoints or state dirs whose stored config names a module as the env
backend. Shared by the tests and benchmarks/faults.py's security section."""

from __future__ import annotations

from pathlib import Path

from navrl_daemon.config import load_config, to_toml

# A small eval task: a crafted checkpoint's policy fits it, `eval` of it takes a second.
EVAL_TINY = [
    "env.num_envs=4",
    "env.field_size=10.0",
    "env.num_obstacles=4",
    "env.num_dynamic_obstacles=8",
    "env.max_episode_length=20",
    "env.navigation.spawn=local",
    "eval.num_envs=4",
    "eval.layout=train",
    "run.device=cpu",
]
MODULE = "stored_backend_payload"  # planted in a folder, the working directory of a command
BACKEND = f"{MODULE}:make"


def nested_toml(kind: str, depth: int) -> str:
    """A TOML value `depth` inline tables ("table") or arrays ("array") deep."""
    if kind == "table":
        return "{a = " * depth + "1" + "}" * depth
    return "[" * depth + "1" + "]" * depth


def plant_module(folder: Path) -> Path:
    """`folder/MODULE.py`, which writes `folder/marker` when imported (and whose factory
    exits 9); returns the marker's path: no marker, none of its code ran."""
    marker = folder / "marker"
    (folder / f"{MODULE}.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\ndef make(*a, **k):\n    raise SystemExit(9)\n"
    )
    return marker


def checkpoint_naming(path: Path, backend: str) -> Path:
    """A `.nrc` whose stored config names `backend`, with an untrained policy that fits it."""
    from navrl_daemon.rl.policy import make_policy
    from navrl_daemon.storage.checkpoint import encode_checkpoint

    cfg = load_config(None, [*EVAL_TINY, f'env.backend="{backend}"'], environ={})
    state = {
        "config": cfg.model_dump(mode="json"),
        "learner": {"policy": make_policy(cfg, "cpu").state_dict()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode_checkpoint(state, iteration=1, frames=64, policy_version=1))
    return path


def run_config_naming(state: Path, backend: str) -> Path:
    """`state/config.toml` (the run's resolved config) naming `backend`."""
    stored = load_config(None, [*EVAL_TINY, f'env.backend="{backend}"'], environ={})
    path = state / "config.toml"
    path.write_text(to_toml(stored))
    return path
