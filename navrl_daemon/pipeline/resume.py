"""Where a run starts from: the newest valid checkpoint in the state dir, or nothing.

Between storage (which files are valid) and rl (how a state is put back). A checkpoint
holds the learner (policy with ValueNorm, optimisers, minibatch RNG, version) and, unless
it is a warm start imported from a NavRL policy, the collector (env state, running
TensorDict, episode stats, process RNGs). The collector half is restored only when the
env config and seed are the ones it was saved with; otherwise new episodes start.
With a curriculum, the collector state also holds its progress: the training env is
rebuilt at the stage it was saved at before the env state is put back. When the env section
or the seed changed but the stages up to the one reached still train the same
(rl/curriculum.py: `progress_kept`), the progress is kept: the run goes on at its stage,
in new episodes.
What the parts are and how each is put back is rl/run_state.py's; a file found here is
migrated to today's state format first.
"""

from __future__ import annotations

import platform
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog
import torch
from pydantic import BaseModel

from navrl_daemon import __version__
from navrl_daemon.config import Config
from navrl_daemon.env.contract import DensityLevels
from navrl_daemon.errors import ConfigError, DataError
from navrl_daemon.rl.collector import Collector
from navrl_daemon.rl.curriculum import Curriculum, progress_kept
from navrl_daemon.rl.learner import Learner
from navrl_daemon.rl.policy import has_own_critic, make_policy
from navrl_daemon.rl.ppo import make_optimizers
from navrl_daemon.rl.run_state import COLLECTOR, LEARNER, SNAPSHOT_VERSION, RunState, migrate
from navrl_daemon.rl.snapshot import saved_optimizer
from navrl_daemon.storage.checkpoint import (
    REJECTED,
    CheckpointDir,
    CheckpointHeader,
    read_header,
    verify,
)
from navrl_daemon.storage.history import read_results
from navrl_daemon.storage.policy_file import policy_tensors
from navrl_daemon.storage.run_mirror import MirrorPoint, RunMirror, place, staged_checkpoint

log = structlog.get_logger("resume")

FULL = "full"
WARM_START = "warm_start"
OFFLINE = "offline"  # written by an offline (offline.objective = "bc") run


@dataclass(frozen=True)
class Resumed:
    path: Path
    iteration: int
    frames: int
    kind: str
    env_restored: bool
    # The curriculum's progress came from the checkpoint (with the env, or without it
    # when only env keys outside env.curriculum changed).
    curriculum_restored: bool = False


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


