"""How a run executes, decided once from its config and its device: the execution plan.

Each mode is one rule here, and each choice carries the rule that made it (`Choice.why`):
- update path (`ppo.update_path`): "eager", "fused" or "cuda_graph" (rl/fast_update.py);
- compile (`ppo.compile`): the fused and CUDA-graph steps through torch.compile;
- collect path (`env.collect_path`): rollout and evaluation steps op by op or captured;
- reset (`env.navigation.reset_mode`): the embedded env's indexed or masked auto-reset;
- trainer stream (`pipeline.trainer_stream`): the trainer's own CUDA stream;
- compressed rollouts (`pipeline.compress_rollouts`): env-group minibatches of LZ4 copies;
- LiDAR lowering (`ppo.lidar_conv`): the LiDAR CNN's convolutions as matmuls or conv2d;
- ranks: data parallelism over torchrun's processes.

"auto" never falls back silently where the config names a path: a path that cannot run
is a ConfigError (exit 78). The config applies the rules it can at load time
(`run.device = "auto"` leaves the device unknown); the daemon makes the plan once its
device is resolved and logs it, and hands the trainer stream and the policy its choices;
the env and the learner apply the same rules to what they are built with. No torch here:
a device is its name ("cpu", "cuda", "cuda:1"), so a plan is computed, and tested,
without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from navrl_daemon.errors import ConfigError

UpdatePath = Literal["eager", "fused", "cuda_graph"]
CollectPath = Literal["eager", "cuda_graph"]
ResetMode = Literal["indexed", "masked"]
Lowering = Literal["native", "matmul"]


# What the rules read of a config (config/sections.py's sections, which apply these rules
# when they load: the rules name the keys they read instead of importing the sections).
class NavigationModes(Protocol):
    @property
    def reset_mode(self) -> Literal["auto", "indexed", "masked"]: ...


class EnvModes(Protocol):
    @property
    def backend(self) -> str: ...
    @property
    def collect_path(self) -> Literal["auto", "eager", "cuda_graph"]: ...
    @property
    def navigation(self) -> NavigationModes: ...


class PPOModes(Protocol):
    @property
    def update_path(self) -> str: ...
    @property
    def compile(self) -> bool: ...
    @property
    def lidar_conv(self) -> str: ...


class PipelineModes(Protocol):
    @property
    def compress_rollouts(self) -> bool: ...
    @property
    def trainer_stream(self) -> bool: ...


class OfflineModes(Protocol):
    @property
    def objective(self) -> str: ...


class ConfigModes(Protocol):
    @property
    def env(self) -> EnvModes: ...
    @property
    def ppo(self) -> PPOModes: ...
    @property
    def pipeline(self) -> PipelineModes: ...
    @property
    def offline(self) -> OfflineModes: ...


# What the fast PPO update paths (rl/fast_update.py) do not cover, in the words of the
# option that brings it in: they run NavRL's update in one process, on frame minibatches.
NOT_FAST = {
    "reducer": "data parallelism over ranks (distributed)",
    "env_groups": "env-group minibatches (pipeline.compress_rollouts)",
}
# What only the CUDA-graph path does not cover: an extra loss term that reads data the host
# hands it each minibatch (the BC term waits for the prefetcher), which a graph replay
# would not see.
NOT_GRAPH = {
    "aux_loss": "an extra loss term fed by the host (offline.objective = 'ppo+bc')",
}

T = TypeVar("T")


@dataclass(frozen=True)
class Choice(Generic[T]):
    """A mode and the rule that chose it."""

    value: T
    why: str


def device_type(device: object) -> str:
    """ "cpu" or "cuda" of a device or its name ("cuda:1", a torch.device)."""
    return str(device).partition(":")[0]


def update_path(
    requested: str,
    device: object | None,
    *,
    why_not: str | None = None,
    why_not_graph: str | None = None,
) -> Choice[UpdatePath]:
    """The path a PPO update runs on; `device` None while unknown (run.device = "auto" at
    load time). `why_not`: what rules the fast paths out (one of NOT_FAST), None when
    nothing does; `why_not_graph`: what rules out the CUDA-graph path only (NOT_GRAPH).
    "auto" is "cuda_graph" on a CUDA device ("fused" where only the graph is ruled out)
    and "eager" otherwise; an explicit fast path that cannot run is a ConfigError."""
    kind = None if device is None else device_type(device)
    if requested == "auto":
        if why_not is not None:
            return Choice("eager", f"auto: eager, the fast paths do not support {why_not}")
        if kind != "cuda":
            return Choice("eager", "auto: eager off CUDA, where no launch overhead is saved")
        if why_not_graph is not None:
            return Choice("fused", f"auto: fused, a CUDA graph does not support {why_not_graph}")
        return Choice("cuda_graph", "auto: the fused step captured as a CUDA graph on CUDA")
    if requested == "eager":
        return Choice("eager", "ppo.update_path = 'eager'")
    if requested not in ("fused", "cuda_graph"):
        raise ConfigError(f"ppo.update_path: unknown path {requested!r}")
    if why_not is not None:
        raise ConfigError(
            f"ppo.update_path = {requested!r} does not support {why_not}; use 'eager' or 'auto'"
        )
    if requested == "cuda_graph" and why_not_graph is not None:
        raise ConfigError(
            f"ppo.update_path = 'cuda_graph' does not support {why_not_graph}; use 'fused', "
            "'eager' or 'auto'"
        )
    if requested == "cuda_graph" and kind not in ("cuda", None):
        raise ConfigError(
            f"ppo.update_path = 'cuda_graph' needs a CUDA device; this run's is {kind}"
        )
    return Choice(requested, f"ppo.update_path = {requested!r}")  # type: ignore[arg-type]


def compile_step(compile_: bool, path: UpdatePath) -> Choice[bool]:
    """Whether the update's step goes through torch.compile: only a fused or CUDA-graph
    step can (an eager path asked to compile is a ConfigError)."""
    if not compile_:
        return Choice(False, "ppo.compile = false")
    if path == "eager":
        raise ConfigError(
            "ppo.compile: only the 'fused' and 'cuda_graph' update paths compile their step; "
            "this run's resolves to 'eager' (set ppo.update_path, 'auto' is eager on a CPU)"
        )
    return Choice(True, f"ppo.compile = true on the {path!r} path")


def collect_path(
    cfg: EnvModes, device: object | None, *, captured: bool | None
) -> Choice[CollectPath]:
    """How the env's rollout and evaluation steps run: "cuda_graph", replays of a captured
    step (rl/captured_rollout.py), or "eager"; `device` None while unknown. `captured`:
    whether the backend's steps can be captured, as its registry entry says
    (env/backends.py), None while unknown (a config on its own). "auto" captures on CUDA
    where the backend can, unless `env.navigation.reset_mode` asks for the indexed reset,
    whose host reads a graph cannot hold; an explicit "cuda_graph" that cannot run is a
    ConfigError."""
    requested = cfg.collect_path
    kind = None if device is None else device_type(device)
    if requested == "auto":
        if kind != "cuda":
            return Choice("eager", "auto: eager off CUDA")
        if captured is False:
            return Choice("eager", f"auto: eager, backend {cfg.backend!r} is not captured")
        if cfg.navigation.reset_mode == "indexed":
            why = "auto: eager, env.navigation.reset_mode = 'indexed' reads the host"
            return Choice("eager", why)
        return Choice("cuda_graph", "auto: the backend's step captured on CUDA")
    if requested == "eager":
        return Choice("eager", "env.collect_path = 'eager'")
    if captured is False:
        raise ConfigError(
            "env.collect_path = 'cuda_graph' captures the env's step; "
            f"env.backend = {cfg.backend!r} cannot be captured and needs 'eager' or 'auto'"
        )
    if cfg.navigation.reset_mode == "indexed":
        raise ConfigError(
            "env.collect_path = 'cuda_graph' cannot hold the indexed reset's host reads; "
            "env.navigation.reset_mode = 'indexed' needs 'eager' or 'auto'"
        )
    if kind not in ("cuda", None):
        raise ConfigError(f"env.collect_path = 'cuda_graph' needs a CUDA device; this is {device}")
    return Choice("cuda_graph", "env.collect_path = 'cuda_graph'")


def reset_mode(cfg: EnvModes, device: object | None, *, captured: bool | None) -> Choice[ResetMode]:
    """How the embedded env auto-resets. "auto" is masked when the steps are captured,
    indexed otherwise: run op by op, the masked reset is slower than the indexed one at
    NavRL's scale (docs/throughput.md), while a graph cannot hold the indexed reset."""
    requested = cfg.navigation.reset_mode
    if requested != "auto":
        return Choice(requested, f"env.navigation.reset_mode = {requested!r}")
    if collect_path(cfg, device, captured=captured).value == "cuda_graph":
        return Choice("masked", "auto: masked, the steps are captured")
    return Choice("indexed", "auto: indexed, the faster one op by op")


