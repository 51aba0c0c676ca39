"""Rollout collection: T steps of every env into a preallocated [N, T] TensorDict. No I/O.

This is NavRL's SyncDataCollector loop written out: the policy samples from its Beta
distribution, the env steps and auto-resets finished envs, and each step's TensorDict
(observation, action, log-prob, value, and the `next` entry holding reward, done flags,
stats and the true final observation before the reset) lands in slot t of the buffer.
"""

from __future__ import annotations

from typing import Protocol

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.envs import EnvBase

from navrl_daemon.env.contract import STAT_KEYS
from navrl_daemon.rl.policy import NavRLPolicy

# The outcomes EpisodeStats reports: the env's stats, then `out_of_bounds`, the share of
# episodes that ended neither by a collision nor by the time limit (they left the height
# band, navrl-task §1.9), which NavRL's stats count nowhere. Evaluations report it too.
EPISODE_KEYS = (*STAT_KEYS, "out_of_bounds")
_COLLISION, _TRUNCATED = STAT_KEYS.index("collision"), STAT_KEYS.index("truncated")


def out_of_bounds(stats: torch.Tensor) -> torch.Tensor:
    """Per ended episode, from its stats [..., len(STAT_KEYS)]: neither a collision nor
    the time limit ended it, so it left the height band."""
    return (stats[..., _COLLISION] < 0.5) & (stats[..., _TRUNCATED] < 0.5)


@torch.no_grad()
def first_step(
    env: EnvBase,
    policy: NavRLPolicy,
    td: TensorDictBase,
    generator: torch.Generator | None = None,
) -> TensorDictBase:
    """One policy+env step, used to learn the rollout layout; returns the step's record."""
    record, _ = env.step_and_maybe_reset(policy.act(td.clone(), False, generator))
    return record


def make_rollout_buffer(example: TensorDictBase, length: int) -> TensorDict:
    """A zeroed [N, length] buffer with the keys, shapes and dtypes of one step's record."""
    n = example.batch_size[0]
    return (
        example.unsqueeze(1)
        .expand(n, length)
        .apply(torch.zeros_like, batch_size=[n, length])
        .to_tensordict()
    )


class Rollout(Protocol):
    """`collect`'s signature: how the collector fills a buffer (eagerly, or replayed)."""

    def __call__(
        self,
        env: EnvBase,
        policy: NavRLPolicy,
        td: TensorDictBase,
        buffer: TensorDictBase,
        generator: torch.Generator | None = None,
    ) -> TensorDictBase: ...


@torch.no_grad()
def collect(
    env: EnvBase,
    policy: NavRLPolicy,
    td: TensorDictBase,
    buffer: TensorDictBase,
    generator: torch.Generator | None = None,
) -> TensorDictBase:
    """Fill `buffer` ([N, T]) in place with T steps from `td`; returns the td to continue from.
    Actions are drawn from `generator` (None: torch's default one)."""
    for t in range(buffer.batch_size[1]):
        td = policy.act(td, False, generator)
        record, td = env.step_and_maybe_reset(td)
        buffer[:, t].update_(record)
    return td


class EpisodeStats:
    """Sums of per-episode stats over finished episodes, kept on device until read.

    NavRL logs the mean stats of the episodes that finished since the last log; reading
    (`take`) is the only host sync.
    """

    def __init__(self, device: torch.device | str) -> None:
        self._sums = torch.zeros(len(EPISODE_KEYS), device=device, dtype=torch.float64)
        self._count = torch.zeros((), device=device, dtype=torch.float64)

    def add(self, rollout: TensorDictBase) -> None:
        done = rollout["next", "done"].squeeze(-1)
        stats = torch.stack([rollout["next", "stats", k].squeeze(-1) for k in STAT_KEYS], -1)
        stats = torch.cat((stats, out_of_bounds(stats).unsqueeze(-1).to(stats.dtype)), -1)
        self._sums += (stats * done.unsqueeze(-1)).sum(dim=tuple(range(done.dim()))).double()
        self._count += done.sum()

    def take_sums(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(sums, count) since the last take, still on device; the counters restart."""
        sums, count = self._sums.clone(), self._count.clone()
        self._sums.zero_()
        self._count.zero_()
        return sums, count

    def merge(self, sums_count: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Add another EpisodeStats' `take_sums()` into this one."""
        sums, count = sums_count
        self._sums += sums.to(self._sums.device)
        self._count += count.to(self._count.device)

    def take(self) -> dict[str, float]:
        """Means since the last take, plus `episodes`; empty dict when none finished."""
        count = int(self._count.item())
        if count == 0:
            return {}
        means = (self._sums / count).tolist()
        self._sums.zero_()
        self._count.zero_()
        return {"episodes": count, **dict(zip(EPISODE_KEYS, means, strict=True))}
