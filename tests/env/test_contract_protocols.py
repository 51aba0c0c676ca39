"""The env contract's optional capabilities are protocols: the embedded env states every
one, a backend without them takes each caller's plain path, and no caller probes an env
with getattr/hasattr or reads its private attributes."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from navrl_2d import Planar2DEnv
from navrl_2d import make_env as make_planar
from tensordict import TensorDictBase
from torchrl.envs import EnvBase

import navrl_daemon
from navrl_daemon.analysis.probes import pillar_pass
from navrl_daemon.config import EnvConfig
from navrl_daemon.env.backends import registered, resolve
from navrl_daemon.env.conformance import run_conformance
from navrl_daemon.env.contract import (
    CapturableEnv,
    DensityLevels,
    Determinism,
    RecordableEnv,
    ResumableEnv,
    ScriptedScene,
)
from navrl_daemon.env.navigation import NavigationEnv
from navrl_daemon.errors import UsageError
from navrl_daemon.pipeline.resume import keep_levels
from navrl_daemon.rl import captured_rollout, evaluate
from navrl_daemon.rl.collector import Collector
from navrl_daemon.rl.curriculum import use_stage
from navrl_daemon.rl.graphs import SameObjects
from navrl_daemon.rl.policy import NavRLPolicy

CFG = EnvConfig().replaced(
    num_envs=4,
    field_size=10.0,
    num_obstacles=4,
    num_dynamic_obstacles=8,
    max_episode_length=20,
    map_levels=[2, 4],
)
PROTOCOLS = (ResumableEnv, CapturableEnv, DensityLevels, Determinism, RecordableEnv)


class Bare(EnvBase):
    """A backend with the contract's keys and specs and none of its optional capabilities
    (the example backend's task, reached through a field, not inherited)."""

    def __init__(self, cfg: EnvConfig = CFG, *, seed: int = 0, **kwargs: object) -> None:
        inner = make_planar(cfg.replaced(map_levels=[]), device="cpu", seed=seed)
        super().__init__(device=inner.device, batch_size=inner.batch_size)
        self.inner = inner
        self.observation_spec = inner.observation_spec.clone()
        self.action_spec = inner.action_spec.clone()
        self.reward_spec = inner.reward_spec.clone()
        self.done_spec = inner.done_spec.clone()

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        return self.inner._reset(tensordict, **kwargs)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self.inner._step(tensordict)

    def _set_seed(self, seed: int | None) -> None:
        self.inner._set_seed(seed)


def bare_factory(cfg: EnvConfig, *, device, seed: int, num_envs=None, layout="train") -> Bare:
    n = cfg.num_envs if num_envs is None else num_envs
    bare = Bare(cfg.model_copy(update={"num_envs": n}), seed=seed)
    bare.inner.layout = layout
    return bare


def navigation(**update: object) -> NavigationEnv:
    return NavigationEnv(CFG.replaced(**update), seed=1)


def test_the_embedded_env_states_every_capability() -> None:
    env = navigation()
    for protocol in PROTOCOLS:
        assert isinstance(env, protocol), protocol.__name__
    assert env.generator is env.generator  # one generator, public
    assert env.deterministic is True
    assert env.graph_objects() == (env.lidar,)


def test_a_backend_states_only_what_it_implements() -> None:
    planar = make_planar(CFG.replaced(map_levels=[]), device="cpu", seed=0)
    assert isinstance(planar, Planar2DEnv) and isinstance(planar, ResumableEnv)
    assert not isinstance(planar, CapturableEnv | DensityLevels | Determinism | RecordableEnv)
    bare = Bare()
    assert not any(isinstance(bare, protocol) for protocol in PROTOCOLS)
    bare.deterministic = False  # what the Isaac Sim backend declares
    assert isinstance(bare, Determinism)


def test_conformance_skips_what_a_backend_does_not_declare() -> None:
    report = run_conformance(bare_factory, CFG, backend="bare", device="cpu", seed=3)
    status = {r.name: r.status for r in report.results}
    assert report.ok, report.failures
    assert status["state"] == "skip" and status["determinism"] == "pass"

    def nondeterministic(*args, **kwargs) -> Bare:
        env = bare_factory(*args, **kwargs)
        env.deterministic = False
        return env

    report = run_conformance(nondeterministic, CFG, backend="bare", device="cpu", seed=3)
    assert {r.name: r.status for r in report.results}["determinism"] == "skip"


def test_without_resumable_state_a_checkpoint_holds_no_env_and_restores_none() -> None:
    collector = SimpleNamespace(env=Bare(), td=None)
    assert Collector.state_dict(collector) is None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no ResumableEnv"):
        Collector.load_state_dict(collector, {"td": {}, "env": {}})  # type: ignore[arg-type]


def stage_switch(old: EnvBase, new: EnvBase) -> tuple[bool, SimpleNamespace]:
    td = old.reset()
    collector = SimpleNamespace(env=old, td=td, cfg=SimpleNamespace(run=SimpleNamespace(seed=1)))
    curriculum = SimpleNamespace(build_env=lambda stage, **kwargs: new, applied=0)
    carried = use_stage(collector, curriculum, 1, carry=True)  # type: ignore[arg-type]
    assert collector.env is new and curriculum.applied == 1
    return carried, collector


def test_a_stage_switch_carries_episodes_only_between_resumable_envs() -> None:
    old, new = navigation(), navigation()
    old.reset()
    carried, collector = stage_switch(old, new)
    assert carried
    assert torch.equal(new.pos, old.pos) and torch.equal(new.level, old.level)
    assert torch.equal(new.generator.get_state(), old.generator.get_state())
    carried, collector = stage_switch(Bare(), Bare())
    assert not carried and collector.td is not None


def test_density_levels_are_kept_only_by_envs_that_have_them() -> None:
    env = navigation()
    saved = torch.tensor([1, 0, 1, 1])
    collector = SimpleNamespace(env=env, td=None)
    keep_levels(collector, {"env": {"level": saved}}, [2, 4], [2, 4])  # type: ignore[arg-type]
    assert torch.equal(env.level, saved) and collector.td is not None
    collector = SimpleNamespace(env=Bare(), td=None)
    keep_levels(collector, {"env": {"level": saved}}, [2, 4], [2, 4])  # type: ignore[arg-type]
    assert collector.td is None  # nothing kept, nothing reset


def test_a_capture_holds_the_env_generator_or_refuses_an_env_without_one() -> None:
    policy = torch.nn.Linear(1, 1)
    env, bare = navigation(), Bare()
    assert evaluate._generators(env) == [env.generator]
    assert evaluate._generators(bare) == []
    held, tensors, _ = evaluate._graph_key(env, policy)  # type: ignore[arg-type]
    assert held == SameObjects(env, env.lidar, policy) and len(tensors) > 0
    held, tensors, _ = evaluate._graph_key(bare, policy)  # type: ignore[arg-type]
    assert held == SameObjects(bare, policy) and tensors == ()
    buffer = env.reset().unsqueeze(1)
    with pytest.raises(TypeError, match="no CapturableEnv"):
        captured_rollout._graph_key(bare, policy, buffer, None)  # type: ignore[arg-type]
    key = captured_rollout._graph_key(env, policy, buffer, None)  # type: ignore[arg-type]
    assert key[0] == SameObjects(env, env.lidar, policy, None)


# The probes the contract replaces: an env's features discovered by name, or its privates.
PROBE = re.compile(r"getattr\((self\.)?env|hasattr\((self\.)?env|\._gen\b")


def test_no_caller_probes_an_env_or_reads_its_generator_privately() -> None:
    package = Path(navrl_daemon.__file__).parent
    hits = [
        f"{path.relative_to(package)}:{number}: {line.strip()}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if PROBE.search(line)
    ]
    assert hits == []


def test_the_embedded_env_records_where_things_are_and_a_bare_backend_cannot() -> None:
    """What recorded evaluations read (`RecordableEnv`), and `eval --plot`'s clear refusal
    of an env without it (a UsageError, exit 2, not an AttributeError)."""
    env = navigation()
    env.reset()
    now, scene = env.whereabouts(), env.scene()
    assert now.drones is env.pos and now.goals is env.goal  # live: a recorder copies
    assert now.moving.shape == (CFG.num_dynamic_obstacles, 3)
    assert scene.map_id.shape == (CFG.num_envs,) and scene.field_size == CFG.field_size
    assert env.collect_path == "eager" and env.collect_fallback  # "auto" on the CPU
    policy = NavRLPolicy()
    results, traj = evaluate.evaluate_recorded(env, policy, seed=0, max_steps=5)
    assert traj.positions.shape == (6, CFG.num_envs, 3) and results["episodes"] >= 0
    from navrl_daemon.commands.eval import _probe

    with pytest.raises(UsageError, match="cannot"):
        _probe(SimpleNamespace(env=SimpleNamespace(backend="bare")), Bare(), policy)  # type: ignore[arg-type]


# A concrete env class named outside env/: what the capability protocols replace.
CONCRETE = {"NavigationEnv", "Planar2DEnv"}
# Strings that name a backend yet test none, with how often each file holds them: the
# default of `env.backend` (the config sits below env/ and must name one), the embedded
# backend's config section `env.navigation` (a key of the config, read whatever the
# backend), and the offline policy kind "navigation" (NavRLPolicy's, kept in
# checkpoints): a policy, not a backend.
NOT_A_TEST = {
    ("config/sections.py", "navigation"): 3,
    ("offline/bc.py", "navigation"): 4,
    ("offline/wiring.py", "navigation"): 3,
    ("pipeline/resume.py", "navigation"): 2,
    ("rl/eval_config.py", "navigation"): 1,
}


def _outside_env() -> list[tuple[str, ast.Module]]:
    package = Path(navrl_daemon.__file__).parent
    return [
        (path.relative_to(package).as_posix(), ast.parse(path.read_text()))
        for path in sorted(package.rglob("*.py"))
        if "env" not in path.relative_to(package).parts[:1]
    ]


def _docstrings(tree: ast.Module) -> set[int]:
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, owners)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _identifier(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.alias):
        return node.name
    return None