def trainer_stream(enabled: bool, device: object) -> Choice[bool]:
    """The trainer's own CUDA stream: where asked for, on a CUDA device."""
    if not enabled:
        return Choice(False, "pipeline.trainer_stream = false")
    if device_type(device) != "cuda":
        return Choice(False, "pipeline.trainer_stream = true, but off CUDA there is one stream")
    return Choice(True, "pipeline.trainer_stream = true on CUDA")


def lidar_lowering(requested: str, device: object) -> Choice[Lowering]:
    """How the LiDAR CNN's convolutions run (rl/lidar_cnn.py): "auto" is matmul on the CPU
    (the CPU recipe's compiled update 1.36x as fast, docs/throughput.md), native elsewhere."""
    if requested != "auto":
        return Choice(requested, f"ppo.lidar_conv = {requested!r}")  # type: ignore[arg-type]
    if device_type(device) == "cpu":
        return Choice("matmul", "auto: matmul on the CPU")
    return Choice("native", "auto: native conv2d off the CPU")


@dataclass(frozen=True)
class ExecutionPlan:
    """Every mode a run executes in, and why."""

    device: str
    update_path: Choice[UpdatePath]
    compile: Choice[bool]
    collect_path: Choice[CollectPath]
    reset: Choice[ResetMode]
    trainer_stream: Choice[bool]
    compressed_rollouts: Choice[bool]
    lidar_conv: Choice[Lowering]
    ranks: Choice[int]

    @classmethod
    def of(
        cls, cfg: ConfigModes, device: object, *, captured: bool, ranks: int = 1
    ) -> ExecutionPlan:
        """The plan of `cfg` on `device` (resolved: not "auto") over `ranks` processes, for
        a backend whose steps can be `captured` or not (env/backends.py says which);
        ConfigError (exit 78) where a mode the config names cannot run there."""
        compressed = cfg.pipeline.compress_rollouts
        why_not = None
        if ranks > 1:
            why_not = NOT_FAST["reducer"]
        elif compressed:
            why_not = NOT_FAST["env_groups"]
        bc = cfg.offline.objective == "ppo+bc"
        path = update_path(
            cfg.ppo.update_path,
            device,
            why_not=why_not,
            why_not_graph=NOT_GRAPH["aux_loss"] if bc else None,
        )
        return cls(
            device=str(device),
            update_path=path,
            compile=compile_step(cfg.ppo.compile, path.value),
            collect_path=collect_path(cfg.env, device, captured=captured),
            reset=reset_mode(cfg.env, device, captured=captured),
            trainer_stream=trainer_stream(cfg.pipeline.trainer_stream, device),
            compressed_rollouts=Choice(
                compressed, f"pipeline.compress_rollouts = {str(compressed).lower()}"
            ),
            lidar_conv=lidar_lowering(cfg.ppo.lidar_conv, device),
            ranks=Choice(ranks, "torchrun's processes" if ranks > 1 else "one process"),
        )

    @property
    def choices(self) -> dict[str, Choice[Any]]:
        return {name: value for name, value in vars(self).items() if isinstance(value, Choice)}

    def fields(self) -> dict[str, Any]:
        """The plan as one log line's fields: each mode's value, and `why` by mode."""
        choices = self.choices
        return {
            "device": self.device,
            **{name: choice.value for name, choice in choices.items()},
            "why": {name: choice.why for name, choice in choices.items()},
        }