class CheckpointFit:
    """Whether a checkpoint's contents fit a run of `cfg`: its kind (an online run takes
    `full` and `warm_start`, an offline one `offline`) and its learner's structure and
    shapes (policy, optimisers) against a policy built from the config. The one check that
    `run` (which skips a file that fails it, as a corrupt one) and `checkpoints verify`
    share; called with (header, state), it returns None or why not."""

    def __init__(self, cfg: Config) -> None:
        self.offline = cfg.offline.objective == "bc"
        self.objective = cfg.offline.objective
        self.kinds = (OFFLINE,) if self.offline else (FULL, WARM_START)
        # Scratch copies on the CPU to load into (under the lock: prune and a rollback can
        # check from two threads). Built with the RNG state saved: the run's initial
        # weights must not depend on whether it checked a file first.
        with torch.random.fork_rng(devices=[]):
            self.policy = make_policy(cfg, "cpu")
            self.optimizers = make_optimizers(self.policy, cfg.ppo)
        self._lock = threading.Lock()

    def __call__(self, header: CheckpointHeader, state: dict[str, Any]) -> str | None:
        kind = state.get("kind")
        if kind not in self.kinds:
            return (
                f"kind {kind!r} does not fit this run (offline.objective = "
                f"{self.objective!r} takes {' or '.join(map(repr, self.kinds))})"
            )
        try:
            with self._lock:
                self._check(kind, state)
        except DataError as err:  # not a policy at all (storage/policy_file.py)
            return str(err)
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as err:
            return f"does not fit this run's policy: {type(err).__name__}: {err}"
        return None

    def _check(self, kind: str, state: dict[str, Any]) -> None:
        if kind == OFFLINE:  # its policy's layout depends on the dataset: load checks it
            offline = state["offline"]
            _require(offline, "offline", ("kind", "optimizer", "steps"))
            if offline["kind"] == "navigation":
                policy = policy_tensors(state["learner"]["policy"], "learner.policy")
                self.policy.load_state_dict(policy)
            return
        learner = state["learner"]
        policy_tensors(learner["policy"], "learner.policy")  # what a policy may hold
        if self.policy.critic_extractor is None and has_own_critic(learner["policy"]):
            # The config, not the file: falling back to an older checkpoint without one
            # (and moving the newer aside) would quietly undo training.
            raise ConfigError(
                "the state dir's checkpoints give the critic a feature extractor of its "
                "own (ppo.separate_critic = true) and this run's config shares the "
                "actor's; set ppo.separate_critic = true to go on from them"
            )
        self.policy.load_state_dict(learner["policy"])  # keys and shapes
        if kind == WARM_START:
            return
        _require(learner, "learner", ("optimizers", "generator", "version"))
        for name, opt in self.optimizers.items():
            saved = saved_optimizer(learner, name)
            if saved is None:
                continue
            opt.load_state_dict(saved)
            for group in opt.param_groups:
                for param in group["params"]:
                    for key, value in opt.state.get(param, {}).items():
                        if (
                            isinstance(value, torch.Tensor)
                            and value.dim()
                            and (value.shape != param.shape)
                        ):
                            raise ValueError(
                                f"optimizer {name}: {key} of shape {tuple(value.shape)} for "
                                f"a parameter of shape {tuple(param.shape)}"
                            )


def _require(entry: dict[str, Any], name: str, keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if k not in entry]
    if missing:
        raise KeyError(f"{name} has no {', '.join(missing)}")


def newest_checkpoint(
    directory: CheckpointDir,
) -> tuple[Path, CheckpointHeader, dict[str, Any]] | None:
    """Clean up after a crash, then find the newest valid file (one that loads and fits
    the run: `directory.accept`). Newer files that are not valid are moved aside
    (`checkpoints/rejected/`), so they never count again. Files exist but none is valid →
    DataError: starting over would quietly throw a run away (a permissions problem can
    make every file unreadable), so nothing is moved then."""
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
    if directory.skipped:
        moved = directory.reject(directory.skipped)
        log.warning(
            "invalid checkpoints moved aside: they never count",
            files=[p.name for p, _ in moved],
            to=str(directory.path / REJECTED),
        )
    if found is None:
        return None
    path, header, state = found
    return path, header, migrate(state, path)


def take_mirror(
    mirror: RunMirror, state_dir: Path, checkpoints: CheckpointDir
) -> MirrorPoint | None:
    """When the state dir has no checkpoint, or only older ones than the mirror's resume
    point (a run moved to a new machine, a lost disk), put that point's files into the
    state dir, so that the run resumes from it; returns it (None: the state dir is used).
    DataError when the point does not check out against MIRROR.json or does not fit the
    run, ConfigError when the mirror cannot be read and the state dir holds nothing to go
    on from: nothing in the state dir is changed then."""
    here = newest_header(state_dir)
    where = mirror.location.where
    try:
        point = mirror.current()
        if point is None:
            log.info("mirror holds no resume point yet", mirror=where)
            return None
        if here is not None and here.iteration >= point.iteration:
            log.info(
                "state dir is not behind its mirror: resuming from the state dir",
                mirror=where,
                mirror_iteration=point.iteration,
                iteration=here.iteration,
            )
            return None
        files = mirror.fetch(point)
    except OSError as err:  # a network file system not mounted, a permission
        if here is None:  # whether there is a run to go on from cannot be told
            raise ConfigError(
                f"checkpoint.mirror = {where!r}: unreadable, and the state dir holds no "
                f"checkpoint: {type(err).__name__}: {err}"
            ) from None
        log.warning(
            "mirror unreadable: resuming from the state dir",
            mirror=where,
            error=f"{type(err).__name__}: {err}",
        )
        return None
    data = files[point.checkpoint]
    staged = staged_checkpoint(checkpoints.path, data)
    try:
        [(_, why)] = verify([staged], checkpoints.accept)
    finally:
        staged.unlink(missing_ok=True)
    if why is not None:
        raise DataError(
            f"mirror {where}: {point.folder}/{point.checkpoint}: {why}; "
            "set checkpoint.mirror elsewhere to start without it"
        )
    place(files, state_dir, point.checkpoint)
    checkpoints.write(data, point.iteration)
    log.warning(
        "resume point restored from the mirror: the state dir was "
        + ("empty" if here is None else "behind"),
        mirror=where,
        point=point.folder,
        iteration=point.iteration,
        frames=point.frames,
        files=sorted(files),
        **({"state_dir_iteration": here.iteration} if here is not None else {}),
    )
    return point


