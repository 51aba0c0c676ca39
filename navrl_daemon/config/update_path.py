"""Which PPO update path a run can take (rl/fast_update.py): the one rule, applied by the
config at load time and by the learner with what it is built with."""

from __future__ import annotations

from typing import Literal

from navrl_daemon.errors import ConfigError

UpdatePath = Literal["eager", "fused", "cuda_graph"]

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


def check_compile(compile_: bool, path: UpdatePath) -> None:
    """ppo.compile needs a path whose step it can compile (the config checks what it can
    tell; with run.device = "auto" the learner checks again with its device)."""
    if compile_ and path == "eager":
        raise ConfigError(
            "ppo.compile: only the 'fused' and 'cuda_graph' update paths compile their step; "
            "this run's resolves to 'eager' (set ppo.update_path, 'auto' is eager on a CPU)"
        )


def resolve_update_path(
    requested: str,
    device_type: str | None,
    *,
    why_not: str | None = None,
    why_not_graph: str | None = None,
) -> UpdatePath:
    """The one rule for whether a `ppo.update_path` can run: the path an update runs on.

    `device_type`: "cpu" or "cuda", None while unknown (run.device = "auto" at load time).
    `why_not`: what rules the fast paths out (one of NOT_FAST), None when nothing does;
    `why_not_graph`: what rules out the CUDA-graph path only (one of NOT_GRAPH).
    "auto" is "cuda_graph" on a CUDA device ("fused" where only the graph is ruled out)
    and "eager" otherwise; an explicit fast path
    that cannot run is a ConfigError (exit 78), never a silent fallback. The config applies
    it at load time; the learner (rl/learner.py) again with what it is built with.
    """
    if requested == "auto":
        if device_type != "cuda" or why_not is not None:
            return "eager"
        return "cuda_graph" if why_not_graph is None else "fused"
    if requested == "eager":
        return "eager"
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
    if requested == "cuda_graph" and device_type not in ("cuda", None):
        raise ConfigError(
            f"ppo.update_path = 'cuda_graph' needs a CUDA device; this run's is {device_type}"
        )
    return requested  # type: ignore[return-value]
