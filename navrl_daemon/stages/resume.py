"""Where a run starts from: the newest valid checkpoint in the state dir, or nothing.

Between storage (which files are valid) and rl (how a state is put back). A checkpoint
holds the learner (policy with ValueNorm, optimisers, minibatch RNG, version) and, unless
it is a warm start imported from a NavRL policy, the collector (env state, running
TensorDict, episode stats, process RNGs). The collector half is restored only when the
env config and seed are the ones it was saved with; otherwise new episodes start.
With a curriculum, the collector state also holds its progress: the training env is
rebuilt at the stage it was saved at before the env state is put back.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog
import torch

from navrl_daemon import __version__
from navrl_daemon.config import Config
from navrl_daemon.env.curriculum import Curriculum
from navrl_daemon.errors import DataError
from navrl_daemon.rl.snapshot import SNAPSHOT_VERSION, restore_collector, restore_learner
from navrl_daemon.rl.training import Collector, Learner
from navrl_daemon.stages.evaluator import read_results
from navrl_daemon.stages.producer import use_stage
from navrl_daemon.storage.checkpoint import CheckpointDir, CheckpointHeader

log = structlog.get_logger("resume")

FULL = "full"
WARM_START = "warm_start"


@dataclass(frozen=True)
class Resumed:
    path: Path
    iteration: int
    frames: int
    kind: str
    env_restored: bool


def library_versions() -> dict[str, str]:
    import tensordict
    import torchrl

    return {
        "navrl_daemon": __version__,
        "torch": str(torch.__version__),  # a TorchVersion, which weights_only cannot load
        "tensordict": str(tensordict.__version__),
        "torchrl": str(torchrl.__version__),
        "numpy": str(np.__version__),
        "python": platform.python_version(),
    }


def static_state(cfg: Config) -> dict[str, Any]:
    """The entries every snapshot of this run carries besides learner and collector."""
    return {
        "kind": FULL,
        "snapshot_version": SNAPSHOT_VERSION,
        "config": cfg.model_dump(),
        "versions": library_versions(),
    }


def newest_checkpoint(
    directory: CheckpointDir,
) -> tuple[Path, CheckpointHeader, dict[str, Any]] | None:
    """Clean up after a crash, then find the newest valid file. Files exist but none is
    valid → DataError: starting over would quietly throw a run away (a permissions
    problem can make every file unreadable)."""
    removed = directory.remove_temp_files()
    if removed:
        log.warning(
            "removed temp files left by an interrupted checkpoint write",
            files=[p.name for p in removed],
        )
    found = directory.newest_valid()
    for path, why in directory.skipped:
        log.warning("skipping invalid checkpoint", file=str(path), reason=why)
    if found is None and directory.skipped:
        bad = "; ".join(f"{p.name}: {why}" for p, why in directory.skipped)
        raise DataError(
            f"{directory.path}: no valid checkpoint among {len(directory.skipped)} file(s) "
            f"({bad}); move them away to start a new run"
        )
    return found


def restore(
    cfg: Config,
    path: Path,
    header: CheckpointHeader,
    state: dict[str, Any],
    learner: Learner,
    collector: Collector,
    curriculum: Curriculum | None = None,
) -> Resumed:
    """Put `state` into learner and collector; DataError when it does not fit."""
    kind = state.get("kind")
    if kind not in (FULL, WARM_START):
        raise DataError(f"checkpoint {path}: unknown kind {kind!r}")
    try:
        if kind == WARM_START:
            learner.policy.load_state_dict(state["learner"]["policy"])
        else:
            restore_learner(learner, state["learner"])
    except (KeyError, RuntimeError, ValueError, TypeError) as err:
        raise DataError(f"checkpoint {path}: does not fit this policy: {err}") from None
    threads = header.meta.get("threads")
    if threads is not None and threads != torch.get_num_threads():
        log.warning(
            "torch thread count differs from the checkpoint's run: training continues, "
            "but not bit for bit as one uninterrupted run would",
            checkpoint_threads=threads,
            threads=torch.get_num_threads(),
        )
    env_restored = False
    saved = state.get("config", {})
    collected = state.get("collector")
    # Checkpoints from before env.curriculum / env.reset_mode / env.map_levels /
    # env.crossing_share existed lack those keys (they ran what the defaults give on the
    # CPU: no curriculum, indexed resets, no density levels, NavRL's border spawns).
    before = {"curriculum": [], "reset_mode": "auto", "map_levels": [], "crossing_share": 0.0}
    saved_env = {**before, **saved.get("env", {})}
    same_env = saved_env == cfg.env.model_dump() and (
        saved.get("run", {}).get("seed") == cfg.run.seed
    )
    if collected is not None and same_env:
        try:
            if curriculum is not None and "curriculum" in collected:
                curriculum.load_state_dict(collected["curriculum"])
                if curriculum.applied != 0:
                    use_stage(collector, curriculum, curriculum.applied)
            restore_collector(collector, collected)
            env_restored = True
        except (KeyError, RuntimeError, ValueError) as err:
            log.warning("env state not restored: new episodes start", reason=str(err))
    elif collected is not None:
        log.warning("env config or seed changed since the checkpoint: new episodes start")
    return Resumed(path, header.iteration, header.frames, kind, env_restored)


def load_learner(directory: CheckpointDir, learner: Learner) -> Path:
    """Rollback: the newest valid checkpoint's learner state, keeping the version counter."""
    found = directory.newest_valid()
    if found is None:
        raise DataError(f"{directory.path}: no valid checkpoint")
    path, _, state = found
    if state.get("kind") != FULL:
        raise DataError(f"checkpoint {path}: a warm start holds no optimiser state")
    restore_learner(learner, state["learner"], counters=False)
    return path


def replay_evaluations(curriculum: Curriculum, results: Path, resumed: Resumed) -> None:
    """Count the evaluations up to the checkpoint that finished after it was taken (they
    are in `results`, not in its curriculum progress), and log where the curriculum is."""
    promotions = curriculum.replay(read_results(results), upto=resumed.iteration)
    log.info(
        "curriculum resumed",
        stage=curriculum.stage,
        name=curriculum.name(curriculum.stage),
        streak=curriculum.progress.streak,
        applied=curriculum.applied,
        replayed_promotions=len(promotions),
    )