def newest_header(state_dir: Path) -> CheckpointHeader | None:
    """How far a run got: the header of the newest checkpoint that has one (a stop writes
    its last trained iteration there; the next run resumes from it). The stop log and the
    run summary both say this, so they name the same iteration; None without a checkpoint."""
    for path in reversed(CheckpointDir(state_dir / "checkpoints").files()):
        try:
            return read_header(path)
        except DataError:
            continue
    return None


# How a run executes, not what it trains: any resume may change these.
EXECUTION_KEYS = frozenset(
    {
        "env.navigation.reset_mode",
        "env.collect_path",
        "env.stage_switch",
        "ppo.update_path",
        "ppo.compile",
        "ppo.max_nonfinite_updates",
    }
)


def changed_settings(cfg: Config, state: dict[str, Any]) -> list[str]:
    """The task and algorithm keys (env.*, ppo.*, run.seed) whose values in `cfg` differ
    from those the checkpoint `state` was trained with; a key a checkpoint's config
    lacks counts at today's default (a migrated state has every key that means
    something else: rl/run_state.py). Empty for a checkpoint that carries no config (a
    warm start)."""
    saved = state.get("config")
    if not isinstance(saved, dict):
        return []
    now = cfg.model_dump()
    defaults = type(cfg)().model_dump()
    changed = []
    for section in ("env", "ppo"):
        model = type(getattr(cfg, section))
        then = _dotted(defaults[section], section, model)
        then |= _dotted(saved.get(section, {}), section, model)
        for name, value in _dotted(now[section], section, model).items():
            if name not in EXECUTION_KEYS and then.get(name) != value:
                changed.append(name)
    if saved.get("run", {}).get("seed", defaults["run"]["seed"]) != cfg.run.seed:
        changed.append("run.seed")
    return changed


