"""The one owner of a checkpoint's state: every stateful part of a run by name, captured
and restored in one loop, and the migrations that bring an older file's state up to date.

A part is anything with `state_dict()` / `load_state_dict(state)` (torch's `Stateful`
shape): the learner (policy with its ValueNorm, optimisers, minibatch generator,
counters), the collector (env, running TensorDict, action generator, process RNGs), the
curriculum's progress. Each belongs to one of two halves, named after the moment it is
captured at: `learner` after the update (the trainer), `collector` right after the
rollout that update trained on (the producer; stages/producer.py says why). A part
added with a name lands under that name in its half; the learner and the collector are
the halves' own entries (`name=None`), which keeps a half's layout what it was before
parts had names.

A new stateful piece is one `add` in `training_state` (which the daemon wires). A change
to what a file holds is one step up of `SNAPSHOT_VERSION` and one migration in
`MIGRATIONS`, from the version before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

from navrl_daemon.config import with_moved_keys
from navrl_daemon.errors import DataError
from navrl_daemon.rl.collector import Collector
from navrl_daemon.rl.curriculum import Curriculum, CurriculumState
from navrl_daemon.rl.learner import Learner

# The layout of the state, a file's `snapshot_version` (the container around it has a
# version of its own: storage/checkpoint.py).
SNAPSHOT_VERSION = 3

LEARNER = "learner"
COLLECTOR = "collector"
Half = Literal["learner", "collector"]


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


class RunState:
    """The stateful parts of a run, by half and name, in the order they were added: the
    order they are restored in (a curriculum puts the env at its stage before the env's
    state is loaded into it)."""

    def __init__(self) -> None:
        self._parts: dict[str, list[tuple[str | None, Stateful]]] = {LEARNER: [], COLLECTOR: []}

    def add(self, half: Half, name: str | None, part: Stateful) -> None:
        """`name=None`: the part's own entries are the half's (one such part per half)."""
        names = [n for n, _ in self._parts[half]]
        if name in names:
            raise ValueError(f"{half} already holds a part named {name!r}")
        self._parts[half].append((name, part))

    def capture(self, half: Half) -> dict[str, Any] | None:
        """The half's state (references where a part gives them: stage them before the
        part changes); None when its own part has none to give (an env backend that
        cannot save its state)."""
        state: dict[str, Any] = {}
        for name, part in self._parts[half]:
            value = part.state_dict()
            if name is not None:
                state[name] = value
            elif value is None:
                return None
            else:
                state.update(value)
        return state

    def restore(self, half: Half, state: dict[str, Any]) -> None:
        """Load every part of the half from `state`; a part's error (KeyError, ValueError,
        RuntimeError) propagates, the parts before it already loaded."""
        for name, part in self._parts[half]:
            part.load_state_dict(state if name is None else state[name])


def training_state(
    learner: Learner, collector: Collector, curriculum: Curriculum | None
) -> RunState:
    """The parts a training run checkpoints: the one place that lists them."""
    state = RunState()
    state.add(LEARNER, None, learner)
    if curriculum is not None:  # before the collector: its stage's env takes the env state
        state.add(COLLECTOR, "curriculum", CurriculumState(curriculum, collector))
    state.add(COLLECTOR, None, collector)
    return state


# ------------------------------------------------------------------------------ migrations

# Env keys added while files were at version 1 and what a file without one ran: no
# curriculum, indexed resets, no density levels, NavRL's border spawns, steps op by op,
# reaching never ends an episode, levels all the way down, NavRL's reward.
V1_ENV_KEYS: dict[str, Any] = {
    "curriculum": [],
    "reset_mode": "auto",
    "map_levels": [],
    "crossing_share": 0.0,
    "collect_path": "auto",
    "reach_hold": 0,
    "min_level": 0,
    "safety_weight": 1.0,
}


def _from_v1(state: dict[str, Any]) -> dict[str, Any]:
    """Version 1 grew keys without a version step: give its config every env key, its
    collector halves (this rank's and its peers') the action generator, and drop the
    episode sums they no longer hold."""
    state = dict(state)
    config = state.get("config")
    if isinstance(config, dict):
        state["config"] = {**config, "env": {**V1_ENV_KEYS, **config.get("env", {})}}
    collected = state.get("collector")
    if isinstance(collected, dict):
        collected = _v1_collector(collected)
        if "peers" in collected:
            collected["peers"] = [_v1_collector(p) for p in collected["peers"]]
        state["collector"] = collected
    return state


def _v1_collector(collected: dict[str, Any]) -> dict[str, Any]:
    """Before the collector had a generator of its own, actions were drawn from the
    device's default one: its state in the file's process RNGs (the first CUDA device's
    on a CUDA run)."""
    collected = {k: v for k, v in collected.items() if k != "episodes"}
    if "sampler" not in collected:
        rng = collected["rng"]
        collected["sampler"] = rng["cuda"][0] if rng["cuda"] else rng["torch"]
    return collected


def _from_v2(state: dict[str, Any]) -> dict[str, Any]:
    """Version 2 held the embedded backend's keys in the env section itself: they move to
    `env.navigation`, where the config has them since (config/loader.py: MOVED)."""
    config = state.get("config")
    if not isinstance(config, dict):
        return state
    return {**state, "config": with_moved_keys(config)[0]}


# Version N's migration gives a state of version N + 1.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _from_v1, 2: _from_v2}


def migrate(state: dict[str, Any], where: object) -> dict[str, Any]:
    """`state` as this version writes it (a new dict; the file's is left alone). DataError
    for a file a newer version wrote: going on from it here could drop what it holds."""
    version = int(state.get("snapshot_version", 1))
    if version > SNAPSHOT_VERSION:
        raise DataError(
            f"checkpoint {where}: written by a newer navrl-daemon (state format {version}; "
            f"this one reads up to {SNAPSHOT_VERSION}): upgrade to resume it"
        )
    while version < SNAPSHOT_VERSION:
        state = MIGRATIONS[version](state)
        version += 1
    return {**state, "snapshot_version": version}
