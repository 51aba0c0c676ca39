"""What an evaluation flies, from the config alone: its env section, its step cap, and the
key two configs share when they evaluate the same drones on the same maps.

No torch here: scripts that only read configs (benchmarks/learning.py --check-config)
import this without the ~5 s that torch, tensordict and torchrl take to import.
"""

from __future__ import annotations

from typing import Any

from navrl_daemon.config import Config, EnvConfig


def eval_steps(cfg: Config) -> int:
    return cfg.eval.max_steps or cfg.env.max_episode_length


def eval_env_config(cfg: Config) -> EnvConfig:
    """The env section as the evaluation flies it (see rl/evaluations.py: `make_eval_env`)."""
    navigation = cfg.env.navigation.model_copy(
        update={
            "map_levels": [],
            "min_level": 0,
            "num_maps": cfg.eval.num_maps or cfg.env.navigation.num_maps,
            "reach_hold": 0,  # NavRL's evaluation: at the goal when the episode ends
            "safety_weight": 1.0,  # NavRL's reward: evaluation returns compare across runs
        }
    )
    return cfg.env.model_copy(
        update={
            "navigation": navigation,
            "num_obstacles": cfg.eval.num_obstacles or cfg.env.num_obstacles,
            "max_episode_length": max(cfg.env.max_episode_length, cfg.eval.max_steps),
        }
    )


# The training spawn rule's keys: a backend's "navrl" layout places every start and goal
# itself (NavRL's crossing) and reads none of them (env/contract.py).
SPAWN_RULE_KEYS = ("spawn", "goal_distance", "crossing_share", "spawn_height")


def evaluation_key(cfg: Config) -> dict[str, Any]:
    """What an evaluation under `cfg` flies: its env (less the keys it never reads; its
    episode length with `eval.max_steps` gives `eval_steps`), the eval section and the
    training maps' seed. Two configs with equal keys evaluate the same drones on the same
    maps, e.g. a curriculum stage of local hops and the crossing stage after it, both
    evaluated on NavRL's crossing."""
    env = eval_env_config(cfg).plain()
    del env["curriculum"]
    if cfg.eval.layout == "navrl":
        for key in SPAWN_RULE_KEYS:
            env.pop(key)
    section = cfg.eval.model_dump() | {"num_obstacles": env["num_obstacles"]}  # 0: the env's
    return {"env": env, "eval": section, "seed": cfg.run.seed}
