"""NavRL's evaluation (SPEC §4): Beta-mean actions, each env's first episode. No I/O."""

from __future__ import annotations

import torch
from torchrl.envs import EnvBase

from navrl_daemon.rl.policy import NavRLPolicy
from navrl_daemon.rl.rollout import STAT_KEYS


@torch.no_grad()
def evaluate(env: EnvBase, policy: NavRLPolicy, *, seed: int, max_steps: int) -> dict[str, float]:
    """Mean stats over the envs' first episodes.

    The env is reseeded and fully reset, so the same weights always give the same numbers.
    Stepping stops once every env has finished its first episode (later steps cannot change
    the result). An env still running after `max_steps` reports its stats so far and counts
    in `unfinished`.
    """
    env.set_seed(seed)
    td = env.reset()
    n = env.batch_size[0]
    first = torch.zeros(n, len(STAT_KEYS), device=env.device)
    finished = torch.zeros(n, dtype=torch.bool, device=env.device)
    last = first
    for step in range(max_steps):
        td = policy.act(td, deterministic=True)
        record, td = env.step_and_maybe_reset(td)
        last = torch.cat([record["next", "stats", k] for k in STAT_KEYS], dim=-1)
        newly = record["next", "done"].squeeze(-1) & ~finished
        first[newly] = last[newly]
        finished |= newly
        if step % 16 == 15 and bool(finished.all()):  # a host sync: not every step
            break
    first[~finished] = last[~finished]
    means = first.mean(dim=0).tolist()
    return {
        "episodes": n,
        **dict(zip(STAT_KEYS, means, strict=True)),
        "unfinished": int((~finished).sum()),
    }