def test_no_caller_outside_env_tells_backends_apart_by_class() -> None:
    """No code outside env/ names a concrete env class (comments and docstrings may)."""
    hits = [
        f"{where}:{getattr(node, 'lineno', '?')}: {_identifier(node)}"
        for where, tree in _outside_env()
        for node in ast.walk(tree)
        if _identifier(node) in CONCRETE
    ]
    assert hits == []


def test_no_caller_outside_env_tells_backends_apart_by_name() -> None:
    """No code outside env/ spells a name the backends' registry knows (`env list`): what
    a backend supports is asked of the registry or of the env, and a message naming a
    backend takes the name from the registry. Comments and docstrings may name them."""
    names = {backend.name for backend in registered()}
    # A name in a message: after "backend", or quoted.
    named = re.compile(rf"(?:backend\W+|['\"])({'|'.join(map(re.escape, names))})\b")
    found: dict[tuple[str, str], list[int]] = {}
    for where, tree in _outside_env():
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
                continue
            if id(node) in docstrings:
                continue
            match = named.search(node.value)
            name = match.group(1) if match else node.value if node.value in names else None
            if name is not None:
                found.setdefault((where, name), []).append(node.lineno)
    hits = sorted(
        f"{where}:{lines}: {name!r}"
        for (where, name), lines in found.items()
        if len(lines) != NOT_A_TEST.get((where, name), 0)
    )
    assert hits == []


def test_the_registry_states_what_each_backend_implements() -> None:
    """What the registry says a backend supports, which rules read before an env is built
    (the plan's collect path, `eval --plot`'s message), is what its env implements."""
    for name, env in (("navigation", navigation()), ("navrl-2d", make_planar(CFG))):
        backend = resolve(name)
        assert backend.captured == isinstance(env, CapturableEnv), name
        assert backend.recorded == isinstance(env, RecordableEnv), name
    assert isinstance(navigation(), ScriptedScene)
    with pytest.raises(UsageError, match="cannot"):
        pillar_pass(Bare(), NavRLPolicy())