def _dotted(values: dict[str, Any], where: str, model: type[BaseModel]) -> dict[str, Any]:
    """A section's `values` by dotted name, those of the sections it holds too
    (`env.navigation.spawn`); a dict that is one value (`env.options`) stays one."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        field = model.model_fields.get(key)
        inner = field.annotation if field is not None else None
        if isinstance(value, dict) and isinstance(inner, type) and issubclass(inner, BaseModel):
            out |= _dotted(value, f"{where}.{key}", inner)
        else:
            out[f"{where}.{key}"] = value
    return out


def check_settings(cfg: Config, path: Path, state: dict[str, Any]) -> None:
    """Refuse (ConfigError, exit 78) to resume `path` with other task or algorithm
    settings than it was trained with, unless `run.allow_config_change` asks for it: a
    run's directory holds one experiment, and going on from another task's weights is a
    decision, not an accident."""
    changed = changed_settings(cfg, state)
    if not changed:
        return
    if not cfg.run.allow_config_change:
        raise ConfigError(
            f"{path.parent.parent} holds a run trained with other settings than these "
            f"(checkpoint {path.name}): {', '.join(changed)}. Give this run a state dir "
            "of its own (--state-dir), or set run.allow_config_change=true to go on from "
            "those weights with the new settings (fine-tuning)"
        )
    log.warning("config changed since the checkpoint", keys=changed, checkpoint=str(path))


def restore(
    cfg: Config,
    path: Path,
    header: CheckpointHeader,
    state: dict[str, Any],
    parts: RunState,
    learner: Learner,
    collector: Collector,
    curriculum: Curriculum | None = None,
) -> Resumed:
    """Put `state` (migrated: `newest_checkpoint`) into the run's parts: the learner's
    half always (a warm start's policy only), the collector's when env config and seed
    are the ones it was saved with. DataError when the learner's does not fit."""
    kind = state.get("kind")
    if kind not in (FULL, WARM_START):
        raise DataError(f"checkpoint {path}: unknown kind {kind!r}")
    try:
        if kind == WARM_START:
            learner.policy.load_state_dict(state[LEARNER]["policy"])
        else:
            parts.restore(LEARNER, state[LEARNER])
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
    collected = state.get(COLLECTOR)
    saved_env = dict(saved.get("env", {}))
    env_now = cfg.env.model_dump()
    # How a later promotion treats the episodes in flight: not part of the env's state.
    saved_env.pop("stage_switch", None)
    env_now.pop("stage_switch")
    same_env = saved_env == env_now and (saved.get("run", {}).get("seed") == cfg.run.seed)
    if collected is not None and same_env:
        try:
            parts.restore(COLLECTOR, collected)
            env_restored = True
        except (KeyError, RuntimeError, ValueError) as err:
            log.warning("env state not restored: new episodes start", reason=str(err))
    elif collected is not None:
        log.warning("env config or seed changed since the checkpoint: new episodes start")
    progress = None if collected is None else collected.get("curriculum")
    kept = None
    if curriculum is not None and progress is not None and not env_restored:
        kept = progress_kept(saved_env["curriculum"], env_now["curriculum"], progress)
        if kept is not None:
            # The run goes on at the stage it had reached, in new episodes: with `applied`
            # 0 the producer builds a fresh env of that stage before its first rollout.
            curriculum.load_state_dict(kept)
    if collected is not None and not same_env and (curriculum is None or kept is not None):
        # Where the run goes on (no curriculum, or the stage it had reached), so do the
        # envs' density levels; a curriculum that starts over starts them over too.
        saved_levels = saved_env["navigation"]["map_levels"]
        keep_levels(collector, collected, saved_levels, cfg.env.navigation.map_levels)
    if curriculum is None or progress is None:
        return Resumed(path, header.iteration, header.frames, kind, env_restored)
    if env_restored:
        return Resumed(path, header.iteration, header.frames, kind, True, True)
    return Resumed(path, header.iteration, header.frames, kind, False, kept is not None)


def keep_levels(
    collector: Collector, collected: dict[str, Any], saved: list[int], now: list[int]
) -> None:
    """After an env change where the run goes on (no curriculum, or its progress kept):
    new episodes start at the density levels the checkpoint's envs had reached, raised to
    the env's `min_level`, when the levels still name the same pillar counts (`saved` ==
    `now`, `env.navigation.map_levels`) for as many envs. Otherwise every env starts at its
    floor."""
    levels = collected.get("env", {}).get("level")
    env = collector.env
    if not now or saved != now or levels is None or not isinstance(env, DensityLevels):
        return
    here = env.level
    if here.shape != levels.shape:
        return
    here.copy_(levels.to(here.device).clamp_min(env.min_level))
    collector.td = env.reset()  # the first episodes fly the kept levels too
    shares = torch.bincount(here.cpu(), minlength=len(now)) / here.numel()
    log.info("density levels kept", level_shares=[round(x, 4) for x in shares.tolist()])


def load_learner(directory: CheckpointDir, learner: Learner) -> Path:
    """Rollback: the newest valid checkpoint's learner state, keeping the version counter."""
    found = directory.newest_valid()
    if found is None:
        raise DataError(f"{directory.path}: no valid checkpoint")
    path, _, state = found
    if state.get("kind") != FULL:
        raise DataError(f"checkpoint {path}: a warm start holds no optimiser state")
    learner.load_state_dict(migrate(state, path)[LEARNER], counters=False)
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
