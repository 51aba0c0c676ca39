"""Env backends by name: built-in, entry point, or "module:factory".

`env.backend` is resolved in this order:
1. a built-in name: "navigation" (the embedded task) or "isaac" (NavRL's Isaac Sim env);
2. a name registered under the `navrl_daemon.backends` entry-point group, e.g.

       [project.entry-points."navrl_daemon.backends"]
       navrl-2d = "navrl_2d:make_env"

3. "package.module:factory", imported directly: only when the user's own config names it.
   A config read out of a file (a checkpoint's, a state dir's config.toml) may name a
   built-in or an installed backend, never a module: `check_stored` refuses it.

The factory is called as `factory(cfg.env, device=, seed=, num_envs=, layout=)` and
returns a TorchRL env honouring `contract.py`. Nothing is imported until a backend is
chosen, so Isaac Sim is never imported unless `env.backend = "isaac"`.

What a backend supports beyond the contract is stated here, by the registry, so that no
caller tells backends apart by name: `Backend.captured` (steps a CUDA graph can hold,
`env.collect_path`), `Backend.reach_hold` (episodes ended by `env.navigation.reach_hold`),
`Backend.recorded` (paths recorded for plots and probes) and `Backend.packages` (what it
needs installed, for `doctor`). A backend the registry does not build itself (an entry
point, a module) states none of them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points

import torch

from navrl_daemon.config import EnvConfig
from navrl_daemon.env.conformance import Report, run_conformance
from navrl_daemon.env.contract import EnvFactory, Layout
from navrl_daemon.env.navigation import NavigationEnv
from navrl_daemon.errors import ConfigError

ENTRY_POINT_GROUP = "navrl_daemon.backends"
MODULE = "module:factory"  # the origin of a backend named by its module, not registered


@dataclass(frozen=True)
class Backend:
    name: str
    target: str  # "module:factory"
    origin: str  # "built-in", "entry point (<distribution>)" or "module:factory"
    # Its steps can be captured as a CUDA graph (the env is a `CapturableEnv`).
    captured: bool = False
    # It ends an episode once the drone has held its goal `env.navigation.reach_hold` steps.
    reach_hold: bool = False
    # Its env records where the drones fly (a `RecordableEnv`: plots, videos, probes).
    recorded: bool = False
    # The packages it imports that the base install lacks, and how to get them.
    packages: tuple[str, ...] = ()
    install: str = ""

    def check(self, cfg: EnvConfig) -> None:
        """ConfigError (exit 78) where `cfg` asks for what this backend does not do."""
        holds = [cfg.navigation.reach_hold, *(stage.reach_hold or 0 for stage in cfg.curriculum)]
        if any(holds) and not self.reach_hold:
            raise ConfigError(
                f"env.navigation.reach_hold: backend {self.name!r} does not end episodes at "
                f"the goal; {able('reach_hold')} can"
            )

    def load(self) -> EnvFactory:
        module_name, _, attr = self.target.partition(":")
        try:
            obj: object = importlib.import_module(module_name)
        except ImportError as e:
            raise ConfigError(
                f"env.backend = {self.name!r}: cannot import module {module_name!r} "
                f"({type(e).__name__}: {e})"
            ) from None
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise ConfigError(
                    f"env.backend = {self.name!r}: module {module_name!r} has no factory {attr!r}"
                )
            obj = getattr(obj, part)
        if not callable(obj):
            raise ConfigError(f"env.backend = {self.name!r}: {self.target} is not callable")
        return obj  # type: ignore[return-value]


BUILTIN = (
    Backend(
        "navigation",
        "navrl_daemon.env.backends:embedded",
        "built-in",
        captured=True,
        reach_hold=True,
        recorded=True,
    ),
    Backend(
        "isaac",
        "navrl_daemon.env.isaac:make_isaac_env",
        "built-in",
        packages=("isaacsim", "omni-drones", "hydra-core"),
        install="see docs/backends.md",
    ),
)


def registered() -> list[Backend]:
    """Built-ins, then entry points by name (an entry point cannot shadow a built-in)."""
    found = list(BUILTIN)
    builtin = {b.name for b in BUILTIN}
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if ep.name not in builtin:
            dist = ep.dist.name if ep.dist is not None else "?"
            found.append(Backend(ep.name, ep.value, f"entry point ({dist})"))
    return found


def resolve(name: str) -> Backend:
    """The backend `env.backend = name` means; ConfigError naming the choices if none."""
    for backend in registered():
        if backend.name == name:
            return backend
    if ":" in name:
        return Backend(name, name, MODULE)
    choices = ", ".join(b.name for b in registered())
    raise ConfigError(
        f"env.backend = {name!r}: no such backend; registered: {choices}; "
        "or give an importable 'package.module:factory'"
    )


def able(capability: str) -> str:
    """The registered backends that have `capability` (a `Backend` flag), for a message:
    "'navigation'", "'a', 'b'" or "none"."""
    names = [repr(b.name) for b in registered() if getattr(b, capability)]
    return ", ".join(names) or "none"


def backend_of(cfg: EnvConfig) -> Backend:
    """The backend of `cfg.backend`, once `cfg` asks nothing of it that it does not do."""
    backend = resolve(cfg.backend)
    backend.check(cfg)
    return backend


def check_stored(stored: str, *, named: str, source: str) -> None:
    """`env.backend = stored` read from `source`, a file anyone may have written (a shared
    checkpoint, a copied state dir): a built-in or installed backend, or the one the
    user's own config names (`named`), else ConfigError (78). Evaluating a file must not
    import and call code its author chose, from site-packages or the working directory."""
    if stored == named or resolve(stored).origin != MODULE:
        return
    raise ConfigError(
        f"{source} names env.backend = {stored!r}, a module to import and run; a config "
        "read from a file may name a built-in or installed backend (`navrl-daemon env "
        "list`), not code. If you trust it, name it yourself: "
        f"env.backend={stored} (or --config)"
    )


def check_backend(cfg: EnvConfig, *, device: torch.device | str, seed: int) -> Report:
    """The start-up gate of `run`: the conformance suite on small probes (about a second at
    NavRL's scale on CPU). Raises ConfigError (exit 78) naming the backend and each failed
    check; returns the report (with skips) when the backend conforms."""
    backend = backend_of(cfg)
    report = run_conformance(backend.load(), cfg, backend=cfg.backend, device=device, seed=seed)
    if not report.ok:
        lines = "\n  ".join(f"{r.name}: {r.detail}" for r in report.failures)
        raise ConfigError(
            f"env.backend = {cfg.backend!r} fails the env contract "
            f"(`navrl-daemon env check` for the full report):\n  {lines}"
        )
    return report


def embedded(
    cfg: EnvConfig,
    *,
    device: str | torch.device = "cpu",
    seed: int = 0,
    num_envs: int | None = None,
    layout: Layout = "train",
) -> NavigationEnv:
    """The "navigation" backend: the embedded task, configured by the env section alone."""
    if cfg.options:
        raise ConfigError(
            f"env.options: the navigation backend takes no options, got {sorted(cfg.options)}"
        )
    return NavigationEnv(cfg, device=device, seed=seed, num_envs=num_envs, layout=layout)
