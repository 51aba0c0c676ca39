"""Two short CPU runs whose losses, evaluations and final weights are pinned to the bit
(tests/data/pinned_trajectory.json): `config/default.toml` and `config/navrl.toml`, each
at a tiny size. A change of structure that changes no per-frame behaviour leaves them all
as recorded.

Regenerate the fixture on purpose only (a change that is meant to change the maths):
    OMP_NUM_THREADS=1 python -m tests.pinned_trajectory
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

from tests.conftest import DATA, navrl_cli

FIXTURE = DATA / "pinned_trajectory.json"

# Four iterations each, evaluated after 1, 2 and 4 (the early first evaluation, then
# every eval.interval), one intra-op thread (bitwise repeatable only so).
SMALL = [
    "run.device=cpu",
    "run.torch_threads=1",
    "env.num_envs=8",
    "ppo.rollout_length=8",
    "ppo.epochs=2",
    "eval.num_envs=4",
    "eval.interval=2",
    "log.summary_interval=1",
    "metrics.port=0",
    "run.total_frames=256",
]
RUNS = {
    "default": [
        "--config",
        "config/default.toml",
        *SMALL,
        "ppo.minibatches=4",
        "env.max_episode_length=50",
    ],
    # The mirror, per-env map levels, the curriculum's first stage, held-out maps.
    "navrl": ["--config", "config/navrl.toml", *SMALL, "ppo.minibatches=2", "eval.max_steps=20"],
}

# Keys that say how long things took, not what was computed.
TIMED = {"time", "seconds", "frames_per_second", "busy", "eta_s"}


def untimed(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in TIMED and not k.startswith("checkpoint_")}


def weights_digest(path: Path) -> str:
    """sha256 over the exported policy's tensors, in order (not the file's bytes, which
    hold a pickle's framing)."""
    digest = hashlib.sha256()
    for name, tensor in torch.load(path, weights_only=True, map_location="cpu").items():
        digest.update(name.encode())
        digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()


def trajectory(state: Path, name: str) -> dict[str, Any]:
    """Run `name` of RUNS in `state` (a new directory) and read back what it computed."""
    done = navrl_cli("run", "--state-dir", str(state), *RUNS[name])
    if done.returncode != 0:
        raise RuntimeError(f"{name} run exited {done.returncode}: {done.stderr[-3000:]}")

    def rows(path: Path) -> list[dict[str, Any]]:
        return [untimed(json.loads(x)) for x in path.read_text().splitlines()]

    return {
        "history": rows(state / "history.jsonl"),
        "eval": rows(state / "eval" / "results.jsonl"),
        "policy_sha256": weights_digest(state / "export" / "policy.pt"),
    }


def record(workdir: Path) -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "runs": {name: trajectory(workdir / name, name) for name in RUNS},
    }


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        FIXTURE.write_text(json.dumps(record(Path(tmp)), indent=1) + "\n")
    print(f"wrote {FIXTURE}", file=sys.stderr)
